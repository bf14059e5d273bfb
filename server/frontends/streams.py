"""What every front end does with a request's events: the stateless checks, and the one loop of
an open bidirectional call that every front end's streaming method is.

``EventChecker`` runs the checks that need no state on a whole request at once, before anything
reaches the engine core (docs/architecture.md section 3, "Validation"): a non-empty session id of
bounded UTF-8 length, seq >= 1, a finite time, a mark in the model's range, exactly the model's
number of finite values (for a model that takes missing values, ``ModelDescription.missing_values``:
finite or NaN).

``StreamLoop.serve`` runs one call: it admits the stream (``CoreAPI.open_stream``), reads requests,
has the protocol's ``StreamCodec`` decode each into a ``CoreRequest`` (or a refusal), submits it to
the model's queue with the request's place in the stream as its ``on_done``, and sends the replies.
The core only hands the place its answer, which the place keeps, waking the writer where it waits
for it (the one future the writer made when it had nothing to send: no future a request, no
``asyncio.Event`` set and cleared an event): the writer encodes it on a later turn of the event loop,
so the core's batcher never builds a proto.

Replies leave in the order their requests arrived (``OrderedReplies``): the writer waits for the
oldest answer first, so a session's results reach the client in the order its events were sent,
also when a later request is answered first. A stream may have ``limit`` requests unanswered; past
that its reader waits, so a fast sender is slowed by gRPC flow control. A request refused with a
retry hint (a rate or pending limit) pauses the reading until a retry may pass. A message that does
not parse ends the call with INVALID_ARGUMENT once what was accepted before it is answered; a drain
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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, NoReturn, Protocol, TypeVar

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from aaren.server.contract.columns import MAX_SEQ, NEXT_SEQ, CoreRequest, EventColumns, ModelDescription, Outcomes
from aaren.server.contract.core_api import CoreAPI, OnDone
from aaren.server.contract.errors import ErrorInfo, Reasons
from aaren.server.contract.validation import session_id_error
from aaren.server.observability.metrics import Metrics
from aaren.server.security.auth import current_tenant
from aaren.server.settings import ServerSettings

__all__ = [
    "REASON_METADATA_KEY",
    "RETRY_METADATA_KEY",
    "Accepted",
    "EventChecker",
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


class EventChecker:
    """Builds a ``CoreRequest`` from a request's fields, refusing the events that fail a check."""

    def __init__(
        self, num_marks: int, value_names: Sequence[str], max_session_id_bytes: int, *, missing_values: bool = False
    ) -> None:
        """``missing_values``: NaN values pass (the model takes them); +-inf never does."""
        self.num_marks = num_marks
        self.missing_values = missing_values
        self.value_names = tuple(value_names)
        self.width = len(self.value_names)
        self.max_id_bytes = max_session_id_bytes
        # Ids of at most this many characters fit the byte limit whatever they hold (UTF-8: <= 4 bytes each).
        self._fast_id_chars = max_session_id_bytes // 4

    @classmethod
    def for_model(cls, d: ModelDescription, max_session_id_bytes: int) -> EventChecker:
        """The checks of ``d``'s events (its marks, value names, and whether it takes missing values)."""
        return cls(d.num_marks, d.value_names, max_session_id_bytes, missing_values=d.missing_values)

    def session_id_error(self, sid: str) -> ErrorInfo | None:
        return session_id_error(sid, self.max_id_bytes)

    def request(
        self,
        session_ids: list[str],
        seqs: Sequence[int],
        times: Sequence[float],
        marks: Sequence[int],
        values: Sequence[Sequence[float]],
        *,
        next_seq: bool = False,
        **fields: object,
    ) -> CoreRequest:
        """``n`` events as parallel sequences (``values[i]`` the values of event ``i``) -> a
        ``CoreRequest`` holding the valid ones as columns; ``fields`` go to the request as they are.
        ``next_seq``: ``seqs`` may hold ``NEXT_SEQ`` (0), "the session's next seq".

        The checks run on plain lists first (a sum of floats is finite only if every term is), so
        a request of valid events costs a few builtins and one array per column; only a request
        with a bad event is looked at event by event."""
        n = len(session_ids)
        if not n:
            return CoreRequest(0, np.zeros(0, np.int64), self.empty(), {}, **fields)  # type: ignore[arg-type]
        width = self.width
        fast = self._fast_id_chars
        if n == 1:  # one event (the most common request): the same checks, without the reductions
            flat = list(values[0])
            seq, mark = seqs[0], marks[0]
            valid = (
                len(flat) == width
                and (NEXT_SEQ if next_seq else 1) <= seq <= MAX_SEQ
                and 0 <= mark < self.num_marks
                and math.isfinite(times[0])
                and (not flat or math.isfinite(sum(flat)) or (self.missing_values and not any(map(math.isinf, flat))))
                and 0 < len(session_ids[0]) <= fast
            )
        else:
            flat = [x for v in values for x in v]
            valid = (
                len(flat) == n * width
                and all(len(v) == width for v in values)
                and min(seqs) >= (NEXT_SEQ if next_seq else 1)
                and max(seqs) <= MAX_SEQ
                and min(marks) >= 0
                and max(marks) < self.num_marks
                and math.isfinite(math.fsum(times))
                and (not flat or math.isfinite(sum(flat)) or (self.missing_values and not any(map(math.isinf, flat))))
                and all(0 < len(sid) <= fast for sid in session_ids)
            )
        if valid:
            columns = EventColumns(
                session_ids,
                np.array(seqs, dtype=np.int64),
                np.array(times, dtype=np.float64),
                np.array(marks, dtype=np.int64),
                np.array(flat, dtype=np.float32).reshape(n, width),
            )
            return CoreRequest(n, np.arange(n), columns, {}, **fields)  # type: ignore[arg-type]
        errors: dict[int, ErrorInfo] = {}
        keep: list[int] = []
        for i in range(n):
            error = self.explain(session_ids[i], int(seqs[i]), float(times[i]), int(marks[i]), values[i], next_seq)
            if error is None:
                keep.append(i)
            else:
                errors[i] = error
        columns = EventColumns(
            [session_ids[i] for i in keep],
            np.array([min(int(seqs[i]), MAX_SEQ) for i in keep], dtype=np.int64),
            np.array([times[i] for i in keep], dtype=np.float64),
            np.array([marks[i] for i in keep], dtype=np.int64),
            np.array([x for i in keep for x in values[i]], dtype=np.float32).reshape(len(keep), width),
        )
        return CoreRequest(n, np.array(keep, dtype=np.int64), columns, errors, **fields)  # type: ignore[arg-type]

    def explain(
        self, sid: str, seq: int, time: float, mark: int, values: Sequence[float], next_seq: bool = False
    ) -> ErrorInfo | None:
        """What is wrong with one event (None when nothing is), checks in a fixed order."""
        error = self.session_id_error(sid)
        if error is not None:
            return error
        if seq < 1 and not (next_seq and seq == NEXT_SEQ):
            return Reasons.seq_zero(sid, seq)
        if not math.isfinite(time):
            return Reasons.time_not_finite(sid, seq, time)
        if not 0 <= mark < self.num_marks:
            return Reasons.mark_out_of_range(sid, seq, mark, self.num_marks)
        if len(values) != self.width:
            return Reasons.values_wrong_width(sid, seq, len(values), self.value_names)
        for j, v in enumerate(values):
            if not math.isfinite(v) and not (self.missing_values and math.isnan(v)):
                return Reasons.values_not_finite(sid, seq, j, self.value_names[j], v)
        return None

    def empty(self) -> EventColumns:
        return EventColumns.empty(self.width)


