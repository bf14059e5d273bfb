"""Local IPC between the engine core and its front-end processes: columns over a unix socket.

Each front end holds one connection to the core (``CoreClient``); the core serves them all
(``CoreServer``). A frame is a 4-byte little-endian length and a pickle (protocol 5) of a tuple
``(kind, ...)``. Requests and outcomes travel packed: the requests a front end submitted during one
turn of its event loop go as one frame whose events are concatenated columns, and the outcomes a
batch settled for one front end go back as one frame of concatenated columns, so the per-event
cost is a few array slices, not an object per event.

Only processes of this server connect: the socket lives in a directory only the server's user can
enter (mode 0700), and a connection must first present the random key the core gave its front
ends (compared in constant time) before anything it sends is unpickled.

Frames, front end -> core: ``hello(key, index)``, ``submit(packed requests)``, ``count(reason,
code, n)``, ``call(id, method, kwargs)``, ``metrics_reply(id, families)``. Core -> front end:
``welcome((descriptions, aliases))``, ``serving(bool)``, ``results(packed outcomes)``, ``reply(id, value,
error)``, ``metrics(id)``, ``drain()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import pickle
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from aaren.server.contract.columns import CoreRequest, EventColumns, ModelDescription, Outcomes
from aaren.server.contract.errors import Code, ErrorInfo, Reasons

__all__ = ["CoreClient", "CoreServer", "pack_outcomes", "pack_requests", "unpack_outcomes", "unpack_requests"]

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<I")
MAX_FRAME_BYTES = 1 << 31
KEY_ENV = "AAREN_CORE_KEY"


# ---------------------------------------------------------------------- framing


async def read_frame(reader: asyncio.StreamReader) -> tuple[Any, ...]:
    (n,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(n))


def write_frame(writer: asyncio.StreamWriter, frame: tuple[Any, ...]) -> None:
    data = pickle.dumps(frame, protocol=5)
    if len(data) >= MAX_FRAME_BYTES:
        raise ValueError(f"IPC frame of {len(data)} bytes is too large")
    writer.write(_LENGTH.pack(len(data)) + data)


# ---------------------------------------------------------------------- packing

RawArray = tuple[str, tuple[int, ...], bytes]


def _raw(a: np.ndarray) -> RawArray:
    """An array as (dtype, shape, bytes): pickled about twice as fast as the array itself."""
    return a.dtype.str, a.shape, a.tobytes()


def _array(raw: RawArray) -> np.ndarray:
    """The array back, read-only (a view of the frame's bytes)."""
    dtype, shape, data = raw
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def pack_requests(items: list[tuple[int, CoreRequest]]) -> dict[str, Any]:
    """Requests (with their ids) as one set of concatenated columns (all of one value width)."""
    requests = [r for _, r in items]
    sizes = [len(r.index) for r in requests]
    events = [r.events for r in requests]
    return {
        "ids": [i for i, _ in items],
        "n": [r.n for r in requests],
        "m": sizes,
        "meta": [(r.top_k, r.last_only, r.tenant, r.model) for r in requests],
        "errors": [r.errors for r in requests],
        "index": _raw(np.concatenate([r.index for r in requests])),
        "session_ids": [s for e in events for s in e.session_ids],
        "seq": _raw(np.concatenate([e.seq for e in events])),
        "time": _raw(np.concatenate([e.time for e in events])),
        "mark": _raw(np.concatenate([e.mark for e in events])),
        "values": _raw(np.concatenate([e.values for e in events])),
    }


def unpack_requests(packed: dict[str, Any]) -> list[tuple[int, CoreRequest]]:
    out = []
    at = 0
    ids, sids = packed["ids"], packed["session_ids"]
    index, seq, time, mark, values = (_array(packed[k]) for k in ("index", "seq", "time", "mark", "values"))
    for k, (n, m, (top_k, last_only, tenant, model), errors) in enumerate(
        zip(packed["n"], packed["m"], packed["meta"], packed["errors"], strict=True)
    ):
        end = at + m
        events = EventColumns(sids[at:end], seq[at:end], time[at:end], mark[at:end], values[at:end])
        out.append((ids[k], CoreRequest(n, index[at:end], events, errors, top_k, last_only, tenant, model)))
        at = end
    return out


def output_signature(outcomes: Outcomes) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The names and trailing shapes of ``outcomes``' output columns: outcomes of one signature (one
    model's, or none) concatenate into one set of columns."""
    return tuple((name, column.shape[1:]) for name, column in outcomes.outputs.items())


def group_by_signature(items: list[tuple[int, Outcomes]]) -> list[list[tuple[int, Outcomes]]]:
    """``items`` in groups that ``pack_outcomes`` can pack together (outcomes without outputs go with
    the first group), each in the order given."""
    groups: dict[tuple[Any, ...], list[tuple[int, Outcomes]]] = {}
    bare: list[tuple[int, Outcomes]] = []
    for item in items:
        if item[1].outputs:
            groups.setdefault(output_signature(item[1]), []).append(item)
        else:
            bare.append(item)
    out = list(groups.values())
    if not out:
        return [bare] if bare else []
    out[0] = bare + out[0]
    return out


def pack_outcomes(items: list[tuple[int, Outcomes]]) -> dict[str, Any]:
    """Outcomes (with their request ids) as one set of concatenated columns; every outcome with
    outputs must have the same ``output_signature`` (``group_by_signature``)."""
    outcomes = [o for _, o in items]
    names = next((list(o.outputs) for o in outcomes if o.outputs), [])
    with_outputs = [o for o in outcomes if o.outputs]
    return {
        "ids": [i for i, _ in items],
        "n": [len(o.kind) for o in outcomes],
        "f": [len(o.forecast_index) for o in outcomes],
        "errors": [o.errors for o in outcomes],
        "request_errors": [o.request_error for o in outcomes],
        "kind": _raw(np.concatenate([o.kind for o in outcomes])),
        "last_seq": _raw(np.concatenate([o.last_seq for o in outcomes])),
        "forecast_index": _raw(np.concatenate([o.forecast_index for o in outcomes])),
        "outputs": {k: _raw(np.concatenate([o.outputs[k] for o in with_outputs])) for k in names},
    }


def unpack_outcomes(packed: dict[str, Any]) -> list[tuple[int, Outcomes]]:
    out = []
    at = fat = 0
    outputs = {name: _array(raw) for name, raw in packed["outputs"].items()}
    kind, last_seq, forecast_index = (_array(packed[k]) for k in ("kind", "last_seq", "forecast_index"))
    for k, (n, f, errors, request_error) in enumerate(
        zip(packed["n"], packed["f"], packed["errors"], packed["request_errors"], strict=True)
    ):
        end, fend = at + n, fat + f
        columns = {name: v[fat:fend] for name, v in outputs.items()} if f else {}
        out.append(
            (
                packed["ids"][k],
                Outcomes(kind[at:end], last_seq[at:end], errors, forecast_index[fat:fend], columns, request_error),
            )
        )
        at, fat = end, fend
    return out


# ---------------------------------------------------------------------- the core's side


class _Connection:
    """One front end connected to the core: its outbox of outcomes, flushed once per loop turn."""

    def __init__(self, writer: asyncio.StreamWriter, index: int) -> None:
        self.writer = writer
        self.index = index
        self.outbox: list[tuple[int, Outcomes]] = []
        self.flush_scheduled = False
        self.pending_calls: dict[int, asyncio.Future[Any]] = {}
        self.closed = False

    def send(self, frame: tuple[Any, ...]) -> None:
        if not self.closed:
            write_frame(self.writer, frame)

    def deliver(self, request_id: int, outcomes: Outcomes) -> None:
        self.outbox.append((request_id, outcomes))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        items, self.outbox = self.outbox, []
        if items and not self.closed:
            # Several models answer on one connection: one frame per set of output columns.
            for group in group_by_signature(items):
                try:
                    self.send(("results", pack_outcomes(group)))
                except Exception:
                    log.exception("sending results to front end %d failed", self.index)


class CoreServer:
    """Serves an ``EngineCore`` to front-end processes on a unix socket at ``path``."""

    def __init__(self, core: Any, path: str, key: str) -> None:
        self.core = core
        self.path = path
        self.key = key.encode()
        self.connections: set[_Connection] = set()
        self.serving = False
        self._server: asyncio.AbstractServer | None = None
        self._call_ids = 0
        self._calls: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.closed = True
            connection.writer.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def broadcast(self, frame: tuple[Any, ...]) -> None:
        for connection in list(self.connections):
            with contextlib.suppress(Exception):
                connection.send(frame)

    def set_serving(self, serving: bool) -> None:
        self.serving = serving
        self.broadcast(("serving", serving))

    async def collect_metrics(self, timeout: float = 2.0) -> list[list[tuple[Any, ...]]]:
        """Every connected front end's metric families (as ``families_of`` makes them)."""
        loop = asyncio.get_running_loop()
        waits = []
        for connection in list(self.connections):
            self._call_ids += 1
            future: asyncio.Future[Any] = loop.create_future()
            connection.pending_calls[self._call_ids] = future
            with contextlib.suppress(Exception):
                connection.send(("metrics", self._call_ids))
            waits.append(future)
        if not waits:
            return []
        done, _ = await asyncio.wait(waits, timeout=timeout)
        return [f.result() for f in done if not f.cancelled() and f.exception() is None]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection: _Connection | None = None
        try:
            (n,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
            key = await reader.readexactly(min(n, 256))
            if n > 256 or not hmac.compare_digest(key, self.key):
                log.warning("refused an IPC connection without the core's key")
                return
            kind, index = await read_frame(reader)
            if kind != "hello":
                return
            connection = _Connection(writer, index)
            self.connections.add(connection)
            connection.send(("welcome", (self.core.descriptions, self.core.aliases), self.serving))
            while True:
                frame = await read_frame(reader)
                self._handle(connection, frame)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:
            log.exception("IPC connection of a front end failed")
        finally:
            if connection is not None:
                connection.closed = True
                self.connections.discard(connection)
                for future in connection.pending_calls.values():
                    if not future.done():
                        future.cancel()
            writer.close()

    def _handle(self, connection: _Connection, frame: tuple[Any, ...]) -> None:
        kind = frame[0]
        if kind == "submit":
            for request_id, request in unpack_requests(frame[1]):
                self.core.submit(request, lambda outcomes, rid=request_id: connection.deliver(rid, outcomes))
        elif kind == "count":
            _, code, reason, n, model = frame
            self.core.count_rejection(ErrorInfo(Code(code), reason, ""), n, model)
        elif kind == "call":
            _, call_id, method, kwargs = frame
            task = asyncio.create_task(self._call(connection, call_id, method, kwargs))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        elif kind == "metrics_reply":
            _, call_id, families = frame
            future = connection.pending_calls.pop(call_id, None)
            if future is not None and not future.done():
                future.set_result(families)

    async def _call(self, connection: _Connection, call_id: int, method: str, kwargs: dict[str, Any]) -> None:
        if method not in _CALLS:
            connection.send(("reply", call_id, None, Reasons.internal()))
            return
        try:
            value = await getattr(self.core, method)(**kwargs)
        except Exception as exc:
            info = getattr(exc, "info", None)
            if not isinstance(info, ErrorInfo):
                log.exception("IPC call %s failed", method)
                info = Reasons.internal()
            connection.send(("reply", call_id, None, info))
            return
        connection.send(("reply", call_id, value, None))


_CALLS = frozenset({"forecast", "get_session", "end_session", "open_stream", "close_stream"})


# ---------------------------------------------------------------------- the front end's side


class CoreClient:
    """The engine core as a front end sees it over IPC: the calls of ``EngineCore`` a front end makes.

    ``on_serving(bool)`` is called when the core's health changes; ``on_lost()`` once, when the
    connection to the core is gone (every request then unanswered is answered ``core_unavailable``).
    """

    def __init__(
        self,
        path: str,
        key: str,
        index: int,
        on_serving: Callable[[bool], Awaitable[None]],
        on_lost: Callable[[], Awaitable[None]],
        on_drain: Callable[[], Awaitable[None]],
        metric_families: Callable[[], list[tuple[Any, ...]]],
    ) -> None:
        self.path = path
        self.key = key.encode()
        self.index = index
        self.description: ModelDescription | None = None
        #: Every served model's description, the default first, and folder names -> model names.
        self.descriptions: tuple[ModelDescription, ...] = ()
        self.aliases: dict[str, str] = {}
        self.serving = False
        self.draining = False
        self.lost = False
        self._on_serving, self._on_lost, self._on_drain = on_serving, on_lost, on_drain
        self._metric_families = metric_families
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._outbox: list[tuple[int, CoreRequest]] = []
        self._flush_scheduled = False
        self._waiting: dict[int, Callable[[Outcomes], None]] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._ids = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def connect(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(self.path)
        self._writer.write(_LENGTH.pack(len(self.key)) + self.key)
        write_frame(self._writer, ("hello", self.index))
        kind, payload, serving = await read_frame(reader)
        if kind != "welcome":
            raise ConnectionError(f"the engine core answered {kind!r} to hello")
        descriptions, aliases = payload
        self.descriptions, self.aliases, self.serving = tuple(descriptions), dict(aliases), serving
        self.description = self.descriptions[0]
        self._reader_task = asyncio.create_task(self._read(reader), name="aaren-core-client")

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        if self._writer is not None:
            self._writer.close()

    @property
    def pending(self) -> int:
        return len(self._waiting) + len(self._outbox)

    # -- calls a front end makes

    def submit(self, request: CoreRequest, on_done: Callable[[Outcomes], None]) -> None:
        if self.lost:
            on_done(Outcomes.all_errors(request.n, dict.fromkeys(range(request.n), Reasons.core_unavailable())))
            return
        self._ids += 1
        self._waiting[self._ids] = on_done
        self._outbox.append((self._ids, request))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        items, self._outbox = self._outbox, []
        if items and not self.lost and self._writer is not None:
            # Models differ in their value width: one frame per width (usually one).
            by_width: dict[int, list[tuple[int, CoreRequest]]] = {}
            for item in items:
                by_width.setdefault(item[1].events.values.shape[1], []).append(item)
            for group in by_width.values():
                write_frame(self._writer, ("submit", pack_requests(group)))

    def count_rejection(self, error: ErrorInfo, n: int = 1, model: str = "") -> None:
        if not self.lost and self._writer is not None:
            write_frame(self._writer, ("count", int(error.code), error.reason, n, model))

    async def _call(self, method: str, **kwargs: Any) -> Any:
        if self.lost or self._writer is None:
            raise Reasons.core_unavailable().exception()
        self._ids += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[self._ids] = future
        write_frame(self._writer, ("call", self._ids, method, kwargs))
        return await future

    async def forecast(self, session_id: str, **options: Any) -> Any:
        return await self._call("forecast", session_id=session_id, **options)

    async def get_session(self, session_id: str, include_state: bool = False, tenant: str = "", model: str = "") -> Any:
        return await self._call(
            "get_session", session_id=session_id, include_state=include_state, tenant=tenant, model=model
        )

    async def end_session(self, session_id: str, tenant: str = "", model: str = "") -> int | None:
        return await self._call("end_session", session_id=session_id, tenant=tenant, model=model)

    async def open_stream(self, tenant: str) -> ErrorInfo | None:
        return await self._call("open_stream", tenant=tenant)

    async def close_stream(self, tenant: str) -> None:
        if not self.lost:
            await self._call("close_stream", tenant=tenant)

    # -- what the core sends

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                frame = await read_frame(reader)
                kind = frame[0]
                if kind == "results":
                    for request_id, outcomes in unpack_outcomes(frame[1]):
                        on_done = self._waiting.pop(request_id, None)
                        if on_done is not None:
                            on_done(outcomes)
                elif kind == "reply":
                    _, call_id, value, error = frame
                    future = self._calls.pop(call_id, None)
                    if future is not None and not future.done():
                        if error is not None:
                            future.set_exception(error.exception())
                        else:
                            future.set_result(value)
                elif kind == "serving":
                    self.serving = frame[1]
                    await self._on_serving(frame[1])
                elif kind == "metrics":
                    assert self._writer is not None
                    write_frame(self._writer, ("metrics_reply", frame[1], self._metric_families()))
                elif kind == "drain":
                    self.draining = True
                    self._spawn(self._on_drain())
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("reading from the engine core failed")
        self._lose()
        await self._on_lost()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lose(self) -> None:
        """The core is gone: whatever it had not answered is answered ``core_unavailable``."""
        self.lost = True
        self.serving = False
        error = Reasons.core_unavailable()
        waiting, self._waiting = self._waiting, {}
        outbox, self._outbox = self._outbox, []
        sizes = {rid: r.n for rid, r in outbox}
        for rid, on_done in waiting.items():
            n = sizes.get(rid)
            if n is None:
                on_done(Outcomes.refused(error))
            else:
                on_done(Outcomes.all_errors(n, dict.fromkeys(range(n), error)))
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error.exception())
        self._calls.clear()
