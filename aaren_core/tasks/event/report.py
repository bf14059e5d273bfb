"""The event task's evaluation of a checkpoint: ``metrics.json``, ``report.md`` and its plots.

``evaluate_checkpoint`` scores a checkpoint written by ``aaren_core.tasks.event.train`` and the
baselines on a split with ``aaren_core.tasks.event.metrics`` and writes a Markdown report with PNG
plots (matplotlib, imported only then): the next-gap distribution against the data, the
calibration of the gap quantiles, and a few sessions' forecasts over time. ``event_summary`` is
its one line for ``aaren evaluate``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.event.config import TrainConfig, command_line
from aaren_core.tasks.event.data import DataSplit, EventData
from aaren_core.tasks.event.heads import LogNormalMixture
from aaren_core.tasks.event.metrics import (
    LEVELS,
    EvalSplit,
    EventPredictions,
    compute_metrics,
    constant_gap_metrics,
    model_predictor,
    recorded_metrics,
)
from aaren_core.tasks.event.model import EventModel
from aaren_core.tasks.event.train import resolve_config
from aaren_core.tasks.report import METRICS_FILE, pyplot, save_figure, write_report

__all__ = ["evaluate_checkpoint", "event_summary", "point_forecast_verdict", "shows_top3"]


def evaluate_checkpoint(
    checkpoint: str | Path,
    *,
    split: str = "test",
    out_dir: str | Path | None = None,
    data: EventData | None = None,
    batch_size: int = 64,
    plots: bool = True,
    data_path: str | None = None,
) -> dict[str, Any]:
    """Score a training checkpoint and the baselines on ``split``; write ``report.md``, ``metrics.json``
    and (with ``plots``) PNGs to ``out_dir`` when given. Returns the ``metrics.json`` content.
    ``data_path`` replaces the events file of the checkpoint's train config (moved, or other events).
    """
    ckpt = load_checkpoint(checkpoint)
    if not isinstance(ckpt.model, EventModel):
        raise ValueError(f"{checkpoint} holds a {ckpt.kind!r} model; expected an event_model checkpoint")
    if "train_config" not in ckpt.metadata:
        raise ValueError(f"{checkpoint}: no train_config in its metadata; evaluate needs a checkpoint from training")
    config = TrainConfig.from_record(ckpt.metadata["train_config"])
    if data_path is not None:
        config = config.replace(data=data_path)
    ev = EvalSplit.from_config(config, split, data)
    model = ckpt.model.eval()
    predictor = model_predictor(model)
    bound, base_bound = model.heads.gap_bound(), ev.train_gap_max()
    resolution = model.config.time_resolution
    pred = ev.score(predictor, batch_size, bound=bound)
    baseline = ev.no_history()
    base_pred = ev.score(baseline, batch_size, bound=base_bound)
    names = ev.data.schema.value_names
    recorded = {
        "resolution": resolution,
        "model": recorded_metrics(ev.score_recorded(predictor, resolution, bound, batch_size)),
        "no_history": recorded_metrics(ev.score_recorded(baseline, resolution, base_bound, batch_size)),
    }
    result = {
        "checkpoint": str(checkpoint),
        "name": ckpt.metadata.get("name", ""),
        "model_version": ckpt.model_version,
        "split": split,
        "num_marks": model.config.num_marks,
        "parameters": sum(p.numel() for p in model.parameters()),
        "model": compute_metrics(pred, names),
        "no_history": compute_metrics(base_pred, names),
        "no_history_parameters": baseline.parameter_count(),
        "constant": constant_gap_metrics(ev.train, ev.train_raw_times, pred),
        "gap_bound": bound,
        "recorded": recorded,
        "train_config": config.to_dict(),
        "dequantization": ckpt.metadata.get("dequantization") or resolve_config(config, ev.data)[1],
        "data_split": ckpt.metadata.get("split") or (ev.data.split.to_dict() if ev.data.split else None),
        "val_metrics": ckpt.metadata.get("val_metrics", {}),
        "epoch": ckpt.metadata.get("epoch"),
        "train_seconds": ckpt.metadata.get("train_seconds"),
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        figures = _plots(ev, pred, base_pred, out) if plots else []
        (out / METRICS_FILE).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        comparison = "comparison.md" if (out / "comparison.md").is_file() else None
        write_report(out, _report(result, ev, figures, comparison))
    return result


def event_summary(result: dict[str, Any], out_dir: str | Path | None = None) -> str:
    """One line of an evaluation's scores (``aaren evaluate``): NLL beside the no-history baseline,
    mark accuracy, time RMSE, calibration, and as recorded (what the server sees)."""
    m, b, r = result["model"], result["no_history"], result["recorded"]["model"]
    top3 = f" (top-3 {m['top3_acc']:.3f})" if shows_top3(result) else ""
    where = f"; report in {out_dir}" if out_dir is not None else ""
    return (
        f"{result['name']} on {result['split']}: NLL {m['nll_total']:.4f} (no-history {b['nll_total']:.4f}), "
        f"mark acc {m['mark_acc']:.3f}{top3}, time RMSE {m['time_rmse']:.3f}, "
        f"q10/q50/q90 {m['calib_q10']:.3f}/{m['calib_q50']:.3f}/{m['calib_q90']:.3f}; as recorded (what the server "
        f"sees) P(G<q)-P(G<=q) q10 {r['calib_q10_below']:.3f}-{r['calib_q10']:.3f}, "
        f"q50 {r['calib_q50_below']:.3f}-{r['calib_q50']:.3f}, q90 {r['calib_q90_below']:.3f}-{r['calib_q90']:.3f}, "
        f"PIT KS {r['pit_ks']:.4f}{where}"
    )


def shows_top3(result: dict[str, Any]) -> bool:
    """Top-3 accuracy is shown only with more than 3 marks (with 3 or fewer it is always 1)."""
    return result.get("num_marks", math.inf) > 3


def point_forecast_verdict(rmse_change: float, mae_change: float) -> str:
    """The report's sentence on the point forecast of the next gap: ``rmse_change`` is the model's
    point forecast's (the truncated mean's) RMSE relative to the best constant's minus 1,
    ``mae_change`` the predicted median's MAE's. A forecast that is not better than the constant
    (a tie included) is called so plainly, however small the margin."""
    numbers = (
        f"the point forecast's RMSE is {rmse_change:+.1%} and the predicted median's MAE {mae_change:+.1%} "
        "against the best constant's (the median is the MAE-optimal point forecast, the mean the RMSE-optimal one)."
    )
    not_better = [name for name, change in (("point forecast", rmse_change), ("median", mae_change)) if change >= 0]
    if len(not_better) == 2:
        head = (
            "History buys no point forecast of the next gap: neither the model's point forecast nor its median "
            "is better than a constant"
        )
    elif not_better:
        head = (
            "History does not reliably help the point forecast of the next gap: "
            f"the model's {not_better[0]} is no better than a constant"
        )
    elif min(rmse_change, mae_change) > -0.1:
        head = "History helps the point forecast of the next gap only a little"
    else:
        head = "History helps the point forecast of the next gap"
    return f"{head}: {numbers}"


def _split_text(result: dict[str, Any], ev: EvalSplit) -> list[str]:
    """The report's paragraph on how the data were split (nothing when the checkpoint does not say)."""
    record = result.get("data_split")
    if not record:
        return []
    cutoffs = record.get("cutoffs")
    split = DataSplit(record["method"], None if cutoffs is None else tuple(cutoffs), record.get("reason", ""))
    why = (
        "Sessions that span the cutoffs are split by time because a split by session would score their events "
        "over the training period; short sessions rarely span them, and whole sessions are then held out. "
        "In a split by time every scored test event comes after every training and validation event and is "
        "forecast from its session's whole history, as the server sees it."
    )
    return ["## Split", "", f"Split {split.describe(ev.data.schema.time_unit)}. {why}", ""]


