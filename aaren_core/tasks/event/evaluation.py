"""Scoring forecasters on held-out, later-in-time events, beside baselines scored by the same code.

A *predictor* maps padded events ``(dt [B, N], marks [B, N], values [B, N, V] raw)`` to a
``HeadOutput`` over ``[B, N]``: position ``k`` forecasts event ``k + 1``. ``model_predictor``
wraps a trained ``EventModel``; ``NoHistoryModel`` is the baseline that ignores history (one
log-normal mixture for every gap, the empirical mark frequencies, the value means and stds, all
fitted on the training split). ``score`` runs any predictor over a split and returns per-event
``EventPredictions``; ``compute_metrics`` turns them into the numbers of the report:

- NLL per predicted event: total and its time, mark and value terms (the training loss);
- the predicted mean gap's RMSE and MAE against the dequantized gap and against the raw
  (recorded, e.g. whole-minute) gap, beside constant predictors (train mean and median gap);
  the same for the predicted median (``*_median`` keys): a mixture component with a tiny weight
  and a wide spread in log time barely changes the likelihood but can make the mean enormous
  (``exp(mu + sigma^2 / 2)``), so the median is the robust point forecast;
- mark accuracy and top-3 accuracy;
- calibration: the fraction of true gaps under the predicted q10, q50 and q90 (ideal 0.1/0.5/0.9);
- at the recorded resolution (``score_recorded``, ``recorded_metrics``): the split replayed as
  recorded, as a server is sent it, scored against the recorded gaps with the served quantiles
  (of the recorded gap), ``P(G < q)`` and ``P(G <= q)``, a randomized PIT and the discrete NLL.

The point forecast is the mean truncated at the largest training gap (``heads.truncated_mean``),
what the service serves as ``mean_gap``; the plain mean's largest value is reported beside it.

``evaluate_checkpoint`` does all of it for a checkpoint written by ``aaren_core.training.event`` and
writes a Markdown report with PNG plots (matplotlib, imported only then).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.event.data import pad_batch
from aaren_core.tasks.event.heads import MIN_LOG_SCALE, HeadOutput, LogNormalMixture, mark_nll, value_nll
from aaren_core.tasks.event.model import EventModel
from aaren_core.tasks.event.schema import EventSchema
from aaren_core.tasks.event.sequences import EventSequence
from aaren_core.tasks.event.splits import DataSplit, EventData
from aaren_core.training.event import TrainConfig, command_line, eval_jitter, load_data, resolve_config

__all__ = [
    "LEVELS",
    "EvalSplit",
    "EventPredictions",
    "NoHistoryModel",
    "Predictor",
    "RecordedPredictions",
    "compute_metrics",
    "constant_gap_metrics",
    "evaluate_checkpoint",
    "fit_lognormal_mixture",
    "model_predictor",
    "point_forecast_verdict",
    "recorded_metrics",
    "score",
    "score_recorded",
]

#: Quantile levels of the calibration check.
LEVELS = (0.1, 0.5, 0.9)
TOP_K = 3

Predictor = Callable[[Tensor, Tensor, Tensor], HeadOutput]


def model_predictor(model: EventModel) -> Predictor:
    """``(dt, marks, values) -> HeadOutput [B, N]`` from a trained model's heads on its features."""

    def predict(dt: Tensor, marks: Tensor, values: Tensor) -> HeadOutput:
        return model.heads(model(dt, marks, values))

    return predict


