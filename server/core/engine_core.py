"""The engine core: one owner of the sessions, the model and the store, driven by columns.

``EngineCore`` implements ``CoreAPI`` (``aaren.server.contract.core_api``), what every front end
talks to, in the same process (``--frontends 0``) or over IPC (``aaren.server.ipc``): ``submit`` a
``CoreRequest`` and get ``Outcomes`` back; the unary calls; stream admission per tenant; drain. It
composes the batchers (``batcher``: admission and limits, validation against state, batching,
model, store, settling), the unary session calls (``sessions``) and the idle
sweeper. Nothing here knows a protocol: the front ends own proto <-> columns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from aaren.server.contract.columns import CoreRequest, ModelDescription, Outcomes, SampledFuture, SessionView
from aaren.server.contract.core_api import ForecastOptions
from aaren.server.contract.errors import ErrorInfo, Reasons
from aaren.server.core.batcher import Admission, Batcher, ModelContext, Scope, warm_plan
from aaren.server.core.sessions import SessionCalls
from aaren.server.observability.metrics import Metrics
from aaren.server.settings import ServerSettings
from aaren.server.stores.base import SessionStore, StoreUnavailableError
from aaren.server.tasks.base import Task

__all__ = ["EngineCore", "ServedModel"]

SLOW_COUNT_PERIOD_S = 30.0

#: The wall clock the idle sweeper holds ``updated_at`` against (seconds since the epoch). A module
#: attribute so that a test can stop it and move it past the TTL by hand, whatever the machine's pace.
wall_clock = time.time


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """One served model: its task, its sessions' store (a session belongs to one model), the batcher
    that runs its batches and its unary session calls."""

    task: Task
    store: SessionStore
    batcher: Batcher
    sessions: SessionCalls


class EngineCore:
    """``task`` and ``store`` are the default model's; ``more`` are the other served models, each
    ``(task, store)`` (``aaren.server.tasks.repository``), reached by ``CoreRequest.model`` or the unary
    calls' ``model``. Admission is shared: a tenant's event rate, pending events, streams and
    sessions span every model."""

    def __init__(
        self,
        task: Task,
        store: SessionStore,
        settings: ServerSettings,
        metrics: Metrics,
        *,
        more: Sequence[tuple[Task, SessionStore]] = (),
        aliases: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.scope = Scope(tenancy=settings.auth_tokens_file is not None)
        self.admission = Admission(settings)
        warm_plan()  # the batch's compiled passes, ready before the first request
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aaren-model")
        self.models: dict[str, ServedModel] = {}
        for served_task, task_store in [(task, store), *more]:
            d = served_task.description
            if d.name in self.models:
                raise ValueError(f"two served models are named {d.name!r}")
            self.models[d.name] = self._served(served_task, task_store)
        self.aliases = {k: v for k, v in (aliases or {}).items() if v in self.models}
        if len(self.models) > 1:  # a tenant's session limit counts its sessions of every model
            cheap = all(m.store.cheap_count for m in self.models.values())
            for m in self.models.values():
                m.batcher.count_tenant_sessions, m.batcher.cheap_tenant_count = self._tenant_sessions, cheap
        default = self.models[task.description.name]
        self.task, self.store, self.batcher = task, store, default.batcher
        self.sessions = default.sessions
        self._tasks: list[asyncio.Task[None]] = []
        metrics.state_bytes_per_session.set(task.description.state_bytes_per_session)
        # Summed over the models when scraped: nothing per batch, no call up from a batcher.
        metrics.active_sessions.set_function(lambda: sum(n for n, _ in self._held()))
        metrics.state_bytes.set_function(lambda: sum(n * b for n, b in self._held()))
        metrics.pending_events.set_function(lambda: self.admission.pending)

    def _served(self, task: Task, store: SessionStore) -> ServedModel:
        s, metrics = self.settings, self.metrics
        d = task.description
        context = ModelContext(task, store, s, metrics, self.scope)
        batcher = Batcher(context, self.admission)
        sessions = SessionCalls(context, batcher, self._executor)
        if s.model_thread:
            executor = self._executor
            batcher.set_worker(lambda fn, *args: asyncio.get_running_loop().run_in_executor(executor, fn, *args))
        store.on_evict = lambda cause: metrics.sessions_evicted.labels(cause).inc()
        metrics.model_state_bytes_per_session.labels(d.name).set(d.state_bytes_per_session)
        return ServedModel(task, store, batcher, sessions)

    async def _tenant_sessions(self, tenant: str) -> int:
        """The tenant's sessions over every model's store."""
        return sum([await m.store.count_group(tenant) for m in self.models.values()])

    def _held(self) -> list[tuple[int, int]]:
        """Each model's sessions held (its batcher's count) and state bytes per session."""
        return [(m.batcher.sessions_held, m.task.description.state_bytes_per_session) for m in self.models.values()]

    @property
    def lost(self) -> bool:
        """Never: this core is the process itself (``CoreAPI``; only an IPC client can lose its core)."""
        return False

    @property
    def pending(self) -> int:
        """Events accepted and not yet answered."""
        return self.admission.pending

    @property
    def description(self) -> ModelDescription:
        """The default model's description."""
        return self.task.description

    @property
    def descriptions(self) -> tuple[ModelDescription, ...]:
        """Every served model's description, the default first."""
        return tuple(m.task.description for m in self.models.values())

    def served(self, model: str) -> ServedModel | None:
        """The model a request names (its name or its folder's; "" the default), None if not served."""
        if not model:
            return self.models[self.task.description.name]
        return self.models.get(model) or self.models.get(self.aliases.get(model, ""))

    def _served_or_raise(self, model: str) -> ServedModel:
        found = self.served(model)
        if found is None:
            raise Reasons.served_model_unknown(model, list(self.models)).exception()
        return found

    async def start(self) -> None:
        self._tasks = [
            *(asyncio.create_task(m.batcher.run(), name=f"aaren-batcher-{name}") for name, m in self.models.items()),
            asyncio.create_task(self._sweep_loop(), name="aaren-sweeper"),
        ]

    @property
    def draining(self) -> bool:
        """New events are refused (``shutting_down``): the server drains."""
        return self.admission.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.admission.draining = value

    async def drain(self) -> None:
        """Refuse new events and wait until every accepted one is answered."""
        self.admission.draining = True
        while self.admission.pending:
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._executor.shutdown(wait=True)
        for m in self.models.values():
            await m.store.close()

    # ------------------------------------------------------------------ streams

    def submit(self, request: CoreRequest, on_done: Callable[[Outcomes], None]) -> None:
        """Accept ``request`` (many sessions, any order between sessions) for the model it names:
        that model's ``Batcher.submit`` (a model not served is refused whole, at once)."""
        served = self.served(request.model)
        if served is None:
            refusal = Reasons.served_model_unknown(request.model, list(self.models))
            self.count_rejection(refusal, request.n, request.model)
            on_done(Outcomes.refused(refusal))
            return
        served.batcher.submit(request, on_done)

    def submitter(self, model: str) -> Callable[[CoreRequest, Callable[[Outcomes], None]], None]:
        """``submit`` for the requests of ``model`` (a served model's name): its batcher's own, so
        that a front end's requests go straight to the model's queue."""
        return self._served_or_raise(model).batcher.submit

    def count_rejection(self, error: ErrorInfo, n: int = 1, model: str = "") -> None:
        """Count events refused whole (e.g. an unknown layout), by their model when it is served;
        those for a model not served count in the service's totals only."""
        served = self.served(model)
        if served is not None:
            served.batcher.count_rejection(error, n)
        else:
            self.metrics.events.labels("rejected").inc(n)
            self.metrics.rejections.labels(error.reason).inc(n)

    async def open_stream(self, tenant: str) -> ErrorInfo | None:
        refusal = self.admission.open_stream(tenant)
        if refusal is not None:
            self.metrics.limit_refusals.labels(refusal.reason).inc()
        return refusal

    async def close_stream(self, tenant: str) -> None:
        self.admission.close_stream(tenant)

    # ------------------------------------------------------------------ unary calls

    async def forecast(
        self, session_id: str, options: ForecastOptions, tenant: str = "", model: str = ""
    ) -> SampledFuture:
        sessions = self._served_or_raise(model).sessions
        return await sessions.forecast(session_id, options, tenant)

    async def get_session(
        self, session_id: str, include_state: bool = False, tenant: str = "", model: str = ""
    ) -> SessionView:
        return await self._served_or_raise(model).sessions.get_session(session_id, include_state, tenant)

    async def end_session(self, session_id: str, tenant: str = "", model: str = "") -> int | None:
        return await self._served_or_raise(model).sessions.end_session(session_id, tenant)

    async def front_end_reports(self, what: str) -> list[Any]:
        """None: in process, the only front end's own numbers are the service's (front-end
        processes report through ``aaren.server.ipc.core_side.CoreServer``)."""
        return []

    # ------------------------------------------------------------------ housekeeping

    async def _sweep_loop(self) -> None:
        """Evict idle sessions now and then; refresh the session gauges of stores that count slowly."""
        period = min(max(self.settings.idle_ttl_s / 4, 0.05), 5.0)
        counted = -math.inf
        while True:
            await asyncio.sleep(period)
            slow_due = time.monotonic() - counted >= SLOW_COUNT_PERIOD_S
            if slow_due:
                counted = time.monotonic()
            for m in self.models.values():
                try:
                    swept = await m.store.sweep(wall_clock())
                    # A slow count (Redis: a SCAN of every key) runs at most every SLOW_COUNT_PERIOD_S.
                    if swept or (slow_due and not m.store.cheap_count):
                        await m.batcher.update_session_gauges()
                except StoreUnavailableError:
                    self.metrics.store_errors.labels("sweep").inc()
