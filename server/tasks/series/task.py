"""The series task on the engine core: ``SeriesTask`` (see ``aaren.server.tasks.recurrent``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aaren.server.tasks.recurrent import RecurrentTask
from aaren.server.tasks.runs import RunColumns
from aaren.server.tasks.series.outputs import SeriesOutputs
from aaren_core.attention.state import State
from aaren_core.checkpoint import Checkpoint
from aaren_core.tasks.series.data import calendar_features
from aaren_core.tasks.series.model import SeriesModel

__all__ = ["SeriesTask", "from_checkpoint"]


class SeriesTask(RecurrentTask):
    """Task ``series``: a ``SeriesModel``; outputs ``SeriesOutputs`` in the data's raw units
    (``SeriesModel.to_raw`` of its heads); an event's calendar features come from its time (Unix
    seconds, ``aaren_core.tasks.series.data.calendar_features``), as in training."""

    task = "series"
    model: SeriesModel

    def __init__(
        self, model: SeriesModel, *, version: str, name: str, metadata: dict[str, Any], device: torch.device
    ) -> None:
        self.last_width = model.config.backbone.d_model
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

    def empty_outputs(self, top_k: int) -> SeriesOutputs:
        c = self.model.config
        return SeriesOutputs(
            np.zeros((0, c.horizon, c.n_channels), np.float32),
            np.zeros((0, c.horizon, c.n_channels, len(c.quantiles)), np.float32),
        )

    @torch.inference_mode()
    def forecast_outputs(self, features: Tensor, top_k: int) -> SeriesOutputs:
        """``features [F, d_model]`` -> raw-unit ``series_mean [F, H, C]``, ``series_quantiles [F, H, C, Q]``."""
        if not len(features):
            return self.empty_outputs(top_k)
        raw = self.model.to_raw(self.model.heads(features))
        return SeriesOutputs(raw.mean.cpu().numpy(), raw.quantiles.cpu().numpy())


def from_checkpoint(ckpt: Checkpoint, device: torch.device, quantiles: Sequence[float], **_: Any) -> SeriesTask:
    """The task of a loaded series-model checkpoint (its registry entry's executor; its quantile
    levels are the model's own)."""
    metadata = ckpt.metadata
    name = str(metadata.get("name") or f"aaren-series-{metadata.get('data', 'model')}")
    return SeriesTask(ckpt.model, version=ckpt.model_version, name=name, metadata=metadata, device=device)
