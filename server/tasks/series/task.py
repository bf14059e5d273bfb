"""The series task on the engine core: ``SeriesTask`` (see ``aaren.server.tasks.recurrent``).

A live stream has the gaps a file has, and the server fills them as training does (the one rule,
docs/tasks.md "A live series with gaps"). For a model of step ``D`` (``step_seconds > 0``) an event
``dt`` after its session's previous one leaves ``k = round(dt / D) - 1`` missing steps (the core's
checks keep ``dt`` on the grid and ``k <= max_gap_steps``). Before the event the task steps the
``k`` filled steps: values ``x_fill`` (the last filled values), times ``t_prev + j D`` (``j = 1..k``),
no forecast; then the event, its NaN values replaced by ``x_fill``:

    x_fill[c] <- x[c] where x[c] is not NaN           (per event, in order)
    x_fill    =  value_mean                           (a session's first: the train mean, z = 0)

``x_fill [C]`` is a row of the session's layout (``FILLED``), stored with its state. The filled
steps are rows of the run's columns (``_expand``), so ``RunTask.apply`` is still the one loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aaren.formats.models import default_max_gap_steps
from aaren.server.stores.base import Rows, as_tensors
from aaren.server.tasks.recurrent import RecurrentTask
from aaren.server.tasks.runs import RunColumns
from aaren.server.tasks.series.outputs import SeriesOutputs
from aaren_core.attention.state import State
from aaren_core.checkpoint import Checkpoint
from aaren_core.tasks.series.data import calendar_features
from aaren_core.tasks.series.model import SeriesModel

__all__ = ["FILLED", "SeriesTask", "from_checkpoint"]

#: The row of a session's last filled values ``[C]`` (raw units).
FILLED = "filled"


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
        channels = self.checkpoint_names(metadata.get("channels"), c.n_channels, "channels", prefix="value_")
        step = float(metadata.get("step_seconds", 0.0))
        self.state_bytes += 4 * c.n_channels  # the FILLED row
        self.description = self.describe_channels(
            name,
            channels,
            mark_names=("observation",),
            time_unit="seconds",
            quantiles=tuple(c.quantiles),
            horizon=c.horizon,
            step_seconds=step,
            missing_values=True,
            max_gap_steps=int(metadata.get("max_gap_steps") or 0) or default_max_gap_steps(step),
        )

    def layout_rows(self) -> dict[str, Tensor]:
        """The backbone's rows and ``FEATURES``, plus ``FILLED [C]``: the train mean (what a
        session's first event's NaN values become)."""
        rows = super().layout_rows()
        rows[FILLED] = self.model.value_mean.detach().to(self.device, torch.float32).clone()
        return rows

    @torch.inference_mode()
    def apply(self, rows: Rows, runs: RunColumns, top_k: int) -> tuple[dict[str, Tensor], SeriesOutputs]:
        """``RunTask.apply`` on the runs with their gaps filled (``_expand``): the filled steps
        get no forecast; each forecast says how many steps were filled before its event."""
        rows = as_tensors(rows)
        expanded, filled_steps, last_filled = self._expand(rows, runs)
        new, outputs = super().apply(rows, expanded, top_k)
        new = {**new, FILLED: last_filled}
        assert isinstance(outputs, SeriesOutputs)
        return new, dataclasses.replace(outputs, filled_steps=filled_steps[runs.want])

    def _expand(self, rows: dict[str, Tensor], runs: RunColumns) -> tuple[RunColumns, np.ndarray, Tensor]:
        """The runs with ``k_i`` filled steps before each event ``i`` and NaN values filled (module
        docstring): the expanded columns (``A + sum k`` events), ``k [A]`` int64, and each session's
        last filled values ``[R, C]`` on the device (its new ``FILLED`` row)."""
        step = self.description.step_seconds
        n, values = len(runs.dt), runs.values
        starts, lengths = runs.starts, runs.lengths
        ends = starts + lengths - 1
        k = np.maximum(np.rint(runs.dt / step).astype(np.int64) - 1, 0) if step > 0 else np.zeros(n, np.int64)
        missing = np.isnan(values)
        gaps = bool(k.any())
        if not missing.any() and not gaps:
            return runs, k, torch.from_numpy(np.ascontiguousarray(values[ends])).to(self.device, torch.float32)
        stored = rows[FILLED].float().cpu().numpy()  # [R, C]
        run_of = np.repeat(np.arange(len(lengths)), lengths)  # [A]
        filled = values
        if missing.any():
            # Forward fill within each run: the last position at or before i where channel c was
            # observed; one before the run's start means none in the run, so the stored row.
            seen = np.where(missing, -1, np.arange(n)[:, None])
            np.maximum.accumulate(seen, axis=0, out=seen)
            own = seen >= starts[run_of][:, None]
            filled = np.where(own, np.take_along_axis(values, np.maximum(seen, 0), axis=0), stored[run_of])
            filled = filled.astype(np.float32)
        last_filled = torch.from_numpy(np.ascontiguousarray(filled[ends])).to(self.device, torch.float32)
        if not gaps:
            return dataclasses.replace(runs, values=filled), k, last_filled
        before = np.empty_like(filled)  # [A, C] the filled values before each event
        before[1:] = filled[:-1]
        before[starts] = stored
        total = n + int(k.sum())
        at = np.arange(n) + np.cumsum(k)  # [A] each event's position in the expanded columns
        owner = np.repeat(np.arange(n), k)  # [S] the event each filled step precedes
        j = np.arange(len(owner)) - np.repeat(np.cumsum(k) - k, k) + 1  # [S] 1..k_i
        slot = at[owner] - k[owner] + j - 1  # [S]
        dt = np.full(total, step)
        dt[at] = runs.dt - k * step
        marks = np.empty(total, runs.marks.dtype)
        marks[at], marks[slot] = runs.marks, runs.marks[owner]
        out = np.empty((total, values.shape[1]), np.float32)
        out[at], out[slot] = filled, before[owner]
        want = np.zeros(total, bool)
        want[at] = runs.want
        times = None
        if runs.times is not None:
            times = np.empty(total)
            times[at] = runs.times
            times[slot] = runs.times[owner] - runs.dt[owner] + j * step
        new_lengths = lengths + np.add.reduceat(k, starts)
        new_starts = np.concatenate(([0], np.cumsum(new_lengths)[:-1]))
        expanded = RunColumns(dt, marks, out, new_starts, new_lengths, want, times)
        return expanded, k, last_filled

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
            np.zeros(0, np.int64),
        )

    @torch.inference_mode()
    def forecast_outputs(self, features: Tensor, top_k: int) -> SeriesOutputs:
        """``features [F, d_model]`` -> raw-unit ``series_mean [F, H, C]``, ``series_quantiles [F, H, C, Q]``."""
        if not len(features):
            return self.empty_outputs(top_k)
        raw = self.model.to_raw(self.model.heads(features))
        return SeriesOutputs(raw.mean.cpu().numpy(), raw.quantiles.cpu().numpy(), np.zeros(len(features), np.int64))


def from_checkpoint(ckpt: Checkpoint, device: torch.device, quantiles: Sequence[float], **_: Any) -> SeriesTask:
    """The task of a loaded series-model checkpoint (its registry entry's executor; its quantile
    levels are the model's own)."""
    metadata = ckpt.metadata
    name = str(metadata.get("name") or f"aaren-series-{metadata.get('data', 'model')}")
    return SeriesTask(ckpt.model, version=ckpt.model_version, name=name, metadata=metadata, device=device)
