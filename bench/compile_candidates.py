"""The candidates for the event model's serving step + forecast at small batches, side by side.

Issue 21 asked for one compiled call per batch instead of hundreds of framework calls, and for the
candidates measured at batch 1, 16, 64 and 256 before one is kept. This runs them in one process, on
the bundled model ``models/default`` (CPU, float32, levels 0.1, 0.5, 0.9, every mark ranked), each cell
round-robin (``bench.core.time_round_robin``: medians over rounds), the inputs of ``bench.kernel``:

- ``fused``: ``FusedEventModel.step`` then ``.forecast`` in eager torch (``inference_mode``);
- ``kernel``: ``aaren_core.tasks.event.kernel.EventKernel.step_forecast`` (numba), what the server uses;
- ``compile``: ``torch.compile`` (inductor, ``dynamic=False``, one graph per batch size) of what
  ``--compile-model`` compiles (``EventTask``'s step and forecast, which trace the modules);
- ``max-autotune``: the same with ``mode="max-autotune-no-cudagraphs"``;
- ``aoti``: AOTInductor (``torch.export`` of the step + forecast, ``aoti_compile_and_package``, loaded
  back), where the export succeeds; where it does not, the table says why.

Each compiled candidate's first call (its compile) is timed with an empty inductor cache
(``TORCHINDUCTOR_CACHE_DIR`` of the run's own) and is not in the timed rounds. Every candidate's outputs
are compared with the fused path's (largest absolute difference of the features and the gap's mean).

    python -m bench.compile_candidates                   # minutes: max-autotune compiles for each B
    python -m bench.compile_candidates --batches 1,64 --skip aoti

Writes ``OUT/compile_candidates.md`` (default ``bench/out``).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numba
import numpy as np
import torch
from rich.console import Console

from aaren.server.tasks.event.task import EventTask
from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.event.fused import FusedEventModel
from aaren_core.tasks.event.kernel import EventKernel
from bench.core import Table, fmt, ratio, time_round_robin
from bench.kernel import CHECKPOINT, QUANTILES, SERVER_THREADS, session_inputs

CANDIDATES = ("fused", "kernel", "compile", "max-autotune", "aoti")
BATCHES = (1, 16, 64, 256)


class StepForecast(torch.nn.Module):
    """``EventTask``'s step then forecast as one module (what ``torch.compile`` and ``torch.export`` see):
    ``(dt [B], marks [B], values [B, V], *state) -> (y [B, d], gap mean [B], gap quantiles [B, Q], ...)``."""

    def __init__(self, task: EventTask, top_k: int) -> None:
        super().__init__()
        self.task = task
        self.model = task.model
        self.top_k = top_k

    def forward(self, dt: torch.Tensor, marks: torch.Tensor, values: torch.Tensor, *state: torch.Tensor) -> Any:
        y, *new = self.task._step_tensors(dt, marks, values, *state)
        return (y, *self.task._forecast_tensors(y, self.top_k), *new)


def _first(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _aoti(module: StepForecast, args: tuple[torch.Tensor, ...], folder: Path) -> Callable[..., Any]:
    """AOTInductor: export, compile into a package, load it back."""
    with torch.inference_mode(False), torch.no_grad():
        exported = torch.export.export(module, args, strict=False)
        path = torch._inductor.aoti_compile_and_package(exported, package_path=str(folder / "step_forecast.pt2"))
    return torch._inductor.aoti_load_package(path)


def _difference(reference: Sequence[Any], other: Sequence[Any]) -> float:
    """The largest absolute difference of the features ``y`` and the gap mean."""
    worst = 0.0
    for a, b in zip(reference[:2], other[:2], strict=True):
        a64 = torch.as_tensor(np.asarray(a), dtype=torch.float64)
        b64 = torch.as_tensor(np.asarray(b), dtype=torch.float64)
        worst = max(worst, float((a64 - b64).abs().max()))
    return worst


def run(batches: Sequence[int], skip: set[str], quick: bool, console: Console) -> list[Table]:
    checkpoint = load_checkpoint(CHECKPOINT)
    model = checkpoint.model.eval()
    fused = FusedEventModel.from_model(model)
    kernel = EventKernel.from_fused(fused, QUANTILES)
    task = EventTask(
        model, version="bench", name="bench", metadata=checkpoint.metadata, device=torch.device("cpu"),
        quantiles=QUANTILES,
    )  # fmt: skip
    m = fused.num_marks
    module = StepForecast(task, m).eval()
    names = [n for n in CANDIDATES if n not in skip]
    speed = Table(
        f"Step + forecast, one event per session: µs per call (CPU, torch {torch.get_num_threads()} thread(s))",
        ["B", *(f"{n} µs" for n in names), *(f"fused ÷ {n}" for n in names if n != "fused")],
    )
    firsts = Table(
        "First call of each compiled candidate, s (its compile, with an empty inductor cache; aoti: export, "
        "compile, package and load too; the kernel's numba cache as it is); largest difference from fused "
        "(features, gap mean)",
        ["B", *(f"{n}: first s / max abs diff" for n in names if n != "fused")],
    )
    for batch in batches:
        (dt, marks, values), state = session_inputs(model, fused, batch)
        args = (dt, marks, values, *state)
        arrays = tuple(t.numpy() for t in args)
        fns: dict[str, Callable[[], Any]] = {}
        first_cells: list[str] = []

        def fused_call(args: tuple[torch.Tensor, ...] = args) -> Any:
            with torch.inference_mode():
                y, *_ = fused.step(*args)
                return (y, *fused.forecast(y, QUANTILES, m))

        reference = fused_call()
        fns["fused"] = fused_call
        for name in (n for n in names if n != "fused"):
            try:
                if name == "kernel":

                    def fn(arrays: tuple[np.ndarray, ...] = arrays) -> Any:
                        out = kernel.step_forecast(*arrays, m)
                        return (out.y, *out.forecast)

                elif name in ("compile", "max-autotune"):
                    torch._dynamo.reset()
                    mode = "max-autotune-no-cudagraphs" if name == "max-autotune" else None
                    compiled = torch.compile(module, dynamic=False, mode=mode)

                    def fn(compiled: Any = compiled, args: tuple[torch.Tensor, ...] = args) -> Any:
                        with torch.inference_mode():
                            return compiled(*args)
                else:
                    t0 = time.perf_counter()
                    with tempfile.TemporaryDirectory() as folder:
                        loaded = _aoti(module, args, Path(folder))
                    built_s = time.perf_counter() - t0

                    def fn(loaded: Any = loaded, args: tuple[torch.Tensor, ...] = args) -> Any:
                        with torch.inference_mode():
                            return loaded(*args)

                out, first_s = _first(fn)
                first_s += built_s if name == "aoti" else 0.0
                fns[name] = fn
                first_cells.append(f"{first_s:.2f} / {_difference(reference, out):.1e}")
                console.log(f"B={batch} {name}: first call {first_s:.2f} s")
            except Exception as exc:  # a candidate that cannot run says why, the others go on
                reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ''}"
                first_cells.append(f"failed ({reason})")
                console.log(f"B={batch} {name}: failed: {reason}")
        firsts.rows.append([str(batch), *first_cells])
        settings = {"repeats": 5 if quick else 25, "warmup": 3, "budget_s": 1.0 if quick else 6.0, "block_s": 0.05}
        us = {n: t * 1e6 for n, t in time_round_robin(fns, **settings).items()}
        speed.rows.append(
            [
                str(batch),
                *(fmt(us[n]) if n in us else "-" for n in names),
                *(ratio(us["fused"], us[n]) if n in us else "-" for n in names if n != "fused"),
            ]
        )
        console.log(f"B={batch}: " + ", ".join(f"{n} {v:.0f} µs" for n, v in us.items()))
    return [speed, firsts]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--skip", default="", help=f"comma-separated candidates to leave out of {CANDIDATES}")
    parser.add_argument("--quick", action="store_true", help="a few rounds per cell")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    torch.set_num_threads(SERVER_THREADS)
    console = Console()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        tables = run(
            [int(b) for b in args.batches.split(",")], set(filter(None, args.skip.split(","))), args.quick, console
        )
    header = [
        "# Serving step + forecast candidates (issue 21)",
        "",
        f"`python -m bench.compile_candidates --batches {args.batches}"
        + (f" --skip {args.skip}" if args.skip else "")
        + ("` (--quick)" if args.quick else "`"),
        "",
        f"torch {torch.__version__}, numba {numba.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs (shared: read the ratios, not the microseconds).",
        "",
    ]
    text = "\n".join(header + [t.markdown() for t in tables])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compile_candidates.md").write_text(text + "\n")
    for t in tables:
        console.print(t.rich())
    console.print(f"wrote {args.out / 'compile_candidates.md'}")


if __name__ == "__main__":
    main()
