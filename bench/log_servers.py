"""Private event logs for ``bench.consume``: a ``redis-server`` or a ``nats-server -js`` of its own.

Each ``LogKit`` starts its server on a free port in a temp dir (no persistence for Redis; NATS keeps
its store in the temp dir), and for one cell at a time: names the source and sink URLs, writes the
cell's events into the source (``addresses.open_writer``), counts the sink cheaply, reads it back
whole, and says whether the consumer is done (every message acknowledged, no dead letters).

Redis cells are **gated**: the events are written before the consumer starts, but its consumer group
is created first at the stream's end (``$``), so the consumer finds nothing to read until ``release``
moves the group back to the start (``XGROUP SETID 0``) and appends the last event (which wakes its
blocked ``XREADGROUP``), in one round trip. ``aaren consume`` starts its consumer before it prints its
ready line; without the gate some events would be answered before the bench's clock starts. NATS
has no such move for a durable consumer, so a NATS cell is not gated (``gated`` False): the count
already in the sink at the ready line is reported beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import redis

from aaren.server.frontends.eventlog.addresses import open_writer
from aaren.server.frontends.eventlog.base import JSON

__all__ = ["LogKit", "NatsKit", "RedisKit", "SinkEntry", "free_port", "nats_available"]

T = TypeVar("T")
#: Events per ``EventWriter.write`` call while filling the source.
WRITE_CHUNK = 2000
START_TIMEOUT_S = 20.0

#: A forecast read back from the sink: (the sink's id of it, body, content type, source id).
SinkEntry = tuple[str, bytes, str, str]


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_available() -> str | None:
    """None when the NATS JetStream module imports and ``nats-server`` is installed; else why not."""
    try:
        import aaren.server.frontends.eventlog.nats_jetstream  # noqa: F401
    except ImportError as exc:
        return f"aaren.server.frontends.eventlog.nats_jetstream does not import ({exc})"
    if not (shutil.which("nats-server") or Path("/usr/sbin/nats-server").exists()):
        return "nats-server is not installed (make system-deps installs it)"
    return None


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _write_all(url: str, bodies: Sequence[bytes]) -> None:
    writer = open_writer(url)
    try:
        for i in range(0, len(bodies), WRITE_CHUNK):
            await writer.write(list(bodies[i : i + WRITE_CHUNK]), JSON)
    finally:
        await writer.close()


class LogKit:
    """One private log server and the cells run on it (see the module docstring)."""

    kind = ""
    #: Whether ``release`` starts the consumer's work (else it starts on its own at startup).
    gated = False
    pid = 0

    def source_url(self) -> str:
        raise NotImplementedError

    def sink_url(self) -> str:
        raise NotImplementedError

    def new_cell(self, cell: int) -> None:
        """Forget the previous cell (its streams), name this one's."""
        raise NotImplementedError

    def prepare(self, bodies: Sequence[bytes]) -> None:
        """Write the cell's event messages into the source (all of them, or all but the gated last)."""
        raise NotImplementedError

    def release(self) -> None:
        """Let the consumer at the events (gated kits); nothing for the others."""

    def count(self) -> int:
        """Forecasts in the sink now (one cheap call)."""
        raise NotImplementedError

    def last_time(self) -> float | None:
        """Wall-clock time (``time.time()``) the sink's last forecast was appended, where the log says."""
        return None

    def settled(self) -> tuple[int, int]:
        """(messages handed out and not acknowledged, messages not yet handed out) of the consumer."""
        raise NotImplementedError

    def dead_letters(self) -> int:
        raise NotImplementedError

    def source_ids(self) -> list[str]:
        """The source's ids of the cell's events, in log order."""
        raise NotImplementedError

    def read_sink(self) -> list[SinkEntry]:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class RedisKit(LogKit):
    """A private ``redis-server`` (no RDB, no AOF); a cell's streams are ``events-N``, ``forecasts-N``."""

    kind = "redis"
    gated = True
    GROUP = "bench"

    def __init__(self, binary: str = "redis-server") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bench-consume-redis-"))
        self.port = free_port()
        exe = shutil.which(binary) or "/usr/bin/redis-server"
        self.process = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.pid = self.process.pid
        self.r = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if self.r.ping():
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log}") from None
                time.sleep(0.05)
        self.events = self.forecasts = ""
        self._last: bytes = b""

    def source_url(self) -> str:
        return f"redis-stream://127.0.0.1:{self.port}/{self.events}?group={self.GROUP}"

    def sink_url(self) -> str:
        return f"redis-stream://127.0.0.1:{self.port}/{self.forecasts}"

    def new_cell(self, cell: int) -> None:
        self.r.flushall()
        self.events, self.forecasts = f"events-{cell}", f"forecasts-{cell}"

    def prepare(self, bodies: Sequence[bytes]) -> None:
        if not bodies:
            raise ValueError("no events to write: expected at least one")
        *first, self._last = bodies
        url = f"redis-stream://127.0.0.1:{self.port}/{self.events}"
        if first:
            _run(_write_all(url, first))
        # The group at the end: the consumer reads nothing until release() moves it to the start.
        self.r.xgroup_create(self.events, self.GROUP, id="$", mkstream=True)

    def release(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.xgroup_setid(self.events, self.GROUP, "0")
        pipe.xadd(self.events, {"data": self._last, "content-type": JSON})  # as RedisEventWriter writes it
        pipe.execute()

    def count(self) -> int:
        return int(self.r.xlen(self.forecasts))

    def last_time(self) -> float | None:
        last = self.r.xrevrange(self.forecasts, count=1)
        return int(last[0][0].split(b"-")[0]) / 1000 if last else None

    def settled(self) -> tuple[int, int]:
        for group in self.r.xinfo_groups(self.events):
            if group["name"] in (self.GROUP, self.GROUP.encode()):
                return int(group["pending"] or 0), int(group.get("lag") or 0)
        raise RuntimeError(f"no consumer group {self.GROUP!r} on stream {self.events!r}")

    def dead_letters(self) -> int:
        return int(self.r.xlen(f"{self.forecasts}.dead"))

    def _range(self, stream: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        out: list[tuple[bytes, dict[bytes, bytes]]] = []
        start = "-"
        while True:
            chunk = self.r.xrange(stream, min=start, count=5000)
            out += chunk
            if len(chunk) < 5000:
                return out
            start = "(" + chunk[-1][0].decode()

    def source_ids(self) -> list[str]:
        return [entry_id.decode() for entry_id, _ in self._range(self.events)]

    def read_sink(self) -> list[SinkEntry]:
        return [
            (entry_id.decode(), f[b"data"], f.get(b"content-type", JSON.encode()).decode(), f[b"source-id"].decode())
            for entry_id, f in self._range(self.forecasts)
        ]

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.r.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class NatsKit(LogKit):
    """A private ``nats-server -js``; a cell's subjects are ``bench.events.N`` and ``bench.forecasts.N``,
    each in a stream of its own (the NATS module's default stream names); the last cell's streams are
    deleted when the next one starts."""

    kind = "nats"
    gated = False
    DURABLE = "bench"

    def __init__(self) -> None:
        import nats  # noqa: F401 (a clear ImportError before any process starts)

        self.dir = Path(tempfile.mkdtemp(prefix="bench-consume-nats-"))
        self.port = free_port()
        exe = shutil.which("nats-server") or "/usr/sbin/nats-server"
        self._log = (self.dir / "nats.log").open("wb")
        self.process = subprocess.Popen(
            [exe, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.dir / "store")],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.pid = self.process.pid
        self.loop = asyncio.new_event_loop()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.nc = self.loop.run_until_complete(self._connect())
                break
            except Exception:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"nats-server did not start on port {self.port}:\n"
                        + (self.dir / "nats.log").read_text(errors="replace")[-2000:]
                    ) from None
                time.sleep(0.1)
        self.js = self.nc.jetstream()
        self.events = self.forecasts = ""
        self._streams: list[str] = []

    async def _connect(self) -> Any:
        import nats

        return await nats.connect(f"nats://127.0.0.1:{self.port}", connect_timeout=1, max_reconnect_attempts=0)

    def _do(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def _stream(self, subject: str) -> str:
        from aaren.server.frontends.eventlog.nats_jetstream import stream_name

        return stream_name(subject)

    def source_url(self) -> str:
        return f"nats://127.0.0.1:{self.port}/{self.events}?durable={self.DURABLE}"

    def sink_url(self) -> str:
        return f"nats://127.0.0.1:{self.port}/{self.forecasts}"

    def new_cell(self, cell: int) -> None:
        for name in self._streams:
            with contextlib.suppress(Exception):
                self._do(self.js.delete_stream(name))
        self.events, self.forecasts = f"bench.events.{cell}", f"bench.forecasts.{cell}"
        self._streams = [self._stream(self.events), self._stream(self.forecasts)]

    def prepare(self, bodies: Sequence[bytes]) -> None:
        _run(_write_all(f"nats://127.0.0.1:{self.port}/{self.events}", bodies))

    def count(self) -> int:
        try:
            info = self._do(self.js.stream_info(self._stream(self.forecasts), subjects_filter=self.forecasts))
        except Exception:  # the sink creates its stream when it opens
            return 0
        subjects = info.state.subjects or {}
        return int(subjects.get(self.forecasts, 0))

    def settled(self) -> tuple[int, int]:
        info = self._do(self.js.consumer_info(self._stream(self.events), self.DURABLE))
        return int(info.num_ack_pending or 0), int(info.num_pending or 0)

    def dead_letters(self) -> int:
        dead = f"{self.forecasts}.dead"
        try:
            info = self._do(self.js.stream_info(self._stream(self.forecasts), subjects_filter=dead))
        except Exception:
            return 0
        return int((info.state.subjects or {}).get(dead, 0))

    def source_ids(self) -> list[str]:
        from aaren.server.frontends.eventlog.nats_jetstream import read_all

        return [seq for seq, _, _ in _run(read_all(f"nats://127.0.0.1:{self.port}/{self.events}"))]

    def read_sink(self) -> list[SinkEntry]:
        from aaren.server.frontends.eventlog.nats_jetstream import read_all

        out: list[SinkEntry] = []
        for seq, data, headers in _run(read_all(self.sink_url())):
            h = {k.lower(): v for k, v in headers.items()}
            out.append((seq, data, h.get("content-type", JSON), h.get("aaren-source-id", "")))
        return out

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._do(self.nc.close())
        self.loop.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
