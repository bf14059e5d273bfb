"""Benchmark of the compiled serving kernel: ``EventKernel.step_forecast`` against the fused torch path.

What it measures (CPU, float32, the bundled model ``models/default``: d_model 64, 2 layers, 4 heads,
time decay, 8 components, 16 marks, 2 values, a 1-minute time resolution; levels 0.1, 0.5, 0.9, every
mark ranked, as the engine core asks; in one run, so that ratios compare like with like):

1. one event for each of ``B`` sessions, then the forecast of each, at ``B`` = 1, 16, 64, 256:
   ``fused`` (``FusedEventModel.step`` then ``.forecast``, under ``torch.inference_mode``), ``kernel``
   (``EventKernel.step_forecast`` on numpy arrays) and ``kernel (tensors)``: the same call with the
   state as torch tensors converted in (``.numpy()``) and out (``torch.from_numpy``), as a caller holding
   tensors pays;
2. the forecast alone from ``B`` feature rows: ``FusedEventModel.forecast`` against ``EventKernel.forecast``;
3. ``step_forecast`` with the layers' matrices by each BLAS found here (``blas.available``: MKL inside torch,
   numpy's OpenBLAS, the kernel's own loops), in turns;
4. ``step_forecast`` as one call and in parts on the CPUs here (``row_parts``, at most the server's
   ``MAX_KERNEL_THREADS``): parts of ``MIN_PART_ROWS`` rows or more, as the server splits, and of any size;
5. the first call in a fresh process (numba's compile, or its load from the cache): in a subprocess with
   an empty ``NUMBA_CACHE_DIR``, then again with the cache that run wrote.

The candidates of one cell take turns, round by round (``bench.core.time_round_robin``), and the
median over rounds is reported. ``torch.set_num_threads`` as the server does (``torch_threads``, 1 by
default); the kernel runs on one thread. ``AAREN_KERNEL_FASTMATH=1`` or ``=reassoc`` (with a
``NUMBA_CACHE_DIR`` of its own: numba's cache does not key on the flag) times the kernel compiled with
``fastmath`` (``aaren_core.tasks.event.kernel.FASTMATH``; the matrix products and the GELU's ``erf32``
contract multiply-adds, and the layer norm reassociates its float64 sums, whatever the flag).

Run from the repository root::

    python -m bench.kernel                  # about a minute on 2 cores
    python -m bench.kernel --quick          # a few seconds

It prints the tables and writes them as Markdown to ``OUT/kernel.md`` (default ``OUT`` = ``bench/out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from aaren.server.app import MAX_KERNEL_THREADS
from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.event import row_parts
from aaren_core.tasks.event.blas import available
from aaren_core.tasks.event.fused import FusedEventModel
from aaren_core.tasks.event.kernel import FASTMATH, EventKernel
from aaren_core.tasks.event.model import EventModel
from aaren_core.tasks.event.row_parts import MIN_PART_ROWS
from bench.core import Table, fmt, ratio, time_round_robin

BATCHES = (1, 16, 64, 256)
#: the batches of the threads table: a part has MIN_PART_ROWS (128) rows or more, so 256 is the server's first split
PART_BATCHES = (64, 128, 256, 512)
QUANTILES = (0.1, 0.5, 0.9)
CHECKPOINT = "models/default"
SERVER_THREADS = 1  # server.settings: torch_threads defaults to 1

#: the first call in a fresh process, timed: the import, the packing and the first step_forecast
FIRST_CALL = """
import json, time
t0 = time.perf_counter()
from aaren_core.tasks.event.kernel import EventKernel
t1 = time.perf_counter()
import torch
from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.event.fused import FusedEventModel
model = load_checkpoint({checkpoint!r}).model.eval()
kernel = EventKernel.from_fused(FusedEventModel.from_model(model), {levels!r})
state = [t.numpy() for t in model.init_state(1).tensors().values()]
dt, marks, values = torch.zeros(1).numpy(), torch.zeros(1, dtype=torch.long).numpy(), torch.zeros(1, 2).numpy()
t2 = time.perf_counter()
kernel.step_forecast(dt, marks, values, *state, 16)
t3 = time.perf_counter()
kernel.forecast(kernel.step_forecast(dt, marks, values, *state, 16).y, 16)
t4 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "step_forecast_s": t3 - t2, "forecast_s": t4 - t3}}))
"""


def first_call_times(cache_dir: Path) -> dict[str, float]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    code = FIRST_CALL.format(checkpoint=CHECKPOINT, levels=QUANTILES)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def session_inputs(model: EventModel, fused: FusedEventModel, batch: int) -> tuple[tuple[torch.Tensor, ...], ...]:
    """Flights-like events for ``batch`` sessions that have seen a few: ``(dt, marks, values)`` and the state."""
    g = torch.Generator().manual_seed(batch)
    state = tuple(model.init_state(batch).tensors().values())

    def events() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dt = torch.empty(batch).exponential_(1 / 20.0, generator=g).round()
        marks = torch.randint(0, fused.num_marks, (batch,), generator=g)
        values = torch.stack([torch.randn(batch, generator=g) * 40, 200 + torch.rand(batch, generator=g) * 2000], -1)
        return dt, marks, values

    with torch.inference_mode():
        for _ in range(3):
            _, *new = fused.step(*events(), *state)
            state = tuple(new)
    return events(), state


def candidates(
    model: EventModel, fused: FusedEventModel, kernel: EventKernel, batch: int
) -> tuple[dict[str, Callable[[], object]], dict[str, Callable[[], object]]]:
    """``(step + forecast, forecast alone)`` callables per candidate at ``batch``."""
    m = fused.num_marks
    (dt, marks, values), state = session_inputs(model, fused, batch)
    arrays = tuple(t.numpy() for t in (dt, marks, values, *state))
    with torch.inference_mode():
        y = fused.step(dt, marks, values, *state)[0]
    features = y.numpy()

    def fused_step() -> object:
        with torch.inference_mode():
            y, *new = fused.step(dt, marks, values, *state)
            return fused.forecast(y, QUANTILES, m), new

    def kernel_tensors() -> object:
        out = kernel.step_forecast(*(t.numpy() for t in (dt, marks, values, *state)), m)
        return [torch.from_numpy(a) for a in (out.y, out.m, out.u, out.w, out.n_events, *out.forecast)]

    def fused_forecast() -> object:
        with torch.inference_mode():
            return fused.forecast(y, QUANTILES, m)

    step = {"fused": fused_step, "kernel": lambda: kernel.step_forecast(*arrays, m), "kernel (tensors)": kernel_tensors}
    forecast = {"fused": fused_forecast, "kernel": lambda: kernel.forecast(features, m)}
    for fn in (*step.values(), *forecast.values()):
        fn()  # numba's compile or cache load, torch's first call: not in the timed warmup
    return step, forecast


def run(batches: Sequence[int], quick: bool, console: Console) -> list[Table]:
    model = load_checkpoint(CHECKPOINT).model.eval()
    fused = FusedEventModel.from_model(model)
    kernel = EventKernel.from_fused(fused, QUANTILES)
    threads = torch.get_num_threads()
    flags = f"fastmath={FASTMATH if isinstance(FASTMATH, bool) else '+'.join(sorted(FASTMATH))}"
    if FASTMATH is not True:
        flags += " (matrix products and erf32: +contract; layer norm: +reassoc)"
    step_table = Table(
        f"Step + forecast, one event per session: µs per call (CPU, torch {threads} thread(s), kernel {flags})",
        [
            "B",
            "fused µs",
            "kernel µs",
            "kernel (tensors) µs",
            "fused ÷ kernel",
            "fused ÷ kernel (tensors)",
            "kernel µs/row",
        ],
    )
    forecast_table = Table(
        f"Forecast alone from B feature rows: µs per call (kernel {flags})",
        ["B", "fused µs", "kernel µs", "fused ÷ kernel", "kernel µs/row"],
    )
    for batch in batches:
        step, forecast = candidates(model, fused, kernel, batch)
        settings = {
            "repeats": 5 if quick else 25,
            "warmup": 3,
            "budget_s": 1.0 if quick else 6.0,
            "block_s": 0.02 if quick else 0.05,
        }
        us = {n: t * 1e6 for n, t in time_round_robin(step, **settings).items()}
        step_table.rows.append(
            [
                str(batch),
                fmt(us["fused"]),
                fmt(us["kernel"]),
                fmt(us["kernel (tensors)"]),
                ratio(us["fused"], us["kernel"]),
                ratio(us["fused"], us["kernel (tensors)"]),
                fmt(us["kernel"] / batch),
            ]
        )
        console.log(f"step+forecast B={batch}: " + ", ".join(f"{n} {v:.0f} µs" for n, v in us.items()))
        us = {n: t * 1e6 for n, t in time_round_robin(forecast, **settings).items()}
        forecast_table.rows.append(
            [
                str(batch),
                fmt(us["fused"]),
                fmt(us["kernel"]),
                ratio(us["fused"], us["kernel"]),
                fmt(us["kernel"] / batch),
            ]
        )
        console.log(f"forecast B={batch}: " + ", ".join(f"{n} {v:.0f} µs" for n, v in us.items()))
    blas_table = blas_comparison(model, fused, batches, quick, console)
    threads_table = threads_comparison(fused, model, quick, console)
    compile_table = Table(
        f"First call in a fresh process, s (kernel {flags}; model load excluded)",
        ["numba cache", "import (torch, numba, kernel)", "first step_forecast", "first forecast"],
    )
    with tempfile.TemporaryDirectory() as cache:
        for label in ("empty (compiles)", "written by the run above (loads)"):
            t = first_call_times(Path(cache))
            compile_table.rows.append(
                [label, f"{t['import_s']:.2f}", f"{t['step_forecast_s']:.2f}", f"{t['forecast_s']:.2f}"]
            )
            console.log(f"first call, cache {label}: {t}")
    return [step_table, forecast_table, blas_table, threads_table, compile_table]


def blas_comparison(
    model: EventModel, fused: FusedEventModel, batches: Sequence[int], quick: bool, console: Console
) -> Table:
    """``EventKernel.step_forecast`` with its layers' matrices by each ``sgemm`` found here (``blas.available``: MKL
    inside torch, numpy's OpenBLAS, the kernel's own loops), round robin: µs a row, and each over the first's."""
    found = available()
    names = list(found)
    table = Table(
        "Step + forecast by the layers' BLAS: µs a row (blas.available; round robin)",
        ["B", *[f"{n} µs/row" for n in names], *[f"{n} ÷ {names[0]}" for n in names[1:]]],
    )
    kernels = {name: EventKernel.from_fused(fused, QUANTILES, blas) for name, blas in found.items()}
    for batch in batches:
        (dt, marks, values), state = session_inputs(model, fused, batch)
        arrays = tuple(t.numpy() for t in (dt, marks, values, *state))
        calls = {n: (lambda k=k, a=arrays: k.step_forecast(*a, fused.num_marks)) for n, k in kernels.items()}
        settings = {"repeats": 5 if quick else 30, "warmup": 3, "budget_s": 1.0 if quick else 8.0, "block_s": 0.05}
        us = {n: t * 1e6 / batch for n, t in time_round_robin(calls, **settings).items()}
        table.rows.append([str(batch), *[fmt(us[n]) for n in names], *[ratio(us[n], us[names[0]]) for n in names[1:]]])
        console.log(f"blas B={batch}: " + ", ".join(f"{n} {v:.2f} µs/row" for n, v in us.items()))
    return table


