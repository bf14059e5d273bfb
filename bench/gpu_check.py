"""GPU readiness in one command: equality, batched throughput and end to end on the model's device.

    python -m bench.gpu_check              # on a GPU machine: CUDA, full sizes
    python -m bench.gpu_check --small      # small sizes (automatic when there is no CUDA: on CPU)

Three parts, one table each (printed, and written to ``OUT/gpu_check.md`` and ``.json``):

(a) **Equality**: the bundled model's ``EventTask`` on the device against the same checkpoint's
    ``EventTask`` on the CPU (float32) and against a float64 reference on the CPU that steps every
    event one at a time (docs/architecture.md section 1, invariant 1). Three phases over the same
    sessions: a history ingest from fresh state (``EventTask.apply`` with runs of mixed lengths
    1..257: the parallel scan), one step of every session (the batched step), and a second ingest
    from the stored state (runs of mixed lengths: gather, scan, scatter). Compared: every state
    field, the features and every forecast column, as the largest error relative to the column's
    scale (``max |a - b| / max |b|``); the top marks as the share of ranks that differ (near ties
    may swap). Each must be within its tolerance; the exit code says whether all were.
(b) **Batched throughput**: a state pool of N resident sessions on the device (1k, 64k, 1M), batches
    of B rows gathered from it (``index_select``), applied (one event each: the batched step, with
    and without the forecast, its columns copied to the host) and scattered back (``index_copy_``),
    and a 64-event history per row through the scan: events/s.
(c) **End to end**: ``aaren serve --device DEV --frontends N`` for one and several front ends, driven
    by ``bench.stream_client`` processes with batched messages (B sessions x 1 event, and 64-event
    histories of one session) in the columns layout: events/s, every event answered with a forecast.

On a machine without CUDA everything runs on the CPU with small sizes, so that
``tests/bench/test_gpu_check.py`` runs it in the suite (it checks the equality, never a time).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from aaren.server.settings import bundled_checkpoint
from aaren.server.stores.base import as_tensors
from aaren.server.tasks.event.task import FEATURES, EventTask, RunColumns, load_event_task
from bench.harness import ROOT, describe, start_aaren

__all__ = ["main"]

QUANTILES = (0.1, 0.5, 0.9)
TOP_K = 3
#: Largest error relative to a column's scale: the device against the CPU's float32 engine, and
#: either against the float64 reference (float32 rounding over histories of up to 257 events).
TOL_DEVICE = 1e-4
TOL_FLOAT64 = 2e-3
#: Most top-mark ranks that may differ (near ties swap under different rounding).
TOL_MARK_SWAPS = 0.01
OUTPUT_COLUMNS = ("time_mean", "time_quantiles", "top_probs", "value_mean", "value_std")


@dataclasses.dataclass(frozen=True)
class Sizes:
    sessions: int  # sessions of the equality check
    lengths: tuple[int, ...]  # their run lengths, in turn
    pools: tuple[int, ...]
    batches: tuple[int, ...]
    scan_batches: tuple[int, ...]
    min_time_s: float
    frontends: tuple[int, ...]
    clients: Callable[[int], int]
    streams: int
    batch: int
    messages: int


FULL = Sizes(
    sessions=240,
    lengths=(1, 2, 7, 63, 64, 257),
    pools=(1_000, 64_000, 1_000_000),
    batches=(256, 4_096, 65_536),
    scan_batches=(64, 1_024, 8_192),
    min_time_s=1.0,
    frontends=(1, 4),
    clients=lambda n: max(2, n),
    streams=8,
    batch=256,
    messages=100,
)
SMALL = Sizes(
    sessions=12,
    lengths=(1, 2, 7, 63, 64, 257),
    pools=(1_000, 64_000),
    batches=(64, 1_024),
    scan_batches=(16,),
    min_time_s=0.05,
    frontends=(1, 2),
    clients=lambda n: min(n, 2),  # several client processes from two front ends, as on a GPU machine
    streams=2,
    batch=64,
    messages=4,
)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fresh_rows(engine: EventTask, n: int) -> dict[str, Tensor]:
    """``n`` fresh rows of every per-session tensor, on the engine's device (``name -> [n, ...]``)."""
    return {k: t.unsqueeze(0).repeat(n, *([1] * t.dim())).contiguous() for k, t in engine.layout_rows().items()}


