"""The runtime: accepts events, applies them in batched model calls, answers with forecasts.

One background task (the batcher) takes the sessions that have pending events, up to
``max_batch_size`` of them, loads their state from the store, applies each session's pending
events in order (one batched ``step`` for sessions with one event, the parallel scan for longer
runs) on a worker thread, writes the new state, and only then resolves the requests (DESIGN.md:
acknowledgement means durable). A session is in at most one batch at a time, so its events
apply in order. The runtime knows nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import torch

from aaren.server.engine import Engine, ForecastColumns, ForecastNumbers, RunInput
from aaren.server.errors import Code, ErrorInfo, ServiceError
from aaren.server.limits import TokenBucket
from aaren.server.metrics import Metrics
from aaren.server.settings import ServerSettings
from aaren.server.stores.base import LoadedBatch, SessionMeta, SessionStore, StoreUnavailableError

__all__ = ["Ack", "Event", "Forecast", "Outcome", "Runtime", "SampledFuture", "SessionView", "StepSummary"]

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_RUN_EVENTS = 4096
SLOW_COUNT_PERIOD_S = 30.0
TENANT_COUNT_TTL_S = 5.0
EMPTY_SESSION_ID = "session_id is empty; expected 1 or more bytes"


@dataclasses.dataclass(slots=True)
class Event:
    """An event as the runtime reads it. Any object with these attributes will do (the servicer
    passes ``aaren.v1.Event`` messages as they are, without copying)."""

    session_id: str
    seq: int
    time: float
    mark: int
    values: Sequence[float]


@dataclasses.dataclass(slots=True)
class Forecast:
    """The forecast after ``seq``: row ``row`` of ``columns``, with its ``top_k`` most likely marks."""

    session_id: str
    seq: int
    last_time: float
    columns: ForecastColumns
    row: int
    top_k: int

    @property
    def numbers(self) -> ForecastNumbers:
        return self.columns.numbers(self.row, self.top_k)


@dataclasses.dataclass(slots=True)
class Ack:
    """An event that needs no forecast: applied, or a duplicate (``seq <= last_seq``) left alone."""

    last_seq: int
    duplicate: bool


Outcome = Forecast | Ack | ErrorInfo


@dataclasses.dataclass(frozen=True)
class SessionView:
    session_id: str
    meta: SessionMeta
    state: bytes | None
    state_bytes: int
    expires_at: float


@dataclasses.dataclass(frozen=True, slots=True)
class StepSummary:
    """What sampled futures say about future event ``step`` (1 = next): absolute times, mark frequencies."""

    step: int
    mean_time: float
    time_quantiles: list[float]
    marks: list[tuple[int, float]]


@dataclasses.dataclass(frozen=True)
class SampledFuture:
    """The exact next-event forecast, plus (horizon > 1) per-step summaries and sampled paths
    (absolute times ``[S][H]``, marks ``[S][H]``, values ``[S][H][V]``)."""

    forecast: Forecast
    steps: list[StepSummary]
    times: list[list[float]]
    marks: list[list[int]]
    values: list[list[list[float]]]


class _Request:
    """One submitted message: its outcomes fill in as batches finish; ``on_done`` gets them all."""

    __slots__ = ("last_only", "on_done", "outcomes", "remaining", "top_k")

    def __init__(self, n: int, top_k: int, last_only: bool, on_done: Callable[[list[Outcome]], None]) -> None:
        self.outcomes: list[Outcome | None] = [None] * n
        self.remaining = n
        self.top_k = top_k
        self.last_only = last_only
        self.on_done = on_done

    def set(self, index: int, outcome: Outcome) -> None:
        if self.outcomes[index] is None:
            self.remaining -= 1
        self.outcomes[index] = outcome
        if self.remaining == 0:
            on_done, self.on_done = self.on_done, _answered
            try:
                on_done(self.outcomes)  # type: ignore[arg-type]
            except Exception:  # the caller's failure to deliver must not fail the batch that stored it
                log.exception("delivering the answer of a request failed")


def _answered(outcomes: list[Outcome]) -> None:
    """Stands in for a request's callback once it has been called."""


@dataclasses.dataclass(slots=True)
class _Run:
    """Consecutive events of one session from one request."""

    request: _Request
    indices: list[int]
    events: list[Event]
    enqueued_at: float


_APPLY = object()
_DUPLICATE_OF_BATCH = object()


@dataclasses.dataclass(slots=True)
class _Plan:
    """What one batch does with one session's queued events: a verdict per event, in order."""

    sid: str
    meta: SessionMeta | None
    unit: int
    verdicts: list[tuple[_Run, int, Event, object]]
    applied: list[tuple[_Run, int, Event]]
    forecast_at: list[int]