@dataclasses.dataclass(slots=True)
class Accepted(Generic[R]):
    """A decoded request: what the core is sent, and how its answer becomes a reply."""

    #: What ``submit`` is handed: the core's request, or a codec's own form of it (aaren.v1's gathered
    #: one-event requests, ``OneEvent``, which its ``Gather`` submits as a group).
    request: CoreRequest | Any
    #: The reply to the core's outcomes, called on a later loop turn than the core's answer; a
    #: request whose answer is its reply already (aaren.v1's gathered requests) passes it on, and its
    #: place skips this call where no ``after`` waits (``_Place.__call__``).
    encode: Callable[[Outcomes | R], R]
    #: Where the request goes: the ``CoreAPI.submitter`` of its model, or what hands it on to it.
    submit: Callable[[Any, OnDone], None]
    #: Awaited before the request is submitted, once every earlier request of the stream is
    #: answered (OIP's sequence_start ends the session of that id first).
    before: Callable[[], Awaitable[None]] | None = None
    #: Awaited with the encoded reply before it is sent (OIP's sequence_end ends the session).
    after: Callable[[R], Awaitable[None]] | None = None


class StreamCodec(Protocol[Q, R]):
    """What one protocol adds to the stream loop: its messages <-> the core's columns; ``draining``:
    its front end drains (new streams are refused)."""

    draining: bool

    async def ready(self, context: grpc.aio.ServicerContext) -> CoreAPI:
        """The core, or the call aborted (UNAVAILABLE) while there is none."""
        ...

    def decode(self, request: Q, tenant: str) -> Accepted[R]:
        """The request as the core's columns and its encoder; raises ``RefusedError`` for a refusal."""
        ...

    def refusal(self, request: Q, info: ErrorInfo) -> R:
        """The reply that refuses ``request`` whole."""
        ...


