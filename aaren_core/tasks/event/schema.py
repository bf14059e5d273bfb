"""What the ids and columns of event data mean, and how values are standardized: ``EventSchema``.

A checkpoint stores the schema, so that inference maps marks and scales values exactly as training
did. The value statistics are fitted on training data only (``fit_standardization``):
``z = (v - mean) / std`` per value column, std floored at ``STD_FLOOR``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from aaren.formats.errors import DataError
from aaren.formats.marks import preview
from aaren.formats.times import TIME_UNITS

if TYPE_CHECKING:
    from aaren_core.tasks.event.sequences import EventSequence

__all__ = ["STD_FLOOR", "EventSchema", "fit_standardization", "moments"]

STD_FLOOR = 1e-6


@dataclasses.dataclass(frozen=True)
class EventSchema:
    """What the ids and columns of event data mean, and how values are standardized.

    ``mark_names[i]`` is the name of mark id ``i``; ``value_names`` are the value columns in order;
    ``value_mean`` and ``value_std`` (one per value column, fitted on training data) standardize
    values as ``(v - mean) / std``.
    """

    mark_names: tuple[str, ...]
    value_names: tuple[str, ...]
    time_unit: str
    value_mean: tuple[float, ...]
    value_std: tuple[float, ...]

    def __post_init__(self) -> None:
        # Coerce lists (from JSON) to tuples so schemas compare and hash by content.
        object.__setattr__(self, "mark_names", tuple(str(m) for m in self.mark_names))
        object.__setattr__(self, "value_names", tuple(str(v) for v in self.value_names))
        object.__setattr__(self, "value_mean", tuple(float(x) for x in self.value_mean))
        object.__setattr__(self, "value_std", tuple(float(x) for x in self.value_std))
        if not self.mark_names:
            raise DataError("schema: mark_names is empty; expected at least one mark")
        if len(set(self.mark_names)) != len(self.mark_names):
            raise DataError(f"schema: mark_names has duplicates: {list(self.mark_names)}")
        if len(set(self.value_names)) != len(self.value_names):
            raise DataError(f"schema: value_names has duplicates: {list(self.value_names)}")
        if self.time_unit not in TIME_UNITS:
            raise DataError(f"schema: unknown time_unit {self.time_unit!r}; expected one of {sorted(TIME_UNITS)}")
        v = len(self.value_names)
        if len(self.value_mean) != v or len(self.value_std) != v:
            raise DataError(
                f"schema: value_mean has {len(self.value_mean)} and value_std {len(self.value_std)} entries; "
                f"expected {v}, one per value column {list(self.value_names)}"
            )
        if not all(math.isfinite(m) for m in self.value_mean):
            raise DataError(f"schema: value_mean must be finite, got {list(self.value_mean)}")
        if not all(math.isfinite(s) and s > 0 for s in self.value_std):
            raise DataError(f"schema: value_std must be finite and > 0, got {list(self.value_std)}")

    @property
    def num_marks(self) -> int:
        return len(self.mark_names)

    @property
    def value_width(self) -> int:
        return len(self.value_names)

    @cached_property
    def _mark_ids(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.mark_names)}

    def mark_id(self, name: str) -> int:
        """The id of mark ``name``; ``DataError`` if the schema has no such mark."""
        try:
            return self._mark_ids[name]
        except KeyError:
            raise DataError(f"unknown mark {name!r}; expected one of {preview(self.mark_names)}") from None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``from_dict`` inverts it (``num_marks``/``value_width`` are informative)."""
        return {
            "mark_names": list(self.mark_names),
            "value_names": list(self.value_names),
            "time_unit": self.time_unit,
            "value_mean": list(self.value_mean),
            "value_std": list(self.value_std),
            "num_marks": self.num_marks,
            "value_width": self.value_width,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EventSchema:
        """Rebuild a schema from ``to_dict`` output; ``DataError`` on missing or inconsistent keys."""
        keys = ("mark_names", "value_names", "time_unit", "value_mean", "value_std")
        missing = [k for k in keys if k not in d]
        if missing:
            raise DataError(f"schema dict: missing keys {missing}; expected {list(keys)}, found {sorted(d)}")
        schema = cls(**{k: d[k] for k in keys})
        for key in ("num_marks", "value_width"):
            if key in d and d[key] != getattr(schema, key):
                raise DataError(f"schema dict: {key} is {d[key]} but the names give {getattr(schema, key)}")
        return schema

    def standardize(self, values: np.ndarray) -> np.ndarray:
        """``(values - mean) / std`` as float32; ``values [..., V]``."""
        mean, std = self._stats(values)
        return ((np.asarray(values, dtype=np.float64) - mean) / std).astype(np.float32)

    def unstandardize(self, values: np.ndarray) -> np.ndarray:
        """``values * std + mean`` as float32, the inverse of ``standardize``; ``values [..., V]``."""
        mean, std = self._stats(values)
        return (np.asarray(values, dtype=np.float64) * std + mean).astype(np.float32)

    def _stats(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        shape = np.shape(values)
        if not shape or shape[-1] != self.value_width:
            raise DataError(f"values have shape {shape}; expected [..., {self.value_width}] ({list(self.value_names)})")
        return np.asarray(self.value_mean, dtype=np.float64), np.asarray(self.value_std, dtype=np.float64)


def moments(values: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-column mean and std (ddof 0, floored at ``STD_FLOOR``) of ``values [n, V]``, in float64."""
    v = np.asarray(values, dtype=np.float64)
    mean = v.mean(axis=0)
    std = np.maximum(v.std(axis=0), STD_FLOOR)
    return tuple(float(x) for x in mean), tuple(float(x) for x in std)


def fit_standardization(sequences: Sequence[EventSequence], schema: EventSchema) -> EventSchema:
    """``schema`` with ``value_mean``/``value_std`` refitted on all events of ``sequences`` (std floor 1e-6).

    Use it on the training split of ``load_events`` data so no statistic comes from later data.
    """
    width = schema.value_width
    chunks = [s.values for s in sequences if len(s)]
    if not chunks:
        return dataclasses.replace(schema, value_mean=(0.0,) * width, value_std=(1.0,) * width)
    for s in sequences:
        if s.values.shape[1] != width:
            raise DataError(f"session {s.session_id!r}: {s.values.shape[1]} value columns; expected {width}")
    mean, std = moments(np.concatenate(chunks, axis=0))
    return dataclasses.replace(schema, value_mean=mean, value_std=std)
