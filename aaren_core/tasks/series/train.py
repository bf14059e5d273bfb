"""The series task's part of the training loop, and its test scores.

A ``SeriesModel`` trains on windows of ``window`` consecutive train steps: after every position
``t`` of a window it forecasts the next ``horizon`` standardized steps (all inside the train
part), loss ``MSE(mean) + quantile_weight * pinball`` (``series_loss``) on every
``loss_stride``-th position counted back from the window's end. Training on every prefix teaches
the forecast from any amount of history, which is what a stream needs. A ``DLinear`` trains on
``lookback`` windows with MSE, as in TSLib. Model selection (``aaren_core.training.loop``): the
lowest validation MSE of the forecast from the last ``lookback`` steps (the protocol every model
shares), early stopping after ``patience`` epochs without improvement. Test (``score_series_task``):
that restricted score for every model, the streaming score (all history through the state) for
Aaren and GRU, and the naive baselines.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from aaren_core.tasks.config import TaskTrainConfig
from aaren_core.tasks.event.data import DataError
from aaren_core.tasks.series.baselines import DLinear, DLinearConfig, last_value, seasonal_naive, windows
from aaren_core.tasks.series.data import SeriesData, calendar_features
from aaren_core.tasks.series.metrics import model_window_predictor, score_series, score_streaming_raw
from aaren_core.tasks.series.model import SeriesModel, SeriesModelConfig, series_loss
from aaren_core.training.loop import BestInMemory, EpochEnd, LoopState, StepLoss, Validation

__all__ = [
    "SeriesLoop",
    "baseline_scores",
    "score_series_task",
    "series_model",
    "shifted_starts",
]


def baseline_scores(data: SeriesData, lookback: int, horizon: int, part: str = "test") -> dict[str, Any]:
    """Last value and seasonal naive (daily) on ``part``'s origins (the seasonal one needs a day of
    history, so in the train part its origins start a day in)."""
    z = data.standardized()
    period = data.steps_per_day
    return {
        "last_value": score_series(lambda o: last_value(z, o, horizon), data, part, lookback, horizon),
        f"seasonal_naive_{period}": score_series(
            lambda o: seasonal_naive(z, o, horizon, period), data, part, max(lookback, period), horizon
        ),
    }


def shifted_starts(starts: np.ndarray, spacing: int, last: int, rng: np.random.Generator) -> np.ndarray:
    """One epoch's window starts: ``starts`` (every ``spacing`` steps from 0) shifted by one random
    offset in ``[0, spacing)``, those past ``last`` dropped."""
    shifted = starts + int(rng.integers(spacing))
    return shifted[shifted <= last]


def series_model(config: TaskTrainConfig, data: SeriesData) -> nn.Module:
    """A fresh ``DLinear`` or ``SeriesModel`` for ``config``, with the data's normalization."""
    if config.model == "dlinear":
        return DLinear(DLinearConfig(config.lookback, config.horizon))
    model = SeriesModel(
        SeriesModelConfig(
            config.backbone(),
            data.n_channels,
            config.horizon,
            config.quantiles,
            4 if config.time_features else 0,
            config.head,
        )
    )
    model.set_normalization(torch.from_numpy(data.mean), torch.from_numpy(data.std))
    return model


def score_series_task(model: nn.Module, config: TaskTrainConfig, data: SeriesData) -> dict[str, Any]:
    """``test.restricted`` (the last ``lookback`` steps, every model) and ``test.streaming`` (all
    history through the state; Aaren and GRU; ``test.streaming_raw`` the same in raw units), MSE
    and MAE on standardized values over the observed targets, beside last value and seasonal naive
    (``baselines``); ``test_from`` (ISO UTC), the ``gaps`` filled and the ``split`` used."""
    model.eval()
    test = {
        "restricted": score_series(
            model_window_predictor(model, data, config.lookback, config.horizon),
            data,
            "test",
            config.lookback,
            config.horizon,
        )
    }
    if isinstance(model, SeriesModel) and config.model in ("aaren", "gru"):
        test["streaming"], test["streaming_raw"] = score_streaming_raw(
            model, data, "test", config.lookback, config.horizon
        )
    return {
        "test": test,
        "baselines": baseline_scores(data, config.lookback, config.horizon),
        "test_from": data.test_from,
        "gaps": {"missing_steps": data.missing_steps, "missing_values": data.missing_values, "fill": "forward"},
        "split": data.split,
    }


