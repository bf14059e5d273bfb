"""Admission and limits of the engine core: what may be accepted now, and what it holds.

Counts the events accepted and not yet answered (the whole server and per tenant), the tenants'
event rates (a token bucket each) and the tenants' open streams. A refusal is an ``ErrorInfo``
from the catalogue with a retry hint; nothing of a refused request is accepted.
"""

from __future__ import annotations

from collections import Counter

from aaren.server.contract.errors import ErrorInfo, Reasons
from aaren.server.core.limits import TokenBucket
from aaren.server.settings import ServerSettings

__all__ = ["Admission"]

PENDING_RETRY_S = 0.1


class Admission:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.pending = 0
        self.tenant_pending: Counter[str] = Counter()
        self.tenant_pending_limit = max(1, settings.max_pending_events // 2)
        self._buckets: dict[str, TokenBucket] = {}
        self.tenant_streams: Counter[str] = Counter()

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
