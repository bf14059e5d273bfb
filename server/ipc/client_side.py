"""The front end's end of the IPC: the engine core in another process, as a ``CoreAPI``.

``CoreClient`` holds one connection to the core's ``CoreServer`` (``aaren.server.ipc.core_side``):
it opens with the core's key, sends the requests submitted during one loop turn as one frame and
hands each request's outcomes to its callback when they come back. It never imports torch (a
front-end process runs it). Frames: ``aaren.server.ipc.framing``; payloads: ``aaren.server.ipc.packing``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aaren.server.contract.columns import (
    CoreRequest,
    ModelDescription,
    Outcomes,
    OutputColumns,
    SampledFuture,
    SessionView,
)
from aaren.server.contract.core_api import ForecastOptions, OnDone
from aaren.server.contract.errors import ErrorInfo, Reasons
from aaren.server.ipc.framing import Outbox, read_frame, send_key, write_frame
from aaren.server.ipc.packing import (
    RESULTS,
    descriptions_of,
    error_of,
    future_of,
    pack_dataclass,
    pack_requests,
    unpack_outcomes,
)
from aaren.server.tasks.registry import spec_of

__all__ = ["CoreClient"]

log = logging.getLogger(__name__)


class CoreClient:
    """The engine core as a front end sees it over IPC: a ``CoreAPI``, like ``EngineCore`` in process.

    ``on_serving(bool)`` is called when the core's health changes; ``on_lost()`` once, when the
    connection to the core is gone (every request then unanswered is answered ``core_unavailable``);
    ``on_drain()`` when the core drains. ``reports``: what this front end answers when the core asks
    (``CoreAPI.front_end_reports``), by name: plain values.
    """

    def __init__(
        self,
        path: str,
        key: str,
        index: int,
        on_serving: Callable[[bool], Awaitable[None]],
        on_lost: Callable[[], Awaitable[None]],
        on_drain: Callable[[], Awaitable[None]],
        reports: Mapping[str, Callable[[], Any]],
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
        self._reports = reports
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._outbox = Outbox[tuple[int, CoreRequest]](self._send)
        self._waiting: dict[int, tuple[OnDone, type[OutputColumns] | None]] = {}
        #: Each served model's output class (its task's), by name and "" for the default.
        self._outputs: dict[str, type[OutputColumns]] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._ids = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def connect(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(self.path)
        send_key(self._writer, self.key)
        write_frame(self._writer, ("hello", self.index))
        kind, payload, serving = await read_frame(reader)
        if kind != "welcome":
            raise ConnectionError(f"the engine core answered {kind!r} to hello")
        descriptions, aliases = payload
        self.descriptions, self.aliases, self.serving = descriptions_of(descriptions), dict(aliases), bool(serving)
        self.description = self.descriptions[0]
        self._outputs = {d.name: spec_of(d.task).load("outputs") for d in self.descriptions}
        self._outputs[""] = self._outputs[self.description.name]
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

    def submit(self, request: CoreRequest, on_done: OnDone) -> None:
        if self.lost:
            on_done(Outcomes.all_errors(request.n, dict.fromkeys(range(request.n), Reasons.core_unavailable())))
            return
        self._ids += 1
        self._waiting[self._ids] = (on_done, self._outputs.get(request.model))
        self._outbox.put((self._ids, request))

    def submitter(self, model: str) -> Callable[[CoreRequest, OnDone], None]:
        """``submit`` itself: the core looks each request's model up on its side."""
        if model not in {d.name for d in self.descriptions}:
            raise Reasons.served_model_unknown(model, [d.name for d in self.descriptions]).exception()
        return self.submit

    def _send(self, items: list[tuple[int, CoreRequest]]) -> None:
        if not self.lost and self._writer is not None:
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
        value = await future
        unpack = RESULTS.get(method)
        return value if unpack is None or unpack[1] is None else unpack[1](value)

    async def forecast(
        self, session_id: str, options: ForecastOptions, tenant: str = "", model: str = ""
    ) -> SampledFuture:
        packed = await self._call(
            "forecast", session_id=session_id, options=pack_dataclass(options), tenant=tenant, model=model
        )
        return future_of(packed, self._outputs.get(model) or self._outputs[self.aliases.get(model, "")])

    async def get_session(
        self, session_id: str, include_state: bool = False, tenant: str = "", model: str = ""
    ) -> SessionView:
        return await self._call(
            "get_session", session_id=session_id, include_state=include_state, tenant=tenant, model=model
        )

    async def front_end_reports(self, what: str) -> list[Any]:
        return await self._call("front_end_reports", what=what)

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
                    for request_id, outcomes in unpack_outcomes(frame[1], self._outputs_of):
                        entry = self._waiting.pop(request_id, None)
                        if entry is not None:
                            _deliver(entry[0], outcomes)
                elif kind == "reply":
                    _, call_id, value, error = frame
                    future = self._calls.pop(call_id, None)
                    if future is not None and not future.done():
                        if error is not None:
                            future.set_exception(error_of(error).exception())  # type: ignore[union-attr]
                        else:
                            future.set_result(value)
                elif kind == "serving":
                    self.serving = bool(frame[1])
                    await self._on_serving(self.serving)
                elif kind == "report":
                    _, report_id, what = frame
                    report = self._reports.get(what)
                    assert self._writer is not None
                    write_frame(self._writer, ("report_reply", report_id, None if report is None else report()))
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

    def _outputs_of(self, request_id: int) -> type[OutputColumns] | None:
        entry = self._waiting.get(request_id)
        return None if entry is None else entry[1]

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
        outbox = self._outbox.take()
        sizes = {rid: r.n for rid, r in outbox}
        for rid, (on_done, _) in waiting.items():
            n = sizes.get(rid)
            if n is None:
                _deliver(on_done, Outcomes.refused(error))
            else:
                _deliver(on_done, Outcomes.all_errors(n, dict.fromkeys(range(n), error)))
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error.exception())
        self._calls.clear()


def _deliver(on_done: OnDone, outcomes: Outcomes) -> None:
    """``on_done(outcomes)``; a front end's future whose call was cancelled meanwhile takes nothing."""
    with contextlib.suppress(asyncio.InvalidStateError):
        on_done(outcomes)