@dataclasses.dataclass(slots=True, eq=False)
class _Place(Generic[Q, R]):
    """One request's place in its stream's order: its answer to come (the core calls the place with
    it: ``on_done``) or its reply already made (``reply``: a refusal)."""

    request: Q
    started: float
    stream: OrderedReplies[Q, R]
    accepted: Accepted[R] | None = None
    reply: R | None = None
    #: The core's outcomes, or a reply made already (``answered``: it has come).
    answer: Outcomes | R | None = None
    answered: bool = False
    #: Its answer came at once (a refusal at submit) and its retry hint already paused the reader.
    noted: bool = False

    def __call__(self, answer: Outcomes | R) -> None:
        """The core's answer (``OnDone``), on the loop's thread: kept, and the writer woken where it waits
        for this place (the oldest). No future a request: one wake-up, not a future's callback and then
        one. An answer that is neither ``Outcomes`` nor None is the reply itself (``Accepted.encode`` passes it on:
        aaren.v1's gathered requests), kept as the reply where no ``after`` waits for it: the writer sends it as
        it is."""
        if answer is None or isinstance(answer, Outcomes) or self.accepted is None or self.accepted.after is not None:
            self.answer, self.answered = answer, True
        else:
            self.reply = answer
        stream = self.stream
        if stream.writer is not None and stream.pending and stream.pending[0] is self:
            stream.wake()


