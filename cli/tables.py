"""The rich tables the client commands print for people (``--json`` prints the same results as JSON)."""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from aaren.client.client import (
    ClassForecastOut,
    ForecastOut,
    ForecastResult,
    ModelInfoOut,
    SeriesForecastOut,
    SessionOut,
)
from aaren.client.replay import ReplayStats


def number(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits; large values with thousands separators."""
    if not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}" if abs(x) < 1e6 else f"{x:,.2f}"


def forecast_table(f: ForecastOut, model: ModelInfoOut) -> Table:
    """An event model's next event: when (mean, quantiles of the gap), which marks, which values."""
    unit = model.time_unit or "time units"
    title = f"Next event of {escape(repr(f.session_id))}"
    table = Table(box=box.SIMPLE_HEAVY, show_header=False, title=title, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("after seq", f"{f.seq} (at {number(f.last_time, 10)} {unit})")
    table.add_row("expected at", f"{number(f.expected_time, 10)} {unit}")
    table.add_row("expected gap", f"{number(f.mean_gap)} {unit}")
    if f.quantiles:
        table.add_row("gap quantiles", "   ".join(f"q{q:g}: {number(v)}" for q, v in sorted(f.quantiles.items())))
    for i, (mark, p) in enumerate(f.marks):
        table.add_row("likely marks" if i == 0 else "", f"{escape(model.mark_name(mark)):<12} {p:6.1%}")
    for i, (mean, std) in enumerate(f.values):
        name = model.value_names[i] if i < len(model.value_names) else f"value {i}"
        table.add_row("values" if i == 0 else "", f"{escape(name)}: {number(mean)} ± {number(std)}")
    table.add_row("model", escape(f"{f.model_name} ({f.model_version})"))
    return table


def steps_table(result: ForecastResult, model: ModelInfoOut) -> Table:
    """Per future step of the sampled futures: mean time, its quantiles, the most frequent marks."""
    table = Table(box=box.SIMPLE_HEAVY, title="Sampled futures", title_justify="left")
    table.add_column("step", justify="right")
    table.add_column("mean time", justify="right")
    for q in model.quantile_levels:
        table.add_column(f"q{q:g}", justify="right")
    table.add_column("most frequent marks")
    for s in result.steps:
        table.add_row(
            str(s.step),
            number(s.mean_time, 8),
            *(number(s.time_quantiles.get(q, math.nan), 8) for q in model.quantile_levels),
            escape(", ".join(f"{model.mark_name(m)} {p:.0%}" for m, p in s.marks)),
        )
    return table


def task_forecast_table(f: SeriesForecastOut | ClassForecastOut, model: ModelInfoOut) -> Table:
    """A series model's next steps (means and the outermost quantiles), or a class model's classes."""
    title = f"Forecast of {escape(repr(f.session_id))} after seq {f.seq} ({escape(model.name)})"
    table = Table(box=box.SIMPLE_HEAVY, title=title, title_justify="left")
    if isinstance(f, ClassForecastOut):
        table.add_column("class")
        table.add_column("probability", justify="right")
        for name, p in f.classes:
            table.add_row(escape(name), f"{p:.1%}")
        return table
    low, high = min(f.quantiles), max(f.quantiles)
    table.add_column("step")
    for name in model.value_names:
        table.add_column(escape(f"{name} mean (q{low:g}-q{high:g})"), justify="right")
    for h, means in enumerate(f.means):
        cells = [
            f"{number(m, 6)} ({number(f.quantiles[low][h][c], 4)}-{number(f.quantiles[high][h][c], 4)})"
            for c, m in enumerate(means)
        ]
        table.add_row(f"+{(h + 1) * model.step_seconds:g} s" if model.step_seconds else str(h + 1), *cells)
    return table


def session_table(s: SessionOut) -> Table:
    """A stored session: last seq and time, events, state size, model, timestamps."""
    title = f"Session {escape(repr(s.session_id))}"
    table = Table(box=box.SIMPLE_HEAVY, show_header=False, title=title, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("last seq", str(s.last_seq))
    table.add_row("last time", number(s.last_time, 10))
    table.add_row("events", str(s.n_events))
    table.add_row("state", f"{s.state_bytes:,} bytes")
    table.add_row("model", escape(f"{s.model_name} ({s.model_version})"))
    for name in ("created_at", "updated_at", "expires_at"):
        stamp = getattr(s, name)
        table.add_row(name.replace("_", " "), stamp.isoformat(timespec="seconds") if stamp else "-")
    return table


def model_table(m: ModelInfoOut) -> Table:
    """A served model (task, shapes, names) and the server's limits."""
    table = Table(box=box.SIMPLE_HEAVY, show_header=False, title=f"Model {escape(repr(m.name))}", title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    marks = ", ".join(m.mark_names[:20]) + (", ..." if len(m.mark_names) > 20 else "")
    rows = [
        ("task", m.task),
        ("version", m.version),
        ("backbone", f"{m.backbone}, d_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads"),
        ("parameters", f"{m.parameters:,}"),
        ("state per session", f"{m.state_bytes_per_session:,} bytes"),
        *([("marks", f"{m.num_marks}" + (f": {marks}" if marks else ""))] if m.task == "event" else []),
        (
            "channels" if m.task != "event" else "values",
            f"{m.value_width}" + (f": {', '.join(m.value_names)}" if m.value_names else ""),
        ),
        *([("horizon", f"{m.horizon} steps of {m.step_seconds:g} s")] if m.task == "series" else []),
        *([("gaps filled", f"up to {m.max_gap_steps} missing steps")] if m.max_gap_steps else []),
        *([("missing values", "NaN allowed (filled or read as offline)")] if m.missing_values else []),
        *([("classes", f"{len(m.class_names)}: {', '.join(m.class_names)}")] if m.task == "class" else []),
        *(
            [("policy", f"{m.env or '-'}: {m.action_width} actions, target return {m.target_return:g}")]
            if m.task == "policy"
            else []
        ),
        ("time unit", m.time_unit or "-"),
        ("quantiles", ", ".join(f"{q:g}" for q in m.quantile_levels)),
        ("device", m.device),
    ]
    lim = m.limits
    rows += [
        ("max events / message", f"{lim.max_events_per_request:,}"),
        ("max message", f"{lim.max_message_bytes:,} bytes"),
        ("max session id", f"{lim.max_session_id_bytes} bytes"),
        ("horizon / samples", f"max {lim.max_horizon} / max {lim.max_num_samples} (default {lim.default_num_samples})"),
        ("default top-k", str(lim.default_top_k)),
        ("idle TTL", f"{lim.idle_ttl_seconds:g} s" if lim.idle_ttl_seconds else "none"),
    ]
    if len(m.served_models) > 1:
        rows.append(("served models", ", ".join(m.served_models)))
    for key, value in rows:
        table.add_row(key, escape(value))
    return table


def summary_table(stats: ReplayStats) -> Table:
    """A replay's counts, rate and per-message latencies."""
    s = stats.summary()
    table = Table(box=box.SIMPLE_HEAVY, show_header=False, title="Replay summary", title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("events sent", f"{s['events']:,}")
    table.add_row("forecasts", f"{s['forecasts']:,}")
    table.add_row("acks", f"{s['acks']:,}")
    table.add_row("duplicates", f"{s['duplicates']:,}")
    table.add_row("errors", f"[red]{s['errors']:,}[/red]" if s["errors"] else "0")
    for reason, n in s["errors_by_reason"].items():
        table.add_row(f"  {escape(reason)}", f"{n:,}")
    table.add_row("messages", f"{s['messages']:,}")
    table.add_row("elapsed", f"{s['elapsed_s']:.2f} s")
    table.add_row("events/s", f"{s['events_per_s']:,.0f}")
    for name, ms in s["latency_ms"].items():
        table.add_row(f"latency {name} (per message)", f"{ms:.2f} ms")
    return table


def scores_table(model: ModelInfoOut, scores: dict[str, Any]) -> Table:
    """The replay scored against the file's own truth (``TaskScorer``)."""
    table = Table(box=box.SIMPLE_HEAVY, show_header=False, title="Scored against the file", title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    if model.task == "series":
        since = f", from {scores['score_from']:g}" if "score_from" in scores else ""
        table.add_row("forecast origins", f"{scores['origins']:,} (the next {model.horizon} steps in the file{since})")
        table.add_row("targets scored", f"{scores['targets']:,} ({scores['targets_missing']:,} missing or NA, skipped)")
        table.add_row("MSE / MAE (raw units)", f"{scores['mse']:.4g} / {scores['mae']:.4g}")
        table.add_row("last value MSE / MAE", f"{scores['last_value_mse']:.4g} / {scores['last_value_mae']:.4g}")
        for key, value in scores.items():
            if key.startswith("coverage_"):
                table.add_row(key.replace("_", " "), f"{value:.3f}")
    else:
        table.add_row("labelled sequences", f"{scores['sequences']:,}")
        for fraction, accuracy in scores["accuracy_by_fraction"].items():
            table.add_row(f"accuracy after {float(fraction):.0%} seen", f"{accuracy:.3f}")
    return table