def random_runs(rng: np.random.Generator, lengths: np.ndarray, num_marks: int, width: int) -> RunColumns:
    total = int(lengths.sum())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    dt = rng.exponential(1.0, total)
    dt[starts] = np.where(rng.random(len(starts)) < 0.5, 0.0, dt[starts])  # some sessions' first event
    return RunColumns(
        dt=dt,
        marks=rng.integers(0, num_marks, total).astype(np.int64),
        values=rng.standard_normal((total, width)).astype(np.float32),
        starts=starts,
        lengths=lengths.astype(np.int64),
        want=np.ones(total, dtype=bool),
    )


# -------------------------------------------------------------------------------------------- (a)


class Reference:
    """The model in float64 on the CPU, stepping every event one at a time (batched across sessions)."""

    def __init__(self, engine: EventTask) -> None:
        self.model = copy.deepcopy(engine.model).to("cpu").double().eval()
        self.state_type = engine._state_type
        self.fields = engine._state_fields

    @torch.inference_mode()
    def apply(self, rows: dict[str, Tensor], runs: RunColumns) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        rows = {k: t.clone() for k, t in rows.items()}
        dt = torch.from_numpy(runs.dt)
        marks = torch.from_numpy(runs.marks)
        values = torch.from_numpy(runs.values).double()
        features = torch.zeros(len(runs.dt), rows[FEATURES].shape[-1], dtype=torch.float64)
        for t in range(int(runs.lengths.max())):
            active = np.flatnonzero(runs.lengths > t)
            sel = torch.from_numpy(active)
            idx = torch.from_numpy(runs.starts[active] + t)
            state = self.state_type(**{k: rows[k][sel] for k in self.fields})
            y, new = self.model.step(dt[idx], marks[idx], values[idx], state)
            for k, v in new.tensors().items():
                rows[k][sel] = v
            rows[FEATURES][sel] = y
            features[idx] = y
        f = self.model.forecast(features, QUANTILES, TOP_K)
        outputs = {
            "time_mean": f.time_mean,
            "time_quantiles": f.time_quantiles,
            "top_marks": f.top_marks,
            "top_probs": f.top_probs,
            "value_mean": f.value_mean,
            "value_std": f.value_std,
        }
        return rows, outputs


def rel_err(a: Tensor | np.ndarray, b: Tensor | np.ndarray) -> float:
    """``max |a - b| / max |b|`` in float64 (0 for empty columns); infinities must match exactly."""
    a = torch.as_tensor(np.asarray(a.cpu() if isinstance(a, Tensor) else a)).double()
    b = torch.as_tensor(np.asarray(b.cpu() if isinstance(b, Tensor) else b)).double()
    if a.numel() == 0:
        return 0.0
    finite = torch.isfinite(b)
    if not torch.equal(finite, torch.isfinite(a)) or not torch.equal(a[~finite], b[~finite]):
        return float("inf")
    scale = float(b[finite].abs().max()) if finite.any() else 0.0
    diff = float((a[finite] - b[finite]).abs().max()) if finite.any() else 0.0
    return diff / scale if scale > 0 else diff


def mark_swaps(a: Tensor | np.ndarray, b: Tensor | np.ndarray) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float((a != b).mean()) if a.size else 0.0


SUMMARY = (
    ("state", ("state.m", "state.u", "state.w", "state.h")),
    ("features", (FEATURES,)),
    ("time mean", ("time_mean",)),
    ("time quantiles", ("time_quantiles",)),
    ("mark probs", ("top_probs",)),
    ("values", ("value_mean", "value_std")),
    ("top marks differing", ("top_marks",)),
)


