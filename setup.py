"""Package layout of the distribution (the metadata is in pyproject.toml).

One import namespace, ``aaren`` (docs/architecture.md "Layout"): each room of the tree installs under
its own name, and the package list is derived from the tree (every folder with an ``__init__.py``
below a room), so a new sub-package cannot be left out of the wheel by a hand-written list.

The bundled model repository ``models/`` is a room too (``aaren.models``), whose checkpoints and
reports are package data: the wheel is the whole product, and ``aaren serve`` from an installed
wheel serves the same models as from a checkout (tests/deploy/test_wheel.py).
"""

from setuptools import find_packages, setup

#: import name -> folder of the checkout
ROOMS = {
    "aaren": "aaren",
    "aaren.v1": "proto/aaren/v1",
    "aaren.oip": "proto/aaren/oip",
    "aaren.client": "client",
    "aaren.cli": "cli",
    "aaren.server": "server",
    "aaren_core": "aaren_core",
    "aaren.models": "models",
}

#: package -> the data files it ships (globs relative to its folder); the sdist takes them too
PACKAGE_DATA = {
    # Each model folder: what the server loads (weights, config) and what a user reads (metrics, report, plots).
    "aaren.models": ["*/model.safetensors", "*/config.json", "*/metrics.json", "*/*.md", "*/*.png"],
}

packages = []
for name, folder in ROOMS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=sorted(set(packages)), package_dir=ROOMS, package_data=PACKAGE_DATA)
