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

``EvalSplit`` is a checkpoint's split dequantized as in training; ``aaren_core.tasks.event.report``
scores a checkpoint with all of it and writes the report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aaren_core.tasks.event.config import TrainConfig
from aaren_core.tasks.event.data import EventSchema, EventSequence, pad_batch
from aaren_core.tasks.event.heads import MIN_LOG_SCALE, HeadOutput, LogNormalMixture, mark_nll, value_nll
from aaren_core.tasks.event.model import EventModel
from aaren_core.tasks.event.splits import EventData
from aaren_core.tasks.event.train import eval_jitter, load_data, resolve_config

__all__ = [
    "LEVELS",
    "EvalSplit",
    "EventPredictions",
    "NoHistoryModel",
    "Predictor",
    "RecordedPredictions",
    "compute_metrics",
    "constant_gap_metrics",
    "fit_lognormal_mixture",
    "model_predictor",
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


class _EventRows:
    """A table of ``E`` forecast events, one row of each array per event; its length is ``E``, the
    rows of ``gap [E]``."""

    gap: np.ndarray

    def __len__(self) -> int:
        return int(self.gap.shape[0])


@dataclasses.dataclass(frozen=True, eq=False)
class EventPredictions(_EventRows):
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
    (``aaren_core.tasks.event.data.dequantize``); pass the sequences' own times when nothing was dequantized.
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
class RecordedPredictions(_EventRows):
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