def summarize(checks: list[dict[str, object]]) -> list[dict[str, object]]:
    """One row per (phase, pair): the largest error of each group of columns, and whether all passed."""
    rows: dict[tuple[object, object], dict[str, object]] = {}
    for c in checks:
        row = rows.setdefault(
            (c["phase"], c["pair"]), {"phase": c["phase"], "pair": c["pair"], "events": c["events"], "ok": True}
        )
        row["ok"] = bool(row["ok"]) and bool(c["ok"])
        for label, columns in SUMMARY:
            if c["column"] in columns:
                row[label] = max(float(row.get(label, 0.0)), float(c["error"]))
        if c["column"] == "state.n_events":
            row["event counts"] = "equal" if c["ok"] else "DIFFER"
    return list(rows.values())


def equality(cpu: EventTask, dev: EventTask, sizes: Sizes, seed: int) -> list[dict[str, object]]:
    """Rows of the equality table: one per (phase, compared pair, column)."""
    rng = np.random.default_rng(seed)
    reference = Reference(cpu)
    d = cpu.description
    n = sizes.sessions
    lengths = np.array([sizes.lengths[i % len(sizes.lengths)] for i in range(n)])
    phases = [
        ("ingest from fresh state (scan)", lengths),
        ("one step of every session", np.ones(n, dtype=np.int64)),
        ("ingest from stored state (scan)", np.array([sizes.lengths[(i + 2) % len(sizes.lengths)] for i in range(n)])),
    ]
    rows_cpu = fresh_rows(cpu, n)
    rows_dev = fresh_rows(dev, n)
    rows_ref = {k: (t.double() if t.is_floating_point() else t.clone()) for k, t in fresh_rows(cpu, n).items()}
    table: list[dict[str, object]] = []
    for phase, run_lengths in phases:
        runs = random_runs(rng, run_lengths, d.num_marks, d.value_width)
        rows_cpu, typed_cpu = cpu.apply(rows_cpu, runs, TOP_K)
        rows_dev, typed_dev = dev.apply(rows_dev, runs, TOP_K)
        rows_cpu, rows_dev = as_tensors(rows_cpu), as_tensors(rows_dev)  # the kernel's rows come as numpy
        out_cpu, out_dev = typed_cpu.to_columns(), typed_dev.to_columns()
        rows_ref, out_ref = reference.apply(rows_ref, runs)
        events = int(run_lengths.sum())
        for pair, (rows_a, out_a), (rows_b, out_b), tol in (
            ("device vs CPU float32", (rows_dev, out_dev), (rows_cpu, out_cpu), TOL_DEVICE),
            ("device vs float64", (rows_dev, out_dev), (rows_ref, out_ref), TOL_FLOAT64),
            ("CPU float32 vs float64", (rows_cpu, out_cpu), (rows_ref, out_ref), TOL_FLOAT64),
        ):
            if pair == "device vs CPU float32" and dev.device == cpu.device:
                continue  # the same engine: nothing to compare

            def add(
                column: str, error: float, tol: float, phase: str = phase, pair: str = pair, events: int = events
            ) -> None:
                table.append(
                    dict(phase=phase, pair=pair, column=column, events=events, error=error, tol=tol, ok=error <= tol)
                )

            for name in rows_b:
                if rows_b[name].is_floating_point():
                    add(name if name == FEATURES else f"state.{name}", rel_err(rows_a[name], rows_b[name]), tol)
                else:  # event counts: exactly equal
                    add(f"state.{name}", 0.0 if torch.equal(rows_a[name].cpu(), rows_b[name].cpu()) else 1.0, 0.0)
            for name in OUTPUT_COLUMNS:
                add(name, rel_err(out_a[name], out_b[name]), tol)
            add("top_marks", mark_swaps(out_a["top_marks"], out_b["top_marks"]), TOL_MARK_SWAPS)
    return table


# -------------------------------------------------------------------------------------------- (b)


def timed(fn: Callable[[], None], device: torch.device, min_time: float) -> float:
    """Seconds per call of ``fn`` (after warm-up calls), over at least ``min_time``."""
    for _ in range(2):
        fn()
    sync(device)
    calls, started = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        if calls % 4 == 0 or calls < 4:
            sync(device)
            elapsed = time.perf_counter() - started
            if elapsed >= min_time:
                return elapsed / calls


