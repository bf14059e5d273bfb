"""The series and class tasks behind the engine core's task interface (``aaren.server.tasks.Task``).

Both keep per session the backbone's constant-size state plus one row of what the last event
left: a series model the backbone output ``features [d_model]`` (its horizon heads run on it),
a class model its ``logits [K]``. Both apply a batch as the event task does: sessions with one
event in one batched ``step``, runs of equal length ``L > 1`` with one parallel ``prefill
[R_L, L]`` (invariant 2: the same numbers as stepping them one by one).

Output columns (numpy, ``[F, ...]`` over F forecasts):

- series (``SERIES_OUTPUTS``): ``series_mean [F, H, C]`` and ``series_quantiles [F, H, C, Q]`` in the
  data's raw units (``SeriesModel.to_raw`` of its heads); an event's calendar features come from
  its time (Unix seconds, ``aaren_core.series_data.calendar_features``), as in training.
- class (``CLASS_OUTPUTS``): ``class_top [F, K]`` class indices by falling probability and
  ``class_probs [F, K]`` their softmax probabilities (every class is ranked; front ends cut).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from aaren.server.columns import ModelDescription
from aaren.server.engine import RunColumns
from aaren.server.tasks import Outputs
from aaren_core.class_model import ClassModel
from aaren_core.series_data import calendar_features
from aaren_core.series_model import SeriesModel
from aaren_core.state import State

__all__ = ["CLASS_OUTPUTS", "SERIES_OUTPUTS", "ClassEngine", "SeriesEngine"]

SERIES_OUTPUTS = ("series_mean", "series_quantiles")
CLASS_OUTPUTS = ("class_top", "class_probs")
LAST = "features"


class _RecurrentTask:
    """What the series and class engines share: rows (state fields + ``last``), batched apply."""

    task: str
    model: SeriesModel | ClassModel

    def __init__(self, model: SeriesModel | ClassModel, *, version: str, device: torch.device) -> None:
        if model.backbone.state_type.growing:
            raise ValueError(
                f"the service keeps a constant-size state per session; the {model.config.backbone.kind!r} "
                "backbone's state grows with every event (use aaren or gru)"
            )
        self.model = model.to(device).eval()
        self.version = version
        self.device = device
        fresh = model.init_state(1, device="cpu")
        self._state_type = type(fresh)
        self._state_fields = list(fresh.tensors())
        self.state_bytes = model.backbone.state_nbytes(fresh) + self.last_width * 4
        self.description: ModelDescription

    @property
    def last_width(self) -> int:
        """Width of the ``last`` row (what a forecast is computed from)."""
        raise NotImplementedError

    def _describe(self, name: str, channels: tuple[str, ...], **task_fields: Any) -> ModelDescription:
        """The description every task shares (backbone, sizes, one mark, the channels as values)
        plus the task's own fields."""
        b = self.model.config.backbone
        return ModelDescription(
            name=name,
            version=self.version,
            backbone=b.kind,
            d_model=b.d_model,
            n_layers=b.n_layers,
            n_heads=b.n_heads,
            num_marks=1,
            value_width=len(channels),
            parameters=sum(p.numel() for p in self.model.parameters()),
            state_bytes_per_session=self.state_bytes,
            value_names=channels,
            device=str(self.device),
            task=self.task,
            **task_fields,
        )

    def _step(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        raise NotImplementedError

    def _prefill(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        raise NotImplementedError

    def _time_inputs(self, runs: RunColumns) -> Tensor | None:
        return None

    def layout_rows(self) -> dict[str, Tensor]:
        rows = {k: t[0] for k, t in self.model.init_state(1, device=self.device).tensors().items()}
        rows[LAST] = torch.zeros(self.last_width, device=self.device)
        return rows

    def state_of(self, rows: dict[str, Tensor]) -> State:
        return self._state_type(**{k: rows[k] for k in self._state_fields})

    @torch.inference_mode()
    def apply(self, rows: dict[str, Tensor], runs: RunColumns, top_k: int) -> tuple[dict[str, Tensor], Outputs]:
        """Session ``r``'s events ``runs.starts[r] : + runs.lengths[r]`` applied to row ``r`` of ``rows``;
        new rows (``rows`` unchanged) and the outputs of the events ``runs.want`` selects."""
        n_events = len(runs.dt)
        values = torch.from_numpy(runs.values).to(self.device, torch.float32).view(n_events, -1)  # [A, C]
        times = self._time_inputs(runs)  # [A, F] or None
        new = {k: t.clone() for k, t in rows.items()}
        last = torch.empty(n_events, self.last_width, device=self.device)  # [A, W]
        for length in np.unique(runs.lengths).tolist():
            members_np = np.flatnonzero(runs.lengths == length)
            members = torch.from_numpy(members_np).to(self.device)
            state = self.state_of({k: t.index_select(0, members) for k, t in rows.items()})
            flat_np = (runs.starts[members_np][:, None] + np.arange(length)).reshape(-1)  # [R_L * L]
            flat = torch.from_numpy(flat_np).to(self.device)
            t = None if times is None else times[flat]
            if length == 1:
                out, state = self._step(values[flat], t, state)  # [R_L, W]
                end = out
                last.index_copy_(0, flat, out)
            else:
                shape = (len(members_np), length)
                out, state = self._prefill(
                    values[flat].view(*shape, -1), None if t is None else t.view(*shape, -1), state
                )  # [R_L, L, W]
                end = out[:, -1]
                last.index_copy_(0, flat, out.reshape(-1, out.shape[-1]))
            for k, tensor in {**state.tensors(), LAST: end}.items():
                new[k].index_copy_(0, members, tensor)
        wanted = last[torch.from_numpy(np.flatnonzero(runs.want)).to(self.device)]
        return new, self.forecast_outputs(wanted, top_k)


class SeriesEngine(_RecurrentTask):
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


class ClassEngine(_RecurrentTask):
    """Task ``class``: a ``ClassModel``; outputs ``CLASS_OUTPUTS`` (module docstring)."""

    task = "class"
    model: ClassModel

    def __init__(
        self, model: ClassModel, *, version: str, name: str, metadata: dict[str, Any], device: torch.device
    ) -> None:
        super().__init__(model, version=version, device=device)
        c = model.config
        channels = tuple(metadata.get("channels") or (f"value_{i}" for i in range(c.n_channels)))
        classes = tuple(str(x) for x in metadata.get("class_names") or range(c.n_classes))
        if len(channels) != c.n_channels or len(classes) != c.n_classes:
            raise ValueError(
                f"the checkpoint names {len(channels)} channels and {len(classes)} classes; "
                f"its model has {c.n_channels} and {c.n_classes}"
            )
        self.description = self._describe(
            name,
            channels,
            mark_names=("step",),
            time_unit=str(metadata.get("time_unit", "steps")),
            class_names=classes,
        )

    @property
    def last_width(self) -> int:
        return self.model.config.n_classes

    def _step(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        return self.model.step(values, state)

    def _prefill(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        return self.model.prefill(values, state)

    def empty_outputs(self, top_k: int) -> Outputs:
        k = self.model.config.n_classes
        return {"class_top": np.zeros((0, k), np.int64), "class_probs": np.zeros((0, k), np.float32)}

    @torch.inference_mode()
    def forecast_outputs(self, logits: Tensor, top_k: int) -> Outputs:
        """``logits [F, K]`` -> every class by falling probability: ``class_top``, ``class_probs [F, K]``."""
        if not len(logits):
            return self.empty_outputs(top_k)
        probs, top = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True)
        return {"class_top": top.cpu().numpy(), "class_probs": probs.cpu().numpy()}
