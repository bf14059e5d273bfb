"""Which head for the series task: direct quantiles (pinball loss) or a Gaussian per step and channel?

Trains the same Aaren ``SeriesModel`` with each head (``SeriesModelConfig.head``) and each seed
on one series data set and horizon, selects each run on validation MSE as ``aaren_core.tasks.run`` does,
and scores the test part's every origin restricted to the last ``L`` steps (the TSLib protocol):
MSE and MAE of the mean, MAE of the median, the mean pinball loss over the quantile levels, the
coverage of the outermost band, and the share of the truth below each quantile (calibration: it
should equal the level). Writes a Markdown table of mean ± std over seeds.

    python -m bench.series_heads --data power-hourly --horizon 96 --seeds 0 1 2 \
        --runs-dir /tmp/aaren-heads --out bench/results/series_heads.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aaren_core.checkpoint import load_checkpoint
from aaren_core.datasets import load_series
from aaren_core.tasks.config import TaskTrainConfig
from aaren_core.tasks.report import METRICS_FILE
from aaren_core.tasks.run import train_task
from aaren_core.tasks.series.baselines import windows
from aaren_core.tasks.series.data import SeriesData, calendar_features
from aaren_core.tasks.series.model import HEADS, SeriesModel

COLUMNS = (
    ("mse", "MSE (mean)", 4),
    ("mae", "MAE (mean)", 4),
    ("mae_median", "MAE (q50)", 4),
    ("pinball", "pinball", 4),
    ("coverage", "coverage q_lo-q_hi", 3),
)


@torch.no_grad()
def quantile_scores(model: SeriesModel, data: SeriesData, part: str, lookback: int, batch: int = 256) -> dict[str, Any]:
    """Scores of the mean and the quantiles from every origin of ``part``, the model restricted to
    the last ``lookback`` steps (standardized units)."""
    z = data.standardized()
    feats = calendar_features(data.times)
    levels = np.array(model.config.quantiles)
    h = model.config.horizon
    origins = data.forecast_origins(part, lookback, h)
    sums = {"se": 0.0, "ae": 0.0, "ae_median": 0.0, "pinball": 0.0, "inside": 0.0, "n": 0}
    below = np.zeros(len(levels))
    median = int(np.argmin(np.abs(levels - 0.5)))
    for i in range(0, len(origins), batch):
        o = origins[i : i + batch]
        raw = torch.from_numpy(windows(data.values, o, lookback))
        tf = torch.from_numpy(windows(feats, o, lookback)) if model.config.time_features else None
        y, _ = model.prefill(raw, tf)
        f = model.heads(y[:, -1])
        mean, q = f.mean.numpy().astype(np.float64), f.quantiles.numpy().astype(np.float64)  # [B, H, C(, Q)]
        truth = z[o[:, None] + np.arange(h)[None, :]]  # [B, H, C]
        err = truth[..., None] - q
        sums["se"] += float(np.square(mean - truth).sum())
        sums["ae"] += float(np.abs(mean - truth).sum())
        sums["ae_median"] += float(np.abs(q[..., median] - truth).sum())
        sums["pinball"] += float(np.maximum(levels * err, (levels - 1) * err).mean(-1).sum())
        sums["inside"] += float(((truth >= q[..., 0]) & (truth <= q[..., -1])).sum())
        below += (truth[..., None] < q).reshape(-1, len(levels)).sum(0)
        sums["n"] += truth.size
    n = sums["n"]
    out = {k: sums[k] / n for k in ("se", "ae", "ae_median", "pinball", "inside")}
    return {
        "mse": out["se"],
        "mae": out["ae"],
        "mae_median": out["ae_median"],
        "pinball": out["pinball"],
        "coverage": out["inside"],
        "below": dict(zip((f"{x:g}" for x in levels), (below / n).tolist(), strict=True)),
        "origins": len(origins),
    }


def _cell(values: list[float], digits: int) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="power-hourly")
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--heads", nargs="+", default=list(HEADS), choices=HEADS)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps-per-epoch", type=int, default=0)
    parser.add_argument("--val-stride", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/aaren-heads"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/series_heads.md"))
    args = parser.parse_args(argv)
    data = load_series(args.data)
    rows: dict[str, list[dict[str, Any]]] = {head: [] for head in args.heads}
    for head in args.heads:
        for seed in args.seeds:
            out_dir = args.runs_dir / f"{args.data}-h{args.horizon}-{head}-s{seed}"
            if not (out_dir / METRICS_FILE).is_file():
                config = TaskTrainConfig(
                    task="series", data=args.data, horizon=args.horizon, head=head, seed=seed, epochs=args.epochs,
                    steps_per_epoch=args.steps_per_epoch, val_stride=args.val_stride, threads=args.threads,
                    out_dir=str(out_dir),
                )  # fmt: skip
                train_task(config, data, verbose=False)
            model = load_checkpoint(out_dir / "best").model
            assert isinstance(model, SeriesModel)
            scores = quantile_scores(model.eval(), data, "test", 96)
            scores["seed"], scores["parameters"] = seed, sum(p.numel() for p in model.parameters())
            rows[head].append(scores)
            print(head, seed, json.dumps({k: v for k, v in scores.items() if k != "below"}), flush=True)
    levels = list(rows[args.heads[0]][0]["below"])
    lines = [
        f"# Series heads: direct quantiles vs Gaussian ({args.data}, H = {args.horizon})",
        "",
        f"`python -m bench.series_heads --data {args.data} --horizon {args.horizon} --seeds "
        f"{' '.join(map(str, args.seeds))} --epochs {args.epochs}` (Aaren d_model 32, 2 layers, threads "
        f"{args.threads}; {data.source}). Test part, every origin, the model restricted to the last 96 steps; "
        "standardized units; mean ± std over seeds. `share < q` is the share of the truth below each "
        "quantile (calibrated: equal to the level).",
        "",
        "| head | params | " + " | ".join(title for _, title, _ in COLUMNS) + " | "
        + " | ".join(f"share < q{level}" for level in levels) + " |",
        "|---|---:|" + "---:|" * (len(COLUMNS) + len(levels)),
    ]  # fmt: skip
    for head, runs in rows.items():
        cells = [_cell([r[key] for r in runs], digits) for key, _, digits in COLUMNS]
        cells += [_cell([r["below"][level] for r in runs], 3) for level in levels]
        lines.append(f"| {head} | {runs[0]['parameters']:,} | " + " | ".join(cells) + " |")
    lines += ["", "Per seed:", "", "| head | seed | " + " | ".join(title for _, title, _ in COLUMNS) + " |"]
    lines.append("|---|---:|" + "---:|" * len(COLUMNS))
    for head, runs in rows.items():
        for r in runs:
            lines.append(f"| {head} | {r['seed']} | " + " | ".join(f"{r[k]:.{d}f}" for k, _, d in COLUMNS) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
