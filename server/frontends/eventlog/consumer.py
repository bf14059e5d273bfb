"""The event-log consumer: events from a ``LogSource``, forecasts to a ``LogSink``, each exactly once.

One batch (at most ``ConsumerOptions.batch`` messages, what was held last time first):

1. decode every message (``messages.decode_event``); one that is not an event is a dead letter; an
   event of a session another member owns (``Member.owns``) is acknowledged unread;
2. cut the events into **layers**: layer r holds the r-th event of each session in the batch, so a
   session has at most one event per layer. A layer is one ``StreamRequest`` per model (all its
   sessions' events as columns: one batched step in the core), answered by the ``Answerer`` (the
   aaren.v1 codec over the engine core in this process, or a server at ``--target``);
3. publish the layer's forecasts (``LogSink.publish``) before the next layer is sent;
4. write the dead letters, acknowledge what is done, keep (``LogSource.hold``) what waits: a
   transient refusal (a busy server, a state conflict) and every later event of its session; an
   event after a seq gap, for at most ``gap_wait_s`` (a later message may fill the gap: a log
   written out of order), after which it is a dead letter.

Why it is exactly once (docs/architecture.md section 3, "From an event log"): the core applies an
event once (the seq rule, one winner per write) and stores its state before it answers; a message
is acknowledged only after its forecast is published. Steps 2-3 keep one invariant: **of a
session's applied events, only its last may be unpublished.** So when a message comes again after
a crash, the core calls it a duplicate and either its seq is the session's last applied seq (its
forecast is then computed again from the stored state, which is what the core answered then, and
offered to the sink under the same ``dedup_id``: the sink keeps one), or it is older, and its
forecast was published before the session's next event was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from aaren.server.contract.errors import Code, ErrorInfo, Reasons, ServiceError
from aaren.server.frontends.eventlog.addresses import Member
from aaren.server.frontends.eventlog.base import (
    DeadLetter,
    LogMessage,
    LogSink,
    LogSource,
    LogUnavailableError,
    Publication,
)
from aaren.server.frontends.eventlog.messages import decode_event, encode_forecast
from aaren.server.observability.metrics import Metrics
from aaren.v1 import aaren_pb2 as pb

__all__ = ["Answerer", "BeforeStore", "ConsumerOptions", "LogConsumer"]

log = logging.getLogger(__name__)

#: Codes of refusals that pass: the message waits in the log and is tried again.
TRANSIENT = frozenset({Code.RESOURCE_EXHAUSTED, Code.ABORTED, Code.UNAVAILABLE, Code.INTERNAL})
#: The most messages the consumer holds, in batches: past it, it reads nothing new until some pass.
HELD_BATCHES = 4
#: Reasons of an event that comes before the ones it follows: a seq gap, or a seq above 1 of a
#: session that has none yet. A later message may fill the gap.
GAPS = frozenset({"seq_gap", "session_not_found"})


#: Awaited with the positions of some of a request's events and their results, before their
#: states are stored (``ForecastServicer.answer``).
BeforeStore = Callable[[list[int], pb.StreamResponse], Awaitable[None]]


class Answerer(Protocol):
    """What answers the consumer's requests: the aaren.v1 codec over a core, or a remote server.
    ``publishes_before_store``: ``answer`` takes a ``before_store`` (the core is in this process)."""

    publishes_before_store: bool

    async def answer(self, request: pb.StreamRequest, before_store: BeforeStore | None = None) -> pb.StreamResponse:
        """The response ``Stream`` would send; raises ``LogUnavailableError`` when there is no answer."""
        ...

    async def latest(self, session_id: str, model: str) -> pb.Forecast:
        """The forecast of the session's stored state (its last applied event's); raises
        ``ServiceError`` for an unknown session, ``LogUnavailableError`` when there is no answer."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """``batch``: messages read at once; ``wait_s``: the longest a read waits for the first one;
    ``gap_wait_s``: how long an event after a seq gap waits for the gap to fill before it is a dead
    letter; ``retry_s``: the pause when every message waits; ``stats_interval_s``: how often lag and
    pending are read; ``content_type``: the forecasts' encoding (None: that of their event)."""

    batch: int = 256
    wait_s: float = 0.2
    gap_wait_s: float = 30.0
    retry_s: float = 0.2
    stats_interval_s: float = 5.0
    content_type: str | None = None


@dataclasses.dataclass(slots=True, eq=False)
class _Item:
    message: LogMessage
    event: pb.Event
    model: str


