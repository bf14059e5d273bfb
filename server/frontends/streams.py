"""The one loop of an open bidirectional call, shared by every front end's streaming method.

``StreamLoop.serve`` runs one call: it admits the stream (``CoreAPI.open_stream``), reads requests,
has the protocol's ``StreamCodec`` decode each into a ``CoreRequest`` (or a refusal), submits it,
and sends the replies. The core's callback only records the outcomes: the codec encodes them on a
later turn of the event loop, so the core's batcher never builds a proto.

Replies leave in the order their requests arrived (``OrderedReplies``): a reply waits for the
earlier ones, so a session's results reach the client in the order its events were sent, also when
a later request is answered first. A stream may have ``limit`` requests unanswered; past that its
reader waits, so a fast sender is slowed by gRPC flow control. A request refused with a retry hint
(a rate or pending limit) pauses the reading until a retry may pass. A message that does not parse
ends the call with INVALID_ARGUMENT once what was accepted before it is answered; a drain
(``close_all``) ends it with UNAVAILABLE the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, NoReturn, Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import Gauge, Histogram

from aaren.server.contract.columns import CoreRequest, Outcomes
from aaren.server.contract.core_api import CoreAPI
from aaren.server.contract.errors import ErrorInfo, Reasons
from aaren.server.security.auth import current_tenant

__all__ = [
    "REASON_METADATA_KEY",
    "RETRY_METADATA_KEY",
    "Accepted",
    "OrderedReplies",
    "RefusedError",
    "StreamCodec",
    "StreamLoop",
    "abort",
]

log = logging.getLogger(__name__)

REASON_METADATA_KEY = "aaren-error-reason"
RETRY_METADATA_KEY = "aaren-retry-after-ms"
#: The longest a refusal's retry hint pauses a stream's reading (a client's hint may say more).
MAX_PAUSE_S = 1.0
_STATUS = {status.value[0]: status for status in grpc.StatusCode}
_CLOSE = object()

Q = TypeVar("Q")  # a request message
R = TypeVar("R")  # a reply message


async def abort(context: grpc.aio.ServicerContext, info: ErrorInfo) -> NoReturn:
    """End the call with ``info``'s status and message; its reason (and retry hint) in the trailers."""
    metadata: tuple[tuple[str, str], ...] = ((REASON_METADATA_KEY, info.reason),)
    if info.retry_after_s:
        metadata += ((RETRY_METADATA_KEY, str(math.ceil(info.retry_after_s * 1000))),)
    await context.abort(_STATUS[int(info.code)], info.message, trailing_metadata=metadata)
    raise AssertionError("context.abort returned")  # it raises; this line tells the type checker so


class RefusedError(Exception):
    """A request refused whole before it reaches the core: ``info`` says why."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


@dataclasses.dataclass(slots=True)
class Accepted(Generic[R]):
    """A decoded request: what the core is sent, and how its answer becomes a reply."""

    request: CoreRequest
    #: The reply to the core's outcomes, called on a later loop turn than the core's answer.
    encode: Callable[[Outcomes], R]
    #: Awaited before the request is submitted, once every earlier request of the stream is
    #: answered (OIP's sequence_start ends the session of that id first).
    before: Callable[[], Awaitable[None]] | None = None
    #: Awaited with the encoded reply before it is sent (OIP's sequence_end ends the session).
    after: Callable[[R], Awaitable[None]] | None = None


class StreamCodec(Protocol[Q, R]):
    """What one protocol adds to the stream loop: its messages <-> the core's columns."""

    def decode(self, request: Q, tenant: str) -> Accepted[R]:
        """The request as the core's columns and its encoder; raises ``RefusedError`` for a refusal."""
        ...

    def refusal(self, request: Q, info: ErrorInfo) -> R:
        """The reply that refuses ``request`` whole."""
        ...


class OrderedReplies(Generic[R]):
    """Unanswered requests of one stream, oldest first, and its outgoing queue ``out``."""

    __slots__ = ("idle", "limit", "out", "pause_s", "pending", "room")

    def __init__(self, limit: int) -> None:
        self.out: asyncio.Queue[object] = asyncio.Queue()
        self.pending: deque[list[R | None]] = deque()
        self.limit = limit
        self.room = asyncio.Event()  # set while fewer than `limit` requests are unanswered
        self.room.set()
        self.idle = asyncio.Event()  # set while none is
        self.idle.set()
        #: Seconds the reader waits before the next read (a refusal's retry hint).
        self.pause_s = 0.0

    def started(self) -> list[R | None]:
        """A slot for the next request's reply."""
        slot: list[R | None] = [None]
        self.pending.append(slot)
        self.idle.clear()
        if len(self.pending) >= self.limit:
            self.room.clear()
        return slot

    def finished(self, slot: list[R | None], reply: R) -> None:
        """``reply`` answers ``slot``: it and every reply ready behind it leave, in order."""
        slot[0] = reply
        while self.pending and self.pending[0][0] is not None:
            self.out.put_nowait(self.pending.popleft()[0])
        if len(self.pending) < self.limit:
            self.room.set()
        if not self.pending:
            self.idle.set()


