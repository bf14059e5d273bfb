"""The task interface of the engine core (docs/architecture.md "Tasks").

A served model declares its task (``ModelDescription.task``); the engine core runs every task
through this one interface: state rows in, state rows out, typed output columns
(``aaren.server.contract.columns.OutputColumns``). The front ends encode a task's output columns in
their protocol's shapes with the task's own codecs, which ``aaren.server.tasks.registry`` names; the
core never sees those shapes. Every task here is a ``aaren.server.tasks.runs.RunTask`` (one ``apply``
over runs of events): the event task (``aaren.server.tasks.event.task.EventTask``: a marked temporal
point process), series forecasting (``SeriesTask``) and classification (``ClassTask``).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from aaren.server.contract.columns import ModelDescription, OutputColumns
from aaren.server.stores.base import Rows
from aaren.server.tasks.runs import RunColumns
from aaren_core.attention.state import State

__all__ = ["Task"]


class Task(Protocol):
    """What the engine core needs of a served model. A task that can sample futures (the event task)
    also has ``sample(rows, horizon, num_samples, seed)``: the unary Forecast's ``horizon > 1``."""

    description: ModelDescription
    version: str
    device: torch.device

    def layout_rows(self) -> dict[str, Tensor]:
        """The fresh row of every per-session tensor (the store keeps rows of these, O(1) each)."""
        ...

    def apply(self, rows: Rows, runs: RunColumns, top_k: int) -> tuple[Rows, OutputColumns]:
        """Apply each session's run of events to its row (a batched step for runs of one event, the
        parallel scan for longer runs); new rows (``rows`` unchanged) and the outputs of the events
        ``runs.want`` selects, in flat order. Rows come and go as tensors or numpy arrays (``Rows``);
        the new rows may come as ``CheckedRows``: the task says which of them are finite (else the
        batcher checks them)."""
        ...

    def forecast_outputs(self, features: Tensor, top_k: int) -> OutputColumns:
        """The outputs of a session from its stored row of features, without new events."""
        ...

    def empty_outputs(self, top_k: int) -> OutputColumns:
        """The output columns of no forecast (``[0, ...]`` each)."""
        ...

    def state_of(self, rows: Rows) -> State:
        """The backbone state held in ``rows`` (``GetSession``'s bytes)."""
        ...