def fit_lognormal_mixture(gaps: np.ndarray, k: int, iters: int = 500, tol: float = 1e-10) -> tuple[np.ndarray, ...]:
    """Maximum-likelihood log-normal mixture of ``gaps [n] > 0`` by EM on ``log gaps`` (float64).

    A log-normal mixture of ``tau`` is a Gaussian mixture of ``log tau`` (the Jacobian ``1 / tau``
    does not depend on the parameters). Starts from means at the ``(i + 0.5) / k`` quantiles;
    returns ``(weights [k], loc [k], scale [k])``. With ``k = 1`` it is the closed form: the mean
    and (ddof 0) std of ``log gaps``.
    """
    z = np.log(np.asarray(gaps, dtype=np.float64))
    if z.size == 0 or not np.isfinite(z).all():
        raise ValueError("fit_lognormal_mixture: expected a non-empty array of positive, finite gaps")
    floor = math.exp(MIN_LOG_SCALE)
    weights = np.full(k, 1.0 / k)
    loc = np.quantile(z, (np.arange(k) + 0.5) / k)
    scale = np.full(k, max(z.std() / k, floor))
    previous = -math.inf
    for _ in range(iters):
        log_p = -0.5 * ((z[:, None] - loc) / scale) ** 2 - np.log(scale) - 0.5 * math.log(2 * math.pi) + np.log(weights)
        top = log_p.max(axis=1, keepdims=True)
        log_norm = top[:, 0] + np.log(np.exp(log_p - top).sum(axis=1))
        resp = np.exp(log_p - log_norm[:, None])  # [n, k]
        mass = resp.sum(axis=0) + 1e-300
        weights = mass / z.size
        loc = (resp * z[:, None]).sum(axis=0) / mass
        scale = np.maximum(np.sqrt((resp * (z[:, None] - loc) ** 2).sum(axis=0) / mass), floor)
        ll = float(log_norm.mean())
        if ll - previous < tol:
            break
        previous = ll
    return weights, loc, scale


class NoHistoryModel(nn.Module):
    """The no-history baseline: the same forecast after every event, fitted on training data.

    Buffers: ``time_logits, time_loc, time_log_scale [K]`` (a log-normal mixture of the gap),
    ``mark_logits [M]`` (log empirical frequencies), ``value_mean, value_std [V]`` (raw units).
    """

    def __init__(self, n_components: int, num_marks: int, value_width: int) -> None:
        super().__init__()
        self.register_buffer("time_logits", torch.zeros(n_components, dtype=torch.float64))
        self.register_buffer("time_loc", torch.zeros(n_components, dtype=torch.float64))
        self.register_buffer("time_log_scale", torch.zeros(n_components, dtype=torch.float64))
        self.register_buffer("mark_logits", torch.zeros(num_marks, dtype=torch.float64))
        self.register_buffer("value_mean", torch.zeros(value_width, dtype=torch.float64))
        self.register_buffer("value_std", torch.ones(value_width, dtype=torch.float64))

    @classmethod
    def fit(cls, sequences: Sequence[EventSequence], schema: EventSchema, n_components: int = 8) -> NoHistoryModel:
        """Fit on the predicted events of ``sequences`` (every event after a session's first; gaps > 0)."""
        targets = [s for s in sequences if len(s) > 1]
        gaps = np.concatenate([np.diff(s.times) for s in targets])
        marks = np.concatenate([s.marks[1:] for s in targets])
        values = np.concatenate([s.values[1:] for s in targets]).astype(np.float64)
        weights, loc, scale = fit_lognormal_mixture(gaps, n_components)
        counts = np.bincount(marks, minlength=schema.num_marks).astype(np.float64)
        model = cls(n_components, schema.num_marks, schema.value_width)
        model.time_logits.copy_(torch.from_numpy(np.log(np.maximum(weights, 1e-300))))
        model.time_loc.copy_(torch.from_numpy(loc))
        model.time_log_scale.copy_(torch.from_numpy(np.log(scale)))
        # A mark never seen in training keeps a tiny probability, so its NLL is large but finite.
        model.mark_logits.copy_(torch.from_numpy(np.log(np.maximum(counts, 1e-6) / counts.sum())))
        if schema.value_width:
            model.value_mean.copy_(torch.from_numpy(values.mean(axis=0)))
            model.value_std.copy_(torch.from_numpy(np.maximum(values.std(axis=0), 1e-6)))
        return model

    def forward(self, dt: Tensor, marks: Tensor, values: Tensor) -> HeadOutput:
        """The same ``HeadOutput`` at every position of ``dt [B, N]`` (float32)."""
        shape = tuple(dt.shape)

        def expand(x: Tensor) -> Tensor:
            return x.float().expand(*shape, x.shape[-1])

        time = LogNormalMixture(expand(self.time_logits), expand(self.time_loc), expand(self.time_log_scale))
        return HeadOutput(time, expand(self.mark_logits), expand(self.value_mean), expand(self.value_std))

    def parameter_count(self) -> int:
        """Fitted numbers: ``3K - 1`` for the mixture, ``M - 1`` mark frequencies, ``2V`` value moments."""
        k, m, v = self.time_loc.numel(), self.mark_logits.numel(), self.value_mean.numel()
        return 3 * k - 1 + m - 1 + 2 * v


