"""Benchmark of the serving step: ``EventTask.apply`` of one event per session, and ``forecast_outputs``.

What it measures (CPU by default, float32, the bundled model ``models/default``: d_model 64,
2 layers, 4 heads, 16 marks, 2 values; in one run, so that ratios compare like with like):

1. ``EventTask.apply`` of one event for each of ``B`` sessions (one batched step, then the forecast
   of every session ranking every mark, as the engine core asks), at ``B`` = 1, 16, 64, 256:
   ``reference`` (``EventTask.fused = False``: ``EventModel.step`` and ``EventModel.forecast``, module
   by module) against ``fused`` (``aaren_core.tasks.event.fused``, the default), and with ``--compiled`` an
   engine built with ``compile_model=True`` (inductor; it traces the reference modules).
2. ``EventTask.forecast_outputs`` alone on ``B`` feature rows, the same candidates.

The candidates of one cell take turns, round by round (``bench.core.time_round_robin``), and the
median over rounds is reported, so drift in the load of these shared machines hits each alike.
The ``aten ops`` column counts the top-level ATen calls of one batch-1 call (torch.profiler):
a figure that does not depend on the load.

Run from the repository root::

    python -m bench.step                  # about a minute on 2 cores
    python -m bench.step --quick          # a few seconds
    python -m bench.step --compiled --threads 1 --out /tmp/bench

It prints the table and writes it as Markdown to ``OUT/step.md`` (default ``OUT`` = ``bench/out``).
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from torch.profiler import ProfilerActivity, profile

from aaren.server.stores.base import as_tensors
from aaren.server.tasks.event.task import EventTask, RunColumns, load_event_task
from bench.core import Table, fmt, ratio, time_round_robin

BATCHES = (1, 16, 64, 256)
QUANTILES = (0.1, 0.5, 0.9)
CHECKPOINT = "models/default"


def aten_ops(fn: Callable[[], object]) -> int:
    """Top-level ATen calls made by one call of ``fn`` (after one warmup call)."""
    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    return sum(1 for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))


def engines(device: torch.device, compiled: bool) -> dict[str, EventTask]:
    reference = load_event_task(CHECKPOINT, device, QUANTILES)
    reference.fused = False
    out = {"reference": reference, "fused": load_event_task(CHECKPOINT, device, QUANTILES)}
    if compiled:
        out["compiled"] = load_event_task(CHECKPOINT, device, QUANTILES, compile_model=True)
    return out


def candidates(engs: dict[str, EventTask], batch: int, what: str) -> dict[str, Callable[[], object]]:
    """One call of ``apply`` (one event per session) or ``forecast_outputs`` per candidate, at ``batch``."""
    rng = np.random.default_rng(batch)
    any_engine = next(iter(engs.values()))
    desc = any_engine.description
    runs = RunColumns.single(
        rng.exponential(20.0, batch).tolist(),
        rng.integers(0, desc.num_marks, batch).tolist(),
        rng.normal(size=(batch, desc.value_width)).tolist(),
    )
    # Rows of sessions that have seen a few events, as a store holds them (one tensor per field).
    rows = {k: torch.stack([t] * batch) for k, t in any_engine.layout_rows().items()}
    for _ in range(3):
        rows, _ = any_engine.apply(rows, runs, desc.num_marks)
    rows = as_tensors(rows)  # the kernel's rows come as numpy
    features = rows["features"]
    if what == "apply":
        return {name: (lambda e=e: e.apply(rows, runs, desc.num_marks)) for name, e in engs.items()}
    return {name: (lambda e=e: e.forecast_outputs(features, desc.num_marks)) for name, e in engs.items()}


def run(batches: Sequence[int], compiled: bool, device: torch.device, quick: bool, console: Console) -> Table:
    engs = engines(device, compiled)
    names = list(engs)
    headers = ["call", "B", *(f"{n} µs" for n in names), "reference ÷ fused"]
    if compiled:
        headers.append("reference ÷ compiled")
    headers += [f"{n} aten ops (B=1)" for n in names if n != "compiled"]
    table = Table(
        f"EventTask: one event per session, µs per call ({device}, {torch.get_num_threads()} threads)", headers
    )
    for what in ("apply", "forecast_outputs"):
        ops = {n: aten_ops(f) for n, f in candidates(engs, 1, what).items() if n != "compiled"}
        for batch in batches:
            fns = candidates(engs, batch, what)
            with torch.inference_mode():
                t = time_round_robin(
                    fns,
                    repeats=5 if quick else 15,
                    warmup=3,
                    budget_s=1.0 if quick else 6.0,
                    block_s=0.02 if quick else 0.05,
                )
            us = {n: t[n] * 1e6 for n in names}
            row = [what, str(batch), *(fmt(us[n]) for n in names), ratio(us["reference"], us["fused"])]
            if compiled:
                row.append(ratio(us["reference"], us["compiled"]))
            row += [str(ops[n]) if batch == batches[0] else "" for n in names if n != "compiled"]
            table.rows.append(row)
            console.log(f"{what} B={batch}: " + ", ".join(f"{n} {us[n]:.0f} µs" for n in names))
    return table


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--compiled", action="store_true", help="also an engine with compile_model=True")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console()
    console.log(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    )
    table = run(args.batches, args.compiled, torch.device(args.device), args.quick, console)
    console.print(table.rich())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "step.md").write_text(table.markdown())
    console.log(f"wrote {args.out / 'step.md'}")


if __name__ == "__main__":
    main()
