"""Benchmark of the model library: per-event step cost and parallel forward+backward cost.

What it measures (all on CPU, float32, in one run so that ratios compare like with like):

1. **Step time per event** of the three backbones (``AarenModel``, ``GRUModel``, ``TransformerModel``
   with its KV cache; ``d_model=64``, 2 layers, 4 heads, eval mode, ``torch.inference_mode``) after
   a history of ``T`` events, at batch 1 and batch 256. The history is reached with one
   ``prefill`` of random events at batch 1, whose state is copied to every row of the batch (the
   step cost does not depend on the state's contents, and this avoids a batch-256 prefill of
   16,384 events). Each timed call is one ``model.step`` whose returned state feeds the next
   call, so the Transformer's cache grows by one per call; every block of calls restarts from
   the history-``T`` state and is at most ``T / 8`` calls long, so the history stays within
   ``[T, 1.125 T]``. Reported: microseconds per event = time per step call / batch.
2. **Forward+backward time** (``loss = out.sum(); loss.backward()``) over a whole sequence of
   ``N`` tokens: ``attention_scan`` with ``method="chunked"`` and ``method="hillis_steele"``
   (scores ``s [B, N, H]``, values ``v [B, N, H, D]``), causal softmax attention by
   ``F.scaled_dot_product_attention(is_causal=True)`` on ``q, k, v [B, H, N, D]`` (a Transformer
   layer's attention cost), and the O(N^2) ``attention_naive`` where its memory allows. The two
   scan methods are also timed forward-only. Then the whole ``AarenModel`` and ``TransformerModel``
   forward+backward on ``x [B, N, 64]``.

The candidates of one measurement (the three backbones at one history and batch; the attention
methods at one ``N``; the two models at one ``N``) take turns, round by round, each with a block
of back-to-back calls lasting about ``block_s``, and the median over rounds is reported, so that
drift in the load of these shared machines hits every candidate alike. A measurement stops
early once its time budget is spent (never below 3 rounds).

Run from the repository root::

    python bench/core.py              # full grid, several minutes on 2 cores
    python bench/core.py --quick      # small grid, under a minute
    python bench/core.py --threads 1 --repeats 9 --out /tmp/bench

It prints the tables, writes them as Markdown to ``OUT/core.md`` and draws ``OUT/core.png``
(default ``OUT`` = ``bench/out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table as RichTable
from torch import Tensor

from aaren_core.attention import attention_naive, attention_scan
from aaren_core.attention.state import State
from aaren_core.nn.backbones import Backbone, BackboneConfig, build_backbone

KINDS = ("aaren", "gru", "transformer")
SCAN_METHODS: tuple[Literal["chunked", "hillis_steele"], ...] = ("chunked", "hillis_steele")
D_MODEL, N_LAYERS, N_HEADS = 64, 2, 4
SEQ_HEADS, SEQ_HEAD_DIM = 4, 16


@dataclasses.dataclass(frozen=True)
class Grid:
    """What to measure and how long to spend on it."""

    histories: tuple[int, ...]
    batches: tuple[int, ...]
    seq_lens: tuple[int, ...]
    seq_batch: int
    naive_max_n: int
    model_max_n: int
    repeats: int
    warmup: int
    budget_s: float
    block_s: float


FULL = Grid(
    histories=(16, 256, 4096, 16384),
    batches=(1, 256),
    seq_lens=(256, 512, 1024, 2048, 4096, 8192),
    seq_batch=4,
    naive_max_n=2048,
    model_max_n=8192,
    repeats=15,
    warmup=2,
    budget_s=12.0,
    block_s=0.05,
)
QUICK = Grid(
    histories=(16, 1024),
    batches=(1, 256),
    seq_lens=(256, 1024),
    seq_batch=4,
    naive_max_n=1024,
    model_max_n=1024,
    repeats=5,
    warmup=1,
    budget_s=1.5,
    block_s=0.02,
)


@dataclasses.dataclass
class Table:
    """A table kept as strings, rendered both with rich and as Markdown."""

    title: str
    headers: list[str]
    rows: list[list[str]] = dataclasses.field(default_factory=list)

    def rich(self) -> RichTable:
        table = RichTable(title=self.title)
        for i, h in enumerate(self.headers):
            table.add_column(h, justify="left" if i == 0 else "right")
        for row in self.rows:
            table.add_row(*row)
        return table

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.headers) + " |"]
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(self.headers) - 1)) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"


def time_round_robin(
    fns: dict[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int,
    budget_s: float,
    block_s: float,
    max_inner: int = 1000,
    before_block: Callable[[str], None] | None = None,
    min_repeats: int = 3,
) -> dict[str, float]:
    """Median seconds per call of each function, the functions taking turns.

    Each function gets a block of ``inner`` back-to-back calls per round, ``inner`` chosen from
    its last warmup call so that a block lasts about ``block_s`` (one call for slow functions);
    a sample is the block's time / ``inner``. ``before_block(name)``, if given, runs untimed
    before every block (and after warmup). Warmup stops early when a single call eats a
    quarter of the budget. Rounds stop after ``repeats`` or, once ``min_repeats`` are done, when
    ``budget_s`` is spent.
    """
    inner: dict[str, int] = {}
    for name, fn in fns.items():
        last = 0.0
        for _ in range(max(1, warmup)):
            t0 = time.perf_counter()
            fn()
            last = time.perf_counter() - t0
            if last > budget_s / 4:
                break
        inner[name] = max(1, min(max_inner, math.ceil(block_s / max(last, 1e-9))))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    for r in range(repeats):
        for name, fn in fns.items():
            if before_block is not None:
                before_block(name)
            t0 = time.perf_counter()
            for _ in range(inner[name]):
                fn()
            samples[name].append((time.perf_counter() - t0) / inner[name])
        if r + 1 >= min_repeats and time.perf_counter() - start > budget_s:
            break
    return {name: statistics.median(ts) for name, ts in samples.items()}


def fmt(x: float | None) -> str:
    """Three significant figures, or a dash for a cell that was not measured."""
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def make_backbone(kind: str) -> Backbone[Any]:
    cfg = BackboneConfig(kind=kind, d_model=D_MODEL, n_layers=N_LAYERS, n_heads=N_HEADS)  # type: ignore[arg-type]
    return build_backbone(cfg)


@dataclasses.dataclass
class StepResult:
    us_per_event: dict[tuple[str, int, int], float]  # (kind, batch, history) -> µs per event
    state_bytes: dict[tuple[str, int], int]  # (kind, history) -> bytes per session


class _Stepper:
    """Steps ``model`` once per call, feeding each returned state to the next call; ``reset``
    goes back to the initial state (states are immutable, so this copies nothing)."""

    def __init__(self, model: Backbone[Any], x_t: Tensor, state: State) -> None:
        self.model, self.x_t, self.initial, self.state = model, x_t, state, state

    def __call__(self) -> None:
        _, self.state = self.model.step(self.x_t, self.state)

    def reset(self) -> None:
        self.state = self.initial


def _time_steps(grid: Grid, models: dict[str, Backbone[Any]], seeds: dict[str, State], batch: int) -> dict[str, float]:
    """Seconds per step call of each backbone at batch ``batch``, every row starting from its seed state."""
    history = int(next(iter(seeds.values())).n_events[0])  # type: ignore[attr-defined]
    x_t = torch.randn(batch, D_MODEL)
    rows = torch.zeros(batch, dtype=torch.long)
    steppers = {kind: _Stepper(m, x_t, seeds[kind].select(rows)) for kind, m in models.items()}
    # Each block restarts from the history-T state and grows it by at most T/8 events.
    return time_round_robin(
        dict(steppers),
        repeats=grid.repeats,
        warmup=grid.warmup,
        budget_s=grid.budget_s,
        block_s=grid.block_s,
        max_inner=max(1, history // 8),
        before_block=lambda kind: steppers[kind].reset(),
    )


def bench_steps(grid: Grid, console: Console) -> StepResult:
    """Per-event step time of every backbone at every (history, batch) of the grid."""
    models = {kind: make_backbone(kind).eval() for kind in KINDS}
    result = StepResult({}, {})
    with torch.inference_mode():
        for history in grid.histories:
            # One real history per backbone at batch 1; rows of a batch are copies of it.
            seeds = {kind: m.prefill(torch.randn(1, history, D_MODEL))[1] for kind, m in models.items()}
            for kind, st in seeds.items():
                result.state_bytes[kind, history] = models[kind].state_nbytes(st)
            for batch in grid.batches:
                for kind, t in _time_steps(grid, models, seeds, batch).items():
                    result.us_per_event[kind, batch, history] = t * 1e6 / batch
                gc.collect()
                console.log(
                    f"step  T={history:>6} B={batch:>4}: "
                    + ", ".join(f"{k} {result.us_per_event[k, batch, history]:.2f} µs/event" for k in KINDS)
                )
    return result


def _fwd_bwd(fn: Callable[[], Tensor], leaves: Sequence[Tensor]) -> Callable[[], None]:
    def run() -> None:
        for t in leaves:
            t.grad = None
        fn().sum().backward()

    return run


def _forward_only(fn: Callable[[], Tensor]) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            fn()

    return run


def _scan(s: Tensor, v: Tensor, method: Literal["chunked", "hillis_steele"]) -> Callable[[], Tensor]:
    return lambda: attention_scan(s, v, method=method)[0]


@dataclasses.dataclass
class SeqResult:
    fwd_bwd_ms: dict[tuple[str, int], float]  # (method, N) -> ms
    fwd_ms: dict[tuple[str, int], float]  # (scan method, N) -> ms
    model_ms: dict[tuple[str, int], float]  # (kind, N) -> ms


def _attention_candidates(grid: Grid, n: int) -> dict[str, Callable[[], None]]:
    """The calls timed side by side at sequence length ``n`` (fresh random inputs)."""
    b, h, d = grid.seq_batch, SEQ_HEADS, SEQ_HEAD_DIM
    s = torch.randn(b, n, h, requires_grad=True)  # [B, N, H]
    v = torch.randn(b, n, h, d, requires_grad=True)  # [B, N, H, D]
    q, k, vv = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))  # [B, H, N, D]
    fns: dict[str, Callable[[], None]] = {}
    for method in SCAN_METHODS:
        scan = _scan(s, v, method)
        fns[method] = _fwd_bwd(scan, (s, v))
        fns[f"{method} fwd"] = _forward_only(scan)
    fns["sdpa"] = _fwd_bwd(lambda: F.scaled_dot_product_attention(q, k, vv, is_causal=True), (q, k, vv))
    if n <= grid.naive_max_n:
        fns["naive"] = _fwd_bwd(lambda: attention_naive(s, v), (s, v))
    return fns


def _model_candidates(grid: Grid, n: int, models: dict[str, Backbone[Any]]) -> dict[str, Callable[[], None]]:
    x = torch.randn(grid.seq_batch, n, D_MODEL)  # [B, N, d_model]
    return {kind: _fwd_bwd(_call(m, x), list(m.parameters())) for kind, m in models.items()}


def _call(model: Backbone[Any], x: Tensor) -> Callable[[], Tensor]:
    return lambda: model(x)


def bench_sequences(grid: Grid, console: Console) -> SeqResult:
    """Forward+backward of the scans, causal SDPA, the naive reference and the whole models."""
    result = SeqResult({}, {}, {})
    models = {kind: make_backbone(kind).train() for kind in ("aaren", "transformer")}
    for n in grid.seq_lens:
        times = time_round_robin(
            _attention_candidates(grid, n),
            repeats=grid.repeats,
            warmup=grid.warmup,
            budget_s=grid.budget_s,
            block_s=grid.block_s,
        )
        for name, t in times.items():
            if name.endswith(" fwd"):
                result.fwd_ms[name.removesuffix(" fwd"), n] = t * 1e3
            else:
                result.fwd_bwd_ms[name, n] = t * 1e3
        gc.collect()
        if n <= grid.model_max_n:
            times = time_round_robin(
                _model_candidates(grid, n, models),
                repeats=grid.repeats,
                warmup=grid.warmup,
                budget_s=grid.budget_s,
                block_s=grid.block_s,
            )
            for kind, t in times.items():
                result.model_ms[kind, n] = t * 1e3
            gc.collect()
        console.log(
            f"seq   N={n:>5}: "
            + ", ".join(f"{name} {result.fwd_bwd_ms[name, n]:.1f} ms" for name in ("chunked", "hillis_steele", "sdpa"))
            + "".join(
                f", {kind} model {result.model_ms[kind, n]:.1f} ms" for kind in models if (kind, n) in result.model_ms
            )
        )
    return result


def step_tables(grid: Grid, res: StepResult) -> list[Table]:
    table = Table(
        "Step time per event (µs/event = time per step call / batch)",
        ["batch", "history", "aaren", "gru", "transformer", "transformer/aaren", "gru/aaren"],
    )
    for batch in grid.batches:
        for history in grid.histories:
            a, g, t = (res.us_per_event.get((kind, batch, history)) for kind in KINDS)
            table.rows.append([str(batch), f"{history:,}", fmt(a), fmt(g), fmt(t), ratio(t, a), ratio(g, a)])
    state = Table(
        "State size per session (bytes)",
        ["history", "aaren", "gru", "transformer", "transformer/aaren"],
    )
    for history in grid.histories:
        a, g, t = (res.state_bytes[kind, history] for kind in KINDS)
        state.rows.append([f"{history:,}", f"{a:,}", f"{g:,}", f"{t:,}", ratio(t, a)])
    return [table, state]


def seq_tables(grid: Grid, res: SeqResult) -> list[Table]:
    fb = Table(
        f"Forward+backward of the attention alone (ms; B={grid.seq_batch}, H={SEQ_HEADS}, D={SEQ_HEAD_DIM})",
        [
            "N",
            "chunked",
            "hillis_steele",
            "sdpa causal",
            "naive",
            "hs/chunked",
            "sdpa/chunked",
            "naive/chunked",
            "faster scan",
        ],
    )
    fwd = Table(
        f"Forward only of the scans (ms; B={grid.seq_batch}, H={SEQ_HEADS}, D={SEQ_HEAD_DIM})",
        ["N", "chunked", "hillis_steele", "hs/chunked", "faster scan"],
    )
    for n in grid.seq_lens:
        c, hs = res.fwd_bwd_ms[("chunked", n)], res.fwd_bwd_ms[("hillis_steele", n)]
        sd, nv = res.fwd_bwd_ms.get(("sdpa", n)), res.fwd_bwd_ms.get(("naive", n))
        fb.rows.append(
            [
                f"{n:,}",
                fmt(c),
                fmt(hs),
                fmt(sd),
                fmt(nv),
                ratio(hs, c),
                ratio(sd, c),
                ratio(nv, c),
                "chunked" if c < hs else "hillis_steele",
            ]
        )
        cf, hf = res.fwd_ms[("chunked", n)], res.fwd_ms[("hillis_steele", n)]
        fwd.rows.append([f"{n:,}", fmt(cf), fmt(hf), ratio(hf, cf), "chunked" if cf < hf else "hillis_steele"])
    model = Table(
        f"Forward+backward of the whole backbone (ms; B={grid.seq_batch}, d_model={D_MODEL}, {N_LAYERS} layers)",
        ["N", "aaren", "transformer", "transformer/aaren"],
    )
    for n in grid.seq_lens:
        a, t = res.model_ms.get(("aaren", n)), res.model_ms.get(("transformer", n))
        if a is not None or t is not None:
            model.rows.append([f"{n:,}", fmt(a), fmt(t), ratio(t, a)])
    return [fb, fwd, model]


def plot(grid: Grid, steps: StepResult, seqs: SeqResult, path: Path) -> None:
    """Two log-log panels: step µs/event vs history, fwd+bwd ms vs N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    colors = {"aaren": "C0", "gru": "C2", "transformer": "C3"}
    styles = ["-", "--", ":", "-."]
    for i, batch in enumerate(grid.batches):
        for kind in KINDS:
            ys = [steps.us_per_event[kind, batch, t] for t in grid.histories]
            ax1.plot(grid.histories, ys, styles[i % 4], marker="o", color=colors[kind], label=f"{kind}, B={batch}")
    ax1.set(
        xscale="log",
        yscale="log",
        xlabel="history (events)",
        ylabel="µs per event",
        title="One step per event (eval, inference_mode)",
    )
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)

    series = [
        ("chunked", seqs.fwd_bwd_ms, "C0", "-"),
        ("hillis_steele", seqs.fwd_bwd_ms, "C1", "-"),
        ("sdpa", seqs.fwd_bwd_ms, "C3", "-"),
        ("naive", seqs.fwd_bwd_ms, "C7", "-"),
        ("aaren", seqs.model_ms, "C0", "--"),
        ("transformer", seqs.model_ms, "C3", "--"),
    ]
    for name, data, color, style in series:
        ns = [n for n in grid.seq_lens if (name, n) in data]
        if ns:
            label = f"{name} model" if data is seqs.model_ms else f"{name} attention"
            ax2.plot(ns, [data[name, n] for n in ns], style, marker="o", color=color, label=label)
    ax2.set(
        xscale="log",
        yscale="log",
        xlabel="N (tokens)",
        ylabel="ms (forward+backward)",
        title=f"Forward+backward over a sequence (B={grid.seq_batch})",
    )
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)
    for ax, ticks in ((ax1, grid.histories), (ax2, grid.seq_lens)):
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a much smaller grid (under a minute)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out", help="output directory")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per measurement (max)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    grid = QUICK if args.quick else FULL
    if args.repeats is not None:
        grid = dataclasses.replace(grid, repeats=max(1, args.repeats))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)

    header = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
        f"{'quick' if args.quick else 'full'} grid, up to {grid.repeats} rounds (median), "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}"
    )
    console.log(header)
    start = time.perf_counter()
    steps = bench_steps(grid, console)
    seqs = bench_sequences(grid, console)
    elapsed = time.perf_counter() - start

    tables = step_tables(grid, steps) + seq_tables(grid, seqs)
    for table in tables:
        console.print(table.rich())
    md = "\n".join(["# bench/core.py", "", header + f", {elapsed:.0f} s", "", *[t.markdown() for t in tables]])
    (args.out / "core.md").write_text(md)
    plot(grid, steps, seqs, args.out / "core.png")
    console.log(f"wrote {args.out / 'core.md'} and {args.out / 'core.png'} ({elapsed:.0f} s of measurement)")


if __name__ == "__main__":
    main()