def epoch_batches(starts: np.ndarray, config: TaskTrainConfig) -> list[np.ndarray]:
    """``starts`` (already shuffled) cut into batches of ``batch_size``, at most ``steps_per_epoch`` (0: all)."""
    batches = [starts[i : i + config.batch_size] for i in range(0, len(starts), config.batch_size)]
    return batches[: config.steps_per_epoch] if config.steps_per_epoch else batches


class SeriesLoop(BestInMemory):
    """The series task's part of the loop (``aaren_core.training.loop.TaskLoop``): batches of window
    starts, ``series_loss`` (MSE for DLinear), the validation MSE of the restricted forecast as the
    score; the best weights are kept in memory."""

    def __init__(self, config: TaskTrainConfig, data: SeriesData, model: nn.Module) -> None:
        self.config, self.data, self.model = config, data, model
        self.rng = np.random.default_rng(config.seed)
        self.z, self.feats = data.standardized(), calendar_features(data.times)
        self.train_end = data.part("train")[1]
        self.spacing = 1
        if isinstance(model, DLinear):
            self.starts = np.arange(config.lookback, self.train_end - config.horizon + 1)
        else:
            # Window starts every quarter window: each train step is a scored position ~4 times an epoch.
            self.spacing = max(1, config.window // 4)
            self.starts = np.arange(0, self.train_end - config.window - config.horizon + 1, self.spacing)
        if self.starts.size == 0:
            raise DataError(
                f"{data.name}: {self.train_end} train steps are too few for window/lookback and horizon "
                f"{config.horizon}"
            )
        self.keep()

    def batches(self, epoch: int) -> list[np.ndarray]:
        config = self.config
        starts = self.starts
        if config.window_offsets and self.spacing > 1:
            last = self.train_end - config.window - config.horizon
            starts = shifted_starts(starts, self.spacing, last, self.rng)
        return epoch_batches(self.rng.permutation(starts), config)

    def step_loss(self, starts: np.ndarray) -> StepLoss:
        config, model, z = self.config, self.model, self.z
        h = config.horizon
        if isinstance(model, DLinear):
            pred = model(torch.from_numpy(windows(z, starts, config.lookback)))
            idx = starts[:, None] + np.arange(h)[None, :]  # [B, H]
            target = torch.from_numpy(z[idx])
            seen = self.data.target_mask(idx)  # [B, H, C]: filled targets do not count
            if seen is None:
                loss = (pred - target).square().mean()
            else:
                w = torch.from_numpy(seen).to(target.dtype)
                loss = ((pred - target).square() * w).sum() / w.sum().clamp_min(1)
            return StepLoss(loss, loss.item(), 1)
        w = config.window
        steps = starts[:, None] + np.arange(w)[None, :]  # [B, W]
        values = torch.from_numpy(self.data.values[steps])
        tf = torch.from_numpy(self.feats[steps]) if config.time_features else None
        y, _ = model.prefill(values, tf)
        positions = np.arange((w - 1) % config.loss_stride, w, config.loss_stride)  # scored; always the last
        target_idx = starts[:, None, None] + positions[None, :, None] + 1 + np.arange(h)[None, None, :]  # [B, P, H]
        target = torch.from_numpy(z[target_idx])  # [B, P, H, C]
        forecast = model.heads(y[:, torch.from_numpy(positions)])
        seen = self.data.target_mask(target_idx)  # [B, P, H, C]: filled targets do not count
        mask = torch.ones(target.shape[:2], dtype=torch.bool) if seen is None else torch.from_numpy(seen)
        levels = torch.tensor(config.quantiles, dtype=target.dtype)
        loss = series_loss(forecast, target, mask, levels, config.quantile_weight)[0]
        return StepLoss(loss, loss.item(), 1)

    def validate(self, train_loss: float) -> Validation:
        config = self.config
        val = score_series(
            model_window_predictor(self.model, self.data, config.lookback, config.horizon),
            self.data, "val", config.lookback, config.horizon, stride=config.val_stride,
        )  # fmt: skip
        return Validation(val["mse"], val)

    def record(self, end: EpochEnd) -> dict[str, Any]:
        val = end.validation.metrics
        return {"epoch": end.epoch - 1, "train_loss": end.train_loss, "val_mse": val["mse"], "val_mae": val["mae"]}

    def summary(self, end: EpochEnd, record: dict[str, Any]) -> str:
        return (
            f"epoch {record['epoch']}: train loss {end.train_loss:.4f}, val MSE {record['val_mse']:.4f} "
            f"MAE {record['val_mae']:.4f}"
        )

    def selection(self, state: LoopState) -> dict[str, Any]:
        """What training reports of the selection: the best validation MSE, its epoch, the epochs run."""
        return self.selected(state, "val_mse", state.best_score)