@dataclasses.dataclass(frozen=True, eq=False)
class EventPredictions:
    """A predictor's forecasts of every predicted event of a split, flattened to ``E`` events.

    ``session [E]`` (index of the sequence), ``index [E]`` (position of the forecast event in it),
    ``time [E]`` (its dequantized time), ``gap [E]`` (dequantized gap), ``raw_gap [E]`` (recorded
    gap), ``mark [E]``, ``values [E, V]`` (raw); the NLL terms ``nll_time, nll_mark, nll_value [E]``;
    the forecast: ``time_dist`` (mixture over ``[E]``), ``mean_gap [E]`` (the point forecast: the
    mean truncated at the bound given to ``score``), ``untruncated_mean [E]`` (the plain mixture
    mean), ``quantiles [E, Q]`` at ``LEVELS``, ``pit [E]`` (predicted CDF at the true gap),
    ``top_marks [E, 3]``, ``value_mean [E, V]``.
    """

    session: np.ndarray
    index: np.ndarray
    time: np.ndarray
    gap: np.ndarray
    raw_gap: np.ndarray
    mark: np.ndarray
    values: np.ndarray
    nll_time: np.ndarray
    nll_mark: np.ndarray
    nll_value: np.ndarray
    time_dist: LogNormalMixture
    mean_gap: np.ndarray
    untruncated_mean: np.ndarray
    quantiles: np.ndarray
    pit: np.ndarray
    top_marks: np.ndarray
    value_mean: np.ndarray

    def __len__(self) -> int:
        return int(self.gap.shape[0])


