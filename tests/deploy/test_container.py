"""The Dockerfile and the compose stack: first read (every file they name exists and is in the
build context, every setting they pass is a real one, the health check command runs against a
real server), then run for real with Debian's Docker engine (deploy/docker/dockerd.sh): the image
is built with `make image`, started, asked for health from the host, and replays the real flights;
the compose file's Redis and server replicas are started with Debian's docker-compose.

A machine where Docker cannot run fails these tests with make's output (they install what they
need as root on Debian, as `make image` does); they never skip for want of an engine."""

from __future__ import annotations

import csv
import datetime
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
    assert "models" in sources and "server" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not ignored(source), f"COPY {source}: excluded from the build context by .dockerignore"
    assert ignored(".venv") and ignored("runs") and ignored(".git"), "local state must stay out of the context"


def test_runtime_stage_runs_as_non_root_with_the_bundled_models_from_the_wheel():
    final = stages()[-1]
    users = [rest for instruction, rest in final if instruction == "USER"]
    assert users and users[-1] not in ("root", "0"), "the runtime stage must switch to a non-root user"
    env = " ".join(rest for instruction, rest in final if instruction == "ENV")
    # The wheel carries the models (aaren.models), so the build stage copies them in before it builds
    # the wheel, and the runtime stage neither copies a second set nor points AAREN_MODELS_DIR elsewhere.
    (build,) = [stage for stage in stages() if stage[0][1].endswith(" AS build")]
    assert ["models"] in [shlex.split(rest)[:-1] for instruction, rest in build if instruction == "COPY"]
    assert [rest for instruction, rest in final if instruction == "COPY" and "--from" not in rest] == []
    assert "AAREN_MODELS_DIR" not in env
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


# Debian's client, of the engine's own version; /usr/local/bin/docker may be another one.
DOCKER = "/usr/bin/docker"
ENGINE = ROOT / "deploy" / "docker" / "dockerd.sh"
# Set by deploy/docker/build-image.sh's defaults: where the base image and the extra CA come from.
BASE_IMAGE = "aaren-base:bookworm"
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
# One tag per checkout: two work trees testing on one machine share the engine (and its cache),
# never each other's image.
IMAGE = f"aaren-test:{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}"
REDIS_IMAGE = "aaren-test-redis:bookworm"


def tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Engine:
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([DOCKER, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"docker {' '.join(args)}:\n{tail(done.stdout + done.stderr)}"
        return done

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["docker-compose", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"docker-compose {' '.join(args)}:\n{tail(done.stdout + done.stderr)}"
        return done


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """The image built by `make image`, and the engine that built it, stopped after if this run
    started it and no other run uses it (its data root, with the build cache, stays)."""
    root = Path(os.environ.get("AAREN_DOCKER_ROOT") or Path(os.environ.get("TMPDIR") or "/tmp") / "aaren-docker")
    root.mkdir(parents=True, exist_ok=True)
    # Every run using the engine holds this lock shared; a run that gets it alone after is the last.
    users = (root / "users.lock").open("w")
    fcntl.flock(users, fcntl.LOCK_SH)
    was_up = subprocess.run([ENGINE, "status"], capture_output=True, timeout=60).returncode == 0
    # Cold, this installs Debian's Docker tools, debootstraps the base and builds (minutes).
    done = subprocess.run(["make", "image", f"IMAGE={IMAGE}"], cwd=ROOT, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, (
        "`make image` failed: these tests need a running Docker engine (deploy/docker/dockerd.sh, "
        f"Debian's docker.io, root):\n{tail(done.stdout + done.stderr)}"
    )
    host = subprocess.run([ENGINE, "start"], capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    yield Engine(env={**os.environ, "DOCKER_HOST": host})
    with users:
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        if not was_up:
            subprocess.run([ENGINE, "stop"], capture_output=True, timeout=120)


@pytest.fixture
def network(engine: Engine) -> Iterator[str]:
    """A network of this test's own: the engine has no default bridge (deploy/docker/dockerd.sh)."""
    name = f"aaren-test-{uuid.uuid4().hex[:8]}"
    engine.run("network", "create", name)
    yield name
    engine.run("network", "rm", name, check=False)


def aaren(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The host's own command line (this test's venv), as a user runs it against the container."""
    return subprocess.run([AAREN, *args], capture_output=True, text=True, timeout=timeout)


def wait_serving(address: str, alive: Callable[[], bool], limit_s: float = 180) -> None:
    """Until `aaren health` on the host says SERVING; the model loads in seconds, so the limit only
    bounds a server that never comes up (and a container that exited ends the wait at once)."""
    deadline = time.monotonic() + limit_s
    while True:
        done = aaren("health", "--target", address, "--timeout", "2", timeout=60)
        if done.returncode == 0:
            assert "SERVING" in done.stdout, done.stdout
            return
        assert alive(), f"the server at {address} exited: {done.stdout}{done.stderr}"
        assert time.monotonic() < deadline, f"{address} not SERVING: {done.stdout}{done.stderr}"
        time.sleep(1)


def replay(address: str, *args: str, out: Path | None = None) -> dict:
    extra = ["--out", str(out)] if out is not None else []
    done = aaren("replay", "flights", "--target", address, "--no-progress", "--json", *extra, *args, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_final_image_holds_no_extra_ca_certificate(engine):
    """The proxy's CA reached pip as a build secret; no file of the final image may contain it."""
    certs = sorted(p for p in EXTRA_CA_DIR.rglob("*.crt") if p.is_file()) if EXTRA_CA_DIR.is_dir() else []
    if not certs:
        pytest.skip(f"no extra CA certificates in {EXTRA_CA_DIR}: the build was given none to leak")
    probes = []
    for cert in certs:
        body = [line for line in cert.read_text().splitlines() if line.strip() and not line.startswith("-----")]
        probes.append(body[len(body) // 2])  # a line of this certificate's own base64
    patterns = "\n".join(probes) + "\n"
    # The certificates are mounted beside the search so that the search itself is shown to find them.
    mounts = [a for i, cert in enumerate(certs) for a in ("-v", f"{cert}:/probe/{i}.crt:ro")]
    done = engine.run(
        "run", "--rm", "--network", "none", "--user", "root", "--entrypoint", "sh", *mounts, IMAGE, "-c",
        f"printf '%s' {shlex.quote(patterns)} >/tmp/patterns; "
        "grep -rlsF -f /tmp/patterns --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev / "
        "| grep -v '^/tmp/patterns$'",
        timeout=600, check=False,
    )  # fmt: skip
    found = set(done.stdout.split())
    assert found >= {f"/probe/{i}.crt" for i in range(len(certs))}, f"the search found nothing: {done.stderr}"
    leaked = sorted(f for f in found if not f.startswith("/probe/"))
    assert not leaked, f"the final image contains the host's extra CA certificate in {leaked}"


def test_image_serves_the_flights_one_forecast_per_event(engine, network, start_server, tmp_path):
    from aaren.client.events_file import read_flights

    name = f"aaren-test-{uuid.uuid4().hex[:8]}"
    engine.run(
        "run", "--detach", "--name", name, "--network", network, "--publish", "127.0.0.1::50051",
        "--env", "AAREN_PLAINTEXT=true", IMAGE,
    )  # fmt: skip
    try:
        port = engine.run("port", name, "50051").stdout.split()[0].rsplit(":", 1)[1]
        address = f"127.0.0.1:{port}"

        def alive() -> bool:
            return engine.run("inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true"

        wait_serving(address, alive)
        # The image serves the whole bundled repository: the event model by default, a model per task.
        from aaren.client import SyncClient

        with SyncClient(address) as client:
            info = client.describe_model()
            assert (info.name, info.task) == ("aaren-flights", "event")
            assert set(info.served_models) == {
                "aaren-flights",
                "aaren-series-power",
                "aaren-class-vowels",
                "aaren-policy-hopper",
            }
            assert client.describe_model("aaren-series-power").horizon == 24
        out = tmp_path / "forecasts.csv"
        # Many events a message: the same forecasts, in a fraction of one-event messages' time.
        summary = replay(address, "--batch", "16", out=out)
        events = read_flights("test").events
        n = len(events)
        assert summary["events"] == summary["answered"] == summary["forecasts"] == n > 50_000, summary
        assert summary["errors"] == 0 and summary["duplicates"] == 0, summary
        with out.open() as f:
            rows = list(csv.DictReader(f))
        assert {r["status"] for r in rows} == {"forecast"}
        assert sorted((r["session_id"], int(r["seq"])) for r in rows) == sorted((e.session_id, e.seq) for e in events)

        # The image serves the bundled model: the host's own server with models/default forecasts
        # the same for the first events (float32, batched differently: values in minutes agree
        # to 1e-4, e.g. a predicted delay near zero computed from a std of tens of minutes).
        host = start_server(checkpoint=ROOT / "models" / "default")
        host_out = tmp_path / "host.csv"
        replay(host.address, "--batch", "16", "--limit", "2000", out=host_out)
        with host_out.open() as f:
            expected = {(r["session_id"], r["seq"]): r for r in csv.DictReader(f)}
        served = {(r["session_id"], r["seq"]): r for r in rows}
        assert len(expected) == 2000
        for key, want in expected.items():
            got = served[key]
            assert got["mark_1"] == want["mark_1"], key
            for column in ("mean_gap", "q0.5", "p_1", "dep_delay_mean"):
                assert float(got[column]) == pytest.approx(float(want[column]), rel=1e-4, abs=1e-4), (key, column)

        # The image's own HEALTHCHECK (aaren health inside the container) passes too: the first check that starts
        # once the replays are over. One during them may time out (a Python process started on two cores that the
        # replay, its client and the host's server share: CI once saw three in a row, "unhealthy"), and Docker
        # reports the status of the last three, so the status alone would say more about the load than the image.
        loaded = time.time()
        deadline = time.monotonic() + 120
        while True:
            log = json.loads(engine.run("inspect", "--format", "{{json .State.Health.Log}}", name).stdout)
            after = [c for c in log if check_started(c["Start"]) > loaded]
            if after:
                assert after[0]["ExitCode"] == 0, f"the image's health check failed after the load: {after[0]}"
                break
            assert time.monotonic() < deadline, f"no health check ran within 120 s: {log}"
            time.sleep(1)
    finally:
        engine.run("rm", "--force", name, check=False)


def check_started(stamp: str) -> float:
    """A Docker health check's ``Start`` (RFC 3339 with up to nanoseconds, e.g. ``2026-12-07T19:30:00.123456789Z``, or
    with an offset) as seconds since the epoch."""
    match = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp.strip())
    assert match, f"not a Docker time stamp: {stamp!r}"
    seconds, fraction, zone = match.groups()
    when = datetime.datetime.fromisoformat(seconds + ("+00:00" if zone == "Z" else zone))
    return when.timestamp() + float(f"0.{fraction or 0}")


def compose_for_this_machine(compose: dict) -> dict:
    """The users' docker-compose.yml, changed only where this machine needs it:
    - no top-level `name:` (Debian's docker-compose 1.29 rejects it; the project is named by -p);
    - Redis from a local stand-in (tests/deploy/images/redis.Dockerfile), since no image registry
      is reachable; Prometheus, Grafana and the paced replay client are left out (the first two
      cannot be pulled; the test replays from the host instead);
    - the server from the image `make image` built, not rebuilt by compose;
    - ephemeral loopback host ports: the fixed 50051-50052 may be taken on a shared machine.
    Everything else (commands, environment, health checks, depends_on, replicas, volumes) is kept."""
    variant = {k: v for k, v in compose.items() if k != "name"}
    services = {name: dict(compose["services"][name]) for name in ("redis", "aaren")}
    services["redis"]["image"] = REDIS_IMAGE
    services["aaren"].pop("build", None)
    services["aaren"]["image"] = IMAGE
    services["aaren"]["ports"] = ["127.0.0.1::50051"]
    variant["services"] = services
    variant["volumes"] = {"redis-data": None}
    return variant


def test_compose_replicas_share_sessions_through_redis(engine, compose, tmp_path):
    engine.run(
        "build", "--quiet", "--network", "host", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--tag", REDIS_IMAGE,
        "--file", str(ROOT / "tests" / "deploy" / "images" / "redis.Dockerfile"), str(tmp_path),
        timeout=900,
    )  # fmt: skip
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(compose_for_this_machine(compose), sort_keys=False))
    project = ["--file", str(path), "--project-name", f"aarentest{uuid.uuid4().hex[:8]}"]
    try:
        engine.compose(*project, "up", "--detach", timeout=600)
        replicas = compose["services"]["aaren"]["deploy"]["replicas"]
        addresses = []
        for index in range(1, replicas + 1):
            published = engine.compose(*project, "port", "--index", str(index), "aaren", "50051").stdout.strip()
            assert published, f"replica {index} publishes no port"
            addresses.append(f"127.0.0.1:{published.rsplit(':', 1)[1]}")
        assert len(set(addresses)) == replicas == 2

        def alive() -> bool:
            states = engine.compose(*project, "ps", "--services", "--filter", "status=running").stdout.split()
            return "aaren" in states

        for address in addresses:
            wait_serving(address, alive)
        first, second = addresses
        applied = replay(first, "--batch", "8", "--limit", "2000")
        assert applied["forecasts"] == 2000 and applied["errors"] == 0, applied
        # The other replica knows those events (from Redis) and applies the next ones.
        more = replay(second, "--batch", "8", "--limit", "4000")
        assert more["duplicates"] == 2000 and more["forecasts"] == 2000 and more["errors"] == 0, more
    finally:
        subprocess.run(
            ["docker-compose", *project, "down", "--volumes", "--timeout", "5"],
            env=engine.env, capture_output=True, timeout=300,
        )  # fmt: skip