def _dequantization_text(result: dict[str, Any], ev: EvalSplit) -> str:
    """The report's paragraph on the time resolution: the jitter used and whether it was derived or given."""
    cfg, unit = ev.config, ev.data.schema.time_unit
    record = result.get("dequantization") or {}
    jitter = float(record.get("jitter", cfg.jitter or 0.0))
    derived = record.get("derived") or {}
    if record.get("source", "given") == "derived":
        how = record.get("how", "derived from the training times")
    else:
        how = f"given as jitter={jitter:g}"
        if "step" in derived and derived["step"] != jitter:
            how += f"; the training times alone give {derived['step']:g}"
    if not jitter:
        return (
            f"The event times ({unit}) are continuous ({how}), so they are not dequantized: "
            "time NLL, calibration and point errors are on the recorded gaps."
        )
    given = record.get("source", "given") != "derived"
    ties = f" {derived['ties']:.1%} of the training gaps are 0." if given and "ties" in derived else ""
    return (
        f"Event times ({unit}) are recorded to a resolution of {jitter:g} {unit} ({how}).{ties} "
        "Tied times would make a continuous gap density reward a spike at 0, so every event time gets "
        f"uniform jitter U(0, {jitter:g}) and each session is re-sorted (marks and values move with "
        "their times): a fresh draw every training epoch, one fixed draw "
        f"(seed {cfg.eval_seed}, one stream per split) for validation and test, so every model is scored on "
        "the same events. Time NLL and calibration are on the jittered gaps; point errors are given "
        "against both the jittered and the raw (recorded) gaps."
    )


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def _report(result: dict[str, Any], ev: EvalSplit, figures: list[str], comparison: str | None = None) -> str:
    cfg = ev.config
    m, b = result["model"], result["no_history"]
    const = result["constant"]
    lines = [
        f"# {result['name'] or 'model'}: evaluation on the {result['split']} split",
        "",
        f"Model `{result['model_version']}`: {cfg.backbone} backbone"
        f"{' with time decay' if cfg.backbone_config().time_decay else ''}, d_model {cfg.d_model}, "
        f"{cfg.n_layers} layers, "
        f"{cfg.n_heads} heads, {cfg.n_components} mixture components, {result['parameters']:,} parameters; "
        f"data `{cfg.data}`, best validation epoch {result['epoch']} "
        f"(val NLL {result['val_metrics'].get('total', math.nan):.4f}). "
        f"{int(m['events']):,} predicted events in {len(ev.sequences)} sessions."
        + (f" Trained in {result['train_seconds']:.0f} s." if result.get("train_seconds") else ""),
        "",
        *_split_text(result, ev),
        "## Dequantization",
        "",
        _dequantization_text(result, ev),
        "",
        "## Scores (per predicted event)",
        "",
        "| | model | no-history baseline |",
        "|---|---:|---:|",
        f"| NLL total (nats) | {_fmt(m['nll_total'], 4)} | {_fmt(b['nll_total'], 4)} |",
        f"| NLL time | {_fmt(m['nll_time'], 4)} | {_fmt(b['nll_time'], 4)} |",
        f"| NLL mark | {_fmt(m['nll_mark'], 4)} | {_fmt(b['nll_mark'], 4)} |",
        f"| NLL values | {_fmt(m['nll_value'], 4)} | {_fmt(b['nll_value'], 4)} |",
        f"| mark accuracy | {_fmt(m['mark_acc'])} | {_fmt(b['mark_acc'])} |",
    ]
    if shows_top3(result):
        lines.append(f"| mark top-3 accuracy | {_fmt(m['top3_acc'])} | {_fmt(b['top3_acc'])} |")
    lines += [
        f"| fraction of gaps under q10 (ideal 0.1) | {_fmt(m['calib_q10'])} | {_fmt(b['calib_q10'])} |",
        f"| fraction of gaps under q50 (ideal 0.5) | {_fmt(m['calib_q50'])} | {_fmt(b['calib_q50'])} |",
        f"| fraction of gaps under q90 (ideal 0.9) | {_fmt(m['calib_q90'])} | {_fmt(b['calib_q90'])} |",
    ]
    for name in ev.data.schema.value_names:
        key = f"value_rmse.{name}"
        lines.append(f"| RMSE of predicted {name} (raw units) | {_fmt(m[key], 2)} | {_fmt(b[key], 2)} |")
    unit = ev.data.schema.time_unit
    lines += [
        "",
        f"No-history baseline: one {cfg.n_components}-component log-normal mixture fitted by EM on all training "
        "gaps, the empirical mark frequencies and the value means and stds of the training split "
        f"({result['no_history_parameters']} numbers).",
        "",
        f"## Point forecast of the next gap ({unit})",
        "",
        "The model's point forecast (the service's `mean_gap`; `expected_time` adds it to the last event's time) "
        f"is the mean of its predicted gap distribution truncated at U = {result['gap_bound']:.6g} {unit}, the "
        "largest training gap: E[tau | tau <= U], in closed form and never above U. The plain mean "
        "exp(mu + sigma^2/2) of a mixture component with a tiny weight and a wide spread in log time barely moves "
        "the likelihood but can be enormous; the truncated one equals it wherever the mixture puts no mass past U. "
        "The predicted median is shown too (the MAE-optimal forecast). Constant forecasts are fitted on the "
        "training gaps of the same kind as the target.",
        "",
        "| forecast | RMSE | MAE | RMSE vs raw gap | MAE vs raw gap |",
        "|---|---:|---:|---:|---:|",
        f"| model (point forecast: mean truncated at U) | {_fmt(m['time_rmse'])} | {_fmt(m['time_mae'])} "
        f"| {_fmt(m['time_rmse_raw'])} | {_fmt(m['time_mae_raw'])} |",
        f"| model (predicted median) | {_fmt(m['time_rmse_median'])} | {_fmt(m['time_mae_median'])} "
        f"| {_fmt(m['time_rmse_raw_median'])} | {_fmt(m['time_mae_raw_median'])} |",
        f"| no-history (its truncated mean) | {_fmt(b['time_rmse'])} | {_fmt(b['time_mae'])} "
        f"| {_fmt(b['time_rmse_raw'])} | {_fmt(b['time_mae_raw'])} |",
    ]
    for name, c in const.items():
        lines.append(
            f"| {name} ({c['value']:.2f}; raw {c['value_raw']:.2f}) | {_fmt(c['time_rmse'])} | {_fmt(c['time_mae'])} "
            f"| {_fmt(c['time_rmse_raw'])} | {_fmt(c['time_mae_raw'])} |"
        )
    best_rmse = min(c["time_rmse"] for c in const.values())
    best_mae = min(c["time_mae"] for c in const.values())
    lines += [
        "",
        point_forecast_verdict(m["time_rmse"] / best_rmse - 1, m["time_mae_median"] / best_mae - 1)
        + f" Largest point forecast: {m['max_mean_gap']:.4g} {unit} (the plain mean's: "
        f"{m['max_untruncated_mean_gap']:.4g}).",
        "",
    ]
    lines += _recorded_section(result, unit)
    if comparison:
        lines += [
            f"Aaren vs Transformer vs GRU (same parameter budget, several seeds): [{comparison}]({comparison}).",
            "",
        ]
    lines += [
        "## Reproduce",
        "",
        "```",
        command_line(cfg),
        f"aaren evaluate {cfg.out_dir}/best --split {result['split']}",
        "```",
        "",
        "Training is deterministic given the seed: the same aaren_core code, torch version and thread count "
        f"({cfg.threads or 'torch default'}) give the same weights, bit for bit.",
        "",
    ]
    if figures:
        lines += ["## Plots", ""]
        lines += [f"![{f}]({f})" for f in figures]
        lines.append("")
    return "\n".join(lines)


