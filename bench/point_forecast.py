"""Which point forecast of the next gap, and which served quantiles: measured on trained checkpoints.

For each checkpoint (``--run NAME=DIR[@DATA]``; ``DATA`` replaces the events file of its train
config) it scores the test split and prints Markdown tables:

1. **Point forecast candidates**, scored against the jittered and the recorded next gaps beside
   the best constants: the mixture mean, its median, the mean truncated at the largest training
   gap ``U`` (``E[tau | tau <= U]``), at the training gaps' 99.9th percentile, at the predicted
   distribution's own 99th percentile, and the mean clipped at ``U``; with the largest forecast
   of each against ``U``.
2. **Input mismatch**: the time NLL and calibration on the jittered targets when the model is fed
   the jittered times (as in training) or the recorded ones (as a server is).
3. **Raw replay**: the split as recorded, fed and scored as a server sees it, with the continuous
   gap's quantiles (the service before) and the recorded gap's (``discrete_quantiles``):
   ``P(G < q)`` and ``P(G <= q)``, the randomized PIT and its KS distance, the discrete NLL.

    python -m bench.point_forecast --out bench/point_forecast.md --run flights=models/default \\
        --run tailnum-aaren=/tmp/aaren-bench/aaren-tailnum/best@/tmp/aaren-bench/tailnum.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.event.config import TrainConfig
from aaren_core.tasks.event.heads import LogNormalMixture, log_partial_expectation
from aaren_core.tasks.event.metrics import EvalSplit, compute_metrics, model_predictor, recorded_metrics


def _errors(forecast: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    err = forecast - target
    return float(np.sqrt(np.mean(err**2))), float(np.mean(np.abs(err)))


def candidates(dist: LogNormalMixture, bound: float, bound_999: float) -> dict[str, np.ndarray]:
    """Every candidate point forecast of the mixture over ``[E]`` events."""
    log_w, loc, log_scale = dist._double()
    q = dist.quantiles(torch.tensor([0.5, 0.99])).double()
    mean = dist.mean().double()
    own = torch.exp(log_partial_expectation(log_w, loc, log_scale, torch.log(q[:, 1:])).squeeze(-1)) / 0.99
    return {
        "mean": mean.numpy(),
        "median": q[:, 0].numpy(),
        "mean truncated at U (max train gap)": dist.truncated_mean(bound).numpy(),
        "mean truncated at train q0.999": dist.truncated_mean(bound_999).numpy(),
        "mean truncated at own q0.99": own.numpy(),
        "min(mean, U)": mean.clamp_max(bound).numpy(),
    }


def bench_run(name: str, directory: str, data: str | None) -> list[str]:
    ckpt = load_checkpoint(directory)
    config = TrainConfig.from_record(ckpt.metadata["train_config"])
    if data:
        config = config.replace(data=data)
    model = ckpt.model.eval()
    ev = EvalSplit.from_config(config, "test")
    w = config.jitter
    unit = ev.data.schema.time_unit
    train_gaps = np.concatenate([np.diff(t) for t in ev.train_raw_times if len(t) > 1])
    bound = ev.train_gap_max()
    bound_999 = float(np.quantile(train_gaps, 0.999))
    predictor = model_predictor(model)
    pred = ev.score(predictor)
    lines = [
        f"### {name}: `{directory}` ({config.backbone}, data `{config.data}`, {len(pred):,} test events, "
        f"unit {unit}, resolution {w:.6g})",
        "",
        f"U = largest training gap + resolution = {bound:.6g} {unit}; training q0.999 = {bound_999:.6g}; "
        f"mean training gap {train_gaps.mean():.4g}, median {np.median(train_gaps):.4g}.",
        "",
        "| point forecast | RMSE | MAE | RMSE vs recorded | MAE vs recorded | largest | largest / U |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, forecast in candidates(pred.time_dist, bound, bound_999).items():
        rmse, mae = _errors(forecast, pred.gap)
        rmse_raw, mae_raw = _errors(forecast, pred.raw_gap)
        top = float(forecast.max())
        lines.append(
            f"| {label} | {rmse:.4g} | {mae:.4g} | {rmse_raw:.4g} | {mae_raw:.4g} | {top:.4g} | {top / bound:.3g} |"
        )
    for label, value in (("train mean gap", train_gaps.mean()), ("train median gap", np.median(train_gaps))):
        rmse, mae = _errors(np.full(len(pred), value), pred.gap)
        rmse_raw, mae_raw = _errors(np.full(len(pred), value), pred.raw_gap)
        lines.append(f"| constant: {label} | {rmse:.4g} | {mae:.4g} | {rmse_raw:.4g} | {mae_raw:.4g} | {value:.4g} | |")

    fed_raw = compute_metrics(ev.score(predictor, recorded_inputs=True))
    fed_jit = compute_metrics(pred)
    lines += [
        "",
        "Input mismatch (targets: the jittered gaps):",
        "",
        "| inputs | NLL time | ≤q10 | ≤q50 | ≤q90 |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, m in (("jittered times (training)", fed_jit), ("recorded times (server)", fed_raw)):
        lines.append(
            f"| {label} | {m['nll_time']:.4f} | {m['calib_q10']:.3f} | {m['calib_q50']:.3f} | {m['calib_q90']:.3f} |"
        )

    continuous = recorded_metrics(ev.score_recorded(predictor, 0.0, bound))
    discrete = recorded_metrics(ev.score_recorded(predictor, w, bound))
    lines += [
        "",
        f"Raw replay (recorded times in, recorded gaps scored; {discrete['zero_gap_fraction']:.1%} of gaps are 0). "
        "Calibrated: P(G < q) ≤ p ≤ P(G ≤ q); randomized PIT uniform (KS 0).",
        "",
        "| served quantiles | P(G<q10) | P(G≤q10) | P(G<q50) | P(G≤q50) | P(G<q90) | P(G≤q90) "
        "| PIT≤.1 | PIT≤.5 | PIT≤.9 | PIT KS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, m in (("continuous gap (before)", continuous), ("recorded gap (after)", discrete)):
        cells = [f"{m[f'calib_q{p}_below']:.3f} | {m[f'calib_q{p}']:.3f}" for p in (10, 50, 90)]
        pits = " | ".join(f"{m[f'pit_q{p}']:.3f}" for p in (10, 50, 90))
        lines.append(f"| {label} | {' | '.join(cells)} | {pits} | {m['pit_ks']:.4f} |")
    lines += [
        "",
        f"Discrete NLL of the recorded gap: {discrete['nll_time']:.4f} nats; served point forecast vs recorded gap: "
        f"RMSE {discrete['time_rmse']:.4g}, MAE {discrete['time_mae']:.4g}; served (recorded-gap) median: "
        f"MAE {discrete['time_mae_median']:.4g}; mark accuracy {discrete['mark_acc']:.3f}.",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, help="NAME=CHECKPOINT_DIR[@DATA]")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lines = ["# Point forecast and served quantiles, measured", ""]
    for spec in args.run:
        name, _, rest = spec.partition("=")
        directory, _, data = rest.partition("@")
        section = bench_run(name, directory, data or None)
        print("\n".join(section), flush=True)
        lines += section
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
