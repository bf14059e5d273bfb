"""One session's events in time order: ``EventSequence``.

``times [n]`` (float64, non-decreasing), ``marks [n]`` (int64 ids into ``EventSchema.mark_names``),
``values [n, V]`` (float32, raw) and ``context``, how many leading events are history only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from aaren.formats.errors import DataError

__all__ = ["EventSequence"]


@dataclasses.dataclass(frozen=True, eq=False)
class EventSequence:
    """One session's events in time order.

    ``times [n]`` float64 non-decreasing, ``marks [n]`` int64 ids (>= 0), ``values [n, V]`` float32
    raw (not standardized). Inputs are converted to these dtypes and checked on construction.
    ``context``: how many leading events are history only: the model reads them (its state
    includes them) but scoring and training predict only events ``j >= max(context, 1)``. A split
    by event time (``split_at_times``) gives a held-out part its earlier events as context.
    """

    session_id: str
    times: np.ndarray
    marks: np.ndarray
    values: np.ndarray
    context: int = 0

    def __post_init__(self) -> None:
        times = np.ascontiguousarray(self.times, dtype=np.float64)
        marks = np.ascontiguousarray(self.marks, dtype=np.int64)
        values = np.ascontiguousarray(self.values, dtype=np.float32)
        n = times.shape[0] if times.ndim == 1 else -1
        if times.ndim != 1 or marks.shape != (n,) or values.ndim != 2 or values.shape[0] != n:
            raise DataError(
                f"session {self.session_id!r}: times {times.shape}, marks {marks.shape}, values {values.shape}; "
                "expected [n], [n] and [n, V]"
            )
        if not np.isfinite(times).all():
            raise DataError(f"session {self.session_id!r}: times must be finite")
        if n > 1 and (np.diff(times) < 0).any():
            k = int(np.argmax(np.diff(times) < 0)) + 1
            raise DataError(
                f"session {self.session_id!r}: event {k} at time {times[k]} comes before event {k - 1} at "
                f"{times[k - 1]}; expected non-decreasing times"
            )
        if n and marks.min() < 0:
            raise DataError(f"session {self.session_id!r}: negative mark id {int(marks.min())}; expected ids >= 0")
        if not np.isfinite(values).all():
            raise DataError(f"session {self.session_id!r}: values must be finite")
        if not 0 <= self.context <= n:
            raise DataError(f"session {self.session_id!r}: context {self.context}; expected 0 <= context <= {n}")
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "marks", marks)
        object.__setattr__(self, "values", values)

    def __len__(self) -> int:
        return int(self.times.shape[0])

    @property
    def predicted(self) -> int:
        """How many of its events are predicted (scored): all but the first and the context."""
        return max(0, len(self) - max(self.context, 1))
