"""Offline scores of the series task, as TSLib scores them.

Forecasts from every origin of a part (``SeriesData.forecast_origins``) compared with the truth on
standardized values,

    MSE = mean over origins, steps h < H, channels of (x_hat - x)^2,   MAE likewise of |x_hat - x|,

plus both per step ``h``. With gaps (``SeriesData.observed``) the means run over the observed
targets only (origins already follow real rows); ``targets`` counts them. A window model
(DLinear, or a ``SeriesModel`` restricted to the last ``L`` steps) sees ``z[s - L : s]``; a
streaming ``SeriesModel`` has seen ``z[0 : s]`` through its state (``streaming_forecasts``), so its
numbers say what serving gives, and the restricted ones make the comparison with window baselines
fair.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from aaren_core.tasks.series.baselines import windows
from aaren_core.tasks.series.data import SeriesData, calendar_features
from aaren_core.tasks.series.model import SeriesModel

__all__ = [
    "ErrorSums",
    "Predictor",
    "model_window_predictor",
    "score_series",
    "score_streaming",
    "score_streaming_raw",
    "streaming_forecasts",
]

Predictor = Callable[[np.ndarray], np.ndarray]


class ErrorSums:
    """Running squared and absolute errors per horizon step, for ``[B, H, C]`` batches, over the
    entries a ``mask [B, H, C]`` keeps (all without one)."""

    def __init__(self, horizon: int) -> None:
        self.se = np.zeros(horizon, dtype=np.float64)
        self.ae = np.zeros(horizon, dtype=np.float64)
        self.count = 0
        self.counts = np.zeros(horizon, dtype=np.int64)
        self.masked = False

    def update(self, pred: np.ndarray, target: np.ndarray, mask: np.ndarray | None = None) -> None:
        if pred.shape != target.shape:
            raise ValueError(f"forecast {pred.shape} and truth {target.shape} differ")
        err = pred.astype(np.float64) - target
        if mask is not None:
            self.masked = True
            err = np.where(mask, err, 0.0)
            self.counts += mask.sum(axis=(0, 2))
        else:
            self.counts += pred.shape[0] * pred.shape[2]
        self.se += np.square(err).sum(axis=(0, 2))
        self.ae += np.abs(err).sum(axis=(0, 2))
        self.count += pred.shape[0] * pred.shape[2]

    def result(self) -> dict[str, float | list[float]]:
        """``mse``, ``mae`` over every counted target, ``mse_by_step``, ``mae_by_step`` ``[H]``,
        ``targets`` (the count)."""
        if not self.masked:  # every entry counts: the same numbers as before masks existed
            n = max(self.count, 1)
            mse, mae = float(self.se.sum() / (n * len(self.se))), float(self.ae.sum() / (n * len(self.ae)))
            by_step = (self.se / n, self.ae / n)
        else:
            total, per = max(int(self.counts.sum()), 1), np.maximum(self.counts, 1)
            mse, mae = float(self.se.sum() / total), float(self.ae.sum() / total)
            by_step = (self.se / per, self.ae / per)
        return {
            "mse": mse,
            "mae": mae,
            "mse_by_step": by_step[0].tolist(),
            "mae_by_step": by_step[1].tolist(),
            "targets": int(self.counts.sum()),
        }


def _targets(z: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
    return z[origins[:, None] + np.arange(horizon)[None, :]]  # [B, H, C]


def _mask(data: SeriesData, origins: np.ndarray, horizon: int) -> np.ndarray | None:
    return data.target_mask(origins[:, None] + np.arange(horizon)[None, :])  # [B, H, C] or None


def score_series(
    predict: Predictor, data: SeriesData, part: str, lookback: int, horizon: int, batch: int = 256, stride: int = 1
) -> dict[str, float | list[float]]:
    """Score ``predict(origins [B]) -> standardized forecasts [B, H, C]`` on every ``stride``-th
    origin of ``part`` (TSLib: ``stride = 1``)."""
    z = data.standardized()
    origins = data.forecast_origins(part, lookback, horizon)[::stride]
    sums = ErrorSums(horizon)
    for i in range(0, len(origins), batch):
        o = origins[i : i + batch]
        sums.update(predict(o), _targets(z, o, horizon), _mask(data, o, horizon))
    out = sums.result()
    out["windows"] = len(origins)
    return out


def model_window_predictor(model: nn.Module, data: SeriesData, lookback: int, horizon: int) -> Predictor:
    """A predictor that runs ``model`` on the last ``lookback`` steps only: a ``DLinear`` on
    standardized windows, or a ``SeriesModel`` on raw windows, taking its forecast after the
    window's last step."""
    z = data.standardized()
    feats = calendar_features(data.times)

    @torch.no_grad()
    def predict(origins: np.ndarray) -> np.ndarray:
        if isinstance(model, SeriesModel):
            raw = torch.from_numpy(windows(data.values, origins, lookback))
            tf = torch.from_numpy(windows(feats, origins, lookback)) if model.config.time_features else None
            y, _ = model.prefill(raw, tf)
            return model.heads(y[:, -1]).mean[:, :horizon].numpy()
        return model(torch.from_numpy(windows(z, origins, lookback)))[:, :horizon].numpy()

    return predict