def _recorded_section(result: dict[str, Any], unit: str) -> list[str]:
    """The report's scores of the raw replay: the split as recorded, as the server is sent it."""
    rec = result["recorded"]
    m, b, w = rec["model"], rec["no_history"], rec["resolution"]
    if w > 0:
        intro = (
            f"The server is sent the recorded times (resolution {w:g} {unit}; {m['zero_gap_fraction']:.1%} of these "
            "next gaps are 0), not jittered ones. This replays the split as recorded: recorded times in, recorded "
            "gaps G scored. The served quantiles are those of G (the recorded gap of two jittered events is a "
            "difference of floors; its distribution follows from the model's continuous one in closed form), so "
            "for a discrete G a calibrated q_p has P(G < q_p) <= p <= P(G <= q_p); the randomized PIT "
            "P(G < g) + V P(G = g), V ~ U(0, 1), is uniform under a correct forecast. NLL is -log P(G = g)."
        )
    else:
        intro = (
            "The model records no time resolution (times taken as continuous): this replays the split as recorded "
            "and scores the served quantiles against the recorded gaps."
        )
    rows = [
        ("fraction of G below q10 / at or below q10 (ideal: 0.1 in between)", "calib_q10_below", "calib_q10"),
        ("fraction of G below q50 / at or below q50", "calib_q50_below", "calib_q50"),
        ("fraction of G below q90 / at or below q90", "calib_q90_below", "calib_q90"),
    ]
    lines = [
        "## At the recorded resolution (as the server sees it)",
        "",
        intro,
        "",
        "| | model | no-history baseline |",
        "|---|---:|---:|",
    ]
    if "nll_time" in m:
        lines.append(f"| NLL time of G (nats) | {_fmt(m['nll_time'], 4)} | {_fmt(b['nll_time'], 4)} |")
    for label, lo, hi in rows:
        lines.append(f"| {label} | {_fmt(m[lo])} / {_fmt(m[hi])} | {_fmt(b[lo])} / {_fmt(b[hi])} |")
    lines += [
        f"| randomized PIT at or below 0.1 / 0.5 / 0.9 | {_fmt(m['pit_q10'])} / {_fmt(m['pit_q50'])} / "
        f"{_fmt(m['pit_q90'])} | {_fmt(b['pit_q10'])} / {_fmt(b['pit_q50'])} / {_fmt(b['pit_q90'])} |",
        f"| randomized PIT: KS distance from uniform | {_fmt(m['pit_ks'], 4)} | {_fmt(b['pit_ks'], 4)} |",
        f"| point forecast RMSE / MAE vs G | {_fmt(m['time_rmse'])} / {_fmt(m['time_mae'])} "
        f"| {_fmt(b['time_rmse'])} / {_fmt(b['time_mae'])} |",
        f"| served median MAE vs G | {_fmt(m['time_mae_median'])} | {_fmt(b['time_mae_median'])} |",
        f"| mark accuracy | {_fmt(m['mark_acc'])} | {_fmt(b['mark_acc'])} |",
        "",
        f"With the continuous gap's quantiles (the service before) the fractions at or below q10 / q50 / q90 are "
        f"{_fmt(m['calib_q10_continuous'])} / {_fmt(m['calib_q50_continuous'])} / {_fmt(m['calib_q90_continuous'])}.",
        "",
    ]
    const = result["constant"]
    best_rmse = min(c["time_rmse_raw"] for c in const.values())
    best_mae = min(c["time_mae_raw"] for c in const.values())
    lines += [
        "At the recorded resolution: "
        + point_forecast_verdict(m["time_rmse"] / best_rmse - 1, m["time_mae_median"] / best_mae - 1),
        "",
    ]
    return lines


