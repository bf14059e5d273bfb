"""The Dockerfile and the compose stack, checked without a Docker engine (none on these machines):
every file they name exists and is in the build context, every setting they pass is a real one,
and the image's health check command runs against a real server."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from aaren.server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {f"AAREN_{name.upper()}" for name in ServerSettings.model_fields}
AAREN = str(Path(sys.executable).parent / "aaren")


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        instruction, _, rest = full.partition(" ")
        out.append((instruction.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction, rest in dockerfile():
        if instruction == "FROM":
            result.append([])
        if result:
            result[-1].append((instruction, rest))
    return result


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (or a folder above it) out of the build context."""
    parts = Path(path).parts
    result = False
    for pattern in dockerignore():
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        for i in range(1, len(parts) + 1):
            candidate = "/".join(parts[:i])
            if fnmatch.fnmatch(candidate, pattern) or fnmatch.fnmatch(candidate, pattern.removeprefix("**/")):
                result = not negate
    return result


def copies() -> list[tuple[list[str], str]]:
    """Sources and destination of every COPY from the build context (not ``--from`` a stage)."""
    out = []
    for instruction, rest in dockerfile():
        if instruction not in ("COPY", "ADD"):
            continue
        args = shlex.split(rest)
        if any(a.startswith("--from") for a in args):
            continue
        args = [a for a in args if not a.startswith("--")]
        out.append((args[:-1], args[-1]))
    return out


def test_every_copy_source_exists_and_is_in_the_build_context():
    sources = [s for srcs, _ in copies() for s in srcs]
    assert "models/default" in sources and "server" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not ignored(source), f"COPY {source}: excluded from the build context by .dockerignore"
    assert ignored(".venv") and ignored("runs") and ignored(".git"), "local state must stay out of the context"


def test_runtime_stage_runs_as_non_root_with_the_bundled_model():
    final = stages()[-1]
    users = [rest for instruction, rest in final if instruction == "USER"]
    assert users and users[-1] not in ("root", "0"), "the runtime stage must switch to a non-root user"
    env = " ".join(rest for instruction, rest in final if instruction == "ENV")
    checkpoint = re.search(r"AAREN_CHECKPOINT=(\S+)", env)
    model_dest = next(dest for srcs, dest in copies() if "models/default" in srcs)
    assert checkpoint and checkpoint.group(1) == model_dest, "AAREN_CHECKPOINT must point at the copied model"
    for name in re.findall(r"\b(AAREN_[A-Z_]+)=", env):
        assert name in SETTINGS, f"ENV {name} is not a setting of aaren serve"
    exposed = {p for instruction, rest in final if instruction == "EXPOSE" for p in rest.split()}
    assert {"50051", "9464"} <= exposed
    assert re.search(r"AAREN_ADDRESS=0\.0\.0\.0:50051", env) and re.search(r"AAREN_METRICS_PORT=9464", env)


def healthcheck_command(port: int) -> list[str]:
    (rest,) = [rest for instruction, rest in stages()[-1] if instruction == "HEALTHCHECK"]
    exec_form = re.search(r"CMD\s+(\[.*\])\s*$", rest)
    assert exec_form, f"HEALTHCHECK should use the exec form: {rest}"
    argv = yaml.safe_load(exec_form.group(1))
    assert argv[0] == "aaren" and "127.0.0.1:50051" in argv
    return [AAREN, *[a.replace("127.0.0.1:50051", f"127.0.0.1:{port}") for a in argv[1:]]]


def test_healthcheck_command_passes_on_a_serving_server_and_fails_otherwise(start_server):
    srv = start_server()
    done = subprocess.run(healthcheck_command(srv.server.grpc_port), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "SERVING" in done.stdout, done.stdout + done.stderr

    down = start_server(store_url="redis://127.0.0.1:1/0?timeout_s=0.2")  # its store never answers
    done = subprocess.run(healthcheck_command(down.server.grpc_port), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "NOT_SERVING" in done.stdout, done.stdout + done.stderr

    srv.stop()
    done = subprocess.run(healthcheck_command(srv.server.grpc_port), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "UNAVAILABLE" in done.stderr, done.stdout + done.stderr


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_references_only_files_that_exist(compose):
    for name, service in compose["services"].items():
        build = service.get("build")
        if build is not None:
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile_name = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            assert (context / dockerfile_name).is_file(), f"{name}: no {dockerfile_name} in {context}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: mounts {source}, which does not exist"
            else:
                assert source in compose.get("volumes", {}), f"{name}: named volume {source} is not declared"


def test_compose_stack_shape_and_settings(compose):
    services = compose["services"]
    assert {"aaren", "redis", "prometheus", "grafana", "replay"} <= set(services)
    aaren = services["aaren"]
    assert aaren["deploy"]["replicas"] == 2
    for service in services.values():
        for key in service.get("environment", {}):
            if key.startswith("AAREN_"):
                assert key in SETTINGS, f"{key} is not a setting of aaren serve"
    store = urlparse(aaren["environment"]["AAREN_STORE_URL"])
    assert store.scheme == "redis" and store.hostname == "redis", "the replicas must share the compose Redis"
    redis_cmd = services["redis"]["command"]
    assert "--appendonly" in redis_cmd and redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert redis_cmd[redis_cmd.index("--maxmemory-policy") + 1] == "noeviction"
    assert services["replay"]["image"] == aaren["image"], "the replay client runs from the server's image"


def test_compose_replay_command_uses_real_options(compose):
    command = compose["services"]["replay"]["command"]
    assert command[:2] == ["replay", "flights"]
    help_text = subprocess.run([AAREN, "replay", "--help"], capture_output=True, text=True, timeout=60).stdout
    for option in (a for a in command if a.startswith("--")):
        assert option in help_text, f"aaren replay has no option {option}"
    target = command[command.index("--target") + 1]
    assert target.split(":")[0] in compose["services"] and target.endswith(":50051")