@torch.no_grad()
def streaming_forecasts(
    model: SeriesModel, data: SeriesData, origins: np.ndarray, horizon: int, chunk: int = 2048
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """What serving returns: the model ingests the series from step 0 in chunks (``prefill``
    with the carried state, as history in one call does) and yields ``(origins, forecasts)``
    batches, the forecast for origin ``s`` being the one after step ``s - 1``, ``[b, H, C]``
    standardized. Aaren's and the GRU's states stay O(1); a Transformer's cache grows with ``T``."""
    origins = np.sort(origins)
    end = int(origins.max())
    values = torch.from_numpy(data.values)
    feats = torch.from_numpy(calendar_features(data.times)) if model.config.time_features else None
    state = model.init_state(1)
    for start in range(0, end, chunk):
        stop = min(start + chunk, end)
        tf = feats[None, start:stop] if feats is not None else None
        y, state = model.prefill(values[None, start:stop], tf, state)
        here = origins[(origins - 1 >= start) & (origins - 1 < stop)]
        if here.size:
            out = model.heads(y[0, here - 1 - start]).mean[:, :horizon]
            yield here, out.numpy()


def score_streaming(
    model: SeriesModel, data: SeriesData, part: str, lookback: int, horizon: int, stride: int = 1
) -> dict[str, float | list[float]]:
    """``score_series`` for the streaming model on the same origins as the window models."""
    return score_streaming_raw(model, data, part, lookback, horizon, stride)[0]


def score_streaming_raw(
    model: SeriesModel, data: SeriesData, part: str, lookback: int, horizon: int, stride: int = 1
) -> tuple[dict[str, float | list[float]], dict[str, float | int]]:
    """``score_streaming``, and the same forecasts scored in raw units (``x_hat std + mean`` in
    float32 as ``SeriesModel.to_raw`` gives them, against the raw values): ``{mse, mae, targets}``,
    what a replay of the file against the served model measures."""
    z = data.standardized()
    origins = data.forecast_origins(part, lookback, horizon)[::stride]
    sums, raw = ErrorSums(horizon), ErrorSums(horizon)
    for o, pred in streaming_forecasts(model, data, origins, horizon):
        mask = _mask(data, o, horizon)
        sums.update(pred, _targets(z, o, horizon), mask)
        raw.update(pred * data.std + data.mean, _targets(data.values.astype(np.float64), o, horizon), mask)
    out = sums.result()
    out["windows"] = len(origins)
    raw_out = raw.result()
    return out, {"mse": raw_out["mse"], "mae": raw_out["mae"], "targets": raw_out["targets"]}