@dataclasses.dataclass(slots=True)
class _Batch:
    """What one batch did with its messages."""

    done: list[LogMessage] = dataclasses.field(default_factory=list)
    held: list[LogMessage] = dataclasses.field(default_factory=list)
    dead: list[DeadLetter] = dataclasses.field(default_factory=list)
    pause_s: float = 0.0


class LogConsumer:
    """Runs until ``stop``: ``await run()``; ``source_up`` says whether the source answers (readiness)."""

    def __init__(
        self,
        source: LogSource,
        sink: LogSink,
        answerer: Answerer,
        metrics: Metrics,
        member: Member | None = None,
        options: ConsumerOptions | None = None,
    ) -> None:
        self.source = source
        self.sink = sink
        self.answerer = answerer
        self.member = member or Member()
        self.options = options or ConsumerOptions()
        self.source_up = False
        #: Set once the source and sink have been opened the first time.
        self.opened = asyncio.Event()
        self._stopping = asyncio.Event()
        self._held: list[LogMessage] = []
        self._first_seen: dict[str, float] = {}  # held message id -> when it was first read
        self._opened = False
        label = source.label
        outcomes = ("forecast", "duplicate", "dead_letter", "skipped")
        self._messages = {o: metrics.log_messages.labels(label, o) for o in outcomes}
        self._redeliveries = metrics.log_redeliveries.labels(label)
        self._dead_letters = metrics.log_dead_letters
        self._published = {r: metrics.log_published.labels(sink.label, r) for r in ("new", "repeat")}
        self._lag = metrics.log_lag.labels(label)
        self._pending = metrics.log_pending.labels(label)
        self._up = metrics.log_source_up.labels(label)
        self._batch_messages = metrics.log_batch_messages
        self._up.set(0)

    def stop(self) -> None:
        """Finish the batch in hand (publish, acknowledge), then return from ``run``."""
        self._stopping.set()

    async def run(self) -> None:
        stats = asyncio.create_task(self._watch(), name="aaren-log-stats")
        try:
            while not self._stopping.is_set():
                try:
                    await self.step()
                except LogUnavailableError as exc:
                    self._set_up(False, str(exc))
                    self._opened = False  # reopen: what a lost reply handed out is pending again
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), 1.0)
                except Exception:  # a bug must not stop the consumer: what it did not acknowledge comes again
                    log.exception("log consumer: a batch failed; reading again from what is unacknowledged")
                    self._opened = False
                    self._held = []
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), 1.0)
        finally:
            stats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stats

    async def step(self) -> int:
        """Read one batch and handle it; returns how many messages it read (held ones included)."""
        if not self._opened:
            await self.source.open()
            await self.sink.open()
            self._opened = True
            self._set_up(True)
            self.opened.set()
        room = self._room()
        fresh = await self.source.read(room, self.options.wait_s if not self._held else 0.0) if room else []
        self._set_up(True)
        held_ids = {m.id for m in self._held}
        messages = self._held + [m for m in fresh if m.id not in held_ids]
        if not messages:
            return 0
        self._batch_messages.observe(len(messages))
        for m in fresh:
            if m.deliveries > 1 and m.id not in held_ids:
                self._redeliveries.inc()
        outcome = await self._handle(messages)
        await self.sink.dead_letter(outcome.dead)
        for letter in outcome.dead:
            self._dead_letters.labels(self.source.label, letter.reason).inc()
        self._messages["dead_letter"].inc(len(outcome.dead))
        await self.source.ack(outcome.done + [letter.message for letter in outcome.dead])
        await self.source.hold(outcome.held)
        self._held = outcome.held
        kept = {m.id for m in outcome.held}
        self._first_seen = {k: v for k, v in self._first_seen.items() if k in kept}
        if outcome.held and len(outcome.held) == len(messages):
            # Nothing moved: wait before trying the same messages again (a retry hint, or a gap).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), max(self.options.retry_s, outcome.pause_s))
        return len(messages)

    def _room(self) -> int:
        """How many messages to read: a batch's worth beside what is held, and some even when held
        messages fill a batch (the one that fills their gap may be next in the log), none past
        ``HELD_BATCHES`` batches held."""
        batch, held = self.options.batch, len(self._held)
        if held >= HELD_BATCHES * batch:
            return 0
        return max(batch - held, -(-batch // 4))

    async def _handle(self, messages: Sequence[LogMessage]) -> _Batch:
        batch = _Batch()
        items: list[_Item] = []
        layers: list[list[_Item]] = []
        depth: dict[tuple[str, str], int] = defaultdict(int)
        for m in messages:
            decoded = decode_event(m)
            if isinstance(decoded, ErrorInfo):
                batch.dead.append(DeadLetter(m, int(decoded.code), decoded.reason, decoded.message))
                continue
            event, model = decoded
            if not self.member.owns(event.session_id):
                batch.done.append(m)
                self._messages["skipped"].inc()
                continue
            item = _Item(m, event, model)
            items.append(item)
            key = (model, event.session_id)
            r = depth[key]
            depth[key] = r + 1
            if r == len(layers):
                layers.append([])
            layers[r].append(item)
        if self.answerer.publishes_before_store:
            await self._apply_runs(items, batch)
        else:
            await self._apply_layers(layers, batch)
        order = {m.id: n for n, m in enumerate(messages)}
        batch.held.sort(key=lambda m: order[m.id])
        return batch

    async def _apply_runs(self, items: list[_Item], batch: _Batch) -> None:
        """The core is in this process: the batch's events in one request per model (a session's run
        applied by the scan); each piece's forecasts are published before its states are stored
        (``before_store``), so a stored state's forecasts are always out."""
        groups = _by_model(items)

        def publisher(group: list[_Item]) -> Callable[[list[int], pb.StreamResponse], Awaitable[None]]:
            async def before_store(positions: list[int], response: pb.StreamResponse) -> None:
                out = [
                    self._publication(group[i], result.forecast)
                    for i, result in zip(positions, response.results, strict=True)
                    if result.WhichOneof("outcome") == "forecast"
                ]
                await self._publish(out)

            return before_store

        responses = await asyncio.gather(
            *(self.answerer.answer(_request(g), before_store=publisher(g)) for g in groups)
        )
        again: list[tuple[Publication, _Item]] = []
        blocked: set[tuple[str, str]] = set()
        for group, response in zip(groups, responses, strict=True):
            for item, _ in await self._sort(group, response, batch, blocked, again):
                batch.done.append(item.message)  # published before its state was stored
        await self._publish_or_hold(again, batch)

    async def _apply_layers(self, layers: list[list[_Item]], batch: _Batch) -> None:
        """The core is elsewhere (``--target``): layer by layer, each layer's forecasts published
        before the next layer is sent (module docstring)."""
        blocked: set[tuple[str, str]] = set()  # sessions with an event that waits: their later ones wait too
        for index, layer in enumerate(layers):
            items = [i for i in layer if (i.model, i.event.session_id) not in blocked]
            batch.held += [i.message for i in layer if (i.model, i.event.session_id) in blocked]
            if not items:
                continue
            try:
                groups = _by_model(items)
                responses = await asyncio.gather(*(self.answerer.answer(_request(g)) for g in groups))
                publications: list[tuple[Publication, _Item]] = []
                for group, response in zip(groups, responses, strict=True):
                    for item, forecast in await self._sort(group, response, batch, blocked, publications):
                        publications.append((self._publication(item, forecast), item))
                await self._publish([p for p, _ in publications])
            except LogUnavailableError as exc:
                # Nothing of this layer is published: every message from here on waits, so only a
                # session's last applied event can be unpublished (module docstring).
                log.warning("log consumer: %s; the batch's remaining messages wait", exc)
                for later in layers[index:]:
                    batch.held += [i.message for i in later if i.message not in batch.held]
                batch.held = _unique(batch.held)
                batch.done = [m for m in batch.done if m not in set(batch.held)]
                batch.pause_s = self.options.retry_s
                if not await self.sink.healthy():
                    raise
                return
            for _, item in publications:
                batch.done.append(item.message)

    async def _publish(self, publications: list[Publication]) -> None:
        new = await self.sink.publish(publications)
        self._published["new"].inc(new)
        self._published["repeat"].inc(len(publications) - new)

    async def _publish_or_hold(self, publications: list[tuple[Publication, _Item]], batch: _Batch) -> None:
        """Publish what a batch offers again (duplicates); held for another try when the sink fails."""
        if not publications:
            return
        try:
            await self._publish([p for p, _ in publications])
        except LogUnavailableError as exc:
            log.warning("log consumer: %s; %d duplicates wait", exc, len(publications))
            batch.held += [item.message for _, item in publications]
            batch.pause_s = self.options.retry_s
            return
        batch.done += [item.message for _, item in publications]

    async def _sort(
        self,
        group: list[_Item],
        response: pb.StreamResponse,
        batch: _Batch,
        blocked: set[tuple[str, str]],
        again: list[tuple[Publication, _Item]],
    ) -> list[tuple[_Item, pb.Forecast]]:
        """Where each event of one answered request goes: its forecast (returned), nothing new (done),
        a forecast to offer again (``again``: a duplicate of the session's last applied event), a wait
        or a dead letter (``_refused``)."""
        forecasts: list[tuple[_Item, pb.Forecast]] = []
        if response.HasField("request_error"):
            for item in group:
                self._refused(item, _info(response.request_error), batch, blocked)
            return forecasts
        for item, result in zip(group, response.results, strict=True):
            outcome = result.WhichOneof("outcome")
            if outcome == "forecast":
                forecasts.append((item, result.forecast))
                self._messages["forecast"].inc()
            elif outcome == "ack":
                forecast = None
                if item.event.seq == result.ack.last_seq:
                    # Maybe applied before a crash and never published: offer its forecast again.
                    try:
                        forecast = await self.answerer.latest(item.event.session_id, item.model)
                    except ServiceError as exc:  # ended or evicted since: nothing to offer
                        log.warning("log consumer: no forecast for duplicate %s: %s", item.message.id, exc)
                if forecast is not None:
                    again.append((self._publication(item, forecast), item))
                else:
                    batch.done.append(item.message)
                self._messages["duplicate"].inc()
            else:
                self._refused(item, _info(result.error), batch, blocked)
        return forecasts

    def _refused(self, item: _Item, info: ErrorInfo, batch: _Batch, blocked: set[tuple[str, str]]) -> None:
        """An event the core did not apply: it waits (a transient refusal; a gap, for a while) or is a dead letter."""
        m = item.message
        now = time.monotonic()
        first = self._first_seen.setdefault(m.id, now)
        if info.code in TRANSIENT:
            batch.held.append(m)
            blocked.add((item.model, item.event.session_id))  # its session's later events wait behind it
            batch.pause_s = max(batch.pause_s, info.retry_after_s)
            return
        if info.reason in GAPS and now - first < self.options.gap_wait_s:
            # Not blocking: a message later in the log may be the one that fills the gap.
            batch.held.append(m)
            return
        if info.reason in GAPS:
            info = Reasons.seq_gap_unfilled(info, self.options.gap_wait_s)
        batch.dead.append(DeadLetter(m, int(info.code), info.reason, info.message))

    def _publication(self, item: _Item, forecast: pb.Forecast) -> Publication:
        content_type = self.options.content_type or item.message.content_type
        model = forecast.model.name or item.model
        return Publication(
            f"{model}/{forecast.session_id}/{forecast.seq}",
            model,
            forecast.session_id,
            forecast.seq,
            encode_forecast(forecast, content_type, item.message.id),
            content_type,
            item.message.id,
        )

    def _set_up(self, up: bool, why: str = "") -> None:
        if up != self.source_up:
            if up:
                log.info("log source %s answers", self.source.label)
            else:
                log.error("log source %s does not answer: %s", self.source.label, why)
        self.source_up = up
        self._up.set(1 if up else 0)

    async def _watch(self) -> None:
        """Lag and pending now and then; the source's health."""
        while True:
            try:
                stats = await self.source.stats()
                self._lag.set(stats.lag)
                self._pending.set(stats.pending)
            except LogUnavailableError as exc:
                self._set_up(False, str(exc))
            except Exception:  # a log that cannot count must not stop the consumer
                log.exception("reading the log's lag failed")
            await asyncio.sleep(self.options.stats_interval_s)


def _by_model(items: list[_Item]) -> list[list[_Item]]:
    """Items grouped by model, each group in log order."""
    groups: dict[str, list[_Item]] = defaultdict(list)
    for item in items:
        groups[item.model].append(item)
    return list(groups.values())


def _request(group: list[_Item]) -> pb.StreamRequest:
    return pb.StreamRequest(
        events=[i.event for i in group], model=group[0].model, forecast_mode=pb.FORECAST_MODE_EVERY_EVENT
    )


def _info(error: pb.EventError) -> ErrorInfo:
    try:
        code = Code(error.code)
    except ValueError:  # a code this server never sends (a remote server's): it may pass
        code = Code.UNAVAILABLE
    return ErrorInfo(code, error.reason, error.message, error.retry_after_ms / 1000)


def _unique(messages: list[LogMessage]) -> list[LogMessage]:
    seen: set[int] = set()
    out = []
    for m in messages:
        if id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out
