"""The series and class tasks behind the engine core's task interface (``aaren.server.tasks.base.Task``).

Both keep per session the backbone's constant-size state plus one row of what the last event
left: a series model the backbone output ``features [d_model]`` (its horizon heads run on it),
a class model its ``logits [K]``. Both apply a batch as the event task does: sessions with one
event in one batched ``step``, runs of equal length ``L > 1`` with one parallel ``prefill
[R_L, L]`` (invariant 2: the same numbers as stepping them one by one).

Output columns (numpy, ``[F, ...]`` over F forecasts):

- series (``SERIES_OUTPUTS``): ``series_mean [F, H, C]`` and ``series_quantiles [F, H, C, Q]`` in the
  data's raw units (``SeriesModel.to_raw`` of its heads); an event's calendar features come from
  its time (Unix seconds, ``aaren_core.tasks.series.data.calendar_features``), as in training.
- class (``CLASS_OUTPUTS``): ``class_top [F, K]`` class indices by falling probability and
  ``class_probs [F, K]`` their softmax probabilities (every class is ranked; front ends cut).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from aaren.server.contract.columns import ModelDescription
from aaren.server.tasks.base import Outputs
from aaren.server.tasks.event.task import RunColumns
from aaren_core.attention.state import State
from aaren_core.tasks.classify.model import ClassModel
from aaren_core.tasks.series.model import SeriesModel

__all__ = ["LAST", "RecurrentTask"]

LAST = "features"


class RecurrentTask:
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
