"""Aaren (with and without time decay) vs Transformer vs GRU vs no-history: seeds, one table.

Trains every backbone with every seed (sequentially, same config but the backbone and, for the
GRU, the width that matches Aaren's parameter count), scores each run's best checkpoint on the
test split with ``aaren_core.tasks.event.metrics``, adds the no-history baseline and the constant gap
forecasts, and writes a Markdown table of mean ± std over seeds. Finished runs are reused, so an
interrupted comparison continues where it stopped.

    python bench/forecast_compare.py --runs-dir /tmp/aaren-runs/compare --out models/default/comparison.md
    python bench/forecast_compare.py --data flights-aircraft --kinds aaren aaren-decay transformer gru \
        --epochs 12 --length-buckets 50 --runs-dir /tmp/aaren-runs/aircraft --out bench/results/time_decay_aircraft.md

``aaren-decay`` is the Aaren backbone with ``time_decay`` (scores decay with each event's age at
a learned rate per head, ``aaren_core.nn.layers.AarenAttention``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.event.config import TrainConfig, command_line
from aaren_core.tasks.event.data import BUILTIN_DATASETS
from aaren_core.tasks.event.metrics import EvalSplit, compute_metrics, constant_gap_metrics, model_predictor
from aaren_core.tasks.event.model import EventModel, EventModelConfig
from aaren_core.tasks.event.train import train

KINDS = ("aaren", "aaren-decay", "transformer", "gru")
TITLES = {
    "flights": "next-event forecasting of New York departures (by airport and day)",
    "flights-aircraft": "next-departure forecasting of each aircraft leaving New York (by tail number)",
}
COLUMNS = (
    ("nll_total", "NLL total", 4),
    ("nll_time", "NLL time", 4),
    ("nll_mark", "NLL mark", 4),
    ("nll_value", "NLL values", 4),
    ("time_rmse", "gap RMSE", 3),
    ("time_mae", "gap MAE", 3),
    ("time_rmse_median", "gap RMSE (q50)", 3),
    ("time_mae_median", "gap MAE (q50)", 3),
    ("mark_acc", "mark acc", 4),
    ("top3_acc", "top-3 acc", 4),
    ("calib_q10", "≤q10", 3),
    ("calib_q50", "≤q50", 3),
    ("calib_q90", "≤q90", 3),
)


def parameters(config: TrainConfig, num_marks: int, value_width: int) -> int:
    model = EventModel(
        EventModelConfig(
            backbone=config.backbone_config(),
            num_marks=num_marks,
            value_width=value_width,
            n_components=config.n_components,
            time_features=config.time_features,
        )
    )
    return sum(p.numel() for p in model.parameters())


def gru_width(base: TrainConfig, num_marks: int, value_width: int) -> tuple[int, int, int]:
    """The GRU width whose whole model is closest in parameters to the Aaren model: (width, gru, aaren)."""
    target = parameters(base, num_marks, value_width)
    best = min(
        range(8, 4 * base.d_model + 1),
        key=lambda d: abs(parameters(base.replace(backbone="gru", d_model=d), num_marks, value_width) - target),
    )
    return best, parameters(base.replace(backbone="gru", d_model=best), num_marks, value_width), target


def mean_std(values: list[float], digits: int) -> str:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 1:
        return f"{arr[0]:.{digits}f}"
    return f"{arr.mean():.{digits}f} ± {arr.std(ddof=1):.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--kinds", nargs="+", default=["aaren", "transformer", "gru"], choices=KINDS)
    parser.add_argument("--data", default="flights", choices=sorted(BUILTIN_DATASETS))
    parser.add_argument("--epochs", type=int, default=TrainConfig().epochs)
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/compare"))
    parser.add_argument("--out", type=Path, default=Path("models/default/comparison.md"))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--length-buckets", type=int, default=0, help="TrainConfig.length_buckets (0: off)")
    parser.add_argument(
        "--reuse-scores", action="store_true", help="take finished runs' stored test metrics instead of rescoring them"
    )
    parser.add_argument("--note", default="", help="a paragraph to add under Setup (e.g. code changes between runs)")
    args = parser.parse_args()

    data = BUILTIN_DATASETS[args.data]()
    base = TrainConfig(
        data=args.data, epochs=args.epochs, threads=args.threads, length_buckets=args.length_buckets, progress=False
    )
    width, gru_params, aaren_params = gru_width(base, data.schema.num_marks, data.schema.value_width)
    print(f"GRU width {width}: {gru_params:,} parameters vs Aaren's {aaren_params:,}", flush=True)
    runs: dict[str, list[dict]] = {k: [] for k in args.kinds}
    ev = EvalSplit.from_config(base, "test", data)
    base = base.replace(jitter=ev.config.jitter)  # the resolution derived from the data (1 minute)
    for kind in args.kinds:
        for seed in args.seeds:
            out_dir = args.runs_dir / f"{kind}-s{seed}"
            record_path = out_dir / "result.json"
            if record_path.is_file() and args.reuse_scores:
                runs[kind].append(json.loads(record_path.read_text()))
                continue
            if record_path.is_file():
                # Rescore: the table always comes from the current evaluation code.
                record = json.loads(record_path.read_text())
                model = load_checkpoint(out_dir / "best").model
                record["test"] = compute_metrics(ev.score(model_predictor(model)), data.schema.value_names)
                record_path.write_text(json.dumps(record, indent=1) + "\n")
                runs[kind].append(record)
                continue
            extra: dict[str, object] = {"d_model": width} if kind == "gru" else {}
            if kind.startswith("aaren"):
                decay = kind == "aaren-decay"
                extra = {"time_decay": decay, **({"name": f"aaren-decay-{args.data}"} if decay else {})}
            config = base.replace(backbone=kind.removesuffix("-decay"), seed=seed, out_dir=str(out_dir), **extra)
            t0 = time.perf_counter()
            result = train(config, data=data)
            wall = time.perf_counter() - t0
            model = load_checkpoint(result.best_dir).model
            metrics = compute_metrics(ev.score(model_predictor(model)), data.schema.value_names)
            record = {
                "kind": kind,
                "seed": seed,
                "config": config.to_dict(),
                "command": command_line(config),
                "parameters": result.parameters,
                "train_seconds": result.train_seconds,
                "wall_seconds": wall,
                "epochs_run": len(result.history),
                "best_epoch": result.best_epoch,
                "best_val": result.best_val,
                "stopped_early": result.stopped_early,
                "test": metrics,
            }
            record_path.write_text(json.dumps(record, indent=1) + "\n")
            runs[kind].append(record)
            print(f"{kind} seed {seed}: test NLL {metrics['nll_total']:.4f}, {wall:.0f}s", flush=True)

    baseline = ev.no_history()
    base_pred = ev.score(baseline)
    base_metrics = compute_metrics(base_pred, data.schema.value_names)
    constants = constant_gap_metrics(ev.train, ev.train_raw_times, base_pred)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(runs, base_metrics, baseline.parameter_count(), constants, base, width, args))
    (args.runs_dir / "comparison.json").write_text(
        json.dumps({"runs": runs, "no_history": base_metrics, "constant": constants}, indent=1) + "\n"
    )
    print(args.out.read_text())


def report(
    runs: dict[str, list[dict]],
    base_metrics: dict[str, float],
    base_params: int,
    constants: dict[str, dict[str, float]],
    base: TrainConfig,
    width: int,
    args: argparse.Namespace,
) -> str:
    header = "| model | params | " + " | ".join(c[1] for c in COLUMNS) + " | train time (s) | epochs (best) |"
    lines = [
        f"# Aaren vs Transformer vs GRU vs no-history: {TITLES.get(args.data, args.data)}",
        "",
        f"Data `{args.data}`. Test split (Nov-Dec 2013, {int(base_metrics['events']):,} predicted events); "
        "mean ± std over seeds "
        f"{', '.join(map(str, args.seeds))}. Each run keeps its best-validation (October) epoch. NLL in nats per "
        "predicted event; gap errors in minutes against the dequantized gap; ≤qX: fraction of true gaps under the "
        "predicted X% quantile (ideal 0.10 / 0.50 / 0.90).",
        "",
        header,
        "|" + "---|" * (len(COLUMNS) + 4),
    ]
    for kind, records in runs.items():
        if not records:
            continue
        cells = [mean_std([r["test"][key] for r in records], digits) for key, _, digits in COLUMNS]
        secs = mean_std([r["train_seconds"] for r in records], 0)
        epochs = ", ".join(f"{r['epochs_run']} ({r['best_epoch']})" for r in records)
        d = records[0]["config"]["d_model"]
        lines.append(
            f"| {kind} (d={d}) | {records[0]['parameters']:,} | " + " | ".join(cells) + f" | {secs} | {epochs} |"
        )
    cells = [f"{base_metrics[key]:.{digits}f}" for key, _, digits in COLUMNS]
    lines.append(f"| no-history | {base_params} | " + " | ".join(cells) + " | - | - |")
    for name, c in constants.items():
        row = ["-"] * len(COLUMNS)
        row[4], row[5] = f"{c['time_rmse']:.3f}", f"{c['time_mae']:.3f}"
        lines.append(f"| constant: {name} ({c['value']:.2f} min) | 1 | " + " | ".join(row) + " | - | - |")
    lines += ["", "Point errors against the raw whole-minute gaps (mean ± std over seeds):", ""]
    lines += ["| model | gap RMSE vs raw | gap MAE vs raw |", "|---|---:|---:|"]
    for kind, records in runs.items():
        if records:
            lines.append(
                f"| {kind} | {mean_std([r['test']['time_rmse_raw'] for r in records], 3)} | "
                f"{mean_std([r['test']['time_mae_raw'] for r in records], 3)} |"
            )
    lines.append(f"| no-history | {base_metrics['time_rmse_raw']:.3f} | {base_metrics['time_mae_raw']:.3f} |")
    for name, c in constants.items():
        lines.append(
            f"| constant: {name} (raw {c['value_raw']:.2f} min) | {c['time_rmse_raw']:.3f} | {c['time_mae_raw']:.3f} |"
        )
    lines += [
        "",
        "## Per seed",
        "",
        "| model | seed | params | test NLL | mark acc | gap RMSE | gap RMSE (q50) | largest predicted mean gap (min) "
        "| best val NLL | epochs (best) | train time (s) |",
    ]
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, records in runs.items():
        for r in records:
            t = r["test"]
            lines.append(
                f"| {kind} | {r['seed']} | {r['parameters']:,} | {t['nll_total']:.4f} | {t['mark_acc']:.4f} | "
                f"{t['time_rmse']:.3f} | {t['time_rmse_median']:.3f} | {t['max_mean_gap']:.4g} | {r['best_val']:.4f} | "
                f"{r['epochs_run']} ({r['best_epoch']}) | {r['train_seconds']:.0f} |"
            )
    if "aaren" in runs and "transformer" in runs and runs["aaren"] and runs["transformer"]:
        a = {k: np.mean([r["test"][k] for r in runs["aaren"]]) for k, _, _ in COLUMNS}
        t = {k: np.mean([r["test"][k] for r in runs["transformer"]]) for k, _, _ in COLUMNS}
        pa, pt = runs["aaren"][0]["parameters"], runs["transformer"][0]["parameters"]
        lines += [
            "",
            "## Targets (means over seeds)",
            "",
            f"- Aaren vs Transformer test NLL: {a['nll_total']:.4f} vs {t['nll_total']:.4f} "
            f"({a['nll_total'] / t['nll_total'] - 1:+.2%}; target within 2%).",
            f"- Mark accuracy: {a['mark_acc']:.4f} vs {t['mark_acc']:.4f} "
            f"({100 * (a['mark_acc'] - t['mark_acc']):+.2f} points; target within 1 point).",
            f"- Gap RMSE: {a['time_rmse']:.3f} vs {t['time_rmse']:.3f} "
            f"({a['time_rmse'] / t['time_rmse'] - 1:+.2%}; target within 5%); with the predicted median as the "
            f"point forecast: {a['time_rmse_median']:.3f} vs {t['time_rmse_median']:.3f} "
            f"({a['time_rmse_median'] / t['time_rmse_median'] - 1:+.2%}).",
            f"- Parameters: {pa:,} vs {pt:,} ({pa / pt - 1:+.2%}; target within 1%).",
        ]
    means = {
        kind: {k: float(np.mean([r["test"][k] for r in records])) for k in ("nll_total", "mark_acc", "time_rmse")}
        for kind, records in runs.items()
        if records
    }
    pairs = [(a, b) for a in ("aaren-decay", "aaren") for b in ("transformer", "gru", "aaren") if a != b]
    pairs = [(a, b) for a, b in pairs if a in means and b in means]
    if pairs:
        lines += ["", "## Side by side (means over seeds)", ""]
        lines += ["| model | vs | test NLL | Δ NLL | mark acc | Δ mark acc (points) |", "|---|---|---:|---:|---:|---:|"]
        for a, b in pairs:
            ma, mb = means[a], means[b]
            lines.append(
                f"| {a} | {b} | {ma['nll_total']:.4f} vs {mb['nll_total']:.4f} | "
                f"{ma['nll_total'] - mb['nll_total']:+.4f} ({ma['nll_total'] / mb['nll_total'] - 1:+.2%}) | "
                f"{ma['mark_acc']:.4f} vs {mb['mark_acc']:.4f} | {100 * (ma['mark_acc'] - mb['mark_acc']):+.2f} |"
            )
    lines += [
        "",
        "## Setup",
        "",
        f"- Same training for every model: {base.epochs} epochs at most, batch {base.batch_size} sessions, AdamW "
        f"(lr {base.lr:g}, weight decay {base.weight_decay:g}), {base.warmup_steps} warmup steps then cosine to "
        f"{base.min_lr_ratio:g} lr, gradient clip {base.grad_clip:g}, early stopping after {base.patience} epochs "
        f"without a validation improvement of {base.min_delta:g} nats; {base.n_components}-component log-normal "
        "mixture for the gap.",
        f"- Aaren and Transformer: d_model {base.d_model}, {base.n_layers} layers, {base.n_heads} heads, d_ff "
        f"{base.backbone_config().d_ff}; Aaren's extra parameters are its learned query tokens. The GRU "
        f"({base.n_layers} layers) has width {width}, the width whose whole model (embedding and heads included) "
        "comes closest to Aaren's parameter count.",
        "- Dequantization: departure times are whole minutes and about 15% of gaps are 0. Every time gets "
        f"uniform jitter U(0, {base.jitter:g}) min and sessions are re-sorted; a fresh draw each training epoch, a "
        f"fixed draw (seed {base.eval_seed}) for validation and test, the same for every model.",
        "- No-history baseline: one log-normal mixture fitted by EM on all (jittered) training gaps, the empirical "
        "mark frequencies and the value means/stds of the training split, scored by the same code.",
        "- Train time: wall seconds of the epochs (training and validation), on a shared 2-core CPU, so "
        "indicative only.",
        *([f"- {args.note}"] if args.note else []),
        "",
        f"Reproduce: `python bench/forecast_compare.py --data {args.data} --kinds {' '.join(args.kinds)} "
        f"--epochs {args.epochs} --threads {args.threads} --length-buckets {args.length_buckets} "
        f"--runs-dir {args.runs_dir} --out {args.out}` "
        f"(one run: `{command_line(base)}` with `--backbone`, `--seed` and, for the GRU, `--d-model {width}`).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