class Runtime:
    def __init__(self, engine: Engine, store: SessionStore, settings: ServerSettings, metrics: Metrics) -> None:
        self.engine = engine
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self._pending: dict[str, deque[_Run]] = {}
        self._ready: OrderedDict[str, None] = OrderedDict()
        self._wakeup = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aaren-model")
        self._batcher: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._n_pending = 0
        self.draining = False
        #: Sessions ids are "<tenant>/<session_id>" when authentication (hence tenants) is on.
        self._tenancy = settings.auth_tokens_file is not None
        self._tenant_pending: Counter[str] = Counter()
        self._tenant_pending_limit = max(1, settings.max_pending_events // 2)
        self._buckets: dict[str, TokenBucket] = {}
        self._tenant_counts: dict[str, tuple[float, int]] = {}
        store.on_evict = lambda cause: metrics.sessions_evicted.labels(cause).inc()
        metrics.state_bytes_per_session.set(engine.description.state_bytes_per_session)
        # Label children resolved once: a labels() lookup per event costs more than the increment.
        self._applied = metrics.events.labels("applied")
        self._duplicates = metrics.events.labels("duplicate")
        self._rejected = metrics.events.labels("rejected")
        self._by_reason: dict[str, object] = {}
        self._latency = {phase: metrics.event_latency.labels(phase) for phase in ("queue", "model", "store", "total")}
        self._io_pause = settings.io_pause_ms / 1000
        self._num_marks = engine.description.num_marks
        self._value_width = engine.description.value_width
        # Ids of at most this many characters fit the byte limit whatever they hold (UTF-8: <= 4 bytes each).
        self._fast_id_chars = settings.max_session_id_bytes // 4

    async def start(self) -> None:
        self._batcher = asyncio.create_task(self._batch_loop(), name="aaren-batcher")
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="aaren-sweeper")

    async def drain(self) -> None:
        """Refuse new events and wait until every accepted one is answered."""
        self.draining = True
        while self._n_pending:
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        for task in (self._batcher, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._executor.shutdown(wait=True)
        await self.store.close()

    async def _in_worker(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _check_session_id(self, sid: str) -> ErrorInfo | None:
        if not sid:
            return ErrorInfo(Code.INVALID_ARGUMENT, "session_id_empty", EMPTY_SESSION_ID)
        n_bytes = len(sid.encode("utf-8", "surrogatepass"))
        if n_bytes > self.settings.max_session_id_bytes:
            return ErrorInfo(
                Code.INVALID_ARGUMENT,
                "session_id_too_long",
                f"session_id is {n_bytes} bytes; expected at most {self.settings.max_session_id_bytes}",
            )
        return None

    def validate(self, event: Event) -> ErrorInfo | None:
        """The checks that need no session state."""
        # Fast path for a valid event (each field read once; a sum is finite only if every term is).
        values = event.values
        if (
            0 < len(event.session_id) <= self._fast_id_chars
            and event.seq >= 1
            and 0 <= event.mark < self._num_marks
            and len(values) == self._value_width
            and math.isfinite(event.time + sum(values))
        ):
            return None
        return self._explain(event)

    def _explain(self, event: Event) -> ErrorInfo | None:
        """What is wrong with ``event`` (None when nothing is, e.g. finite numbers whose sum overflows)."""
        d = self.engine.description
        sid = event.session_id
        error = self._check_session_id(sid)
        if error is not None:
            return error
        if event.seq < 1:
            return ErrorInfo(
                Code.INVALID_ARGUMENT, "seq_zero", f"seq of session {sid!r} is {event.seq}; seqs start at 1"
            )
        if not math.isfinite(event.time):
            return ErrorInfo(
                Code.INVALID_ARGUMENT,
                "time_not_finite",
                f"time of session {sid!r} seq {event.seq} is {event.time}; expected a finite number",
            )
        if not 0 <= event.mark < d.num_marks:
            return ErrorInfo(
                Code.INVALID_ARGUMENT,
                "mark_out_of_range",
                f"mark {event.mark} of session {sid!r} seq {event.seq} is out of range; expected 0..{d.num_marks - 1}",
            )
        if len(event.values) != d.value_width:
            return ErrorInfo(
                Code.INVALID_ARGUMENT,
                "values_wrong_width",
                f"session {sid!r} seq {event.seq} has {len(event.values)} values; expected {d.value_width} "
                f"({', '.join(d.value_names)})",
            )
        for j, v in enumerate(event.values):
            if not math.isfinite(v):
                return ErrorInfo(
                    Code.INVALID_ARGUMENT,
                    "values_not_finite",
                    f"value {j} ({d.value_names[j]}) of session {sid!r} seq {event.seq} is {v}; "
                    "expected a finite number",
                )
        return None

    def enqueue(
        self,
        events: Sequence[Event],
        on_done: Callable[[list[Outcome]], None],
        *,
        top_k: int = 0,
        last_only: bool = False,
        tenant: str = "",
    ) -> None:
        """Accept ``events`` (many sessions, any order between sessions); ``on_done(outcomes)`` is
        called once with one outcome per event, in the events' order, after their state is stored.

        ``last_only``: forecast only the last applied event of each session in ``events`` (ack the
        others). ``tenant``: whose sessions these are (session ids are scoped per tenant). Raises
        ``ServiceError`` (nothing accepted) for a request over a limit: its size, the server's or
        the tenant's pending events, or the tenant's event rate; ``retry_after_s`` then says when
        a retry may pass.
        """
        if len(events) > self.settings.max_events_per_request:
            self.count_rejection(ErrorInfo(Code.RESOURCE_EXHAUSTED, "too_many_events", ""), n=len(events))
            raise ServiceError(
                Code.RESOURCE_EXHAUSTED,
                "too_many_events",
                f"request has {len(events)} events; expected at most {self.settings.max_events_per_request} "
                "(split it into several messages)",
            )
        if not events:
            on_done([])
            return
        self._admit(len(events), tenant)
        received = time.perf_counter()
        total_latency = self._latency["total"]

        def answered(outcomes: list[Outcome]) -> None:
            total_latency.observe(time.perf_counter() - received)
            on_done(outcomes)

        request = _Request(len(events), top_k or self.settings.default_top_k, last_only, answered)
        if self.draining:
            err = ErrorInfo(Code.UNAVAILABLE, "shutting_down", "the server is shutting down; reconnect and resend")
            for i in range(len(events)):
                self.count_rejection(err)
                request.set(i, err)
            return
        now = received
        runs: dict[str, _Run] = {}
        for i, event in enumerate(events):
            error = self.validate(event)
            if error is not None:
                self.count_rejection(error)
                request.set(i, error)
                continue
            key = f"{tenant}/{event.session_id}" if tenant else event.session_id
            run = runs.get(key)
            if run is None:
                runs[key] = run = _Run(request, [], [], now)
            run.indices.append(i)
            run.events.append(event)
        for sid, run in runs.items():
            self._pending.setdefault(sid, deque()).append(run)
            self._ready[sid] = None
            self._n_pending += len(run.events)
            if tenant:
                self._tenant_pending[tenant] += len(run.events)
        if runs:
            self.metrics.pending_events.set(self._n_pending)
            self._wakeup.set()

    def _admit(self, n: int, tenant: str) -> None:
        """Refuse (``ServiceError`` RESOURCE_EXHAUSTED) a request of ``n`` events that would pass a
        bound: pending events of the server or of the tenant, or the tenant's event rate."""
        s = self.settings
        limit, message, retry = None, "", 0.0
        if self._n_pending + n > s.max_pending_events:
            limit, retry = "server_busy", 0.1
            message = f"the server has {self._n_pending} events pending (at most {s.max_pending_events})"
        elif tenant and self._tenant_pending[tenant] + n > self._tenant_pending_limit:
            limit, retry = "tenant_pending_limit", 0.1
            message = (
                f"tenant {tenant!r} has {self._tenant_pending[tenant]} events pending "
                f"(at most {self._tenant_pending_limit})"
            )
        elif s.tenant_events_per_s > 0:
            wait = self._buckets.setdefault(tenant, TokenBucket(s.tenant_events_per_s, s.tenant_burst_events)).take(n)
            if wait > 0:
                limit, retry = "tenant_rate_limited", wait
                message = (
                    f"tenant {tenant or '(default)'!r} is over its event rate ({s.tenant_events_per_s:g} events/s, "
                    f"bursts of {s.tenant_burst_events})"
                )
        if limit is None:
            return
        self.metrics.limit_refusals.labels(limit).inc()
        self.count_rejection(ErrorInfo(Code.RESOURCE_EXHAUSTED, limit, ""), n=n)
        raise ServiceError(
            Code.RESOURCE_EXHAUSTED,
            limit,
            f"{message}; nothing of this request was accepted: retry in {retry:.3f} s",
            retry_after_s=retry,
        )

    async def submit(
        self, events: Sequence[Event], *, top_k: int = 0, last_only: bool = False, tenant: str = ""
    ) -> list[Outcome]:
        """``enqueue`` and wait for the outcomes."""
        future: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()

        def done(outcomes: list[Outcome]) -> None:
            if not future.done():
                future.set_result(outcomes)

        self.enqueue(events, done, top_k=top_k, last_only=last_only, tenant=tenant)
        return await future

    def count_rejection(self, error: ErrorInfo, n: int = 1) -> None:
        """Count ``n`` rejected events by reason (also those the servicer refuses before the runtime)."""
        self._rejected.inc(n)
        child = self._by_reason.get(error.reason)
        if child is None:
            child = self._by_reason[error.reason] = self.metrics.rejections.labels(error.reason)
        child.inc(n)  # type: ignore[attr-defined]

    async def _batch_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            wait = self.settings.max_batch_wait_ms / 1000
            # Always yield once: stream readers then queue what has arrived while the last batch ran.
            # Busy (a full batch of events waits): still pause briefly, so that grpc.aio's poller thread
            # gets the GIL and delivers reads and writes; with a bare yield, back-to-back batches serve
            # saturated streams unevenly.
            busy = len(self._ready) >= self.settings.max_batch_size or self._n_pending >= self.settings.max_batch_events
            await asyncio.sleep(self._io_pause if busy else wait)
            units: list[tuple[str, list[_Run]]] = []
            counts: list[int] = []
            n_events, max_sessions, max_events = 0, self.settings.max_batch_size, self.settings.max_batch_events
            while self._ready and len(units) < max_sessions and n_events < max_events:
                sid, _ = self._ready.popitem(last=False)
                runs, n = self._take(sid)
                units.append((sid, runs))
                counts.append(n)
                n_events += n
            if not self._ready:
                self._wakeup.clear()
            try:
                await self._run_batch(units)
            except Exception:  # a bug must not stop the service: fail this batch's unanswered events only
                log.exception("batch of %d sessions failed", len(units))
                err = ErrorInfo(Code.ABORTED, "batch_aborted", "the batch holding this event failed; resend it")
                for _, runs in units:
                    for run in runs:
                        for i in run.indices:
                            if run.request.outcomes[i] is None:
                                self.count_rejection(err)
                                run.request.set(i, err)
            finally:
                pending, ready, tenant_pending = self._pending, self._ready, self._tenant_pending
                more = False
                for (sid, _), n in zip(units, counts, strict=True):
                    self._n_pending -= n
                    if self._tenancy:
                        tenant = sid.partition("/")[0]
                        tenant_pending[tenant] -= n
                        if not tenant_pending[tenant]:
                            del tenant_pending[tenant]
                    if pending[sid]:
                        ready[sid] = None
                        more = True
                    else:
                        del pending[sid]
                if more:
                    self._wakeup.set()
                self.metrics.pending_events.set(self._n_pending)

    def _take(self, sid: str) -> tuple[list[_Run], int]:
        """The session's queued runs, oldest first, up to ``MAX_RUN_EVENTS`` events (at least one
        run), and how many events they hold."""
        queue = self._pending[sid]
        runs = [queue.popleft()]
        total = len(runs[0].events)
        while queue and total + len(queue[0].events) <= MAX_RUN_EVENTS:
            total += len(queue[0].events)
            runs.append(queue.popleft())
        return runs, total

    async def _run_batch(self, units: list[tuple[str, list[_Run]]]) -> None:
        started = time.perf_counter()
        queue_latency = self._latency["queue"]
        seen: set[int] = set()
        for _, runs in units:
            for run in runs:
                if id(run.request) not in seen:  # once per request: its events arrived together
                    seen.add(id(run.request))
                    queue_latency.observe(started - run.enqueued_at)
        ids = [sid for sid, _ in units]
        try:
            loaded = await self._timed("load", self.store.load(ids))
        except StoreUnavailableError as exc:
            self._fail_all(units, ErrorInfo(Code.UNAVAILABLE, "store_unavailable", f"session store unavailable: {exc}"))
            return
        self._reset_foreign_states(ids, loaded)

        # Seq, time and model checks against the stored state, event by event.
        plans: list[_Plan] = []
        allowance = await self._session_allowance(ids, loaded.metas)
        for u, (sid, runs) in enumerate(units):
            plan = self._plan_session(sid, runs, loaded.metas[u], u, allowance)
            if plan.applied:
                plans.append(plan)
            else:
                self._settle(plan, None, None, 0)  # nothing to store: duplicates and errors answer now
        if not plans:
            return

        inputs: list[RunInput] = []
        top_k = 1
        for plan in plans:
            applied = plan.applied
            last_time = plan.meta.last_time if plan.meta is not None else applied[0][2].time
            if len(applied) == 1:  # the common case, spelled out: one event, the last of its run
                run, _, event = applied[0]
                plan.forecast_at = [0]
                inputs.append(RunInput([event.time - last_time], [event.mark], [list(event.values)], plan.forecast_at))
                if run.request.top_k > top_k:
                    top_k = run.request.top_k
                continue
            last_of_run = {id(run): pos for pos, (run, _, _) in enumerate(applied)}
            dts, forecast_at = [], []
            for pos, (run, _, event) in enumerate(applied):
                dts.append(event.time - last_time)
                last_time = event.time
                if not run.request.last_only or last_of_run[id(run)] == pos:
                    forecast_at.append(pos)
            plan.forecast_at = forecast_at
            marks = [e.mark for _, _, e in applied]
            inputs.append(RunInput(dts, marks, [list(e.values) for _, _, e in applied], forecast_at))
            top_k = max(top_k, max(run.request.top_k for run, _, _ in applied))

        self.metrics.batch_size.observe(len(plans))
        self.metrics.batch_events.observe(sum(len(p.applied) for p in plans))
        index = torch.tensor([p.unit for p in plans], device=self.engine.device)
        rows = {k: t.index_select(0, index) for k, t in loaded.tensors.items()}
        model_started = time.perf_counter()
        if self.settings.model_thread:
            new_rows, columns, starts = await self._in_worker(self.engine.apply, rows, inputs, top_k)
        else:
            new_rows, columns, starts = self.engine.apply(rows, inputs, top_k)
        store_started = time.perf_counter()
        plans, starts = self._drop_non_finite(plans, starts, new_rows)
        if not plans:
            return

        now = time.time()
        metas = [
            SessionMeta(
                last_seq=p.applied[-1][2].seq,
                last_time=p.applied[-1][2].time,
                created_at=p.meta.created_at if p.meta else now,
                updated_at=now,
                model_version=self.engine.version,
            )
            for p in plans
        ]
        expected = [p.meta.last_seq if p.meta else 0 for p in plans]
        try:
            written = await self._timed("save", self.store.save([p.sid for p in plans], new_rows, metas, expected))
        except StoreUnavailableError as exc:
            err = ErrorInfo(Code.UNAVAILABLE, "store_unavailable", f"session store unavailable, state not saved: {exc}")
            for plan in plans:
                self._settle(plan, err, None, 0)
            return
        done = time.perf_counter()
        self._latency["model"].observe(store_started - model_started)
        self._latency["store"].observe(done - store_started)

        started_sessions = 0
        for plan, ok, start in zip(plans, written, starts, strict=True):
            if not ok:
                self.metrics.state_conflicts.inc()
                err = ErrorInfo(
                    Code.ABORTED,
                    "state_conflict",
                    f"session {self._shown(plan.sid)!r} changed while its events were applied (ended, evicted or "
                    "written elsewhere); nothing was applied: resend from your last acknowledged seq",
                )
                self._settle(plan, err, None, 0)
                continue
            if plan.meta is None:
                started_sessions += 1
                self._count_tenant_session(plan.sid, +1)
            self._settle(plan, None, columns, start)
        if started_sessions:
            self.metrics.sessions_started.inc(started_sessions)
        if self.store.cheap_count:
            await self._update_session_gauges()

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        """Await a store call, observing its latency and counting its failure."""
        started = time.perf_counter()
        try:
            return await call
        except StoreUnavailableError:
            self.metrics.store_errors.labels(operation).inc()
            raise
        finally:
            self.metrics.store_latency.labels(operation).observe(time.perf_counter() - started)

    async def _update_session_gauges(self) -> None:
        n = await self.store.count()
        self.metrics.active_sessions.set(n)
        self.metrics.state_bytes.set(n * self.engine.description.state_bytes_per_session)

    def _reset_foreign_states(self, ids: list[str], loaded: LoadedBatch) -> None:
        """With ``on_model_mismatch=reset``: a state another model version wrote becomes a fresh state
        of this model; the session keeps its seq and time, so its client just goes on."""
        if self.settings.on_model_mismatch != "reset":
            return
        for u, meta in enumerate(loaded.metas):
            if meta is None or meta.model_version == self.engine.version:
                continue
            log.warning(
                "session %r was written by model %s; resetting it for %s",
                ids[u],
                meta.model_version,
                self.engine.version,
            )
            for name, row in self.store.layout.rows.items():
                loaded.tensors[name][u] = row
            loaded.metas[u] = dataclasses.replace(meta, model_version=self.engine.version)
            self.metrics.state_resets.inc()

    def _drop_non_finite(
        self, plans: list[_Plan], starts: list[int], rows: dict[str, torch.Tensor]
    ) -> tuple[list[_Plan], list[int]]:
        """Refuse sessions whose new state is not finite (a gap or value too large for float32), so
        that a numeric overflow is an error for its events and never a stored state."""
        floats = [t for t in rows.values() if t.is_floating_point()]
        if not floats:
            return plans, starts
        # One sum first: it is finite when every element is (a finite overflow of the sum only sends
        # us to the exact check below), and it costs a third of the ops of checking row by row.
        total = floats[0].sum()
        for t in floats[1:]:
            total = total + t.sum()
        if bool(torch.isfinite(total)):
            return plans, starts
        finite = torch.isfinite(floats[0].flatten(1)).all(dim=1)
        for t in floats[1:]:
            finite = finite & torch.isfinite(t.flatten(1)).all(dim=1)
        if bool(finite.all()):
            return plans, starts
        keep = finite.tolist()
        for plan, ok in zip(plans, keep, strict=True):
            if not ok:
                err = ErrorInfo(
                    Code.INVALID_ARGUMENT,
                    "numeric_overflow",
                    f"the events of session {self._shown(plan.sid)!r} overflow the model's float32 arithmetic (a "
                    "time gap or a value too large, e.g. above 3.4e38); expected ordinary magnitudes. Nothing was "
                    "applied",
                )
                self._settle(plan, err, None, 0)
        index = torch.tensor([i for i, ok in enumerate(keep) if ok], dtype=torch.long, device=finite.device)
        for k in rows:
            rows[k] = rows[k].index_select(0, index)
        kept = [i for i, ok in enumerate(keep) if ok]
        return [plans[i] for i in kept], [starts[i] for i in kept]

    def _settle(self, plan: _Plan, failed: ErrorInfo | None, columns: ForecastColumns | None, start: int) -> None:
        """Answer every event of ``plan`` in its order, once its state is stored (or failed to be).

        ``failed``: the store write failed, so applied events and duplicates of them get that error.
        The plan's forecasts are rows ``start, start + 1, ...`` of ``columns``.
        """
        if failed is None and len(plan.verdicts) == 1 and plan.forecast_at:  # the common case: one forecast
            run, i, event, _ = plan.verdicts[0]
            run.request.set(i, Forecast(event.session_id, event.seq, event.time, columns, start, run.request.top_k))  # type: ignore[arg-type]
            self._applied.inc()
            return
        wants = set(plan.forecast_at)
        row = start
        last_applied = plan.applied[-1][2].seq if plan.applied else 0
        pos = applied = duplicates = 0
        for run, i, event, verdict in plan.verdicts:
            outcome: Outcome
            if verdict is _APPLY:
                if failed is not None:
                    outcome = failed
                elif pos in wants:
                    outcome = Forecast(event.session_id, event.seq, event.time, columns, row, run.request.top_k)  # type: ignore[arg-type]
                    row += 1
                else:
                    outcome = Ack(event.seq, duplicate=False)
                pos += 1
            elif verdict is _DUPLICATE_OF_BATCH:
                outcome = failed if failed is not None else Ack(last_applied, duplicate=True)
            else:
                outcome = verdict  # type: ignore[assignment]
            if isinstance(outcome, ErrorInfo):
                self.count_rejection(outcome)
            elif verdict is _APPLY:
                applied += 1
            else:
                duplicates += 1
            run.request.set(i, outcome)
        if applied:
            self._applied.inc(applied)
        if duplicates:
            self._duplicates.inc(duplicates)

    def _plan_session(
        self, sid: str, runs: list[_Run], meta: SessionMeta | None, unit: int, allowance: dict[str, int] | None = None
    ) -> _Plan:
        """Classify the session's queued events, in order, against its stored state.

        The applied events' seqs are consecutive. A repeat of an event applied in this same batch
        is answered only after the batch is stored, like the original.
        """
        plan = _Plan(sid, meta, unit, [], [], [])
        if meta is not None and meta.model_version != self.engine.version:
            shown = self._shown(sid)
            err = ErrorInfo(
                Code.FAILED_PRECONDITION,
                "model_mismatch",
                f"session {shown!r} was built by model {meta.model_version!r}; this server runs "
                f"{self.engine.version!r}: end the session to start it again (or run the server with "
                "on_model_mismatch=reset)",
            )
            plan.verdicts = [(run, i, e, err) for run in runs for i, e in zip(run.indices, run.events, strict=True)]
            return plan
        stored_seq = last_seq = meta.last_seq if meta else 0
        last_time = meta.last_time if meta else -math.inf
        for run in runs:
            for i, event in zip(run.indices, run.events, strict=True):
                verdict: object
                if event.seq <= stored_seq:
                    verdict = Ack(stored_seq, duplicate=True)
                elif event.seq <= last_seq:
                    verdict = _DUPLICATE_OF_BATCH
                elif last_seq == 0 and event.seq > 1:
                    evicted = self.store.was_evicted(sid)
                    shown = self._shown(sid)
                    verdict = ErrorInfo(
                        Code.NOT_FOUND,
                        "session_evicted" if evicted else "session_not_found",
                        f"session {shown!r} has no state ("
                        + ("evicted after being idle or for capacity" if evicted else "never started, or ended")
                        + f"), so seq {event.seq} cannot apply; start it again with seq 1",
                    )
                elif last_seq == 0 and allowance and allowance[sid.partition("/")[0]] <= 0:
                    verdict = ErrorInfo(
                        Code.RESOURCE_EXHAUSTED,
                        "tenant_session_limit",
                        f"session {self._shown(sid)!r} cannot start: your tenant holds "
                        f"{self.settings.max_sessions_per_tenant} sessions, the most it may; end sessions you no "
                        "longer need",
                    )
                elif event.seq > last_seq + 1:
                    verdict = ErrorInfo(
                        Code.FAILED_PRECONDITION,
                        "seq_gap",
                        f"seq {event.seq} of session {self._shown(sid)!r} skips ahead: expected seq {last_seq + 1} "
                        f"(last applied seq is {last_seq})",
                    )
                elif event.time < last_time:
                    verdict = ErrorInfo(
                        Code.FAILED_PRECONDITION,
                        "time_before_last",
                        f"time {event.time} of session {self._shown(sid)!r} seq {event.seq} is earlier than its "
                        f"previous event's time {last_time}; expected a time >= {last_time}",
                    )
                else:
                    verdict = _APPLY
                    if last_seq == 0 and allowance:
                        allowance[sid.partition("/")[0]] -= 1  # this session starts: one less may
                    plan.applied.append((run, i, event))
                    last_seq, last_time = event.seq, event.time
                plan.verdicts.append((run, i, event, verdict))
        return plan

    def _shown(self, sid: str) -> str:
        """The session id as its client knows it (without the tenant)."""
        return sid.partition("/")[2] if self._tenancy else sid

    def _scoped(self, session_id: str, tenant: str) -> str:
        return f"{tenant}/{session_id}" if tenant else session_id

    async def _session_allowance(self, ids: list[str], metas: list[SessionMeta | None]) -> dict[str, int] | None:
        """How many sessions each tenant starting one in this batch may still start (its limit minus
        its sessions; counts of a slow store cached for TENANT_COUNT_TTL_S). None: no tenants."""
        if not self._tenancy:
            return None
        starting = {sid.partition("/")[0] for sid, meta in zip(ids, metas, strict=True) if meta is None}
        allowance: dict[str, int] = {}
        now = time.monotonic()
        for tenant in starting:
            cached = None if self.store.cheap_count else self._tenant_counts.get(tenant)
            if (
                cached is None
                or now - cached[0] > TENANT_COUNT_TTL_S
                or cached[1] >= self.settings.max_sessions_per_tenant
            ):
                try:
                    cached = (now, await self.store.count_group(tenant))
                except StoreUnavailableError:
                    cached = (now, 0)  # the load just worked; the save will tell if the store is gone
                self._tenant_counts[tenant] = cached
            allowance[tenant] = self.settings.max_sessions_per_tenant - cached[1]
        return allowance

    def _count_tenant_session(self, sid: str, change: int) -> None:
        """Keep a cached tenant count current with the sessions this server starts and ends."""
        if self._tenancy:
            tenant = sid.partition("/")[0]
            cached = self._tenant_counts.get(tenant)
            if cached is not None:
                self._tenant_counts[tenant] = (cached[0], max(0, cached[1] + change))

    def _fail_all(self, units: list[tuple[str, list[_Run]]], error: ErrorInfo) -> None:
        for _, runs in units:
            for run in runs:
                for i in run.indices:
                    self.count_rejection(error)
                    run.request.set(i, error)

    async def _sweep_loop(self) -> None:
        """Evict idle sessions now and then; refresh the session gauges of stores that count slowly."""
        period = min(max(self.settings.idle_ttl_s / 4, 0.05), 5.0)
        counted = -math.inf
        while True:
            await asyncio.sleep(period)
            try:
                swept = await self.store.sweep(time.time())
                # A slow count (Redis: a SCAN of every key) runs at most every SLOW_COUNT_PERIOD_S.
                slow_due = not self.store.cheap_count and time.monotonic() - counted >= SLOW_COUNT_PERIOD_S
                if swept or slow_due:
                    counted = time.monotonic()
                    await self._update_session_gauges()
            except StoreUnavailableError:
                self.metrics.store_errors.labels("sweep").inc()

    async def _get(self, session_id: str, tenant: str) -> tuple[SessionMeta, dict[str, torch.Tensor]]:
        """The session's stored state. Another tenant's session of the same id is a different key: it
        is never read, and its existence never shows (NOT_FOUND as for none)."""
        error = self._check_session_id(session_id)
        if error is not None:
            raise ServiceError(error.code, error.reason, error.message)
        key = self._scoped(session_id, tenant)
        try:
            found = await self._timed("get", self.store.get(key))
        except StoreUnavailableError as exc:
            raise ServiceError(Code.UNAVAILABLE, "store_unavailable", f"session store unavailable: {exc}") from exc
        if found is None:
            evicted = self.store.was_evicted(key)
            raise ServiceError(
                Code.NOT_FOUND,
                "session_evicted" if evicted else "session_not_found",
                f"session {session_id!r} "
                + ("was evicted (idle past the TTL or for capacity)" if evicted else "does not exist"),
            )
        meta, rows = found
        if meta.model_version != self.engine.version:
            raise ServiceError(
                Code.FAILED_PRECONDITION,
                "model_mismatch",
                f"session {session_id!r} was built by model {meta.model_version!r}; this server runs "
                f"{self.engine.version!r}",
            )
        return meta, rows

    async def forecast(
        self,
        session_id: str,
        *,
        horizon: int = 1,
        num_samples: int = 0,
        seed: int | None = None,
        top_k: int = 0,
        include_paths: bool = False,
        tenant: str = "",
    ) -> SampledFuture:
        """The session's exact next-event forecast; for ``horizon > 1`` also ``num_samples`` sampled
        futures of ``horizon`` events (0: the default count), summarized per step."""
        s = self.settings
        if horizon > s.max_horizon:
            raise ServiceError(
                Code.INVALID_ARGUMENT,
                "horizon_too_large",
                f"horizon {horizon} is too large; expected at most {s.max_horizon}",
            )
        if num_samples > s.max_num_samples:
            raise ServiceError(
                Code.INVALID_ARGUMENT,
                "num_samples_too_large",
                f"num_samples {num_samples} is too large; expected at most {s.max_num_samples}",
            )
        meta, rows = await self._get(session_id, tenant)
        k = top_k or s.default_top_k
        columns = await self._in_worker(self.engine.forecast_columns, rows["features"], k)
        forecast = Forecast(session_id, meta.last_seq, meta.last_time, columns, 0, k)
        if horizon <= 1:
            return SampledFuture(forecast, [], [], [], [])
        n = num_samples or s.default_num_samples
        gaps, marks, values = await self._in_worker(self.engine.sample, rows, horizon, n, seed)
        times = meta.last_time + torch.tensor(gaps, dtype=torch.float64).cumsum(dim=1)  # [S, H]
        levels = torch.tensor(self.engine.quantiles, dtype=torch.float64)
        quantiles = torch.quantile(times, levels, dim=0).T.tolist()  # [H, Q]
        mark_tensor = torch.tensor(marks)
        steps = []
        for h in range(horizon):
            freq = torch.bincount(mark_tensor[:, h], minlength=self.engine.description.num_marks).double() / n
            top = freq.topk(min(k, freq.numel()))
            seen = [(m, p) for m, p in zip(top.indices.tolist(), top.values.tolist(), strict=True) if p > 0]
            steps.append(StepSummary(h + 1, float(times[:, h].mean()), quantiles[h], seen))
        if not include_paths:
            return SampledFuture(forecast, steps, [], [], [])
        return SampledFuture(forecast, steps, times.tolist(), marks, values)

    async def get_session(self, session_id: str, include_state: bool = False, tenant: str = "") -> SessionView:
        meta, rows = await self._get(session_id, tenant)
        state = self.engine.state_of(rows)
        data = state.to_bytes(model_version=self.engine.version) if include_state else None
        return SessionView(
            session_id,
            meta,
            data,
            self.engine.description.state_bytes_per_session,
            meta.updated_at + self.settings.idle_ttl_s,
        )

    async def end_session(self, session_id: str, tenant: str = "") -> SessionMeta | None:
        error = self._check_session_id(session_id)
        if error is not None:
            raise ServiceError(error.code, error.reason, error.message)
        try:
            meta = await self._timed("delete", self.store.delete(self._scoped(session_id, tenant)))
        except StoreUnavailableError as exc:
            raise ServiceError(Code.UNAVAILABLE, "store_unavailable", f"session store unavailable: {exc}") from exc
        if meta is not None:
            self.metrics.sessions_ended.inc()
            self._count_tenant_session(self._scoped(session_id, tenant), -1)
            if self.store.cheap_count:
                await self._update_session_gauges()
        return meta
