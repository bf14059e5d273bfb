"""The engine core: one owner of the sessions, the model and the store, driven by columns.

``EngineCore`` is what every front end talks to, in the same process (``--frontends 0``) or over
IPC (``aaren.server.ipc``): ``submit`` a ``CoreRequest`` and get ``Outcomes`` back; the unary
calls; stream admission per tenant; drain. It composes the admission and limits
(``admission``), the batcher (``batcher``: validation against state, batching, model, store,
settling), the unary session calls (``sessions``) and the idle sweeper. Nothing here knows a
protocol: the front ends own proto <-> columns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import time
from collections.abc import Callable

from aaren.server.admission import Admission
from aaren.server.batcher import Batcher, Scope
from aaren.server.columns import CoreRequest, ModelDescription, Outcomes, SampledFuture, SessionView
from aaren.server.engine import Engine
from aaren.server.errors import ErrorInfo, catalogue
from aaren.server.metrics import Metrics
from aaren.server.sessions import SessionCalls
from aaren.server.settings import ServerSettings
from aaren.server.stores.base import SessionStore, StoreUnavailableError
from aaren.server.validation import EventChecker

__all__ = ["EngineCore"]

SLOW_COUNT_PERIOD_S = 30.0


class EngineCore:
    def __init__(self, engine: Engine, store: SessionStore, settings: ServerSettings, metrics: Metrics) -> None:
        self.engine = engine
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.scope = Scope(tenancy=settings.auth_tokens_file is not None)
        self.admission = Admission(settings)
        self.batcher = Batcher(engine, store, settings, metrics, self.admission, self.scope)
        d = engine.description
        self.checker = EventChecker(d.num_marks, d.value_names, settings.max_session_id_bytes)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aaren-model")
        self.sessions = SessionCalls(
            engine, store, settings, metrics, self.batcher, self.checker, self.scope, self._executor
        )
        if settings.model_thread:
            executor = self._executor
            self.batcher.set_worker(lambda fn, *args: asyncio.get_running_loop().run_in_executor(executor, fn, *args))
        self._tasks: list[asyncio.Task[None]] = []
        self.draining = False
        store.on_evict = lambda cause: metrics.sessions_evicted.labels(cause).inc()
        metrics.state_bytes_per_session.set(d.state_bytes_per_session)

    @property
    def description(self) -> ModelDescription:
        return self.engine.description

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.batcher.run(), name="aaren-batcher"),
            asyncio.create_task(self._sweep_loop(), name="aaren-sweeper"),
        ]

    async def drain(self) -> None:
        """Refuse new events and wait until every accepted one is answered."""
        self.draining = True
        while self.admission.pending:
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._executor.shutdown(wait=True)
        await self.store.close()

    # ------------------------------------------------------------------ streams

    def submit(self, request: CoreRequest, on_done: Callable[[Outcomes], None]) -> None:
        """Accept ``request`` (many sessions, any order between sessions); ``on_done(outcomes)`` is
        called once, after the state of its applied events is stored. A request over a limit (its
        size, the server's or the tenant's pending events, the tenant's event rate) is refused whole,
        at once: ``outcomes.request_error`` says why and when a retry may pass."""
        n = request.n
        refusal: ErrorInfo | None = None
        if n > self.settings.max_events_per_request:
            refusal = catalogue.too_many_events(n, self.settings.max_events_per_request)
        elif n:
            refusal = self.admission.refusal(n, request.tenant)
            if refusal is not None:
                self.metrics.limit_refusals.labels(refusal.reason).inc()
        if refusal is not None:
            self.batcher.count_rejection(refusal, n)
            on_done(Outcomes.refused(refusal))
            return
        if self.draining and n:
            error = catalogue.shutting_down()
            self.batcher.count_rejection(error, n)
            on_done(Outcomes.all_errors(n, dict.fromkeys(range(n), error)))
            return
        self.batcher.enqueue(request, on_done)

    def count_rejection(self, error: ErrorInfo, n: int = 1) -> None:
        """Count events a front end refused whole (e.g. an unknown layout)."""
        self.batcher.count_rejection(error, n)

    async def open_stream(self, tenant: str) -> ErrorInfo | None:
        refusal = self.admission.open_stream(tenant)
        if refusal is not None:
            self.metrics.limit_refusals.labels(refusal.reason).inc()
        return refusal

    async def close_stream(self, tenant: str) -> None:
        self.admission.close_stream(tenant)

    # ------------------------------------------------------------------ unary calls

    async def forecast(self, session_id: str, **options: object) -> SampledFuture:
        return await self.sessions.forecast(session_id, **options)  # type: ignore[arg-type]

    async def get_session(self, session_id: str, include_state: bool = False, tenant: str = "") -> SessionView:
        return await self.sessions.get_session(session_id, include_state, tenant)

    async def end_session(self, session_id: str, tenant: str = "") -> int | None:
        return await self.sessions.end_session(session_id, tenant)

    # ------------------------------------------------------------------ housekeeping

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
                    await self.batcher.update_session_gauges()
            except StoreUnavailableError:
                self.metrics.store_errors.labels("sweep").inc()
