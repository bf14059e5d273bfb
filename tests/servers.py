"""Every server the tests run, started one way for every suite: ``ServerThread`` (a real ``AarenServer``
on its own event loop in this process: the engine core is here, in both process layouts) and
``ServerProcess`` (``aaren serve`` as a process, so that a test can SIGKILL it). Both bind free ports.

Tests get them through conftest's fixtures (``start_server``, and ``pytest.mark.layouts`` for both
process layouts) rather than by hand.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import glob
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

#: The two process layouts every layout-marked test runs in: all in one process, and the engine
#: core with two front-end processes.
LAYOUTS = {"one-process": 0, "2-frontends": 2}
#: the bound on a test server's start (``ServerThread``): the cold start compiles (see there)
START_TIMEOUT_S = 180.0


class ServerThread:
    """A real ``AarenServer`` running on its own event loop in a background thread."""

    def __init__(self, start_timeout_s: float = START_TIMEOUT_S, **settings: Any) -> None:
        """``start_timeout_s`` bounds ``start()`` so that a broken server fails the test instead of
        hanging it. A warm start takes well under a second; the bound is for the cold one: the first
        server of a fresh checkout compiles the event kernel and its plans into numba's cache (about
        60 s on a 2-core machine, so a server test run alone on a fresh clone timed out at 30 s), and
        a server that compiles its model with a cold inductor cache needs minutes."""
        from aaren.server.app import AarenServer
        from aaren.server.settings import ServerSettings

        defaults = {"address": "127.0.0.1:0", "metrics_port": 0, "device": "cpu", "torch_threads": 0, "frontends": 0}
        self.settings = ServerSettings(**{**defaults, **settings})  # torch_threads 0: leave the process as is
        self.server = AarenServer(self.settings)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-server", daemon=True)
        self.start_timeout_s = start_timeout_s

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self.call(self.server.start(), timeout=self.start_timeout_s)
        return self

    def call(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.metrics_port}/metrics"

    def stop(self, grace: float = 1.0) -> None:
        if self.loop.is_running():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                self.call(self.server.stop(grace))
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def layouts_of(start: Callable[..., Any], frontends: int) -> Callable[..., Any]:
    """``start_server`` with ``frontends`` front-end processes unless a test names its own."""

    def start_in_layout(**settings: Any) -> Any:
        settings.setdefault("frontends", frontends)
        return start(**settings)

    return start_in_layout


def repository_of(start: Callable[..., Any], frontends: int, repository: Path) -> Callable[..., Any]:
    """``layouts_of(start, frontends)`` serving the model repository ``repository`` (no single
    checkpoint) unless a test names its own."""
    started = layouts_of(start, frontends)

    def start_repository(**settings: Any) -> Any:
        settings.setdefault("checkpoint", None)
        settings.setdefault("models_dir", repository)
        return started(**settings)

    return start_repository


def frozen_clock_env(at: float | None = None) -> dict[str, str]:
    """Environment that freezes a process's wall clock (``time.time()``) at ``at`` (default: now)
    with Debian's libfaketime; monotonic clocks keep running, so timeouts and the event loop work.
    Two processes started with it read identical wall-clock times, as two replicas whose clocks
    agree within float resolution do."""
    libraries = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not libraries:
        pytest.fail("libfaketime is not installed (make system-deps installs the Debian package libfaketime)")
    frozen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() if at is None else at))
    # No "@": an absolute FAKETIME stands still instead of ticking on from that moment.
    return {"LD_PRELOAD": libraries[0], "FAKETIME": frozen, "DONT_FAKE_MONOTONIC": "1"}


class ServerProcess:
    """``aaren serve`` in its own process (so a test can SIGKILL it), on free ports."""

    def __init__(
        self, log_path: Path, env: dict[str, str] | None = None, command: str = "serve", **settings: Any
    ) -> None:
        """``env``: variables added to this environment for the server (e.g. ``frozen_clock_env()``);
        ``command``: ``serve``, or ``consume`` (then ``consume_*`` settings say what it reads)."""
        defaults = {"address": "127.0.0.1:0", "metrics_port": 0, "device": "cpu", "drain_grace_s": 1.0, "frontends": 0}
        flags = []
        for name, value in {**defaults, **settings}.items():
            flags += [f"--{name.replace('_', '-')}", str(value)]
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from aaren.cli.app import app; app()", command, *flags],
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=None if env is None else {**os.environ, **env},
        )
        assert self.process.stdout is not None
        # "aaren: listening on port N, metrics on port M", or "..., metrics off" (--metrics-port -1),
        # then "; consuming ..." when it consumes a log
        self.ready_line = self.process.stdout.readline().decode().rstrip("\n")
        match = re.fullmatch(
            r"aaren: listening on port (\d+), (?:metrics on port (\d+)|metrics off)(?:; consuming .*)?", self.ready_line
        )
        if match is None:
            self.kill()
            raise RuntimeError(
                f"server did not start: {self.ready_line!r}\n{log_path.read_text(errors='replace')[-3000:]}"
            )
        self.grpc_port = int(match[1])
        self.metrics_port: int | None = int(match[2]) if match[2] is not None else None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        assert self.metrics_port is not None, f"this server serves no metrics: {self.ready_line!r}"
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
