"""One accounting for every load client of the side-by-side benchmarks (aaren's ``bench.stream_client``
and the TorchServe kit's ``bench/peers/torchserve/client.py``), so that their numbers mean the same.

Each session (one stream, one event per message, waiting for each reply) records: the write -> read
latency of every event but its first ``WARM``, its first reply's latency, when each event completed and
the session's span. ``single_summary`` turns that into the JSON fields the benchmarks read:

- ``ev_per_s``: all events / wall time (first write of any session to the last reply);
- ``all_active_ev_per_s``: events completed while every session was still running (the steady state);
- ``p50_ms``, ``p99_ms``, ``mean_ms``: latency percentiles and mean over the counted events;
- ``first_reply_ms_max``, ``session_end_s_min/max``, ``events``, ``errors``, ``first_error``, ``wall_s``.

``one_session`` is that session loop itself, for any bidi stream. Standard library, numpy and grpc only:
it runs in the TorchServe kit's own venv too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import numpy as np

__all__ = ["WARM", "Tally", "one_session", "percentile_ms", "single_summary"]

WARM = 10  # first events of each session left out of the latency statistics


@dataclasses.dataclass
class Tally:
    """What the sessions of one client run recorded (``perf_counter`` seconds)."""

    done: list[float] = dataclasses.field(default_factory=list)  # completion time of every event
    errors: list[str] = dataclasses.field(default_factory=list)
    spans: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (start, end) per session
    firsts: list[float] = dataclasses.field(default_factory=list)  # first reply's latency per session
    lat: list[float] = dataclasses.field(default_factory=list)  # latencies past WARM
    forecasts: int = 0

    def reply(self, index: int, latency: float, now: float) -> None:
        """The reply to a session's ``index``-th event (0-based) came ``latency`` s after its write."""
        if index >= WARM:
            self.lat.append(latency)
        elif index == 0:
            self.firsts.append(latency)
        self.done.append(now)


async def one_session(call: Any, requests: Sequence[Any], problem: Callable[[Any], str | None], tally: Tally) -> None:
    """Write each request on the bidi ``call`` and wait for its reply before the next; ``problem(reply)``
    says what is wrong with a reply (None: it is the one answer expected), which ends the session."""
    started = time.perf_counter()
    for i, request in enumerate(requests):
        t0 = time.perf_counter()
        await call.write(request)
        reply = await call.read()
        latency = time.perf_counter() - t0
        wrong = "the stream ended early" if reply is grpc.aio.EOF else problem(reply)
        if wrong is not None:
            tally.errors.append(wrong)
            break
        tally.forecasts += 1
        tally.reply(i, latency, time.perf_counter())
    tally.spans.append((started, time.perf_counter()))
    await call.done_writing()
    try:
        await asyncio.wait_for(call.code(), 10)
    except TimeoutError:
        call.cancel()


def percentile_ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.array(values) * 1e3, q)), 3) if values else None


def single_summary(tally: Tally, t0: float, wall: float) -> dict[str, object]:
    """The per-event fields of a run of one-event-per-message sessions that began at ``t0``."""
    res: dict[str, object] = dict(
        events=len(tally.done),
        wall_s=round(wall, 3),
        ev_per_s=round(len(tally.done) / wall, 1),
        p50_ms=percentile_ms(tally.lat, 50),
        p99_ms=percentile_ms(tally.lat, 99),
        mean_ms=round(float(np.mean(tally.lat)) * 1e3, 3) if tally.lat else None,
        errors=len(tally.errors),
        first_error=tally.errors[0] if tally.errors else None,
        first_reply_ms_max=round(1e3 * max(tally.firsts), 2) if tally.firsts else None,
        session_end_s_min=round(min(e for _, e in tally.spans) - t0, 3) if tally.spans else None,
        session_end_s_max=round(max(e for _, e in tally.spans) - t0, 3) if tally.spans else None,
    )
    if tally.spans:
        t_end = min(e for _, e in tally.spans)
        t_beg = max(b for b, _ in tally.spans)
        k = sum(1 for t in tally.done if t_beg <= t <= t_end)
        res["all_active_ev_per_s"] = round(k / (t_end - t_beg), 1) if t_end > t_beg else None
    return res