@torch.no_grad()
def score(
    predictor: Predictor,
    sequences: Sequence[EventSequence],
    raw_times: Sequence[np.ndarray],
    schema: EventSchema,
    batch_size: int = 64,
    *,
    bound: float | None = None,
    inputs: Sequence[EventSequence] | None = None,
) -> EventPredictions:
    """Run ``predictor`` over ``sequences`` (gaps > 0) and collect its forecast of every event after
    each session's first. ``raw_times`` are the recorded times aligned with ``sequences``
    (``aaren_core.tasks.event.resolution.dequantize``); pass the sequences' own times when nothing was dequantized.
    ``bound``: the point forecast is ``E[tau | tau <= bound]`` (``LogNormalMixture.truncated_mean``;
    None: the plain mean). ``inputs``: the same events with the times the predictor is fed (e.g.
    the recorded ones, as a server gets them); default ``sequences``. Targets are ``sequences``'.

    The NLL terms are those of ``EventModel.nll``, so a model's figures here equal its training loss.
    """
    levels = torch.tensor(LEVELS, dtype=torch.float32)
    value_std = torch.tensor(schema.value_std, dtype=torch.float32)
    parts: dict[str, list[Any]] = {}
    for start in range(0, len(sequences), batch_size):
        chunk = list(sequences[start : start + batch_size])
        batch = pad_batch(chunk, schema, raw_values=True)
        fed = batch if inputs is None else pad_batch(list(inputs[start : start + batch_size]), schema, raw_values=True)
        out = predictor(fed.dt, fed.marks, fed.values)
        out = HeadOutput(
            LogNormalMixture(out.time.logits[:, :-1], out.time.loc[:, :-1], out.time.log_scale[:, :-1]),
            out.mark_logits[:, :-1],
            out.value_mean[:, :-1],
            out.value_std[:, :-1],
        )
        target = batch.scored[:, 1:]  # [B, N-1]
        tau = batch.dt[:, 1:]
        if bool(((tau <= 0) & target).any()):
            raise ValueError("gaps of predicted events must be > 0; dequantize tied event times first")
        tau = torch.where(target, tau, torch.ones_like(tau))
        raw = np.zeros(tuple(tau.shape), dtype=np.float64)
        for i, times in enumerate(raw_times[start : start + batch_size]):
            raw[i, : len(times) - 1] = np.diff(times)
        rows, cols = torch.nonzero(target, as_tuple=True)
        pick = (rows, cols)
        dist = LogNormalMixture(out.time.logits[pick], out.time.loc[pick], out.time.log_scale[pick])
        gap = tau[pick]
        marks = batch.marks[:, 1:][pick]
        values = batch.values[:, 1:][pick]
        picked = HeadOutput(dist, out.mark_logits[pick], out.value_mean[pick], out.value_std[pick])
        add = {
            "session": (rows + start).numpy(),
            "index": (cols + 1).numpy(),
            "time": batch.times[:, 1:][pick].numpy(),
            "gap": gap.double().numpy(),
            "raw_gap": raw[rows.numpy(), cols.numpy()],
            "mark": marks.numpy(),
            "values": values.numpy(),
            "nll_time": (-dist.log_prob(gap)).double().numpy(),
            "nll_mark": mark_nll(picked, marks).double().numpy(),
            "nll_value": value_nll(picked, values, value_std).double().numpy(),
            "logits": dist.logits,
            "loc": dist.loc,
            "log_scale": dist.log_scale,
            "mean_gap": (dist.mean() if bound is None else dist.truncated_mean(bound)).double().numpy(),
            "untruncated_mean": dist.mean().double().numpy(),
            "quantiles": dist.quantiles(levels).double().numpy(),
            "pit": dist.cdf(gap).double().numpy(),
            "top_marks": picked.mark_logits.topk(min(TOP_K, schema.num_marks), dim=-1).indices.numpy(),
            "value_mean": picked.value_mean.double().numpy(),
        }
        for key, value in add.items():
            parts.setdefault(key, []).append(value)
    if not parts:
        raise ValueError("score: no events to forecast; expected sessions with at least 2 events")
    cat = {k: torch.cat(v) if isinstance(v[0], Tensor) else np.concatenate(v) for k, v in parts.items()}
    return EventPredictions(
        time_dist=LogNormalMixture(cat.pop("logits"), cat.pop("loc"), cat.pop("log_scale")),
        **cat,
    )


def compute_metrics(pred: EventPredictions, value_names: Sequence[str] = ()) -> dict[str, float]:
    """The report's numbers from per-event predictions (see the module docstring)."""
    n = len(pred)
    median = LEVELS.index(0.5)
    nll = {
        "nll_time": float(pred.nll_time.mean()),
        "nll_mark": float(pred.nll_mark.mean()),
        "nll_value": float(pred.nll_value.mean()),
    }
    out: dict[str, float] = {
        "events": float(n),
        "nll_total": nll["nll_time"] + nll["nll_mark"] + nll["nll_value"],
        **nll,
        **_point_errors(pred.mean_gap, pred.gap, pred.raw_gap),
        **{f"{k}_median": v for k, v in _point_errors(pred.quantiles[:, median], pred.gap, pred.raw_gap).items()},
        "max_mean_gap": float(pred.mean_gap.max()),
        "max_untruncated_mean_gap": float(pred.untruncated_mean.max()),
        "mark_acc": float((pred.top_marks[:, 0] == pred.mark).mean()),
        "top3_acc": float((pred.top_marks == pred.mark[:, None]).any(axis=1).mean()),
    }
    for j, level in enumerate(LEVELS):
        out[f"calib_q{round(level * 100)}"] = float((pred.gap <= pred.quantiles[:, j]).mean())
    for j, name in enumerate(value_names):
        out[f"value_rmse.{name}"] = float(np.sqrt(((pred.value_mean[:, j] - pred.values[:, j]) ** 2).mean()))
    return out


