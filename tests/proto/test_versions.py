"""The gRPC stack pyproject allows really works at both ends, and the ecosystem's clients install beside us.

These tests install packages with pip from the package index into throwaway virtual environments
(marked ``venvs``; deselect with ``-m "not venvs"``). The environments are cached under the
system's temporary folder, keyed by the exact versions, so a rerun only runs the probe.

A throwaway venv holds exactly the gRPC packages under test (grpcio, protobuf,
grpcio-health-checking, grpcio-reflection); everything else (torch, numpy, pydantic, aaren
itself) comes from this test run's own environment through a ``.pth`` file that appends its
site-packages *after* the venv's own. That saves reinstalling torch per venv, and unlike
``--system-site-packages`` it cannot hide the versions: the probe reports the version and the
file of every gRPC package it imported, and the test checks they are the venv's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.venvs

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("version_probe.py")
STACK = ("grpcio", "protobuf", "grpcio-health-checking", "grpcio-reflection")
CACHE = Path(tempfile.gettempdir()) / "aaren-test-venvs"
PIP_TIMEOUT_S = 600


def _requirements() -> dict[str, Requirement]:
    """aaren's own requirements on the gRPC stack, from pyproject.toml."""
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    found = {r.name: r for r in map(Requirement, dependencies) if r.name in STACK}
    assert set(found) == set(STACK), f"pyproject.toml lacks requirements on {set(STACK) - set(found)}"
    return found


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    """This environment's pip (it has the machine's index configuration and wheel cache)."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )


def lowest_versions() -> dict[str, str]:
    """The lower bound (``>=``) pyproject gives each package of the stack."""
    lowest = {}
    for name, requirement in _requirements().items():
        bounds = [s.version for s in requirement.specifier if s.operator == ">="]
        assert len(bounds) == 1, f"{requirement}: expected exactly one >= bound"
        lowest[name] = bounds[0]
    return lowest


def resolve(requirements: list[str]) -> dict[str, str]:
    """What pip would install for ``requirements`` into an empty environment: name -> version."""
    done = _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-", *requirements)
    assert done.returncode == 0, f"pip cannot resolve {requirements}:\n{done.stderr[-4000:]}"
    report = json.loads(done.stdout)
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}


def highest_versions() -> dict[str, str]:
    """The newest versions of the stack that pip picks together within pyproject's ranges."""
    resolved = resolve([str(r) for r in _requirements().values()])
    return {name: resolved[name] for name in STACK}


def stack_venv(versions: dict[str, str]) -> Path:
    """A venv with exactly ``versions`` of the stack plus this environment behind it (cached)."""
    pins = sorted(f"{name}=={version}" for name, version in versions.items())
    return cached_venv(f"grpcio{versions['grpcio']}-protobuf{versions['protobuf']}", pins, with_base=True)


def cached_venv(name: str, pins: list[str], *, with_base: bool) -> Path:
    """A venv with ``pins`` installed (cached under ``name`` and a key of the pins); ``with_base``:
    this environment's packages behind the venv's own."""
    parts = [sys.executable, *pins] if with_base else [sys.executable, *pins, "without-base"]
    key = hashlib.sha256(" ".join(parts).encode()).hexdigest()[:16]
    venv = CACHE / f"{name}-{key}"
    if venv.is_dir():
        return venv
    # Built aside and renamed into place: an interrupted build, or a second test run building the
    # same one, never leaves a half-installed venv under the cached name.
    CACHE.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f"{venv.name}.", dir=CACHE))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(building)], check=True, timeout=120)
        python = building / "bin" / "python"
        # With dependencies: pip must find the pins consistent with each other (health-checking and
        # reflection state their own grpcio and protobuf ranges) and brings their small deps.
        done = _pip("--python", str(python), "install", "--quiet", *pins)
        assert done.returncode == 0, f"pip could not install {pins}:\n{done.stderr[-4000:]}"
        if with_base:
            site = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            # addsitedir (not a bare path line) so that this environment's own .pth files (aaren's
            # editable install) run too; appended, so the venv's own packages come first.
            base = sysconfig.get_path("purelib")
            (Path(site) / "zz-aaren-test-base.pth").write_text(f"import site; site.addsitedir({base!r})\n")
        try:
            building.rename(venv)
        except OSError:  # another run finished the same venv first
            if not venv.is_dir():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return venv


def probe(venv: Path) -> dict:
    """Run version_probe.py in ``venv``: the stack it imported and a round trip's results."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK")}
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(PROBE)], capture_output=True, text=True, timeout=300, env=env, cwd=REPO
    )
    assert done.returncode == 0, f"the probe failed in {venv}:\n{done.stderr[-6000:]}"
    return json.loads(done.stdout)


@pytest.mark.parametrize("end", ["lowest", "highest"])
def test_generated_code_and_service_run_at_both_ends_of_the_supported_range(end):
    versions = lowest_versions() if end == "lowest" else highest_versions()
    if end == "lowest":
        # The range must reach protobuf 6: that is what lets tritonclient install beside us.
        assert Version(versions["protobuf"]) < Version("7"), versions
    venv = stack_venv(versions)
    out = probe(venv)

    for name, version in versions.items():
        imported = out["stack"][name]
        assert imported["version"] == version, (name, imported)
        assert Path(imported["file"]).is_relative_to(venv), (name, imported)
    assert out["import_warnings"] == []
    trip = out["round_trip"]
    assert trip["forecast_seqs"] == [1, 2] and trip["errors"] == []
    assert trip["session_last_seq"] == 2
    assert trip["health"] == "SERVING"
    assert "aaren.v1.ForecastService" in trip["reflection_services"]
    assert trip["reflected_stream_input"] == "aaren.v1.StreamRequest"
    assert trip["reflection_v1_services"] == trip["reflection_services"]


def test_current_tritonclient_installs_beside_aaren():
    # Pin the newest release: left open, pip would backtrack to an old tritonclient whose loose
    # protobuf range fits, and the check would pass without meaning anything.
    latest = resolve(["tritonclient[grpc]"])["tritonclient"]
    resolved = resolve([f"tritonclient[grpc]=={latest}", str(REPO)])
    assert resolved["tritonclient"] == latest
    assert "aaren" in resolved
    assert Version(resolved["protobuf"]) < Version("7"), resolved