def threads_comparison(fused: FusedEventModel, model: EventModel, quick: bool, console: Console) -> Table:
    """``EventKernel.step_forecast`` of one call against its rows in parts on ``T`` threads (``row_parts``; ``T``
    the CPUs this process may use, at most ``server.app.MAX_KERNEL_THREADS``): parts of ``MIN_PART_ROWS`` rows or
    more (the server's rule) and parts of any size (``T`` parts whatever the rows), round robin: µs a call."""
    count = min(MAX_KERNEL_THREADS, len(os.sched_getaffinity(0)))
    table = Table(
        f"Step + forecast in parts on {count} threads (row_parts): µs a call (round robin)",
        ["B", "one call µs", f"parts ≥ {MIN_PART_ROWS} rows µs", "parts of any size µs", "one ÷ parts ≥", "one ÷ any"],
    )
    if count < 2:
        console.log("threads: one CPU here, no parts to compare")
        return table
    kernel = EventKernel.from_fused(fused, QUANTILES)
    rules = {"one": 1 << 62, "parts": MIN_PART_ROWS, "any": 1}  # the fewest rows a part
    try:
        for batch in PART_BATCHES:
            (dt, marks, values), state = session_inputs(model, fused, batch)
            arrays = tuple(t.numpy() for t in (dt, marks, values, *state))
            calls = {n: (lambda a=arrays: kernel.step_forecast(*a, fused.num_marks)) for n in rules}
            settings = {"repeats": 5 if quick else 30, "warmup": 3, "budget_s": 1.0 if quick else 8.0, "block_s": 0.05}
            row_parts.set_threads(count)
            us = {
                n: t * 1e6
                for n, t in time_round_robin(
                    calls, before_block=lambda n: row_parts.set_threads(count, rules[n]), **settings
                ).items()
            }
            table.rows.append(
                [str(batch), *(fmt(us[n]) for n in rules), ratio(us["one"], us["parts"]), ratio(us["one"], us["any"])]
            )
            console.log(f"threads B={batch}: " + ", ".join(f"{n} {v:.0f} µs" for n, v in us.items()))
    finally:
        row_parts.set_threads(1)
    return table


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--threads", type=int, default=SERVER_THREADS, help="torch threads (0: torch's default)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console()
    console.log(
        f"torch {torch.__version__}, numpy {np.__version__}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.get_num_threads()} thread(s)"
    )
    tables = run(args.batches, args.quick, console)
    for table in tables:
        console.print(table.rich())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernel.md").write_text("\n".join(t.markdown() for t in tables))
    console.log(f"wrote {args.out / 'kernel.md'}")


if __name__ == "__main__":
    main()