@dataclasses.dataclass(eq=False)
class StreamLoop(Generic[Q, R]):
    """The streaming method of one front end: ``serve`` one call, ``close_all`` at a drain.

    ``serve`` is itself the grpc handler (the servicer registers the bound method), so a reply goes
    from the loop to gRPC without passing through the servicer. ``ready(context)``: the core, or the
    call aborted while there is none; ``draining()``: the front end drains; ``open_streams``: the
    gauge of open streams; ``latency``: the histogram of request-to-reply seconds; ``on_reply(reply,
    started)``: what else a protocol counts per reply (OIP's statistics), if anything."""

    codec: StreamCodec[Q, R]
    limit: int
    _: dataclasses.KW_ONLY
    ready: Callable[[grpc.aio.ServicerContext], Awaitable[CoreAPI]]
    draining: Callable[[], bool]
    open_streams: Gauge
    latency: Histogram
    on_reply: Callable[[R, float], None] | None = None
    _open: set[asyncio.Queue[object]] = dataclasses.field(default_factory=set, init=False, repr=False)
    _tasks: set[asyncio.Task[None]] = dataclasses.field(default_factory=set, init=False, repr=False)

    def close_all(self) -> None:
        """Ask every open stream to end with UNAVAILABLE once its accepted requests are answered."""
        for out in self._open:
            out.put_nowait(_CLOSE)

    async def serve(self, requests: AsyncIterator[Q], context: grpc.aio.ServicerContext) -> AsyncIterator[R]:
        """The replies of one call, in request order (an async generator for grpc.aio)."""
        core = await self.ready(context)
        if self.draining() or core.draining:
            await abort(context, Reasons.shutting_down())
        tenant = current_tenant.get()
        refusal = await core.open_stream(tenant)
        if refusal is not None:
            await abort(context, refusal)
        stream = OrderedReplies[R](self.limit)
        self._open.add(stream.out)
        self.open_streams.inc()
        reader = asyncio.create_task(self._read(core, stream, requests, tenant))
        try:
            while True:
                item = await stream.out.get()
                if item is None:
                    break
                if item is _CLOSE:
                    # Send what was accepted before the drain, then end the call.
                    reader.cancel()
                    await stream.idle.wait()
                    while not stream.out.empty():
                        pending = stream.out.get_nowait()
                        if pending is not None and pending is not _CLOSE:
                            yield pending  # type: ignore[misc]
                    await abort(context, Reasons.shutting_down())
                yield item  # type: ignore[misc]
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                exc = reader.exception()
                if isinstance(exc, DecodeError):
                    await abort(context, Reasons.malformed_request(exc))
                log.error("stream reader failed", exc_info=exc)
                await abort(context, Reasons.internal())
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._open.discard(stream.out)
            self.open_streams.dec()
            with contextlib.suppress(Exception):  # a core that is gone counts no streams
                await core.close_stream(tenant)

    async def _read(self, core: CoreAPI, stream: OrderedReplies[R], requests: AsyncIterator[Q], tenant: str) -> None:
        codec = self.codec
        try:
            async for request in requests:
                started = time.perf_counter()
                try:
                    accepted = codec.decode(request, tenant)
                except RefusedError as exc:
                    self._finish(stream, stream.started(), codec.refusal(request, exc.info), started)
                    continue
                except Exception:  # a bug must cost this request, not the stream
                    log.exception("decoding a request failed")
                    self._finish(stream, stream.started(), codec.refusal(request, Reasons.internal()), started)
                    continue
                if accepted.before is not None:
                    # Whatever this stream sent before is answered before the request's own step.
                    await stream.idle.wait()
                    await accepted.before()
                self._submit(core, stream, request, accepted, started)
                pause, stream.pause_s = stream.pause_s, 0.0
                if pause:
                    # A refused request (a rate or pending limit): stop reading this stream until
                    # a retry may pass, so a flood costs the server one answer per pause, not a
                    # CPU-bound loop of refusals that would slow everybody else down.
                    await asyncio.sleep(min(pause, MAX_PAUSE_S))
                if not stream.room.is_set():
                    await stream.room.wait()
            await stream.idle.wait()
        except DecodeError:
            await stream.idle.wait()  # answer what was accepted before the malformed message
            raise
        finally:
            stream.out.put_nowait(None)  # the writer ends the call, with the reader's error if any

    def _submit(
        self, core: CoreAPI, stream: OrderedReplies[R], request: Q, accepted: Accepted[R], started: float
    ) -> None:
        slot = stream.started()
        loop = asyncio.get_running_loop()

        def encode(outcomes: Outcomes) -> None:
            try:
                reply = accepted.encode(outcomes)
            except Exception:  # a bug must cost this request, not the stream
                log.exception("encoding the answer of a request failed")
                reply = self.codec.refusal(request, Reasons.internal())
            if accepted.after is None:
                self._finish(stream, slot, reply, started)
            else:
                task = asyncio.ensure_future(self._after(accepted.after, stream, slot, reply, started))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        def done(outcomes: Outcomes) -> None:
            """The core's answer: kept as columns until a later turn of the loop encodes it."""
            error = outcomes.request_error
            if error is not None and error.retry_after_s:
                stream.pause_s = max(stream.pause_s, error.retry_after_s)
            loop.call_soon(encode, outcomes)

        try:
            core.submit(accepted.request, done)
        except Exception:  # a bug must cost this request, not the stream
            log.exception("submitting a request failed")
            self._finish(stream, slot, self.codec.refusal(request, Reasons.internal()), started)

    async def _after(
        self,
        after: Callable[[R], Awaitable[None]],
        stream: OrderedReplies[R],
        slot: list[R | None],
        reply: R,
        started: float,
    ) -> None:
        try:
            await after(reply)
        finally:
            self._finish(stream, slot, reply, started)

    def _finish(self, stream: OrderedReplies[R], slot: list[R | None], reply: R, started: float) -> None:
        self.latency.observe(time.perf_counter() - started)
        if self.on_reply is not None:
            self.on_reply(reply, started)
        stream.finished(slot, reply)
