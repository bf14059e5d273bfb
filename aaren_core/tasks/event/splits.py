"""How event data is split into train / validation / test, and the split data set.

Two ways (``SPLIT_METHODS``): by event time (``split_at_times``: every session cut at two times,
each held-out part with the session's earlier events as context) or by session (``split_by_time``:
whole sessions by their first event). ``split_cutoffs`` picks the two times from event-time
quantiles, ``choose_split`` picks the way for a file; ``DataSplit`` records what was done and
``EventData`` holds the parts with their schema.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from aaren.formats.errors import DataError
from aaren_core.tasks.event.schema import EventSchema
from aaren_core.tasks.event.sequences import EventSequence

__all__ = [
    "SPLIT_METHODS",
    "DataSplit",
    "EventData",
    "choose_split",
    "split_at_times",
    "split_by_time",
    "split_cutoffs",
]

#: How a data set is split: ``time`` (``split_at_times``), ``sessions`` (whole sessions by first event).
SPLIT_METHODS = ("time", "sessions")


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