def cycle(engine: EventTask, pool: dict[str, Tensor], chunks: Sequence[Tensor], runs: RunColumns) -> Callable[[], None]:
    """One batch: gather the next chunk's rows from ``pool``, apply ``runs``, scatter the new rows back."""
    turn = [0]

    def once() -> None:
        idx = chunks[turn[0] % len(chunks)]
        turn[0] += 1
        rows = {k: t.index_select(0, idx) for k, t in pool.items()}
        new, _ = engine.apply(rows, runs, TOP_K)
        for k, t in as_tensors(new).items():
            pool[k].index_copy_(0, idx, t)

    return once


@torch.inference_mode()
def throughput(engine: EventTask, sizes: Sizes, seed: int) -> list[dict[str, object]]:
    d = engine.description
    device = engine.device
    rng = np.random.default_rng(seed)
    table: list[dict[str, object]] = []
    for n in sizes.pools:
        pool = fresh_rows(engine, n)
        pool_bytes = sum(t.numel() * t.element_size() for t in pool.values())
        perm = torch.randperm(n, device=device)
        for kind, batches, length in (
            ("step", sizes.batches, 1),
            ("step + forecast", sizes.batches, 1),
            ("64-event scan + forecast", sizes.scan_batches, 64),
        ):
            for b in batches:
                if b > n:
                    continue
                chunks = [perm[i * b : (i + 1) * b] for i in range(min(8, n // b))]
                runs = random_runs(rng, np.full(b, length), d.num_marks, d.value_width)
                if kind == "step":
                    runs = dataclasses.replace(runs, want=np.zeros(len(runs.dt), dtype=bool))
                per_call = timed(cycle(engine, pool, chunks, runs), device, sizes.min_time_s)
                table.append(
                    dict(
                        pool=n,
                        pool_mb=round(pool_bytes / 2**20, 1),
                        kind=kind,
                        batch=b,
                        events=b * length,
                        ms_per_batch=round(per_call * 1e3, 3),
                        events_per_s=round(b * length / per_call),
                    )
                )
        del pool, perm
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return table


# -------------------------------------------------------------------------------------------- (c)


def end_to_end(device: str, sizes: Sizes, out: Path) -> list[dict[str, object]]:
    table: list[dict[str, object]] = []
    for frontends in sizes.frontends:
        server = start_aaren(frontends, out / f"gpu_check-serve-f{frontends}.log", device=device)
        try:
            model = describe(server.address)
            for mode in ("batch", "run"):
                batch = sizes.batch if mode == "batch" else 64
                clients = sizes.clients(frontends)
                cmd = [
                    sys.executable,
                    "-m",
                    "bench.stream_client",
                    "--target",
                    server.address,
                    "--mode",
                    mode,
                    "--streams",
                    str(sizes.streams),
                    "--batch",
                    str(batch),
                    "--messages",
                    str(sizes.messages),
                    "--layout",
                    "columns",
                    "--channels",
                    str(sizes.streams),
                    "--num-marks",
                    str(model.num_marks),
                    "--value-width",
                    str(model.value_width),
                ]
                started = time.perf_counter()
                procs = [
                    subprocess.Popen(
                        [*cmd, "--tag", f"f{frontends}-{mode}-c{c}"], cwd=ROOT, stdout=subprocess.PIPE, text=True
                    )
                    for c in range(clients)
                ]
                results = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
                forecasts = sum(int(r["forecasts"]) for r in results)
                events = sum(int(r["events"]) for r in results)
                wall = max(float(r["wall_s"]) for r in results)
                table.append(
                    dict(
                        frontends=frontends,
                        clients=clients,
                        message=(f"{batch} sessions x 1 event" if mode == "batch" else "64-event history of 1 session"),
                        events=events,
                        forecasts=forecasts,
                        errors=sum(int(r["errors"]) for r in results),
                        wall_s=round(wall, 3),
                        events_per_s=round(forecasts / wall) if wall else 0,
                        msg_p50_ms=max(r["msg_p50_ms"] or 0 for r in results),
                        client_s=round(time.perf_counter() - started, 1),
                    )
                )
        finally:
            server.stop()
    return table


# -------------------------------------------------------------------------------------------- report


def markdown(title: str, rows: list[dict[str, object]], columns: Sequence[str]) -> list[str]:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.2e}" if v and (abs(v) < 1e-2 or abs(v) >= 1e6) else f"{v:g}"
        if isinstance(v, bool):
            return "ok" if v else "**FAIL**"
        return str(v)

    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return [*lines, ""]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="small sizes (automatic without CUDA)")
    p.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    p.add_argument("--checkpoint", default=None, help="default: the bundled model")
    p.add_argument("--skip", default="", help="comma list of parts to leave out: equality,throughput,e2e")
    p.add_argument("--frontends", default=None, help="comma list of front-end counts for (c)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="output folder")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    small = a.small or device.type != "cuda"
    sizes = SMALL if small else FULL
    if a.frontends:
        sizes = dataclasses.replace(sizes, frontends=tuple(int(x) for x in a.frontends.split(",")))
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    a.out.mkdir(parents=True, exist_ok=True)
    checkpoint = a.checkpoint or str(bundled_checkpoint())
    torch.manual_seed(a.seed)
    cpu = load_event_task(checkpoint, torch.device("cpu"), QUANTILES)
    dev = cpu if device.type == "cpu" else load_event_task(checkpoint, device, QUANTILES)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    head = [
        "# bench/gpu_check.py",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; device {device} ({name}); "
        f"{'small' if small else 'full'} sizes; torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; model {cpu.description.name} ({cpu.description.parameters} parameters, "
        f"{cpu.description.state_bytes_per_session} state bytes per session)",
        "",
        "`" + " ".join(["python -m bench.gpu_check", *(sys.argv[1:] if argv is None else argv)]) + "`",
        "",
    ]
    print("\n".join(head), flush=True)
    result: dict[str, object] = {"device": str(device), "small": small}
    lines = list(head)
    ok = True
    timings: dict[str, float] = {}
    if "equality" not in skip:
        started = time.perf_counter()
        eq = equality(cpu, dev, sizes, a.seed)
        timings["equality"] = round(time.perf_counter() - started, 1)
        result["equality"] = eq
        ok = all(bool(r["ok"]) for r in eq)
        part = markdown(
            f"(a) equality: largest error relative to each column's scale; tolerance {TOL_DEVICE:g} device vs CPU, "
            f"{TOL_FLOAT64:g} vs float64, top marks differing <= {TOL_MARK_SWAPS:g} "
            f"({'all within tolerance' if ok else 'FAILED'})",
            summarize(eq),
            ("phase", "pair", "events", *(label for label, _ in SUMMARY), "event counts", "ok"),
        )
        print("\n".join(part), flush=True)
        lines += part
    if "throughput" not in skip:
        started = time.perf_counter()
        tp = throughput(dev, sizes, a.seed)
        timings["throughput"] = round(time.perf_counter() - started, 1)
        result["throughput"] = tp
        part = markdown(
            "(b) batched throughput: B rows gathered from a pool of N resident sessions, applied, scattered back",
            tp,
            ("pool", "pool_mb", "kind", "batch", "events", "ms_per_batch", "events_per_s"),
        )
        print("\n".join(part), flush=True)
        lines += part
    if "e2e" not in skip:
        started = time.perf_counter()
        e2e = end_to_end(str(device), sizes, a.out)
        timings["e2e"] = round(time.perf_counter() - started, 1)
        result["e2e"] = e2e
        e2e_ok = all(r["errors"] == 0 and r["forecasts"] == r["events"] for r in e2e)
        ok = ok and e2e_ok
        part = markdown(
            f"(c) end to end: aaren serve --device {device}, batched messages, columns layout "
            f"({'every event forecast' if e2e_ok else 'SOME EVENTS NOT FORECAST'})",
            e2e,
            (
                "frontends",
                "clients",
                "message",
                "events",
                "forecasts",
                "errors",
                "wall_s",
                "events_per_s",
                "msg_p50_ms",
            ),
        )
        print("\n".join(part), flush=True)
        lines += part
    result["ok"] = ok
    result["seconds"] = timings
    (a.out / "gpu_check.md").write_text("\n".join(lines))
    (a.out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    verdict = "all checks passed" if ok else "CHECKS FAILED"
    print(f"gpu_check: {verdict} (seconds per part: {timings}); tables in {a.out / 'gpu_check.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
