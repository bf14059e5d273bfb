"""Throwaway virtual environments for the tests marked ``venvs``: made with this run's pip (it has
the machine's index configuration and wheel cache), cached under the system's temporary folder
(``aaren-test-venvs/``) by what was installed into them, so a rerun reuses them."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

CACHE = Path(tempfile.gettempdir()) / "aaren-test-venvs"
PIP_TIMEOUT_S = 900


def pip(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """This environment's pip; ``--python VENV/bin/python`` first aims it at another venv."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        cwd=cwd,
    )


def new_venv(path: Path) -> Path:
    """A venv without pip of its own at ``path`` (``pip`` above installs into it); its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def site_packages(python: Path) -> Path:
    """The purelib folder of the venv of ``python``."""
    done = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(done.stdout.strip())


def put_behind(python: Path, base: Path) -> None:
    """Make the site-packages ``base`` importable in the venv of ``python``, after the venv's own.

    ``addsitedir`` (not a bare path line) so that ``base``'s own .pth files run too (an editable
    install's); a file named to sort last, so the venv's own packages come first."""
    (site_packages(python) / "zz-aaren-test-base.pth").write_text(f"import site; site.addsitedir({str(base)!r})\n")


def cached_venv(name: str, key: Sequence[str], build: Callable[[Path], None]) -> Path:
    """The venv ``CACHE/<name>-<hash of key>``, made by ``build(python)`` the first time.

    Built aside and renamed into place: an interrupted build, or a second test run building the
    same one, never leaves a half-made venv under the cached name."""
    venv = CACHE / f"{name}-{hashlib.sha256(' '.join([sys.executable, *key]).encode()).hexdigest()[:16]}"
    if venv.is_dir():
        return venv
    CACHE.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f"{venv.name}.", dir=CACHE))
    try:
        build(new_venv(building))
        try:
            building.rename(venv)
        except OSError:  # another run finished the same venv first
            if not venv.is_dir():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return venv
