"""The task interface of the engine core (docs/architecture.md "Tasks").

A served model declares its task (``ModelDescription.task``); the engine core runs every task
through this one interface: state rows in, state rows out, output columns. The front ends encode
a task's output columns in their protocol's shapes; the core never sees those shapes. The event
task (``aaren.server.tasks.event.task.EventTask``: a marked temporal point process, next gap distribution,
next marks, next values) is the first implementation; its output columns are
``aaren.server.tasks.event.task.OUTPUT_NAMES``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from aaren.server.contract.columns import ModelDescription
from aaren_core.attention.state import State

__all__ = ["Outputs", "RunColumnsLike", "Task"]

#: A task's outputs: name -> ``[F, ...]`` over F forecasts (numpy, on the host).
Outputs = dict[str, np.ndarray]


class RunColumnsLike(Protocol):
    """The events a batch applies, flat and grouped by session (``aaren.server.tasks.event.task.RunColumns``)."""

    dt: np.ndarray
    marks: np.ndarray
    values: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    want: np.ndarray


class Task(Protocol):
    """What the engine core needs of a served model."""

    description: ModelDescription
    version: str
    device: torch.device

    def layout_rows(self) -> dict[str, Tensor]:
        """The fresh row of every per-session tensor (the store keeps rows of these, O(1) each)."""
        ...

    def apply(self, rows: dict[str, Tensor], runs: RunColumnsLike, top_k: int) -> tuple[dict[str, Tensor], Outputs]:
        """Apply each session's run of events to its row (a batched step for runs of one event, the
        parallel scan for longer runs); new rows (``rows`` unchanged) and the outputs of the events
        ``runs.want`` selects, in flat order."""
        ...

    def forecast_outputs(self, features: Tensor, top_k: int) -> Outputs:
        """The outputs of a session from its stored row of features, without new events."""
        ...

    def empty_outputs(self, top_k: int) -> Outputs:
        """The output columns of no forecast (``[0, ...]`` each)."""
        ...

    def state_of(self, rows: dict[str, Tensor]) -> State:
        """The backbone state held in ``rows`` (``GetSession``'s bytes)."""
        ...