class OrderedReplies(Generic[Q, R]):
    """The unanswered requests of one stream, oldest first, and what its writer and reader wait for.

    Each wait is a future made only while a coroutine waits (``writer``, ``reader``, ``drained``), set by whoever
    makes its condition true: one event of one stream touches no future but the writer's (asyncio's ``Event``
    costs a call a ``set`` and a ``clear`` whether anybody waits or not, three of them an event)."""

    __slots__ = ("closing", "drained", "limit", "pause_s", "pending", "reader", "reader_done", "writer")

    def __init__(self, limit: int) -> None:
        self.pending: deque[_Place[Q, R]] = deque()
        self.limit = limit
        #: the writer's wait for something new to look at (``wake``), while it waits
        self.writer: asyncio.Future[None] | None = None
        #: the reader's wait for room (fewer than ``limit`` unanswered), while it waits
        self.reader: asyncio.Future[None] | None = None
        #: a wait for no request unanswered (``idle``), while one waits
        self.drained: asyncio.Future[None] | None = None
        #: Seconds the reader waits before the next read (a refusal's retry hint).
        self.pause_s = 0.0
        self.reader_done = False
        self.closing = False

    def wake(self) -> None:
        """Wake the writer if it waits (its wait, ``writer``, is a future the writer makes before it awaits it; a
        wait cancelled with its call is left as it is)."""
        writer = self.writer
        if writer is not None:
            self.writer = None
            if not writer.done():
                writer.set_result(None)

    async def room(self) -> None:
        """Until fewer than ``limit`` requests are unanswered."""
        while len(self.pending) >= self.limit:
            self.reader = asyncio.get_running_loop().create_future()
            await self.reader

    async def idle(self) -> None:
        """Until no request is unanswered."""
        while self.pending:
            self.drained = asyncio.get_running_loop().create_future()
            await self.drained

    def add(self, place: _Place[Q, R]) -> None:
        """The next request's place. When this place is the oldest, the writer is woken once its reply
        can be made (at once for a refusal; for an answer to come, by the place when it comes), not
        before: a wake-up that would only find the answer missing costs the loop a turn."""
        pending = self.pending
        pending.append(place)
        if len(pending) == 1 and (place.answered or place.reply is not None):
            self.wake()

    def sent(self) -> None:
        """The oldest request's reply leaves."""
        pending = self.pending
        pending.popleft()
        if self.reader is not None and len(pending) < self.limit:
            reader, self.reader = self.reader, None
            if not reader.done():  # not cancelled with its call
                reader.set_result(None)
        if self.drained is not None and not pending:
            drained, self.drained = self.drained, None
            if not drained.done():
                drained.set_result(None)

    def note(self, outcomes: Outcomes | R) -> None:
        """A refusal's retry hint pauses the reading (an answer that is a reply already has none)."""
        error = outcomes.request_error if isinstance(outcomes, Outcomes) else None
        if error is not None and error.retry_after_s:
            self.pause_s = max(self.pause_s, error.retry_after_s)


