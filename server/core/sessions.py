"""Unary calls on one session: its forecast (and sampled futures), its description, its end."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import TypeVar

import torch

from aaren.server.contract.columns import SampledFuture, SessionView, StepSummary
from aaren.server.contract.core_api import ForecastOptions
from aaren.server.contract.errors import Reasons
from aaren.server.contract.validation import session_id_error
from aaren.server.core.batcher import Batcher, ModelContext
from aaren.server.stores.base import SessionMeta, StoreUnavailableError

__all__ = ["SessionCalls"]

T = TypeVar("T")


class SessionCalls:
    def __init__(self, context: ModelContext, batcher: Batcher, executor: concurrent.futures.Executor) -> None:
        self.task = context.task
        self.store = context.store
        self.settings = context.settings
        self.metrics = context.metrics
        self.scope = context.scope
        self.batcher = batcher
        self._executor = executor

    async def _in_worker(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _checked_key(self, session_id: str, tenant: str) -> str:
        error = session_id_error(session_id, self.settings.max_session_id_bytes)
        if error is not None:
            raise error.exception()
        return self.scope.key(session_id, tenant)

    async def _store_call(self, operation: str, call: Awaitable[T]) -> T:
        try:
            return await self.batcher.timed(operation, call)
        except StoreUnavailableError as exc:
            raise Reasons.store_unavailable(exc).exception() from exc

    async def _get(self, session_id: str, tenant: str) -> tuple[SessionMeta, dict[str, torch.Tensor]]:
        """The session's stored state. Another tenant's session of the same id is a different key: it
        is never read, and its existence never shows (NOT_FOUND as for none)."""
        key = self._checked_key(session_id, tenant)
        found = await self._store_call("get", self.store.get(key))
        if found is None:
            raise Reasons.session_lookup_missing(session_id, self.store.was_evicted(key)).exception()
        meta, rows = found
        if meta.model_version != self.task.version:
            raise Reasons.model_mismatch(session_id, meta.model_version, self.task.version, event=False).exception()
        return meta, rows

    async def forecast(self, session_id: str, options: ForecastOptions, tenant: str = "") -> SampledFuture:
        """The session's exact next-event forecast; for ``options.horizon > 1`` also
        ``options.num_samples`` sampled futures of that many events (0: the default count),
        summarized per step."""
        s = self.settings
        horizon, num_samples, seed, top_k = options.horizon, options.num_samples, options.seed, options.top_k
        include_paths = options.include_paths
        if horizon > s.max_horizon:
            raise Reasons.horizon_too_large(horizon, s.max_horizon).exception()
        if num_samples > s.max_num_samples:
            raise Reasons.num_samples_too_large(num_samples, s.max_num_samples).exception()
        d = self.task.description
        if horizon > 1 and not hasattr(self.task, "sample"):  # a task that samples futures has ``sample``
            raise Reasons.sampling_unsupported(d.name, d.task).exception()
        meta, rows = await self._get(session_id, tenant)
        k = top_k or s.default_top_k
        outputs = await self._in_worker(self.task.forecast_outputs, rows["features"], d.ranked)
        nothing: list = []
        if horizon <= 1:
            return SampledFuture(session_id, meta.last_seq, meta.last_time, outputs, k, [], nothing, nothing, nothing)
        n = num_samples or s.default_num_samples
        gaps, marks, values = await self._in_worker(self.task.sample, rows, horizon, n, seed)
        times = meta.last_time + torch.tensor(gaps, dtype=torch.float64).cumsum(dim=1)  # [S, H]
        levels = torch.tensor(self.task.quantiles, dtype=torch.float64)
        quantiles = torch.quantile(times, levels, dim=0).T.tolist()  # [H, Q]
        mark_tensor = torch.tensor(marks)
        steps = []
        for h in range(horizon):
            freq = torch.bincount(mark_tensor[:, h], minlength=self.task.description.num_marks).double() / n
            top = freq.topk(min(k, freq.numel()))
            seen = [(m, p) for m, p in zip(top.indices.tolist(), top.values.tolist(), strict=True) if p > 0]
            steps.append(StepSummary(h + 1, float(times[:, h].mean()), quantiles[h], seen))
        if not include_paths:
            return SampledFuture(session_id, meta.last_seq, meta.last_time, outputs, k, steps, [], [], [])
        return SampledFuture(
            session_id, meta.last_seq, meta.last_time, outputs, k, steps, times.tolist(), marks, values
        )

    async def get_session(self, session_id: str, include_state: bool = False, tenant: str = "") -> SessionView:
        meta, rows = await self._get(session_id, tenant)
        state = self.task.state_of(rows)
        data = state.to_bytes(model_version=self.task.version) if include_state else None
        return SessionView(
            session_id,
            meta.last_seq,
            meta.last_time,
            meta.created_at,
            meta.updated_at,
            meta.model_version,
            data,
            self.task.description.state_bytes_per_session,
            meta.updated_at + self.settings.idle_ttl_s,
        )

    async def end_session(self, session_id: str, tenant: str = "") -> int | None:
        """End the session (delete its state); its last seq, or None when there was none."""
        key = self._checked_key(session_id, tenant)
        meta = await self._store_call("delete", self.store.delete(key))
        if meta is not None:
            self.metrics.sessions_ended.inc()
            self.batcher.session_ended(key)
            self.batcher.sessions_changed(-1)
            if self.store.cheap_count:
                await self.batcher.update_session_gauges()
        return None if meta is None else meta.last_seq
