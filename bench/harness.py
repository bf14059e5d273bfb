"""Servers as subprocesses for the benchmarks, and the CPU time of their processes from ``/proc``.

``start_aaren`` runs ``aaren serve`` (any ``--frontends``, any ``--device``), ``start_echo`` the
project's no-op ``bench.echo_server``; both wait for the server's "listening on port N" line and
stop by their own pid (SIGTERM, then SIGKILL). ``Server.processes()`` names the processes whose
CPU counts as the server's: an aaren server's core (the ``aaren serve`` pid) and its front ends
(that pid's children), the echo's one process.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc

__all__ = [
    "ROOT",
    "Server",
    "children",
    "cpu_seconds",
    "describe",
    "main_thread_cpu_seconds",
    "start_aaren",
    "start_echo",
]

ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 180.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (``/proc/PID/stat`` fields 14
    and 15); 0 when it is gone."""
    return _stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def main_thread_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``'s main thread so far (``/proc/PID/task/PID/stat``): in a
    Python gRPC server, its event loop's thread, where the loop, the servicer's Python and gRPC's Cython run
    (gRPC's own I/O and poller threads are the rest of ``cpu_seconds``); 0 when it is gone."""
    return _stat_cpu_seconds(Path(f"/proc/{pid}/task/{pid}/stat"))


def _stat_cpu_seconds(path: Path) -> float:
    try:
        data = path.read_text()
    except OSError:
        return 0.0
    fields = data[data.rindex(")") + 2 :].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (from every thread's ``children`` list), in pid order."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found.update(int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return sorted(found)


def describe(address: str, timeout: float = 30.0) -> pb.DescribeModelResponse:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.ForecastServiceStub(channel).DescribeModel(pb.DescribeModelRequest(), timeout=timeout)


class Server:
    """A server subprocess: ``port`` once ready; ``stop()`` ends it (and so its children)."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        ready: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            list(cmd),
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
        )
        self.pid = self.proc.pid
        self.port = self._wait_ready(re.compile(ready))
        self.address = f"127.0.0.1:{self.port}"

    def _wait_ready(self, pattern: re.Pattern[str]) -> int:
        assert self.proc.stdout is not None
        lines: list[str] = []
        found: list[int] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").strip()
                if not found:
                    lines.append(line)
                    match = pattern.search(line)
                    if match:
                        found.append(int(match.group(1)))
            # keep draining so that a chatty server never blocks on a full pipe

        threading.Thread(target=read, daemon=True, name=f"{self.name}-stdout").start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not found:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name} did not start: {lines[-5:]!r}\n{tail}")
            time.sleep(0.05)
        return found[0]

    def processes(self) -> dict[str, int]:
        """Label -> pid of every process of this server: ``core`` (or the server's one process)
        and ``frontend-i`` for its children."""
        kids = children(self.pid)
        if not kids:
            return {self.name if self.name == "echo" else "core": self.pid}
        return {"core": self.pid, **{f"frontend-{i}": pid for i, pid in enumerate(kids)}}

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def aaren_command() -> list[str]:
    return [sys.executable, "-c", "from aaren.cli.app import app; app()", "serve"]


def start_aaren(
    frontends: int,
    log_path: Path,
    *,
    device: str = "cpu",
    extra: Sequence[str] = (),
    name: str | None = None,
) -> Server:
    """``aaren serve`` on a free port, metrics off, the bundled model, the in-memory store."""
    cmd = [
        *aaren_command(),
        "--address",
        "127.0.0.1:0",
        "--device",
        device,
        "--frontends",
        str(frontends),
        "--metrics-port",
        "-1",
        "--log-level",
        "WARNING",
        *extra,
    ]
    return Server(
        name or f"aaren-f{frontends}",
        cmd,
        r"aaren: listening on port (\d+)",
        log_path,
    )


def start_echo(model: pb.DescribeModelResponse, log_path: Path) -> Server:
    """The no-op echo with the forecast shape of ``model`` (its quantiles, top marks, values)."""
    cmd = [
        sys.executable,
        "-m",
        "bench.echo_server",
        "--address",
        "127.0.0.1:0",
        "--quantiles",
        str(len(model.quantile_levels) or 3),
        "--marks",
        str(min(3, len(model.mark_names) or 3)),
        "--values",
        str(len(model.value_names)),
        "--model-name",
        model.name,
        "--model-version",
        model.version,
    ]
    return Server("echo", cmd, r"echo: listening on port (\d+)", log_path)
