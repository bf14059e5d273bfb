"""What a task's aaren.v1 encoder is (torch-free): output columns -> ``aaren.v1`` reply protos.

The aaren.v1 front end writes what every forecast has (session id, seq, last time, model) and
leaves the task's part to the encoder of the model's task (``aaren.server.tasks.registry``), one
per served model, built once with ``(description, default_top_k)``:

- ``rows(outputs, k)``: a writer ``write(forecast, f, last_time)`` of forecast ``f`` (row ``f`` of the
  output columns) into one ``pb.Forecast`` (RESPONSE_LAYOUT_ROWS and the unary ``Forecast``);
- ``columns(block, outputs, k, last_times)``: every forecast into one ``pb.ForecastColumns``
  (RESPONSE_LAYOUT_COLUMNS: one packed ``extend`` per column);
- optionally ``wire(outputs, k, last_times)``: each forecast's task part as ``pb.Forecast`` wire
  bytes (``list[bytes]``, ``F`` of them), what ``rows`` writes, for the stream's replies in rows
  layout, which are assembled as bytes and parsed once per reply (no message object per event).
  ``wire_rows(encoder)`` gives an encoder's own ``wire`` or one built on its ``rows`` writer.

``k`` is the request's top_k already cut to ``ModelDescription.ranked``; ``outputs`` are the
task's typed outputs (``Outcomes.outputs``: an instance of the task's ``OutputColumns`` class).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from aaren.server.contract.columns import ModelDescription, OutputColumns
from aaren.v1 import aaren_pb2 as pb

__all__ = ["Encoder", "RowWriter", "TaskEncoder", "WireRows", "wire_rows"]

#: ``write(forecast, f, last_time)``: forecast ``f``'s task part into ``forecast`` (in place).
RowWriter = Callable[[pb.Forecast, int, float], None]
#: ``wire(outputs, k, last_times)``: each forecast's task part as ``pb.Forecast`` wire bytes.
WireRows = Callable[[OutputColumns, int, Sequence[float]], list[bytes]]


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


def wire_rows(encoder: Encoder) -> WireRows:
    """``encoder``'s ``wire`` method, or (an encoder without one) its ``rows`` writer run into one
    ``pb.Forecast`` per forecast, serialized."""
    own = getattr(encoder, "wire", None)
    if own is not None:
        return own  # type: ignore[no-any-return]

    def wire(outputs: OutputColumns, k: int, last_times: Sequence[float]) -> list[bytes]:
        write = encoder.rows(outputs, k)
        out = []
        for f, last_time in enumerate(last_times):
            forecast = pb.Forecast()
            write(forecast, f, last_time)
            out.append(forecast.SerializeToString())
        return out

    return wire
