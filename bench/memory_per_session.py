"""Resident memory per session: the engine core alone, filled with N sessions of one event each.

    python -m bench.memory_per_session                       # 100k, 250k, 500k, 1M sessions
    python -m bench.memory_per_session --sessions 1000000 --checkpoints 200000,500000,1000000

The engine core is assembled as ``bench.engine_core`` assembles it (bundled model on the CPU, the
memory store, default settings) but with a session capacity above N, so nothing is evicted. Requests
of 256 new sessions x 1 event (seq 1) are built one at a time, submitted and answered, and dropped, so
that only what the server keeps grows. At each checkpoint (after ``gc.collect()``) the process's
resident set size (``/proc/self/statm``) is read; the table gives the growth per session since the
start (before the first event) and between checkpoints (the marginal cost, free of start-up), beside
the state pool's own bytes per session (the rows the pool holds for the sessions, its spare rows
included) and what the state itself is (``ModelDescription.state_bytes_per_session``). Memory, not
time: the figures do not move with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

__all__ = ["main", "measure"]

BATCH = 256


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def measure(sessions: int, checkpoints: list[int]) -> dict[str, object]:
    from aaren.server.contract.columns import FORECAST, Outcomes
    from aaren.server.core.engine_core import EngineCore
    from aaren.server.frontends.streams import EventChecker
    from aaren.server.observability.metrics import Metrics
    from aaren.server.settings import ServerSettings, bundled_checkpoint
    from aaren.server.stores import StateLayout, open_store
    from aaren.server.tasks.event.task import load_event_task, resolve_device

    settings = ServerSettings(session_capacity=sessions + BATCH)
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    task = load_event_task(str(bundled_checkpoint()), resolve_device("cpu"), settings.quantiles)
    store = open_store(
        settings.store_url, StateLayout(task.layout_rows()), capacity=settings.session_capacity, idle_ttl_s=3600.0
    )
    core = EngineCore(task, store, settings, Metrics())
    await core.start()
    d = task.description
    checker = EventChecker(d.num_marks, d.value_names, settings.max_session_id_bytes)
    rng = np.random.default_rng(0)
    loop = asyncio.get_running_loop()
    gc.collect()
    start_rss = _rss_bytes()
    rows: list[dict[str, object]] = []
    done = last_done = 0
    last_rss = start_rss
    try:
        for checkpoint in checkpoints:
            while done < checkpoint:
                n = min(BATCH, checkpoint - done)
                ids = [f"session-{done + i:08d}" for i in range(n)]
                request = checker.request(
                    ids, [1] * n, (rng.exponential(60.0, n) + 1.0).tolist(), rng.integers(0, d.num_marks, n).tolist(),
                    rng.standard_normal((n, d.value_width)).tolist(),
                )  # fmt: skip
                answer: asyncio.Future[Outcomes] = loop.create_future()
                core.submit(request, answer.set_result)
                outcomes = await answer
                if int((outcomes.kind == FORECAST).sum()) != n:
                    raise SystemExit(f"a request of {n} new sessions was not answered with {n} forecasts")
                done += n
            gc.collect()
            rss = _rss_bytes()
            pool_rows = getattr(store, "pool_rows", 0)
            row_bytes = store.layout.row_nbytes
            rows.append(
                {
                    "sessions": done,
                    "rss_mib": round(rss / 2**20, 1),
                    "bytes_per_session_since_start": round((rss - start_rss) / done),
                    "bytes_per_session_marginal": round((rss - last_rss) / max(done - last_done, 1)),
                    "pool_bytes_per_session": round(pool_rows * row_bytes / done),
                    "held": await store.count(),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            last_rss, last_done = rss, done
    finally:
        await core.close()
    return {
        "state_bytes_per_session": d.state_bytes_per_session,
        "start_rss_mib": round(start_rss / 2**20, 1),
        "rows": rows,
    }


def table(result: dict[str, object]) -> str:
    lines = [
        f"state per session: {result['state_bytes_per_session']} B; resident before the first event: "
        f"{result['start_rss_mib']} MiB",
        "",
        "| sessions held | resident MiB | B per session since start | B per session since the last row "
        "| state pool B per session |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:  # type: ignore[union-attr]
        lines.append(
            f"| {r['sessions']:,} | {r['rss_mib']} | {r['bytes_per_session_since_start']:,} "
            f"| {r['bytes_per_session_marginal']:,} | {r['pool_bytes_per_session']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=1_000_000)
    p.add_argument("--checkpoints", default="100000,250000,500000,1000000", help="comma list, the last = --sessions")
    p.add_argument("--out", type=Path, default=None, help="also write the Markdown table here")
    a = p.parse_args(argv)
    checkpoints = sorted({int(c) for c in a.checkpoints.split(",") if int(c) <= a.sessions} | {a.sessions})
    result = asyncio.run(measure(a.sessions, checkpoints))
    text = table(result)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
