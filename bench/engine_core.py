"""The engine core alone: its events/s ceiling, fed in-process with ready-made ``CoreRequest`` s.

The core is assembled as ``aaren serve`` assembles it (bundled model on the CPU, the in-memory
store, default settings: batcher, admission, store writes, settling), but no gRPC, no parsing
and no encoding: every request is built before the clock starts (``EventChecker.request``, as a
front end builds it) and handed to ``EngineCore.submit``; a round submits ``--inflight`` requests
of disjoint sessions at once and waits for all their outcomes (as that many streams of a front
end would), and the next round continues the same sessions one seq (or one run) further.

Kinds (``--kind``): ``b1`` one session x 1 event, one request at a time (the core's share of a
one-session round trip: nothing to amortize), ``b64`` 64 sessions x 1 event per request, ``b256``
256 x 1, ``run64`` one 64-event history of one session per request (the parallel scan). One JSON line per kind:
``ev_per_s``, ``us_per_event``, ``forecasts``, ``events``, ``errors``, ``kernel_threads`` (the threads a large
batch's kernel call may split across: ``aaren_core.tasks.event.row_parts``, set as the server sets it),
``kernel_blas`` (what computes the kernel's layer products: ``EventKernel.blas_name``; under valgrind, whose CPU
the libraries see otherwise, ``blas.rows_exact`` may fail them both and leave the kernel's loops).

    python -m bench.engine_core --kind b64,b256,run64 --rounds 50
    python -m bench.engine_core --kind b256 --rounds 1000 --reps 5 --kernel-threads 1,-1   # in turns
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time

import numpy as np

from aaren.server.app import apply_threads
from aaren.server.contract.columns import FORECAST, CoreRequest, Outcomes
from aaren.server.core.engine_core import EngineCore
from aaren.server.frontends.streams import EventChecker
from aaren.server.observability.metrics import Metrics
from aaren.server.settings import ServerSettings, bundled_checkpoint
from aaren.server.stores import StateLayout, open_store
from aaren.server.tasks.event.task import load_event_task, resolve_device
from aaren_core.tasks.event import row_parts

__all__ = ["KINDS", "main"]

#: kind -> (sessions per request, events per session per request, requests in flight)
KINDS = {"b1": (1, 1, 1), "b64": (64, 1, 4), "b256": (256, 1, 2), "run64": (1, 64, 8), "q64": (1, 1, 64)}


def build_requests(
    checker: EventChecker, kind: str, rounds: int, num_marks: int, width: int, seed: int = 0
) -> list[list[CoreRequest]]:
    """``rounds`` rounds of ``inflight`` ready-made requests each."""
    sessions, length, inflight = KINDS[kind]
    rng = np.random.default_rng(seed)
    out: list[list[CoreRequest]] = []
    clock = np.zeros((inflight, sessions))
    for k in range(rounds):
        batch = []
        for j in range(inflight):
            ids, seqs, times, marks, values = [], [], [], [], []
            for i in range(sessions):
                gaps = rng.exponential(1.0, length)
                t = clock[j, i] + np.cumsum(gaps) + 1.0
                clock[j, i] = t[-1]
                ids += [f"{kind}-{j}-{i}"] * length
                seqs += list(range(k * length + 1, (k + 1) * length + 1))
                times += t.tolist()
                marks += rng.integers(0, num_marks, length).tolist()
                values += rng.standard_normal((length, width)).tolist()
            batch.append(checker.request(ids, seqs, times, marks, values))
        out.append(batch)
    return out


async def measure(kind: str, rounds: int, warmup: int, kernel_threads: int | None = None) -> dict[str, object]:
    settings = ServerSettings() if kernel_threads is None else ServerSettings(kernel_threads=kernel_threads)
    apply_threads(settings, frontends=0)  # as `aaren serve --frontends 0` sets torch's and the kernel's threads
    engine = load_event_task(str(bundled_checkpoint()), resolve_device("cpu"), settings.quantiles)
    store = open_store(
        settings.store_url,
        StateLayout(engine.layout_rows()),
        capacity=settings.session_capacity,
        idle_ttl_s=settings.idle_ttl_s,
    )
    core = EngineCore(engine, store, settings, Metrics())
    await core.start()
    d = engine.description
    checker = EventChecker(d.num_marks, d.value_names, settings.max_session_id_bytes)
    requests = build_requests(checker, kind, warmup + rounds, d.num_marks, d.value_width)
    loop = asyncio.get_running_loop()
    gc.collect()
    gc.freeze()

    async def one_round(batch: list[CoreRequest]) -> list[Outcomes]:
        # The core answers on this loop's thread: a future's set_result, as a front end's stream hands it
        # (StreamLoop._submit), not a thread-safe call that wakes the loop through its self-pipe.
        futures = [loop.create_future() for _ in batch]
        for request, future in zip(batch, futures, strict=True):
            core.submit(request, future.set_result)
        return await asyncio.gather(*futures)

    try:
        for batch in requests[:warmup]:
            await one_round(batch)
        forecasts = errors = events = 0
        started = time.perf_counter()
        for batch in requests[warmup:]:
            for outcomes in await one_round(batch):
                events += len(outcomes.kind)
                got = int((outcomes.kind == FORECAST).sum())
                forecasts += got
                errors += len(outcomes.kind) - got + (outcomes.request_error is not None)
        wall = time.perf_counter() - started
    finally:
        await core.close()
    sessions, length, inflight = KINDS[kind]
    return dict(
        kind=kind,
        sessions_per_request=sessions,
        events_per_session=length,
        inflight=inflight,
        rounds=rounds,
        events=events,
        forecasts=forecasts,
        errors=errors,
        kernel_threads=row_parts.threads(),
        kernel_blas=engine.kernel_blas,
        wall_s=round(wall, 4),
        ev_per_s=round(forecasts / wall, 1),
        us_per_event=round(wall / max(forecasts, 1) * 1e6, 2),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", default="b1,b64,b256,run64", help=f"comma list of {', '.join(KINDS)}")
    p.add_argument("--rounds", type=int, default=50, help="measured rounds per kind")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured rounds first")
    p.add_argument(
        "--kernel-threads",
        default="",
        help="comma list of kernel_threads settings to measure in turns, rep by rep (default: the settings')",
    )
    p.add_argument("--reps", type=int, default=1, help="measurements of each kind (and kernel_threads)")
    a = p.parse_args(argv)
    choices: list[int | None] = [int(t) for t in a.kernel_threads.split(",") if t] or [None]
    bad = 0
    for kind in a.kind.split(","):
        rounds = a.rounds * 8 if kind == "b1" else a.rounds  # one event a round: more rounds
        for _ in range(a.reps):
            for threads in choices:
                res = asyncio.run(measure(kind, rounds, a.warmup, threads))
                print(json.dumps(res), flush=True)
                bad += int(res["errors"]) > 0 or res["forecasts"] != res["events"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
