"""The batcher: accepted requests in, batched model calls, outcomes out, on whole columns.

Accepted requests wait in one FIFO queue. A batch takes events from its head (up to
``max_batch_events`` events of at most ``max_batch_size`` sessions; a request may be split over
batches, in order), loads the sessions' state, checks every event against it (seq order, time
order, model version; for a model of regular steps, ``step_seconds > 0``, the step grid and the
longest gap it fills) in one compiled pass over the batch (the plan below), applies each session's
events in order in one batched model call (``EventTask.apply``: one step for sessions with one event,
the parallel scan for longer runs), writes the new state, and only then answers (docs/architecture.md:
acknowledgement means durable). Batches run one after another, so a session is in one batch at a time and its
events apply in order. Nothing here knows a protocol.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import enum
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from itertools import chain
from typing import Any, TypeVar

import numpy as np
import torch

from aaren.jit import compiled
from aaren.server.contract.columns import (
    ACK,
    DUPLICATE,
    ERROR,
    FORECAST,
    NEXT_SEQ,
    CoreRequest,
    Outcomes,
    OutputColumns,
)
from aaren.server.contract.errors import ErrorInfo, Reasons
from aaren.server.core.limits import TokenBucket
from aaren.server.observability.metrics import Metrics, observe_many
from aaren.server.settings import ServerSettings
from aaren.server.stores.base import LoadedBatch, Rows, SaveBatch, SessionStore, StoreUnavailableError, take_rows
from aaren.server.tasks.base import Task
from aaren.server.tasks.runs import CheckedRows, RunColumns

__all__ = ["Admission", "Batcher", "ModelContext", "Scope"]

log = logging.getLogger(__name__)
T = TypeVar("T")

TENANT_COUNT_TTL_S = 5.0


PENDING_RETRY_S = 0.1


# ------------------------------------------------------------------ one batch's plan, compiled
# A batch of ``E`` events of ``U`` sessions is planned in three passes, each one compiled call (numba)
# over plain columns, so that a batch costs a handful of calls whatever its size (a batch of one event
# paid a hundred-odd numpy calls of about a microsecond each when each check was an array expression of
# its own); they live here, beside their one user, so that an event's path does not leave for them:
#
# - ``plan_verdicts``: each event against its session's state, in batch order, the state moving with
#   each applied event (docs/architecture.md section 3, "Validation"): a seq that duplicates the stored
#   state or an event applied earlier in this batch, a seq gap, a time before the session's last, a
#   model version mismatch, and for a model of regular steps the step grid and the longest gap it
#   fills. One loop serves sessions with one event and sessions with many alike.
# - ``plan_runs``: the applied events grouped by session (each session's in order), the gap of each
#   event since its session's previous one, which events get a forecast.
# - ``plan_outcomes``: what became of each event once the states are stored (or a session's run failed).
#
# Only codes and numbers come out; the batcher turns the rare error codes into the catalogue's errors.

# Verdicts, per event of a batch.
APPLY, DUP, DUP_OF_BATCH, ERR = 0, 1, 2, 3
#: How far an event of a model of regular steps may be from its session's grid (seconds).
GRID_TOLERANCE_S = 1e-3


class Why(enum.IntEnum):
    """Why ``plan_verdicts`` refused an event (``reason [E]``; 0 where it did not)."""

    NONE = 0
    MODEL_MISMATCH = 1
    SESSION_MISSING = 2
    SEQ_GAP = 3
    TIME_BEFORE_LAST = 4
    OFF_GRID = 5
    GAP_TOO_LONG = 6


@compiled
def _grid_check(dt: float, step: float, max_gap_steps: int) -> int:
    """The grid check of an event ``dt`` seconds after its session's previous one, for a model of step
    ``D = step``: with ``k = round(dt / D) - 1`` missing steps, ``OFF_GRID`` where
    ``|dt - (k + 1) D| > GRID_TOLERANCE_S`` or ``k < 0``, else ``GAP_TOO_LONG`` where ``k > max_gap_steps``,
    else 0 (on the grid)."""
    steps = np.rint(dt / step)
    if steps < 1 or abs(dt - steps * step) > GRID_TOLERANCE_S:
        return Why.OFF_GRID
    if steps - 1 > max_gap_steps:
        return Why.GAP_TOO_LONG
    return Why.NONE


@compiled
def plan_verdicts(
    sess: np.ndarray,
    seq: np.ndarray,
    times: np.ndarray,
    stored_seq: np.ndarray,
    stored_time: np.ndarray,
    foreign: np.ndarray,
    step: float,
    max_gap_steps: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None, np.ndarray | None, int]:
    """The verdict of each event ``i`` of session ``sess[i]`` (``[E]``, batch order) against the stored
    columns ``[U]`` (``stored_seq``, ``stored_time``: the last applied seq and time, 0 and -inf for a
    session without state; ``foreign``: written by another model version), each applied event moving
    its session's seq and time on for the events after it. ``step > 0``: a model of regular steps.

    Returns ``seq [E]`` with ``NEXT_SEQ`` (0) resolved to the seq after the session's last applied one
    (a copy), ``verdict [E]`` (``APPLY``, ``DUP``, ``DUP_OF_BATCH``, ``ERR``), ``reason [E]`` (``Why``),
    ``dup_seq [E]`` (a duplicate's acknowledged seq: the stored one), what a refusal compared with:
    ``ref_seq [E]``, ``ref_time [E]`` (the session's last applied seq and time at that event), and the
    number refused. ``reason``, ``ref_seq`` and ``ref_time`` are None where none was refused (numba hands
    each array it returns to Python through a lookup of its type, some 3,000 instructions; a None costs
    nothing)."""
    n = sess.shape[0]
    out_seq = seq.astype(np.int64)
    verdict = np.zeros(n, np.int8)
    reason = np.zeros(n, np.int8)
    dup_seq = np.zeros(n, np.int64)
    ref_seq = np.zeros(n, np.int64)
    ref_time = np.zeros(n, np.float64)
    cur_seq = stored_seq.astype(np.int64)
    cur_time = stored_time.astype(np.float64)
    refused = 0
    for i in range(n):
        u = sess[i]
        s = out_seq[i]
        t = times[i]
        last = cur_seq[u]
        ref_seq[i] = last
        ref_time[i] = cur_time[u]
        why = Why.NONE
        if foreign[u]:
            why = Why.MODEL_MISMATCH
        else:
            if s == NEXT_SEQ and last > 0:
                s = last + 1
                out_seq[i] = s
            if s == NEXT_SEQ or (last == 0 and s > 1):
                why = Why.SESSION_MISSING
            elif s <= stored_seq[u]:
                verdict[i] = DUP
                dup_seq[i] = stored_seq[u]
            elif s <= last:
                verdict[i] = DUP_OF_BATCH
            elif s > last + 1:
                why = Why.SEQ_GAP
            elif t < cur_time[u]:
                why = Why.TIME_BEFORE_LAST
            else:
                if last > 0 and step > 0:
                    why = _grid_check(t - cur_time[u], step, max_gap_steps)
                if why == Why.NONE:
                    cur_seq[u] = s
                    cur_time[u] = t
        if why != Why.NONE:
            verdict[i] = ERR
            reason[i] = why
            refused += 1
    if not refused:
        return out_seq, verdict, None, dup_seq, None, None, refused
    return out_seq, verdict, reason, dup_seq, ref_seq, ref_time, refused


@compiled
def plan_runs(
    verdict: np.ndarray,
    sess: np.ndarray,
    times: np.ndarray,
    exists: np.ndarray,
    stored_time: np.ndarray,
    piece_counts: np.ndarray,
    last_only: np.ndarray,
    n_sessions: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """The applied events (``verdict == APPLY``) of a batch of ``E`` events of ``n_sessions`` sessions as
    runs, one per session with applied events, in order of their sessions' codes (each run's events in
    batch order).

    ``piece_counts [P]``: the events of each piece (request) of the batch, one after another;
    ``last_only [P]``: whether a piece wants the forecast of each session's last applied event only
    (the others are acknowledged).

    Returns ``by_event [2, A]``: ``applied`` (batch positions, grouped by run) and ``run_of`` (each one's
    run); ``by_run [4, R]``: ``starts``, ``lengths``, ``run_sess`` (each run's session) and ``ends`` (each
    run's last event, an index into ``applied``); ``dt [A]`` (each event's gap since its session's previous
    one: the stored last time for a run's first event of a session with state, else 0), ``want [A]``, and
    whether ``applied`` is every event in batch order (``0..E-1``: the batch's columns serve as the runs' as
    they are). The int columns come as two arrays, not six: numba hands each array it returns to Python
    through a lookup of its type (some 3,000 instructions); a row of one of them costs a few hundred."""
    n = sess.shape[0]
    piece_of = np.empty(n, np.int64)
    at = 0
    for p in range(piece_counts.shape[0]):
        piece_of[at : at + piece_counts[p]] = p
        at += piece_counts[p]
    count = np.zeros(n_sessions + 1, np.int64)
    n_applied = 0
    for i in range(n):
        if verdict[i] == APPLY:
            count[sess[i] + 1] += 1
            n_applied += 1
    n_runs = 0
    for u in range(n_sessions):
        if count[u + 1] > 0:
            n_runs += 1
        count[u + 1] += count[u]
    by_event = np.empty((2, n_applied), np.int64)
    applied, run_of = by_event[0], by_event[1]
    for i in range(n):
        if verdict[i] == APPLY:
            u = sess[i]
            applied[count[u]] = i
            count[u] += 1
    by_run = np.empty((4, n_runs), np.int64)
    starts, lengths, run_sess, ends = by_run[0], by_run[1], by_run[2], by_run[3]
    dt = np.empty(n_applied, np.float64)
    want = np.ones(n_applied, np.bool_)
    r = -1
    for a in range(n_applied):
        i = applied[a]
        u = sess[i]
        if a == 0 or sess[applied[a - 1]] != u:
            r += 1
            starts[r] = a
            lengths[r] = 0
            run_sess[r] = u
            dt[a] = times[i] - stored_time[u] if exists[u] else 0.0
        else:
            dt[a] = times[i] - times[applied[a - 1]]
            p = piece_of[applied[a - 1]]
            if last_only[p] and piece_of[i] == p:
                want[a - 1] = False
        lengths[r] += 1
        ends[r] = a
        run_of[a] = r
    in_order = n_applied == n
    for a in range(n_applied):
        if applied[a] != a:
            in_order = False
            break
    return by_event, by_run, dt, want, in_order


@compiled
def plan_outcomes(
    verdict: np.ndarray,
    sess: np.ndarray,
    seq: np.ndarray,
    dup_seq: np.ndarray,
    applied: np.ndarray,
    want: np.ndarray,
    run_of: np.ndarray,
    run_sess: np.ndarray,
    ends: np.ndarray,
    ok_run: np.ndarray,
    n_sessions: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, int, int, int]:
    """What became of each of a batch's ``E`` events, the runs where ``ok_run [R]`` is false failed.

    Returns ``kind [E]`` (``FORECAST``, ``ACK``, ``DUPLICATE``, ``ERROR``), ``last_seq [E]`` (an ack's or a
    duplicate's seq), ``forecast_row [E]`` (the row of its forecast among the outputs of the wanted
    applied events, which the task made in the order of ``applied``; -1: none), ``failed_run [E]`` (the
    run whose failure is the event's error; -1: none; None where no event's run failed), the numbers applied
    and duplicate, and the rows of those outputs."""
    n = sess.shape[0]
    kind = np.full(n, ERROR, np.int8)
    last_seq = np.zeros(n, np.int64)
    forecast_row = np.full(n, -1, np.int64)
    failed_run = np.full(n, -1, np.int64)
    n_applied = 0
    n_dups = 0
    row = 0
    failed = False
    for a in range(applied.shape[0]):
        i = applied[a]
        r = run_of[a]
        if ok_run[r]:
            last_seq[i] = seq[i]
            n_applied += 1
            if want[a]:
                kind[i] = FORECAST
                forecast_row[i] = row
            else:
                kind[i] = ACK
        else:
            failed_run[i] = r
            failed = True
        if want[a]:
            row += 1
    run_of_sess = np.full(n_sessions, -1, np.int64)
    for r in range(run_sess.shape[0]):
        run_of_sess[run_sess[r]] = r
    for i in range(n):
        v = verdict[i]
        if v == DUP:
            kind[i] = DUPLICATE
            last_seq[i] = dup_seq[i]
            n_dups += 1
        elif v == DUP_OF_BATCH:  # as its session's run went
            r = run_of_sess[sess[i]]
            if r >= 0 and ok_run[r]:
                kind[i] = DUPLICATE
                last_seq[i] = seq[applied[ends[r]]]
                n_dups += 1
            elif r >= 0:
                failed_run[i] = r
                failed = True
    if not failed:
        return kind, last_seq, forecast_row, None, n_applied, n_dups, row
    return kind, last_seq, forecast_row, failed_run, n_applied, n_dups, row


@compiled
def rows_finite(views: Any) -> tuple[np.ndarray, int]:
    """Which rows ``r`` of a batch's new state are finite in every field: ``views`` is a tuple of its float
    fields as ``[R, n]`` arrays of one dtype and layout. Returns ``finite [R]`` and how many are not (a numeric
    overflow is an error for its session's events, never a stored state)."""
    n_rows = views[0].shape[0]
    finite = np.ones(n_rows, np.bool_)
    for v in views:
        for r in range(n_rows):
            if finite[r]:
                row = v[r]
                for j in range(row.shape[0]):
                    if not np.isfinite(row[j]):
                        finite[r] = False
                        break
    bad = 0
    for r in range(n_rows):
        if not finite[r]:
            bad += 1
    return finite, bad


def warm_plan() -> None:
    """Compile (or load from numba's cache) every pass now, on a batch of one event, so that no request
    pays for it: the engine core calls this as it starts."""
    one, zero, time = np.zeros(1, np.int64), np.zeros(1, np.bool_), np.zeros(1)
    out_seq, verdict, _, dup_seq, *_ = plan_verdicts(one, one + 1, time, one, time, zero, 0.0, 0)
    runs = _Runs.of(plan_runs(verdict, one, time, zero, time, one + 1, zero, 1))
    plan_outcomes(
        verdict, one, out_seq, dup_seq, runs.applied, runs.want, runs.run_of, runs.run_sess, runs.ends,
        np.ones(1, np.bool_), 1,
    )  # fmt: skip
    rows_finite((np.zeros((1, 1), np.float32),))


class Admission:
    """What may be accepted now, shared by every model's batcher: the events accepted and not yet
    answered (the whole server and per tenant), the tenants' event rates (a token bucket each) and
    open streams, and whether the server drains. A refusal is an ``ErrorInfo`` from the catalogue
    with a retry hint; nothing of a refused request is accepted."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.pending = 0
        self.tenant_pending: Counter[str] = Counter()
        self.tenant_pending_limit = max(1, settings.max_pending_events // 2)
        self._buckets: dict[str, TokenBucket] = {}
        self.tenant_streams: Counter[str] = Counter()
        #: Set when the server drains: new events are refused (``shutting_down``).
        self.draining = False

    def refusal(self, n: int, tenant: str) -> ErrorInfo | None:
        """Why a request of ``n`` events of ``tenant`` may not be accepted now (None: it may)."""
        s = self.settings
        if self.pending + n > s.max_pending_events:
            message = f"the server has {self.pending} events pending (at most {s.max_pending_events})"
            return Reasons.over_limit("server_busy", message, PENDING_RETRY_S)
        if tenant and self.tenant_pending[tenant] + n > self.tenant_pending_limit:
            message = (
                f"tenant {tenant!r} has {self.tenant_pending[tenant]} events pending "
                f"(at most {self.tenant_pending_limit})"
            )
            return Reasons.over_limit("tenant_pending_limit", message, PENDING_RETRY_S)
        if s.tenant_events_per_s > 0:
            bucket = self._buckets.get(tenant)
            if bucket is None:
                bucket = self._buckets[tenant] = TokenBucket(s.tenant_events_per_s, s.tenant_burst_events)
            wait = bucket.take(n)
            if wait > 0:
                message = (
                    f"tenant {tenant or '(default)'!r} is over its event rate ({s.tenant_events_per_s:g} events/s, "
                    f"bursts of {s.tenant_burst_events})"
                )
                return Reasons.over_limit("tenant_rate_limited", message, wait)
        return None

    def admit(self, n: int, valid: int, tenant: str) -> ErrorInfo | None:
        """Refuse a request of ``n`` events of ``tenant`` (``refusal``), or count its ``valid`` events
        as pending until ``answered``: one call per request, its check and its count together."""
        refusal = self.refusal(n, tenant)
        if refusal is None and valid:
            self.pending += valid
            if tenant:
                self.tenant_pending[tenant] += valid
        return refusal

    def answered(self, n: int, tenant: str) -> None:
        self.pending -= n
        if tenant:
            left = self.tenant_pending[tenant] - n
            if left:
                self.tenant_pending[tenant] = left
            else:
                del self.tenant_pending[tenant]

    def open_stream(self, tenant: str) -> ErrorInfo | None:
        """Count a new stream of ``tenant``, or refuse it (``tenant_stream_limit``)."""
        open_now = self.tenant_streams[tenant]
        if open_now >= self.settings.max_streams_per_tenant:
            return Reasons.tenant_stream_limit(open_now, self.settings.max_streams_per_tenant)
        self.tenant_streams[tenant] = open_now + 1
        return None

    def close_stream(self, tenant: str) -> None:
        left = self.tenant_streams[tenant] - 1
        if left > 0:
            self.tenant_streams[tenant] = left
        else:
            self.tenant_streams.pop(tenant, None)


@dataclasses.dataclass(frozen=True)
class Scope:
    """Session keys: ``<tenant>/<session_id>`` when tenants are on, else the session id."""

    tenancy: bool

    def key(self, session_id: str, tenant: str) -> str:
        return f"{tenant}/{session_id}" if tenant else session_id

    def shown(self, key: str) -> str:
        """The session id as its client knows it (without the tenant)."""
        return key.partition("/")[2] if self.tenancy else key

    @staticmethod
    def tenant_of(key: str) -> str:
        return key.partition("/")[0]


class _PendingRequest:
    """An accepted request. A request settled by one piece of one batch (the common case) is answered
    with views of that batch's columns; one split over batches, or with events refused before the
    core, fills its own outcome columns (``settle``), made when first needed."""

    __slots__ = (
        "chunks",
        "errors",
        "keys",
        "kind",
        "last_seq",
        "on_done",
        "queued",
        "received",
        "remaining",
        "request",
        "taken",
    )

    def __init__(self, request: CoreRequest, keys: list[str], on_done: Callable[[Outcomes], None]) -> None:
        self.request = request
        self.keys = keys
        self.taken = 0
        self.remaining = len(keys)
        self.kind: np.ndarray | None = None
        self.last_seq: np.ndarray | None = None
        self.errors = dict(request.errors) if request.errors else {}
        self.chunks: list[tuple[np.ndarray, OutputColumns]] = []
        self.on_done = on_done
        self.received = time.perf_counter()
        self.queued = False

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """The request's own ``kind [n]`` and ``last_seq [n]`` (made on first use: every event an error)."""
        if self.kind is None or self.last_seq is None:
            n = self.request.n
            self.kind = np.full(n, ERROR, dtype=np.int8)
            self.last_seq = np.zeros(n, dtype=np.int64)
        return self.kind, self.last_seq

    def settle(self, start: int, count: int, decided: _Decided, at: int, errors: dict[int, ErrorInfo]) -> None:
        """Write the outcomes of its events ``start : start + count`` (the batch's ``at : at + count``;
        ``errors`` by offset in the piece) into the request's own columns."""
        positions = self.request.index[start : start + count]
        kind, last_seq = self.columns()
        end = at + count
        kind[positions] = decided.kind[at:end]
        last_seq[positions] = decided.last_seq[at:end]
        for j, error in errors.items():
            self.errors[int(positions[j])] = error
        if decided.outputs is not None:
            rows = decided.forecast_row[at:end]
            has = rows >= 0
            if has.any():
                self.chunks.append((positions[has], decided.outputs.take(rows[has])))

    def outcomes(self) -> Outcomes:
        outputs: OutputColumns | None
        if len(self.chunks) == 1:
            index, outputs = self.chunks[0]
        elif not self.chunks:
            index, outputs = _NO_INDEX, None
        else:  # forecasts from several batches: put them in event order
            index = np.concatenate([c[0] for c in self.chunks])
            order = np.argsort(index, kind="stable")
            index = index[order]
            outputs = type(self.chunks[0][1]).concat([c[1] for c in self.chunks]).take(order)
        kind, last_seq = self.columns()
        return Outcomes(kind, last_seq, self.errors, index, outputs)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


#: The forecast index of no forecast, and of a one-event request's forecast (shared: never written).
_NO_INDEX = _frozen(np.zeros(0, np.int64))
_FIRST_INDEX = _frozen(np.zeros(1, np.int64))


@dataclasses.dataclass(frozen=True)
class ModelContext:
    """What every part of the engine core holds for one served model: its task, its sessions' store,
    the server's settings and metrics, and how session keys are scoped."""

    task: Task
    store: SessionStore
    settings: ServerSettings
    metrics: Metrics
    scope: Scope


class Batcher:
    """Owns the queue and runs the batches (see the module docstring)."""

    def __init__(self, context: ModelContext, admission: Admission) -> None:
        self.task = task = context.task
        self.store = store = context.store
        self.settings = settings = context.settings
        self.metrics = metrics = context.metrics
        self.scope = context.scope
        self.admission = admission
        self._queue: deque[_PendingRequest] = deque()
        self._queued_events = 0
        self._wakeup = asyncio.Event()
        self._in_worker: Callable[..., Awaitable[object]] | None = None
        self._tenant_counts: dict[str, tuple[float, int]] = {}
        self._counted = self._since_count = 0
        self._io_pause = settings.io_pause_ms / 1000
        name = task.description.name
        both = _TotalAndModelCounter
        self._applied = both(metrics.events.labels("applied"), metrics.model_events.labels(name, "applied"))
        self._duplicates = both(metrics.events.labels("duplicate"), metrics.model_events.labels(name, "duplicate"))
        self._rejected = both(metrics.events.labels("rejected"), metrics.model_events.labels(name, "rejected"))
        self._model_sessions = metrics.model_sessions.labels(name)
        #: Sessions of this model held (the last count plus this server's starts and ends since).
        self.sessions_held = 0
        #: A tenant's sessions (all models': the engine core sets it); default: this store's.
        self.count_tenant_sessions: Callable[[str], Awaitable[int]] = store.count_group
        #: Whether that count is cheap (exact every time) rather than cached for TENANT_COUNT_TTL_S.
        self.cheap_tenant_count = store.cheap_count
        self._by_reason: dict[str, object] = {}
        self._latency = {phase: metrics.event_latency.labels(phase) for phase in ("queue", "model", "store", "total")}
        self._store_latency: dict[str, Any] = {}
        #: Every forecast ranks every mark (or class); front ends keep a request's top_k.
        self._top_k = task.description.ranked
        #: A model of regular steps (``step_seconds > 0``): its step and the most missing steps it fills.
        self._step_s = float(task.description.step_seconds)
        self._max_gap_steps = int(task.description.max_gap_steps)
        # The finiteness check of a batch's rows (the paths without the kernel's own) is compiled for a tuple
        # of this model's float fields: compiled (or loaded) now, not on the first history or torch batch.
        _finite_rows(store.layout.empty(1))

    def set_worker(self, run: Callable[..., Awaitable[object]]) -> None:
        """Run model calls with ``run(fn, *args)`` (a worker thread) instead of on the event loop."""
        self._in_worker = run

    # ------------------------------------------------------------------ accepting

    def submit(self, request: CoreRequest, on_done: Callable[[Outcomes], None]) -> None:
        """Accept ``request`` for this model (``CoreAPI.submit``): ``on_done(outcomes)`` is called once,
        after the state of its applied events is stored. A request over a limit (its size, the
        server's or the tenant's pending events, the tenant's event rate) is refused whole, at once:
        ``outcomes.request_error`` says why and when a retry may pass; during a drain every event is
        refused (``shutting_down``)."""
        n = request.n
        admission = self.admission
        if n > self.settings.max_events_per_request:
            refusal: ErrorInfo | None = Reasons.too_many_events(n, self.settings.max_events_per_request)
        elif admission.draining and n:
            error = Reasons.shutting_down()
            self.count_rejection(error, n)
            on_done(Outcomes.all_errors(n, dict.fromkeys(range(n), error)))
            return
        elif n:
            refusal = admission.admit(n, len(request.events.session_ids), request.tenant)
            if refusal is not None:
                self.metrics.limit_refusals.labels(refusal.reason).inc()
        else:
            refusal = None
        if refusal is not None:
            self.count_rejection(refusal, n)
            on_done(Outcomes.refused(refusal))
            return
        self._enqueue(request, on_done)

    def _enqueue(self, request: CoreRequest, on_done: Callable[[Outcomes], None]) -> None:
        """Queue an admitted request's valid events (``Admission.admit`` counted them); ``on_done`` gets
        its outcomes once every event is answered (at once when none is valid)."""
        keys = request.events.session_ids
        if request.tenant:
            prefix = request.tenant + "/"
            keys = [prefix + s for s in keys]
        accepted = _PendingRequest(request, keys, on_done)
        for error in request.errors.values():
            self.count_rejection(error)
        if not keys:
            self._answer(accepted)
            return
        self._queue.append(accepted)
        self._queued_events += len(keys)
        self._wakeup.set()

    def _answer(
        self, accepted: _PendingRequest, took: list[float] | None = None, outcomes: Outcomes | None = None
    ) -> None:
        """Hand ``accepted`` its outcomes (``outcomes``, else its own columns'), its total latency observed
        now or, with ``took``, appended there for the batch to observe at once (``observe_many``)."""
        if outcomes is None:
            outcomes = accepted.outcomes()
        latency = time.perf_counter() - accepted.received
        if took is None:
            self._latency["total"].observe(latency)
        else:
            took.append(latency)
        try:
            accepted.on_done(outcomes)
        except asyncio.InvalidStateError:
            pass  # a future whose call was cancelled meanwhile: nobody waits for the answer
        except Exception:  # the caller's failure to deliver must not fail the batch that stored it
            log.exception("delivering the answer of a request failed")

    def count_rejection(self, error: ErrorInfo, n: int = 1) -> None:
        """Count ``n`` rejected events by reason (also those refused before the core)."""
        self._rejected.inc(n)
        child = self._by_reason.get(error.reason)
        if child is None:
            child = self._by_reason[error.reason] = self.metrics.rejections.labels(error.reason)
        child.inc(n)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            # Always yield once: front ends then queue what has arrived while the last batch ran.
            # Busy (a full batch waits): pause briefly so that gRPC's poller thread gets the GIL and
            # delivers reads and writes; with a bare yield, back-to-back batches serve streams unevenly.
            s = self.settings
            busy = self._queued_events >= s.max_batch_events or len(self._queue) >= s.max_batch_size
            await asyncio.sleep(self._io_pause if busy else s.max_batch_wait_ms / 1000)
            batch = self._take()
            if not self._queue:
                self._wakeup.clear()
            if batch is None:
                continue
            pieces = batch.pieces
            try:
                await self._run_batch(batch)
            except Exception:  # a bug must not stop the service: fail this batch's unanswered events only
                log.exception("batch of %d requests failed", len(pieces))
                self._fail_pieces(pieces, Reasons.batch_aborted())
            finally:
                for accepted, _, count in pieces:
                    self.admission.answered(count, accepted.request.tenant)

    def _take(self) -> _Batch | None:
        """The next batch from the head of the queue: pieces ``(request, start, count)`` of at most
        ``max_batch_events`` events of at most ``max_batch_size`` sessions. Once the events taken could hold
        ``max_batch_size`` sessions, their sessions are counted before each further piece, and none is taken
        once they are that many: under load (64 streams of 64-session messages, 4,096 events queued) a batch
        coded and cut 2,048 events' keys to keep 256 sessions' and queued the rest again."""
        s = self.settings
        pieces: list[tuple[_PendingRequest, int, int]] = []
        budget = s.max_batch_events
        queue = self._queue
        distinct: dict[str, None] | None = None  # the sessions of the pieces taken, once they are counted
        taken = 0
        while queue and budget > 0:
            if taken >= s.max_batch_size:
                if distinct is None:
                    distinct = dict.fromkeys(_piece_keys(pieces))
                if len(distinct) >= s.max_batch_size:
                    break
            head = queue[0]
            start = head.taken
            count = min(len(head.keys) - start, budget)
            pieces.append((head, start, count))
            if distinct is not None:
                distinct.update(dict.fromkeys(head.keys[start : start + count]))
            head.taken += count
            budget -= count
            taken += count
            if head.taken == len(head.keys):
                queue.popleft()
        self._queued_events -= s.max_batch_events - budget
        if not pieces:
            return None
        keys = _piece_keys(pieces)
        sess, ids = code_sessions(keys, distinct)
        if len(ids) > s.max_batch_size:
            cut = int(np.argmax(sess == s.max_batch_size))
            pieces = self._requeue_beyond(pieces, cut)
            keys, sess, ids = keys[:cut], sess[:cut], ids[: s.max_batch_size]
        return _Batch(pieces, keys, sess, ids)

    def _requeue_beyond(
        self, pieces: list[tuple[_PendingRequest, int, int]], keep: int
    ) -> list[tuple[_PendingRequest, int, int]]:
        """Keep the first ``keep`` events of ``pieces``; the rest go back to the head of the queue."""
        kept: list[tuple[_PendingRequest, int, int]] = []
        returned: list[_PendingRequest] = []
        for accepted, start, count in pieces:
            use = max(0, min(count, keep))
            keep -= use
            if use:
                kept.append((accepted, start, use))
            if use < count:
                if accepted.taken == len(accepted.keys):
                    returned.append(accepted)  # it had left the queue
                accepted.taken = start + use
                self._queued_events += count - use
        for accepted in reversed(returned):
            if not self._queue or self._queue[0] is not accepted:
                self._queue.appendleft(accepted)
        self._wakeup.set()
        return kept

    def _fail_pieces(self, pieces: list[tuple[_PendingRequest, int, int]], error: ErrorInfo) -> None:
        for accepted, start, count in pieces:
            if accepted.remaining <= 0:
                continue  # answered before the failure
            index = accepted.request.index[start : start + count]
            kind = accepted.columns()[0]
            still = [int(i) for i in index if int(i) not in accepted.errors and kind[i] == ERROR]
            for i in still:
                accepted.errors[i] = error
            if still:
                self.count_rejection(error, len(still))
            self._finish_piece(accepted, count)

    def _finish_piece(self, accepted: _PendingRequest, count: int, took: list[float] | None = None) -> None:
        accepted.remaining -= count
        if accepted.remaining == 0:
            self._answer(accepted, took)

    # ------------------------------------------------------------------ one batch

    async def _run_batch(self, batch: _Batch) -> None:
        pieces, sess, ids = batch.pieces, batch.sess, batch.ids
        started = time.perf_counter()
        waited = []
        for accepted, _, _ in pieces:
            if not accepted.queued:  # once per request: its events arrived together
                accepted.queued = True
                waited.append(started - accepted.received)
        observe_many(self._latency["queue"], waited)
        events = _BatchEvents.of(pieces)

        try:
            loaded = await self.timed("load", self.store.load(ids))
        except StoreUnavailableError as exc:
            self._fail_pieces(pieces, Reasons.store_unavailable(exc))
            return
        stored = _StoredColumns.of(loaded, self.task.version)
        self._reset_foreign_states(ids, loaded, stored)

        seq, verdict, errors, dup_seq = await self._verdicts(ids, sess, events.seq, events.time, stored)
        work = _BatchInFlight(pieces, events, ids, sess, seq, stored, loaded, verdict, dup_seq, errors)
        self._settle(pieces, await self._apply(work), errors)

    async def _verdicts(
        self, ids: list[str], sess: np.ndarray, seq: np.ndarray, times: np.ndarray, stored: _StoredColumns
    ) -> tuple[np.ndarray, np.ndarray, dict[int, ErrorInfo], np.ndarray]:
        """Each event's verdict against its session's stored state, in order (``plan_verdicts``: the
        applied events' seqs are consecutive per session), the tenants' session limits applied.
        Returns the seqs with ``NEXT_SEQ`` resolved (a copy), verdicts ``[E]``, errors by batch
        position, and the last seq a duplicate is acknowledged with ``[E]``."""
        seq, verdict, reason, dup_seq, ref_seq, ref_time, refused = plan_verdicts(
            sess, seq, times, stored.last_seq, stored.last_time, stored.foreign,
            self._step_s, self._max_gap_steps,
        )  # fmt: skip
        errors: dict[int, ErrorInfo] = {}
        if refused:
            for i in np.flatnonzero(reason).tolist():
                u = int(sess[i])
                errors[i] = self._refusal(
                    int(reason[i]), ids[u], int(seq[i]), float(times[i]), int(ref_seq[i]), float(ref_time[i]), stored, u
                )
        allowance = await self._session_allowance(ids, stored, sess, verdict)
        if allowance is not None:
            self._limit_new_sessions(ids, sess, seq, stored, verdict, errors, allowance)
        return seq, verdict, errors, dup_seq

    def _refusal(
        self, why: int, key: str, seq: int, time: float, ref_seq: int, ref_time: float, stored: _StoredColumns, u: int
    ) -> ErrorInfo:
        """The catalogue's error for an event ``plan_verdicts`` refused (``why``: a ``Why``), which
        it compared with its session's last applied seq and time ``ref_seq``, ``ref_time``."""
        shown = self.scope.shown(key)
        if why == Why.MODEL_MISMATCH:
            return Reasons.model_mismatch(shown, stored.version_of(u), self.task.version)
        if why == Why.SESSION_MISSING:
            return Reasons.session_missing(shown, seq, self.store.was_evicted(key))
        if why == Why.SEQ_GAP:
            return Reasons.seq_gap(shown, seq, ref_seq)
        if why == Why.TIME_BEFORE_LAST:
            return Reasons.time_before_last(shown, seq, time, ref_time)
        if why == Why.OFF_GRID:
            return Reasons.time_off_step_grid(shown, seq, time, ref_time, self._step_s)
        missing = round((time - ref_time) / self._step_s) - 1
        return Reasons.gap_too_long(shown, seq, time, ref_time, missing, self._max_gap_steps)

    async def _session_allowance(
        self, ids: list[str], stored: _StoredColumns, sess: np.ndarray, verdict: np.ndarray
    ) -> dict[str, int] | None:
        """How many sessions each tenant starting one in this batch may still start (its limit minus
        its sessions; counts of a slow store cached for TENANT_COUNT_TTL_S). None: no tenants, or
        no session starts."""
        if not self.scope.tenancy:
            return None
        starting_sessions = np.unique(sess[(verdict == APPLY) & ~stored.exists[sess]])
        if not len(starting_sessions):
            return None
        tenants = {Scope.tenant_of(ids[u]) for u in starting_sessions.tolist()}
        allowance: dict[str, int] = {}
        now = time.monotonic()
        limit = self.settings.max_sessions_per_tenant
        for tenant in tenants:
            cached = None if self.cheap_tenant_count else self._tenant_counts.get(tenant)
            if cached is None or now - cached[0] > TENANT_COUNT_TTL_S or cached[1] >= limit:
                try:
                    cached = (now, await self.count_tenant_sessions(tenant))
                except StoreUnavailableError:
                    cached = (now, 0)  # the load just worked; the save will tell if the store is gone
                self._tenant_counts[tenant] = cached
            allowance[tenant] = limit - cached[1]
        return allowance

    def _limit_new_sessions(
        self,
        ids: list[str],
        sess: np.ndarray,
        seq: np.ndarray,
        stored: _StoredColumns,
        verdict: np.ndarray,
        errors: dict[int, ErrorInfo],
        allowance: dict[str, int],
    ) -> None:
        """Refuse the sessions a tenant may not start, in order of first appearance: the refused
        first event changed nothing, so the session's later events find no session."""
        decided: dict[int, bool] = {}
        limit = self.settings.max_sessions_per_tenant
        candidates = (verdict == APPLY) | (verdict == DUP_OF_BATCH)
        for i in np.flatnonzero(candidates & ~stored.exists[sess]).tolist():
            u = int(sess[i])
            starts = decided.get(u)
            if starts is None:
                tenant = Scope.tenant_of(ids[u])
                starts = decided[u] = allowance[tenant] > 0
                if starts:
                    allowance[tenant] -= 1
            if not starts:
                key = ids[u]
                verdict[i] = ERR
                if int(seq[i]) == 1:
                    errors[i] = Reasons.tenant_session_limit(self.scope.shown(key), limit)
                else:
                    errors[i] = Reasons.session_missing(self.scope.shown(key), int(seq[i]), self.store.was_evicted(key))

    async def _apply(self, work: _BatchInFlight) -> _Decided:
        """Run the model on the applied events, store the new states, and decide every event's outcome
        (``plan_outcomes``); the errors of failed runs go into ``work.errors``."""
        pieces, ids, sess, stored = work.pieces, work.ids, work.sess, work.stored
        counts = np.array([c for _, _, c in pieces], dtype=np.int64)
        last_only = np.array([a.request.last_only for a, _, _ in pieces], dtype=np.bool_)
        planned = plan_runs(
            work.verdict, sess, work.events.time, stored.exists, stored.last_time, counts, last_only, len(ids)
        )
        shape = _Runs.of(planned)
        session_error: dict[int, ErrorInfo] = {}
        outputs: OutputColumns | None = None
        ok_run = _trues(len(shape.run_sess))
        if len(shape.run_sess):
            outputs = await self._run_model(work, shape, session_error)
            for r in session_error:
                ok_run[r] = False
        kind, last_seq, forecast_row, failed_run, n_applied, n_dups, n_outputs = plan_outcomes(
            work.verdict, sess, work.seq, work.dup_seq, shape.applied, shape.want, shape.run_of, shape.run_sess,
            shape.ends, ok_run, len(ids),
        )  # fmt: skip
        if failed_run is not None:
            for i in np.flatnonzero(failed_run >= 0).tolist():
                work.errors[i] = session_error[int(failed_run[i])]
        # every event applied, in batch order, with its forecast: event i's forecast is row i
        every_row = shape.in_order and failed_run is None and n_outputs == len(sess)
        return _Decided(kind, last_seq, forecast_row, outputs, n_outputs, n_applied, n_dups, every_row)

    async def _run_model(
        self, work: _BatchInFlight, shape: _Runs, session_error: dict[int, ErrorInfo]
    ) -> OutputColumns:
        """The task's step over the runs (``plan_runs``), then the store's write of the new states of the
        runs that did not fail; a failed run's error goes into ``session_error`` (by run). Returns the
        outputs of the wanted applied events, in the order of ``applied``."""
        events, ids, seq, stored, loaded = work.events, work.ids, work.seq, work.stored, work.loaded
        applied, want, run_sess, ends = shape.applied, shape.want, shape.run_sess, shape.ends
        every_event = shape.in_order  # every event applies, in batch order: the columns as they are
        # (columns read from the IPC are read-only; torch warns on wrapping one, so those are copied)
        t = _writable(events.time) if every_event else events.time[applied]
        marks = _writable(events.mark) if every_event else events.mark[applied]
        values = _writable(events.values) if every_event else events.values[applied]
        runs = RunColumns(shape.dt, marks, values, shape.starts, shape.lengths, want, t)
        n_runs = len(run_sess)
        self.metrics.batch_size.observe(n_runs)
        self.metrics.batch_events.observe(len(applied))
        rows = loaded.tensors if n_runs == len(ids) else take_rows(loaded.tensors, run_sess)  # as loaded: all apply
        model_started = time.perf_counter()
        if self._in_worker is not None:
            new_rows, outputs = await self._in_worker(self.task.apply, rows, runs, self._top_k)  # type: ignore[misc]
        else:
            new_rows, outputs = self.task.apply(rows, runs, self._top_k)
        store_started = time.perf_counter()

        finite = new_rows.finite if isinstance(new_rows, CheckedRows) else _finite_rows(new_rows)
        keep = _trues(n_runs) if finite is None else finite
        if finite is not None:
            for r in np.flatnonzero(~keep).tolist():
                session_error[r] = Reasons.numeric_overflow(self.scope.shown(ids[int(run_sess[r])]))
        hooked = [k for k, (a, _, _) in enumerate(work.pieces) if a.request.before_store is not None]
        if hooked and keep.any():
            for r, error in (await self._before_store(work, hooked, shape, session_error, outputs)).items():
                session_error[r] = error
                keep[r] = False
        every = finite is None and not session_error
        if every or keep.any():
            kept = None if every else np.flatnonzero(keep)
            now = time.time()
            if kept is None and every_event and n_runs == len(ids) == len(applied):
                # one event a session, every session of the batch in order (the common batch): run r is session r
                # and event r, so the columns are the batch's as they are, no gather (six a batch of one event)
                kept_sess, existed, created = run_sess, stored.exists, stored.created_at
                last_seq, last_time, expected = seq, work.events.time, stored.last_seq
            else:
                kept_sess = run_sess if kept is None else run_sess[kept]  # [K] their sessions
                last = applied[ends if kept is None else ends[kept]]  # [K] their last applied events
                if kept is not None:
                    new_rows = take_rows(new_rows, kept)
                existed, created = stored.exists[kept_sess], stored.created_at[kept_sess]
                last_seq, last_time, expected = seq[last], work.events.time[last], stored.last_seq[kept_sess]
            if np.count_nonzero(existed) < len(existed):  # the sessions this batch starts: created now
                created = np.where(existed, created, now)
            save = SaveBatch(
                # every session of the batch, in order: the loaded list itself (a store may know it again)
                session_ids=ids if len(kept_sess) == len(ids) else [ids[u] for u in kept_sess.tolist()],
                tensors=new_rows,
                last_seq=last_seq,
                last_time=last_time,
                created_at=created,
                updated_at=_filled(len(kept_sess), now),
                model_version=self.task.version,
                expected_seqs=expected,
            )
            try:
                written = await self.timed("save", self.store.save(save))
            except StoreUnavailableError as exc:
                error = Reasons.store_unavailable(exc, saving=True)
                for r in range(n_runs) if kept is None else kept.tolist():
                    session_error[r] = error
            else:
                await self._count_written(ids, kept, kept_sess, existed, written, session_error)
        self._latency["model"].observe(store_started - model_started)
        self._latency["store"].observe(time.perf_counter() - store_started)
        return outputs

    async def _count_written(
        self,
        ids: list[str],
        kept: np.ndarray | None,
        kept_sess: np.ndarray,
        existed: np.ndarray,
        written: list[bool],
        session_error: dict[int, ErrorInfo],
    ) -> None:
        """After a save of the runs ``kept`` (None: all) of sessions ``kept_sess``: the runs whose state
        lost the compare-and-set (``state_conflict``), and the sessions this batch started (counted, the
        gauges moved)."""
        if all(written):
            started = ~existed
        else:
            ok = np.array(written, dtype=bool)
            lost = np.flatnonzero(~ok).tolist()
            self.metrics.state_conflicts.inc(len(lost))
            for k in lost:
                r = k if kept is None else int(kept[k])
                session_error[r] = Reasons.state_conflict(self.scope.shown(ids[int(kept_sess[k])]))
            started = ok & ~existed
        n_started = int(np.count_nonzero(started))
        if n_started:
            self.metrics.sessions_started.inc(n_started)
            self.sessions_changed(n_started)
            if self.store.cheap_count:  # new sessions may have evicted others: count again
                await self.update_session_gauges()
            if self.scope.tenancy:
                for u in kept_sess[started].tolist():
                    self._count_tenant_session(ids[u], +1)

    async def _before_store(
        self,
        work: _BatchInFlight,
        hooked: list[int],
        shape: _Runs,
        session_error: dict[int, ErrorInfo],
        outputs: OutputColumns,
    ) -> dict[int, ErrorInfo]:
        """Await the ``before_store`` of each piece ``hooked`` with its outcomes as they will be once
        stored; the runs of a piece whose hook raised, with their error (``publish_failed``)."""
        ok_run = np.ones(len(shape.run_sess), dtype=np.bool_)
        for r in session_error:
            ok_run[r] = False
        kind, last_seq, forecast_row, failed_run, *_ = plan_outcomes(
            work.verdict, work.sess, work.seq, work.dup_seq, shape.applied, shape.want, shape.run_of,
            shape.run_sess, shape.ends, ok_run, len(work.ids),
        )  # fmt: skip
        errors = dict(work.errors)
        if failed_run is not None:
            for i in np.flatnonzero(failed_run >= 0).tolist():
                errors[i] = session_error[int(failed_run[i])]
        run_at = np.full(len(work.sess), -1, dtype=np.int64)
        run_at[shape.applied] = shape.run_of
        bounds = np.cumsum([0] + [c for _, _, c in work.pieces])
        failed: dict[int, ErrorInfo] = {}
        for k in hooked:
            accepted, start, count = work.pieces[k]
            at, end = int(bounds[k]), int(bounds[k + 1])
            rows = forecast_row[at:end]
            has = rows >= 0
            outcomes = Outcomes(
                kind[at:end].copy(),
                last_seq[at:end].copy(),
                {i - at: e for i, e in errors.items() if at <= i < end},
                np.flatnonzero(has),
                outputs.take(rows[has]) if has.any() else None,
            )
            hook = accepted.request.before_store
            assert hook is not None
            try:
                await hook(accepted.request.index[start : start + count], outcomes)
            except Exception as exc:  # the forecasts are not out: none of these states may be stored
                detail = str(exc) or type(exc).__name__
                runs = run_at[at:end]
                for r in set(runs[runs >= 0].tolist()):
                    failed[r] = Reasons.publish_failed(self.scope.shown(work.ids[int(shape.run_sess[r])]), detail)
        return failed

    def _settle(
        self, pieces: list[tuple[_PendingRequest, int, int]], decided: _Decided, errors: dict[int, ErrorInfo]
    ) -> None:
        """Hand each piece's outcomes to its request: a piece that is its whole request (the common
        case) is answered with views of the batch's columns; the others write into their request's own
        columns, which answers once its last piece is settled. ``errors`` by batch position."""
        if decided.n_applied:
            self._applied.inc(decided.n_applied)
        if decided.n_dups:
            self._duplicates.inc(decided.n_dups)
        by_piece: dict[int, dict[int, ErrorInfo]] = {}
        if errors:
            bounds = np.cumsum([0] + [c for _, _, c in pieces]).tolist()
            for i, error in errors.items():
                self.count_rejection(error)
                p = bisect.bisect_right(bounds, i) - 1
                by_piece.setdefault(p, {})[i - bounds[p]] = error
        at = 0
        took: list[float] = []
        for p, (accepted, start, count) in enumerate(pieces):
            end = at + count
            piece_errors = by_piece.get(p, {})
            if count == accepted.request.n:  # every event of the request, valid all: positions 0..n-1
                accepted.remaining = 0
                self._answer(accepted, took, decided.outcomes(at, end, piece_errors))
            else:
                accepted.settle(start, count, decided, at, piece_errors)
                self._finish_piece(accepted, count, took)
            at = end
        observe_many(self._latency["total"], took)

    # ------------------------------------------------------------------ helpers

    async def timed(self, operation: str, call: Awaitable[T]) -> T:
        """Await a store call, observing its latency and counting its failure."""
        started = time.perf_counter()
        try:
            return await call
        except StoreUnavailableError:
            self.metrics.store_errors.labels(operation).inc()
            raise
        finally:
            latency = self._store_latency.get(operation)
            if latency is None:  # a child looked up once: labels() takes a lock and builds a key per call
                latency = self._store_latency[operation] = self.metrics.store_latency.labels(operation)
            latency.observe(time.perf_counter() - started)

    async def update_session_gauges(self) -> None:
        """Count the sessions held (a slow store's count runs now and then, not per batch)."""
        self._counted = await self.store.count()
        self._since_count = 0
        self._set_session_gauges()

    def sessions_changed(self, change: int) -> None:
        """This server started or ended sessions: between a slow store's counts, the gauges move by
        what this server did (another replica's sessions show at the next count)."""
        if not self.store.cheap_count:
            self._since_count += change
            self._set_session_gauges()

    def _set_session_gauges(self) -> None:
        n = self.sessions_held = max(0, self._counted + self._since_count)
        self._model_sessions.set(n)

    def _count_tenant_session(self, key: str, change: int) -> None:
        """Keep a cached tenant count current with the sessions this server starts and ends."""
        tenant = Scope.tenant_of(key)
        cached = self._tenant_counts.get(tenant)
        if cached is not None:
            self._tenant_counts[tenant] = (cached[0], max(0, cached[1] + change))

    def session_ended(self, key: str) -> None:
        if self.scope.tenancy:
            self._count_tenant_session(key, -1)

    def _reset_foreign_states(self, ids: list[str], loaded: LoadedBatch, stored: _StoredColumns) -> None:
        """With ``on_model_mismatch=reset``: a state another model version wrote becomes a fresh state
        of this model; the session keeps its seq and time, so its client just goes on."""
        if self.settings.on_model_mismatch != "reset" or not stored.foreign.any():
            return
        for u in np.flatnonzero(stored.foreign).tolist():
            log.warning(
                "session %r was written by model %s; resetting it for %s",
                ids[u],
                stored.version_of(u),
                self.task.version,
            )
            for name, row in self.store.layout.rows.items():
                target = loaded.tensors[name]
                target[u] = row.numpy() if isinstance(target, np.ndarray) else row
            self.metrics.state_resets.inc()
        stored.foreign[:] = False


@dataclasses.dataclass(slots=True)
class _Batch:
    """Pieces ``(request, start, count)`` of queued requests, their events' session keys ``[E]``,
    each event's session code ``sess [E]`` and the distinct keys ``ids [U]`` in code order."""

    pieces: list[tuple[_PendingRequest, int, int]]
    keys: list[str]
    sess: np.ndarray
    ids: list[str]


@dataclasses.dataclass(slots=True)
class _BatchEvents:
    """A batch's ``E`` events as columns: ``seq [E]`` as sent, ``time [E]``, ``mark [E]``, ``values [E, V]``
    (the request's own arrays where the batch is one piece of one request)."""

    seq: np.ndarray
    time: np.ndarray
    mark: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, pieces: list[tuple[_PendingRequest, int, int]]) -> _BatchEvents:
        if len(pieces) == 1:
            accepted, s, c = pieces[0]
            e = accepted.request.events
            if s == 0 and c == len(e.seq):
                return cls(e.seq, e.time, e.mark, e.values)
            return cls(e.seq[s : s + c], e.time[s : s + c], e.mark[s : s + c], e.values[s : s + c])
        cols = [(a.request.events, s, s + c) for a, s, c in pieces]
        return cls(
            np.concatenate([e.seq[s:t] for e, s, t in cols]),
            np.concatenate([e.time[s:t] for e, s, t in cols]),
            np.concatenate([e.mark[s:t] for e, s, t in cols]),
            np.concatenate([e.values[s:t] for e, s, t in cols]),
        )


@dataclasses.dataclass(slots=True)
class _BatchInFlight:
    """One batch in flight: its ``E`` events (``events``; ``seq [E]`` with ``NEXT_SEQ`` resolved) of the
    sessions ``ids [U]`` (``sess [E]`` their codes), what the store holds of them, each event's
    ``verdict [E]`` and ``dup_seq [E]`` (``plan_verdicts``), and the errors by batch position."""

    pieces: list[tuple[_PendingRequest, int, int]]
    events: _BatchEvents
    ids: list[str]
    sess: np.ndarray
    seq: np.ndarray
    stored: _StoredColumns
    loaded: LoadedBatch
    verdict: np.ndarray
    dup_seq: np.ndarray
    errors: dict[int, ErrorInfo]


@dataclasses.dataclass(slots=True)
class _Decided:
    """What became of a batch's ``E`` events (``plan_outcomes``): ``kind [E]``, ``last_seq [E]``,
    ``forecast_row [E]`` (the row of its forecast in ``outputs``, which has ``n_outputs`` rows; -1:
    none), and how many were applied and duplicates."""

    kind: np.ndarray
    last_seq: np.ndarray
    forecast_row: np.ndarray
    outputs: OutputColumns | None
    n_outputs: int
    n_applied: int
    n_dups: int
    #: ``forecast_row`` is ``0 .. E - 1``: every event applied with its forecast, in batch order (the common case)
    every_row: bool

    def outcomes(self, at: int, end: int, errors: dict[int, ErrorInfo]) -> Outcomes:
        """The outcomes of the batch's events ``at : end``, a whole request's (its positions 0..n-1):
        views of the batch's columns, the forecasts a slice of its outputs where they are contiguous."""
        kind, last_seq, outputs = self.kind[at:end], self.last_seq[at:end], self.outputs
        if outputs is None:
            return Outcomes(kind, last_seq, errors, _NO_INDEX, None)
        if end - at == 1:  # one event (the most common request): no array call
            row = int(self.forecast_row[at])
            if row < 0:
                return Outcomes(kind, last_seq, errors, _NO_INDEX, None)
            one = outputs if row == 0 and self.n_outputs == 1 else outputs.take(slice(row, row + 1))
            return Outcomes(kind, last_seq, errors, _FIRST_INDEX, one)
        if self.every_row:  # rows at..end, known without reading forecast_row (seven numpy calls a request)
            whole = at == 0 and end == self.n_outputs
            return Outcomes(
                kind, last_seq, errors, np.arange(end - at), outputs if whole else outputs.take(slice(at, end))
            )
        rows = self.forecast_row[at:end]
        has = rows >= 0
        if has.all():
            index, picked = np.arange(end - at), rows
        else:
            index = np.flatnonzero(has)
            picked = rows[has]
        if not len(picked):
            return Outcomes(kind, last_seq, errors, index, None)
        first, n = int(picked[0]), len(picked)
        if int(picked[-1]) - first == n - 1 and (n < 3 or bool((np.diff(picked) == 1).all())):
            whole = first == 0 and n == self.n_outputs
            return Outcomes(kind, last_seq, errors, index, outputs if whole else outputs.take(slice(first, first + n)))
        return Outcomes(kind, last_seq, errors, index, outputs.take(picked))


@dataclasses.dataclass(slots=True)
class _Runs:
    """A batch's applied events ``[A]`` (batch positions, grouped by session) as runs ``[R]``, one per
    session (``plan_runs``): run ``r`` is ``applied[starts[r] : starts[r] + lengths[r]]`` of session
    ``run_sess[r]``, ``run_of [A]`` each applied event's run, ``ends [R]`` each run's last (an index into
    ``applied``), ``dt [A]`` each event's gap since its session's previous one, ``want [A]`` those that get
    a forecast."""

    applied: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    run_sess: np.ndarray
    run_of: np.ndarray
    ends: np.ndarray
    dt: np.ndarray
    want: np.ndarray
    #: ``applied`` is every event of the batch in batch order
    in_order: bool

    @classmethod
    def of(cls, planned: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]) -> _Runs:
        """``plan_runs``' result: its int columns are rows of two arrays."""
        by_event, by_run, dt, want, in_order = planned
        applied, run_of = by_event
        starts, lengths, run_sess, ends = by_run
        return cls(applied, starts, lengths, run_sess, run_of, ends, dt, want, in_order)


@dataclasses.dataclass(slots=True)
class _StoredColumns:
    """What the store holds of a batch's ``U`` sessions, as arrays ``[U]`` (the ``LoadedBatch``'s
    columns as loaded; ``last_time`` is -inf for a session without state), and ``foreign``: held,
    and written by another model version."""

    exists: np.ndarray
    last_seq: np.ndarray
    last_time: np.ndarray
    created_at: np.ndarray
    foreign: np.ndarray
    version: np.ndarray
    versions: tuple[str, ...]

    @classmethod
    def of(cls, loaded: LoadedBatch, version: str) -> _StoredColumns:
        own = loaded.versions.index(version) if version in loaded.versions else -2  # -1 is "none"
        return cls(
            exists=loaded.present,
            last_seq=loaded.last_seq,
            last_time=loaded.last_time,
            created_at=loaded.created_at,
            foreign=loaded.present & (loaded.version != own),
            version=loaded.version,
            versions=loaded.versions,
        )

    def version_of(self, u: int) -> str:
        """The model version that wrote session ``u``."""
        return self.versions[int(self.version[u])]


class _TotalAndModelCounter:
    """Two counter children moved together (the service's total and the model's)."""

    __slots__ = ("_a", "_b")

    def __init__(self, a: Any, b: Any) -> None:
        self._a, self._b = a, b

    def inc(self, n: float = 1) -> None:
        self._a.inc(n)
        self._b.inc(n)


def _piece_keys(pieces: list[tuple[_PendingRequest, int, int]]) -> list[str]:
    """The session keys of ``pieces``' events, in order (one piece's keys sliced, several joined)."""
    if len(pieces) == 1:
        accepted, start, count = pieces[0]
        return accepted.keys[start : start + count]
    return list(chain.from_iterable(accepted.keys[start : start + count] for accepted, start, count in pieces))


def code_sessions(keys: list[str], distinct: dict[str, None] | None = None) -> tuple[np.ndarray, list[str]]:
    """Each event's session coded in order of first appearance, ``sess [E]`` int64, and the distinct keys
    ``[U]`` in code order (``keys`` itself where all differ: a batch of one event a session, the common case);
    ``distinct``: ``dict.fromkeys(keys)`` where the caller has made it.
    Without a Python loop an event: ``dict.fromkeys`` and ``map`` iterate in C (a list comprehension with
    ``setdefault`` took about 0.3 us an event, 5 % of a 64-session batch's time outside the model)."""
    if distinct is None:
        distinct = dict.fromkeys(keys)
    if len(distinct) == len(keys):
        return np.arange(len(keys), dtype=np.int64), keys
    codes = dict(zip(distinct, range(len(distinct)), strict=True))
    # np.fromiter with its count: no list of ints for numpy to inspect (about 20 % under np.array of a list at 64
    # to 256 keys, numpy 2.4)
    return np.fromiter(map(codes.__getitem__, keys), np.int64, len(keys)), list(codes)


def _trues(n: int) -> np.ndarray:
    """``np.ones(n, bool)`` at a third of its cost for a few rows (``np.ones`` and ``np.full`` are Python
    functions over ``empty`` and ``copyto``)."""
    out = np.empty(n, np.bool_)
    out.fill(True)
    return out


def _filled(n: int, value: float) -> np.ndarray:
    """``np.full(n, value)`` (float64), as ``_trues``."""
    out = np.empty(n)
    out.fill(value)
    return out


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _writable(array: np.ndarray) -> np.ndarray:
    return array if array.flags.writeable else array.copy()


def _finite_rows(rows: Rows) -> np.ndarray | None:
    """None when every row of every float field is finite, else a mask ``[R]`` of the finite rows
    (so that a numeric overflow is an error for its session's events and never a stored state)."""
    floats = [t for t in rows.values() if (t.dtype.kind == "f" if isinstance(t, np.ndarray) else t.is_floating_point())]
    if not floats:
        return None
    if not len(floats[0]):
        return None
    if all(isinstance(t, np.ndarray) or t.device.type == "cpu" for t in floats):
        # one compiled pass over the fields' own memory (a pass a field where their dtypes differ)
        views = [np.ascontiguousarray(np.asarray(t).reshape(len(t), -1)) for t in floats]
        groups = [tuple(views)] if len({v.dtype for v in views}) == 1 else [(v,) for v in views]
        finite, bad = rows_finite(groups[0])
        for group in groups[1:]:
            more, more_bad = rows_finite(group)
            if more_bad:
                finite, bad = finite & more, bad + more_bad
        return finite if bad else None
    # One sum of everything first: finite when every element is (a finite overflow of the sum only
    # sends us to the exact check below); one concatenation and one sum, whatever the fields.
    total = torch.cat([t.reshape(-1) for t in floats]).sum()
    if bool(torch.isfinite(total)):
        return None
    finite = torch.isfinite(floats[0].flatten(1)).all(dim=1)
    for t in floats[1:]:
        finite = finite & torch.isfinite(t.flatten(1)).all(dim=1)
    return None if bool(finite.all()) else finite.cpu().numpy()