def _point_errors(forecast: np.ndarray | float, gap: np.ndarray, raw_gap: np.ndarray) -> dict[str, float]:
    err, raw_err = forecast - gap, forecast - raw_gap
    return {
        "time_rmse": float(np.sqrt(np.mean(err**2))),
        "time_mae": float(np.mean(np.abs(err))),
        "time_rmse_raw": float(np.sqrt(np.mean(raw_err**2))),
        "time_mae_raw": float(np.mean(np.abs(raw_err))),
    }


def constant_gap_metrics(
    train: Sequence[EventSequence], train_raw_times: Sequence[np.ndarray], pred: EventPredictions
) -> dict[str, dict[str, float]]:
    """Point errors of constant gap forecasts fitted on the training gaps: their mean (the best
    constant for RMSE) and median (the best for MAE). Each is fitted on the gaps it is scored
    against: dequantized training gaps for the dequantized target, recorded ones for the raw target.
    """
    gaps = np.concatenate([np.diff(s.times) for s in train if len(s) > 1])
    raw = np.concatenate([np.diff(t) for t in train_raw_times if len(t) > 1])
    out: dict[str, dict[str, float]] = {}
    for name, fn in (("train mean gap", np.mean), ("train median gap", np.median)):
        jittered = _point_errors(float(fn(gaps)), pred.gap, pred.raw_gap)
        recorded = _point_errors(float(fn(raw)), pred.gap, pred.raw_gap)
        out[name] = {
            "value": float(fn(gaps)),
            "value_raw": float(fn(raw)),
            "time_rmse": jittered["time_rmse"],
            "time_mae": jittered["time_mae"],
            "time_rmse_raw": recorded["time_rmse_raw"],
            "time_mae_raw": recorded["time_mae_raw"],
        }
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class RecordedPredictions:
    """A predictor's forecasts of a split at its recorded resolution, as a server makes them: fed the
    recorded times, scored against the recorded gaps ``gap [E]`` (ties are 0). ``point [E]``: the
    point forecast; ``quantiles [E, Q]`` at ``LEVELS``: those served (of the recorded gap where
    ``resolution > 0``), ``continuous_quantiles [E, Q]`` those of the continuous gap; ``cdf_below,
    cdf_at [E]``: the predicted ``P(G < gap)`` and ``P(G <= gap)``; ``mark, top_mark [E]``.
    """

    resolution: float
    gap: np.ndarray
    point: np.ndarray
    quantiles: np.ndarray
    continuous_quantiles: np.ndarray
    cdf_below: np.ndarray
    cdf_at: np.ndarray
    mark: np.ndarray
    top_mark: np.ndarray

    def __len__(self) -> int:
        return int(self.gap.shape[0])