class StreamLoop(Generic[Q, R]):
    """The streaming method of one front end: ``serve`` one call, ``close_all`` at a drain.

    ``serve`` is itself the grpc handler (the servicer registers the bound method), so a reply goes
    from the loop to gRPC without passing through the servicer. ``codec``: the protocol's part (it
    also says whether its front end drains and gives the core, ``StreamCodec``); at most
    ``settings.max_inflight_requests_per_stream`` requests of a stream unanswered; ``method``: the
    rpc's name in the request-latency histogram; ``on_reply(reply, started)``: what else a protocol
    counts per reply (OIP's statistics), if anything."""

    def __init__(
        self,
        codec: StreamCodec[Q, R],
        settings: ServerSettings,
        metrics: Metrics,
        method: str,
        on_reply: Callable[[R, float], None] | None = None,
    ) -> None:
        self.codec = codec
        self.limit = settings.max_inflight_requests_per_stream
        self.open_streams = metrics.open_streams
        self.latency = metrics.request_latency.labels(method)
        self.on_reply = on_reply
        self._open: set[OrderedReplies[Q, R]] = set()

    def close_all(self) -> None:
        """Ask every open stream to end with UNAVAILABLE once its accepted requests are answered."""
        for stream in self._open:
            stream.closing = True
            stream.wake()

    async def serve(self, requests: AsyncIterator[Q], context: grpc.aio.ServicerContext) -> AsyncIterator[R]:
        """The replies of one call, in request order (an async generator for grpc.aio)."""
        core = await self.codec.ready(context)
        if self.codec.draining or core.draining:
            await abort(context, Reasons.shutting_down())
        tenant = current_tenant.get()
        refusal = await core.open_stream(tenant)
        if refusal is not None:
            await abort(context, refusal)
        stream = OrderedReplies[Q, R](self.limit)
        loop = asyncio.get_running_loop()
        self._open.add(stream)
        self.open_streams.inc()
        reader = asyncio.create_task(self._read(stream, requests, tenant))
        try:
            while True:
                if stream.closing and not reader.done():
                    reader.cancel()  # send what was accepted before the drain, then end the call
                pending = stream.pending
                if not pending:
                    if stream.closing:
                        await abort(context, Reasons.shutting_down())
                    if stream.reader_done:
                        break
                if not pending or not (pending[0].answered or pending[0].reply is not None):
                    # ``wake`` sets it: a new request, the reader's end, a drain, or the oldest place's answer
                    stream.writer = news = loop.create_future()
                    await news
                    continue
                place = pending[0]
                if place.reply is not None:
                    reply = place.reply
                else:
                    reply = self._reply(stream, place, place.answer)  # type: ignore[arg-type]
                    after = place.accepted.after  # type: ignore[union-attr]
                    if after is not None:
                        await after(reply)
                stream.sent()
                self._finish(reply, place.started)
                yield reply  # type: ignore[misc]
            if not reader.cancelled() and reader.exception() is not None:
                exc = reader.exception()
                if isinstance(exc, DecodeError):
                    await abort(context, Reasons.malformed_request(exc))
                log.error("stream reader failed", exc_info=exc)
                await abort(context, Reasons.internal())
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._open.discard(stream)
            self.open_streams.dec()
            with contextlib.suppress(Exception):  # a core that is gone counts no streams
                await core.close_stream(tenant)

    async def _read(self, stream: OrderedReplies[Q, R], requests: AsyncIterator[Q], tenant: str) -> None:
        codec = self.codec
        try:
            async for request in requests:
                started = time.perf_counter()
                try:
                    accepted = codec.decode(request, tenant)
                except RefusedError as exc:
                    stream.add(_Place(request, started, stream, reply=codec.refusal(request, exc.info)))
                    continue
                except DecodeError:
                    raise  # bytes that are no request end the call (``serve``), as a message gRPC could not read
                except Exception:  # a bug must cost this request, not the stream
                    log.exception("decoding a request failed")
                    stream.add(_Place(request, started, stream, reply=codec.refusal(request, Reasons.internal())))
                    continue
                if accepted.before is not None:
                    # Whatever this stream sent before is answered before the request's own step.
                    await stream.idle()
                    await accepted.before()
                self._submit(stream, request, accepted, started)
                pause, stream.pause_s = stream.pause_s, 0.0
                if pause:
                    # A refused request (a rate or pending limit): stop reading this stream until
                    # a retry may pass, so a flood costs the server one answer per pause, not a
                    # CPU-bound loop of refusals that would slow everybody else down.
                    await asyncio.sleep(min(pause, MAX_PAUSE_S))
                if len(stream.pending) >= stream.limit:
                    await stream.room()
        finally:
            stream.reader_done = True  # the writer ends the call, with the reader's error if any
            stream.wake()

    def _submit(self, stream: OrderedReplies[Q, R], request: Q, accepted: Accepted[R], started: float) -> None:
        place = _Place(request, started, stream, accepted)
        stream.add(place)
        try:
            accepted.submit(accepted.request, place)  # the place is the answer's callback (``_Place.__call__``)
        except Exception:  # a bug must cost this request, not the stream
            log.exception("submitting a request failed")
            place.reply = self.codec.refusal(request, Reasons.internal())
            stream.wake()  # its answer will never come: the writer sends the refusal
            return
        if place.answered:  # refused at once (a limit): pause before the next read
            stream.note(place.answer)  # type: ignore[arg-type]
            place.noted = True

    def _reply(self, stream: OrderedReplies[Q, R], place: _Place[Q, R], outcomes: Outcomes | R) -> R:
        """The reply to ``place``'s ``outcomes`` (a refusal if encoding fails)."""
        assert place.accepted is not None
        if not place.noted:  # an answer that came later (over IPC): its hint pauses the reading now
            stream.note(outcomes)
        try:
            return place.accepted.encode(outcomes)
        except Exception:  # a bug must cost this request, not the stream
            log.exception("encoding the answer of a request failed")
            return self.codec.refusal(place.request, Reasons.internal())

    def _finish(self, reply: R, started: float) -> None:
        self.latency.observe(time.perf_counter() - started)
        if self.on_reply is not None:
            self.on_reply(reply, started)