def _plots(ev: EvalSplit, pred: EventPredictions, base: EventPredictions, out: Path) -> list[str]:
    plt = pyplot()

    unit = ev.data.schema.time_unit
    written = []

    # The predicted marginal density of log10(gap), averaged over (a stride of) events, vs the data.
    stride = max(1, len(pred) // 4000)
    lo, hi = np.quantile(np.log10(pred.gap), [0.001, 0.999])
    grid = np.linspace(lo - 0.3, hi + 0.3, 240)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.hist(np.log10(pred.gap), bins=80, range=(grid[0], grid[-1]), density=True, color="0.8", label="actual (test)")
    for p, label, style in ((pred, "model", "-"), (base, "no-history", "--")):
        dist = p.time_dist
        sub = LogNormalMixture(dist.logits[::stride], dist.loc[::stride], dist.log_scale[::stride])
        tau = torch.from_numpy(10**grid).float()[:, None].expand(-1, sub.loc.shape[0])
        dens = torch.exp(sub.log_prob(tau)).mean(-1).double().numpy() * 10**grid * math.log(10)
        ax.plot(grid, dens, style, label=label)
    ax.set_xlabel(f"log10 gap to next event ({unit})")
    ax.set_ylabel("density")
    ax.set_title("Next-gap distribution: data vs predicted (averaged over events)")
    ax.legend()
    fig.tight_layout()
    written.append(save_figure(fig, out / "gap_distribution.png"))

    levels = np.linspace(0.05, 0.95, 19)
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    ax.plot([0, 1], [0, 1], color="0.6", lw=1)
    for p, label, marker in ((pred, "model", "o"), (base, "no-history", "s")):
        ax.plot(levels, [(p.pit <= q).mean() for q in levels], marker=marker, ms=3, label=f"{label} (CDF at true gap)")
    ax.scatter(
        LEVELS,
        [(pred.gap <= pred.quantiles[:, j]).mean() for j in range(len(LEVELS))],
        color="k",
        zorder=3,
        label="model q10/q50/q90",
    )
    ax.set_xlabel("predicted quantile level")
    ax.set_ylabel("fraction of true gaps below")
    ax.set_title("Calibration of the gap distribution")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(save_figure(fig, out / "calibration.png"))

    picks = _timeline_sessions(ev)
    fig, axes = plt.subplots(len(picks), 1, figsize=(8, 2.3 * len(picks)), sharex=False, squeeze=False)
    for ax, s in zip(axes[:, 0], picks, strict=True):
        rows = pred.session == s
        t0 = ev.sequences[s].times
        # The forecast made at event k is for the gap that follows it: plot it at event k's time.
        at = t0[pred.index[rows] - 1]
        ax.fill_between(at, pred.quantiles[rows, 0], pred.quantiles[rows, 2], step="post", alpha=0.3, label="q10-q90")
        ax.step(at, pred.quantiles[rows, 1], where="post", lw=1, label="median")
        ax.plot(at, pred.gap[rows], ".", ms=3, color="k", label="actual gap")
        ax.set_yscale("log")
        ax.set_ylabel(f"gap ({unit})")
        ax.set_title(ev.sequences[s].session_id, fontsize=9)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel(f"time of the forecasting event ({unit})")
    fig.tight_layout()
    written.append(save_figure(fig, out / "timeline.png"))
    return written


def _timeline_sessions(ev: EvalSplit, count: int = 3) -> list[int]:
    """A few sessions to draw: on the flights task one per origin airport on one day; else the first ones."""
    picks: list[int] = []
    seen: set[str] = set()
    day = None
    for i, seq in enumerate(ev.sequences):
        head, _, tail = seq.session_id.partition("/")
        if len(seq) < 10:
            continue
        if tail and (day is None or tail == day) and head not in seen:
            day = tail
            seen.add(head)
            picks.append(i)
        if len(picks) == count:
            return picks
    return picks or [i for i, s in enumerate(ev.sequences) if len(s) > 1][:count]