@torch.no_grad()
def score_recorded(
    predictor: Predictor,
    sequences: Sequence[EventSequence],
    schema: EventSchema,
    *,
    resolution: float,
    bound: float,
    batch_size: int = 64,
) -> RecordedPredictions:
    """Run ``predictor`` over ``sequences`` with their recorded times (ties allowed: what a server is
    sent) and collect its forecasts of every event after each session's first (``RecordedPredictions``).

    At ``resolution w > 0`` the recorded gap is ``G = n w``; its CDF is ``LogNormalMixture.discrete_cdf``
    and the served quantiles ``discrete_quantiles`` (``aaren_core.tasks.event.heads``). With ``w = 0`` the gap is
    taken as continuous. The point forecast is ``E[tau | tau <= bound]``.
    """
    levels = torch.tensor(LEVELS, dtype=torch.float32)
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(sequences), batch_size):
        batch = pad_batch(list(sequences[start : start + batch_size]), schema, raw_values=True)
        out = predictor(batch.dt, batch.marks, batch.values)
        target = batch.mask[:, 1:] & batch.mask[:, :-1]  # [B, N-1]
        pick = torch.nonzero(target, as_tuple=True)
        dist = LogNormalMixture(*(t[:, :-1][pick] for t in (out.time.logits, out.time.loc, out.time.log_scale)))
        gap = batch.dt[:, 1:][pick].double()
        continuous = dist.quantiles(levels).double()
        if resolution > 0:
            quantiles = dist.discrete_quantiles(levels, resolution)
            n = torch.round(gap / resolution)
            cdf_at = dist.discrete_cdf(n * resolution, resolution)
            cdf_below = dist.discrete_cdf((n - 1) * resolution, resolution)
        else:
            quantiles = continuous
            cdf_at = cdf_below = dist.cdf(gap.to(dist.loc.dtype)).double()
        add = {
            "gap": gap.numpy(),
            "point": dist.truncated_mean(bound).numpy(),
            "quantiles": quantiles.numpy(),
            "continuous_quantiles": continuous.numpy(),
            "cdf_below": cdf_below.numpy(),
            "cdf_at": cdf_at.numpy(),
            "mark": batch.marks[:, 1:][pick].numpy(),
            "top_mark": out.mark_logits[:, :-1][pick].argmax(-1).numpy(),
        }
        for key, value in add.items():
            parts.setdefault(key, []).append(value)
    if not parts:
        raise ValueError("score_recorded: no events to forecast; expected sessions with at least 2 events")
    return RecordedPredictions(resolution=resolution, **{k: np.concatenate(v) for k, v in parts.items()})


