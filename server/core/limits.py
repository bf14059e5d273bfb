"""Rate limits: a token bucket per tenant (refill ``rate`` tokens/s up to ``burst``)."""

from __future__ import annotations

import time

__all__ = ["TokenBucket", "clock"]

#: The clock buckets refill by (seconds, monotonic). A module attribute so that a test can step time by
#: hand instead of depending on the machine's pace.
clock = time.monotonic


class TokenBucket:
    """``take(n)`` spends ``n`` tokens if it can and returns 0.0, else spends nothing and returns the
    seconds until ``n`` tokens will be there (a request larger than ``burst`` waits for a full
    bucket and then may overdraw it, so that it is never refused forever)."""

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated = clock()

    def take(self, n: float) -> float:
        now = clock()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        need = min(n, self.burst)
        if self.tokens >= need:
            self.tokens -= n
            return 0.0
        return (need - self.tokens) / self.rate
