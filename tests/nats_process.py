"""A real ``nats-server -js`` process owned by a test: free port, its own store dir, never a shared server."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_process import end_process, free_port

NATS_BINARY = shutil.which("nats-server") or "/usr/sbin/nats-server"


class NatsProcess:
    """``start()`` / ``stop()`` or ``kill()`` / ``start()`` again on the same port and store dir (file-backed
    streams and consumers survive). ``url``: ``nats://127.0.0.1:PORT``, the base of a log URL."""

    def __init__(self, directory: Path, *, port: int | None = None, extra: tuple[str, ...] = ()) -> None:
        """``extra``: more nats-server arguments (``--user``, ``--pass``)."""
        if not Path(NATS_BINARY).exists():
            pytest.fail("nats-server is not installed (make system-deps installs the Debian package nats-server)")
        self.directory = directory
        self.port = port or free_port()
        self.monitor_port = free_port()
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "nats.log"

    def start(self) -> NatsProcess:
        """Start and wait until JetStream is ready (``/healthz`` answers ok: streams recovered)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            NATS_BINARY,
            "-js",
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "-m", str(self.monitor_port),
            "-sd", str(self.directory / "store"),
            "-l", str(self.log),
            *self.extra,
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
                self.kill()
                raise RuntimeError(f"nats-server did not start on port {self.port}:\n{log}")
            time.sleep(0.05)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/healthz", timeout=1) as reply:
                return json.loads(reply.read()).get("status") == "ok"
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL: what a crash does (what the server wrote to its store files stays)."""
        end_process(self.process, crash=True)

    def stop(self) -> None:
        """SIGTERM: a clean shutdown (streams flushed to the store)."""
        end_process(self.process)


@pytest.fixture(scope="session", name="nats_server")
def nats_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsProcess]:
    """One real nats-server for the whole run (import ``nats_server_fixture`` into a test module to use
    ``nats_server``); tests keep apart by subject and stream names of their own."""
    server = NatsProcess(tmp_path_factory.mktemp("nats")).start()
    yield server
    server.kill()
