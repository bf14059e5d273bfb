"""What a task's aaren.v1 encoder is (torch-free): output columns -> ``aaren.v1`` reply protos.

The aaren.v1 front end writes what every forecast has (session id, seq, last time, model) and
leaves the task's part to the encoder of the model's task (``aaren.server.tasks.registry``), one
per served model, built once with ``(description, default_top_k)``:

- ``rows(outputs, k)``: a writer ``write(forecast, f, last_time)`` of forecast ``f`` (row ``f`` of the
  output columns) into one ``pb.Forecast`` (RESPONSE_LAYOUT_ROWS and the unary ``Forecast``);
- ``columns(block, outputs, k, last_times)``: every forecast into one ``pb.ForecastColumns``
  (RESPONSE_LAYOUT_COLUMNS: one packed ``extend`` per column).

``k`` is the request's top_k already cut to ``ModelDescription.ranked``; ``outputs`` are the
task's typed outputs (``Outcomes.outputs``: an instance of the task's ``OutputColumns`` class).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from aaren.server.contract.columns import ModelDescription, OutputColumns
from aaren.v1 import aaren_pb2 as pb

__all__ = ["Encoder", "RowWriter", "TaskEncoder"]

#: ``write(forecast, f, last_time)``: forecast ``f``'s task part into ``forecast`` (in place).
RowWriter = Callable[[pb.Forecast, int, float], None]


class Encoder(Protocol):
    """A task's aaren.v1 encoder (module docstring)."""

    def __init__(self, description: ModelDescription, default_top_k: int) -> None: ...

    def rows(self, outputs: OutputColumns, k: int) -> RowWriter: ...

    def columns(self, block: pb.ForecastColumns, outputs: OutputColumns, k: int, last_times: list[float]) -> None: ...


class TaskEncoder:
    """The constructor the tasks' encoders share: each keeps its model's ``description`` (the
    quantile levels, the class names it writes) and the server's ``default_top_k``."""

    def __init__(self, description: ModelDescription, default_top_k: int) -> None:
        self.description = description
        self.default_top_k = default_top_k
