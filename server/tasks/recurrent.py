"""What the series and class tasks share behind the engine core's task interface (``aaren.server.tasks.base.Task``).

Both keep per session the backbone's constant-size state plus one row of what the last event
left (``FEATURES``): a series model the backbone output ``[d_model]`` (its horizon heads run on it),
a class model its ``logits [K]``. Both apply a batch through the one ``RunTask.apply`` (runs of
one event in one batched ``step``, runs of equal length ``L > 1`` in one parallel ``prefill [R_L, L]``).
Their outputs: ``aaren.server.tasks.series.outputs.SeriesOutputs`` and
``aaren.server.tasks.classify.outputs.ClassOutputs``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from aaren.server.contract.columns import ModelDescription
from aaren.server.tasks.runs import RunColumns, RunTask
from aaren_core.attention.state import State
from aaren_core.tasks.classify.model import ClassModel
from aaren_core.tasks.series.model import SeriesModel

__all__ = ["RecurrentTask"]


class RecurrentTask(RunTask):
    """The series and class tasks' common part: a model of ``C`` value channels per event, whose
    step and prefill take the values (and, for some, time features)."""

    task: str
    model: SeriesModel | ClassModel

    def __init__(self, model: SeriesModel | ClassModel, *, version: str, device: torch.device) -> None:
        super().__init__(model, version=version, device=device)
        fresh = model.init_state(1, device="cpu")
        self.state_bytes = model.backbone.state_nbytes(fresh) + self.last_width * 4

    def describe_channels(self, name: str, channels: tuple[str, ...], **task_fields: Any) -> ModelDescription:
        """``RunTask.describe`` of a model of one mark whose values are its ``channels``, with the state bytes
        this task counts (backbone state, ``FEATURES``, the task's own rows) and the task's own fields."""
        return self.describe(
            name, value_names=channels, state_bytes=self.state_bytes, task=self.task, num_marks=1, **task_fields
        )

    def _step(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        raise NotImplementedError

    def _prefill(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        raise NotImplementedError

    def _time_inputs(self, runs: RunColumns) -> Tensor | None:
        return None

    def _event_inputs(self, runs: RunColumns) -> tuple[Tensor, Tensor | None]:
        """``values [A, C]`` and the time features ``[A, T]`` (None for a model without them)."""
        values = torch.from_numpy(runs.values).to(self.device, torch.float32).view(len(runs.dt), -1)
        return values, self._time_inputs(runs)

    def _step_events(self, inputs: tuple[Tensor, Tensor | None], flat: Tensor, state: State) -> tuple[Tensor, State]:
        values, times = inputs
        return self._step(values[flat], None if times is None else times[flat], state)

    def _prefill_events(
        self, inputs: tuple[Tensor, Tensor | None], flat: Tensor, shape: tuple[int, int], state: State
    ) -> tuple[Tensor, State]:
        values, times = inputs
        return self._prefill(
            values[flat].view(*shape, -1), None if times is None else times[flat].view(*shape, -1), state
        )
