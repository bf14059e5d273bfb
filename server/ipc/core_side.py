"""The engine core's end of the IPC: serves one ``EngineCore`` to its front-end processes.

Each front end holds one connection (``aaren.server.ipc.client_side.CoreClient``); ``CoreServer``
serves them all on a unix socket. Only processes of this server connect: the socket lives in a
directory only the server's user can enter (mode 0700), and a connection must first present the
random key the core gave its front ends (``framing.check_key``, constant time) before anything it
sends is decoded. Frames: ``aaren.server.ipc.framing``; their payloads: ``aaren.server.ipc.packing``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from aaren.server.contract.columns import Outcomes
from aaren.server.contract.core_api import CoreAPI, ForecastOptions
from aaren.server.contract.errors import Code, ErrorInfo, Reasons, ServiceError
from aaren.server.ipc.framing import Outbox, check_key, read_frame, write_frame
from aaren.server.ipc.packing import (
    RESULTS,
    group_by_signature,
    pack_descriptions,
    pack_error,
    pack_outcomes,
    unpack_dataclass,
    unpack_requests,
)

__all__ = ["CoreServer"]

log = logging.getLogger(__name__)


class _Connection:
    """One front end connected to the core: its outbox of outcomes, flushed once per loop turn."""

    def __init__(self, writer: asyncio.StreamWriter, index: int) -> None:
        self.writer = writer
        self.index = index
        self.outbox = Outbox[tuple[int, Outcomes]](self._send)
        self.pending_calls: dict[int, asyncio.Future[Any]] = {}
        #: the last report of each kind this front end answered (``collect``'s stand-in when it answers late)
        self.last_reports: dict[str, Any] = {}
        self.closed = False

    def send(self, frame: list[Any] | tuple[Any, ...]) -> None:
        if not self.closed:
            write_frame(self.writer, frame)

    def deliver(self, request_id: int, outcomes: Outcomes) -> None:
        self.outbox.put((request_id, outcomes))

    def _send(self, items: list[tuple[int, Outcomes]]) -> None:
        if not self.closed:
            # Several models answer on one connection: one frame per set of output columns.
            for group in group_by_signature(items):
                try:
                    self.send(("results", pack_outcomes(group)))
                except Exception:
                    log.exception("sending results to front end %d failed", self.index)


class CoreServer:
    """Serves an ``EngineCore`` (any ``CoreAPI``) to front-end processes on a unix socket at ``path``."""

    def __init__(self, core: CoreAPI, path: str, key: str) -> None:
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

    async def collect_metrics(self, timeout: float = 2.0) -> list[list[list[Any]]]:
        """Every connected front end's metric families (as ``families_of`` makes them)."""
        return await self.collect("metrics", timeout)

    async def collect(self, what: str, timeout: float = 2.0) -> list[Any]:
        """Every connected front end's report ``what``. One that does not answer within ``timeout`` (a busy
        process) is represented by its last answer, where it gave one: a scrape that left a front end's
        counters out would show them falling, which Prometheus reads as a restart of the counter."""
        loop = asyncio.get_running_loop()
        waits: dict[asyncio.Future[Any], _Connection] = {}
        for connection in list(self.connections):
            self._call_ids += 1
            future: asyncio.Future[Any] = loop.create_future()
            connection.pending_calls[self._call_ids] = future
            with contextlib.suppress(Exception):
                connection.send(("report", self._call_ids, what))
            waits[future] = connection
        if not waits:
            return []
        done, _ = await asyncio.wait(waits, timeout=timeout)
        reports = []
        for future, connection in waits.items():
            if future in done and not future.cancelled() and future.exception() is None:
                connection.last_reports[what] = future.result()
            reports.append(connection.last_reports.get(what))
        return [r for r in reports if r is not None]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection: _Connection | None = None
        try:
            if not await check_key(reader, self.key):
                log.warning("refused an IPC connection without the core's key")
                return
            kind, index = await read_frame(reader)
            if kind != "hello":
                return
            connection = _Connection(writer, int(index))
            self.connections.add(connection)
            welcome = [pack_descriptions(self.core.descriptions), dict(self.core.aliases)]
            connection.send(("welcome", welcome, self.serving))
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

    def _handle(self, connection: _Connection, frame: list[Any]) -> None:
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
        elif kind == "report_reply":
            _, call_id, families = frame
            future = connection.pending_calls.pop(call_id, None)
            if future is not None and not future.done():
                future.set_result(families)

    async def _call(self, connection: _Connection, call_id: int, method: str, kwargs: dict[str, Any]) -> None:
        call = self._front_end_reports if method == "front_end_reports" else _CALLS.get(method)
        if call is None:
            connection.send(("reply", call_id, None, pack_error(Reasons.internal())))
            return
        try:
            value = await call(self.core, kwargs)
        except ServiceError as exc:
            connection.send(("reply", call_id, None, pack_error(exc.info)))
            return
        except Exception:
            log.exception("IPC call %s failed", method)
            connection.send(("reply", call_id, None, pack_error(Reasons.internal())))
            return
        pack = RESULTS.get(method)
        connection.send(("reply", call_id, value if pack is None else pack[0](value), None))

    async def _front_end_reports(self, core: CoreAPI, kwargs: dict[str, Any]) -> list[Any]:
        """Answered here, not by the core: only this server knows the front-end processes."""
        return await self.collect(str(kwargs["what"]))


#: The unary calls a front end may make over the IPC (``CoreAPI``'s), by name.
_CALLS: dict[str, Callable[[CoreAPI, dict[str, Any]], Awaitable[Any]]] = {
    "forecast": lambda core, kwargs: core.forecast(
        **{**kwargs, "options": unpack_dataclass(ForecastOptions, kwargs["options"])}
    ),
    "get_session": lambda core, kwargs: core.get_session(**kwargs),
    "end_session": lambda core, kwargs: core.end_session(**kwargs),
    "open_stream": lambda core, kwargs: core.open_stream(**kwargs),
    "close_stream": lambda core, kwargs: core.close_stream(**kwargs),
}
