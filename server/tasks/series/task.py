"""The series task on the engine core: ``SeriesTask`` (see ``aaren.server.tasks.recurrent``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from aaren.server.tasks.base import Outputs
from aaren.server.tasks.event.task import RunColumns
from aaren.server.tasks.recurrent import RecurrentTask
from aaren_core.attention.state import State
from aaren_core.tasks.series.data import calendar_features
from aaren_core.tasks.series.model import SeriesModel

__all__ = ["SERIES_OUTPUTS", "SeriesTask"]

SERIES_OUTPUTS = ("series_mean", "series_quantiles")


class SeriesTask(RecurrentTask):
    """Task ``series``: a ``SeriesModel``; outputs ``SERIES_OUTPUTS`` (module docstring)."""

    task = "series"
    model: SeriesModel

    def __init__(
        self, model: SeriesModel, *, version: str, name: str, metadata: dict[str, Any], device: torch.device
    ) -> None:
        super().__init__(model, version=version, device=device)
        c = model.config
        channels = tuple(metadata.get("channels") or (f"value_{i}" for i in range(c.n_channels)))
        if len(channels) != c.n_channels:
            raise ValueError(f"the checkpoint names {len(channels)} channels; its model has {c.n_channels}")
        self.description = self._describe(
            name,
            channels,
            mark_names=("observation",),
            time_unit="seconds",
            quantiles=tuple(c.quantiles),
            horizon=c.horizon,
            step_seconds=float(metadata.get("step_seconds", 0.0)),
        )

    @property
    def last_width(self) -> int:
        return self.model.config.backbone.d_model

    def _time_inputs(self, runs: RunColumns) -> Tensor | None:
        if not self.model.config.time_features:
            return None
        if runs.times is None:
            raise ValueError("a series model with calendar features needs the events' times")
        return torch.from_numpy(calendar_features(runs.times)).to(self.device)

    def _step(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        return self.model.step(values, times, state)

    def _prefill(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        return self.model.prefill(values, times, state)

    def empty_outputs(self, top_k: int) -> Outputs:
        c = self.model.config
        return {
            "series_mean": np.zeros((0, c.horizon, c.n_channels), np.float32),
            "series_quantiles": np.zeros((0, c.horizon, c.n_channels, len(c.quantiles)), np.float32),
        }

    @torch.inference_mode()
    def forecast_outputs(self, features: Tensor, top_k: int) -> Outputs:
        """``features [F, d_model]`` -> raw-unit ``series_mean [F, H, C]``, ``series_quantiles [F, H, C, Q]``."""
        if not len(features):
            return self.empty_outputs(top_k)
        raw = self.model.to_raw(self.model.heads(features))
        return {"series_mean": raw.mean.cpu().numpy(), "series_quantiles": raw.quantiles.cpu().numpy()}