def recorded_metrics(pred: RecordedPredictions, seed: int = 0) -> dict[str, float]:
    """Scores at the recorded resolution. For a discrete gap ``G`` a calibrated quantile ``q_p`` has
    ``P(G < q_p) <= p <= P(G <= q_p)``: both fractions are given (``calib_q<p>_below``, ``calib_q<p>``),
    and ``calib_q<p>_continuous`` is ``P(G <= q_p)`` for the continuous gap's quantiles. The
    randomized PIT ``P(G < g) + V P(G = g)``, ``V ~ U(0, 1)`` (seeded), is uniform under a correct
    forecast: ``pit_q<p>`` is the fraction at or below ``p``, ``pit_ks`` the largest distance of its
    empirical CDF from the uniform's. ``nll_time`` is ``-log P(G = g)`` (at ``resolution > 0``).
    Point errors are against ``G``: the point forecast (``time_rmse, time_mae``) and the served
    median (``*_median``)."""
    w = pred.resolution

    def at_or_below(q: np.ndarray) -> np.ndarray:
        if w > 0:  # on the grid: compare grid indices (recorded gaps carry rounding)
            return np.round(pred.gap / w) <= np.round(q / w)
        return pred.gap <= q

    def below(q: np.ndarray) -> np.ndarray:
        return np.round(pred.gap / w) < np.round(q / w) if w > 0 else pred.gap < q

    pit = pred.cdf_below + np.random.default_rng(seed).uniform(size=len(pred)) * (pred.cdf_at - pred.cdf_below)
    u = np.sort(pit)
    ecdf = np.arange(1, len(u) + 1) / len(u)
    median = pred.quantiles[:, LEVELS.index(0.5)]
    out: dict[str, float] = {
        "events": float(len(pred)),
        "resolution": float(w),
        "zero_gap_fraction": float((at_or_below(np.zeros_like(pred.gap))).mean()),
        **{k: v for k, v in _point_errors(pred.point, pred.gap, pred.gap).items() if not k.endswith("_raw")},
        **{f"{k}_median": v for k, v in _point_errors(median, pred.gap, pred.gap).items() if not k.endswith("_raw")},
        "max_point": float(pred.point.max()),
        "mark_acc": float((pred.top_mark == pred.mark).mean()),
        "pit_ks": float(max(np.abs(ecdf - u).max(), np.abs(ecdf - 1 / len(u) - u).max())),
    }
    if w > 0:
        out["nll_time"] = float(-np.log(np.maximum(pred.cdf_at - pred.cdf_below, 1e-300)).mean())
    for j, level in enumerate(LEVELS):
        name = f"calib_q{round(level * 100)}"
        out[name] = float(at_or_below(pred.quantiles[:, j]).mean())
        out[f"{name}_below"] = float(below(pred.quantiles[:, j]).mean())
        out[f"{name}_continuous"] = float((pred.gap <= pred.continuous_quantiles[:, j]).mean())
        out[f"pit_q{round(level * 100)}"] = float((pit <= level).mean())
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class EvalSplit:
    """A checkpoint's data, dequantized as in training: the scored split and the training split."""

    config: TrainConfig
    data: EventData
    split: str
    sequences: list[EventSequence]
    raw_times: list[np.ndarray]
    train: list[EventSequence]
    train_raw_times: list[np.ndarray]
    recorded: list[EventSequence]

    @classmethod
    def from_config(cls, config: TrainConfig, split: str = "test", data: EventData | None = None) -> EvalSplit:
        """The split with the fixed evaluation jitter of ``config`` (``eval_seed``); a jitter or split
        left to derive (``auto``) is derived as training does (``resolve_config``)."""
        if split not in ("train", "val", "test"):
            raise ValueError(f"split {split!r}; expected train, val or test")
        data = data if data is not None else load_data(config)
        config, _ = resolve_config(config, data)
        sequences, raw = eval_jitter(getattr(data, split), config, split)
        train, train_raw = eval_jitter(data.train, config, "train")
        return cls(config, data, split, sequences, raw, train, train_raw, list(getattr(data, split)))

    def score(
        self, predictor: Predictor, batch_size: int = 64, bound: float | None = None, recorded_inputs: bool = False
    ) -> EventPredictions:
        """Score the jittered split; ``recorded_inputs`` feeds the predictor the recorded times of the
        same events (the jittered ones stay the targets)."""
        inputs = None
        if recorded_inputs:
            inputs = [
                EventSequence(s.session_id, t, s.marks, s.values)
                for s, t in zip(self.sequences, self.raw_times, strict=True)
            ]
        schema = self.data.schema
        return score(predictor, self.sequences, self.raw_times, schema, batch_size, bound=bound, inputs=inputs)

    def score_recorded(
        self, predictor: Predictor, resolution: float, bound: float, batch_size: int = 64
    ) -> RecordedPredictions:
        """Score the split as recorded (``score_recorded``): what a server replaying it serves."""
        return score_recorded(
            predictor, self.recorded, self.data.schema, resolution=resolution, bound=bound, batch_size=batch_size
        )

    def train_gap_max(self) -> float:
        """The largest recorded training gap plus the jitter: the bound no jittered training gap exceeds."""
        return max(float(np.diff(t).max()) for t in self.train_raw_times if len(t) > 1) + self.config.jitter

    def no_history(self, n_components: int | None = None) -> NoHistoryModel:
        """The no-history baseline fitted on the (fixed-jitter) training split."""
        return NoHistoryModel.fit(self.train, self.data.schema, n_components or self.config.n_components)


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
        (out / "metrics.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        comparison = "comparison.md" if (out / "comparison.md").is_file() else None
        (out / "report.md").write_text(_report(result, ev, figures, comparison))
    return result


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    written.append(_save(fig, out / "gap_distribution.png"))

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
    written.append(_save(fig, out / "calibration.png"))

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
    written.append(_save(fig, out / "timeline.png"))
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


def _save(fig: Any, path: Path) -> str:
    fig.savefig(path, dpi=72)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name
