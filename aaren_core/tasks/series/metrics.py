"""Offline scores of the series task, as TSLib scores them.

Forecasts from every origin of a part (``SeriesData.forecast_origins``) compared with the truth on
standardized values,

    MSE = mean over origins, steps h < H, channels of (x_hat - x)^2,   MAE likewise of |x_hat - x|,

plus both per step ``h``. A window model (DLinear, or a ``SeriesModel`` restricted to the last
``L`` steps) sees ``z[s - L : s]``; a streaming ``SeriesModel`` has seen ``z[0 : s]`` through its
state (``streaming_forecasts``), so its numbers say what serving gives, and the restricted ones
make the comparison with window baselines fair.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from aaren_core.tasks.series.baselines import windows
from aaren_core.tasks.series.data import SeriesData, calendar_features
from aaren_core.tasks.series.model import SeriesModel

__all__ = ["ErrorSums", "Predictor", "model_window_predictor", "score_series", "score_streaming", "streaming_forecasts"]

Predictor = Callable[[np.ndarray], np.ndarray]


class ErrorSums:
    """Running squared and absolute errors per horizon step, for ``[B, H, C]`` batches."""

    def __init__(self, horizon: int) -> None:
        self.se = np.zeros(horizon, dtype=np.float64)
        self.ae = np.zeros(horizon, dtype=np.float64)
        self.count = 0

    def update(self, pred: np.ndarray, target: np.ndarray) -> None:
        if pred.shape != target.shape:
            raise ValueError(f"forecast {pred.shape} and truth {target.shape} differ")
        err = pred.astype(np.float64) - target
        self.se += np.square(err).sum(axis=(0, 2))
        self.ae += np.abs(err).sum(axis=(0, 2))
        self.count += pred.shape[0] * pred.shape[2]

    def result(self) -> dict[str, float | list[float]]:
        """``mse``, ``mae`` over everything, ``mse_by_step``, ``mae_by_step`` ``[H]``, ``windows``."""
        n = max(self.count, 1)
        return {
            "mse": float(self.se.sum() / (n * len(self.se))),
            "mae": float(self.ae.sum() / (n * len(self.ae))),
            "mse_by_step": (self.se / n).tolist(),
            "mae_by_step": (self.ae / n).tolist(),
        }


def _targets(z: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
    return z[origins[:, None] + np.arange(horizon)[None, :]]  # [B, H, C]


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
        sums.update(predict(o), _targets(z, o, horizon))
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
    z = data.standardized()
    origins = data.forecast_origins(part, lookback, horizon)[::stride]
    sums = ErrorSums(horizon)
    for o, pred in streaming_forecasts(model, data, origins, horizon):
        sums.update(pred, _targets(z, o, horizon))
    out = sums.result()
    out["windows"] = len(origins)
    return out
