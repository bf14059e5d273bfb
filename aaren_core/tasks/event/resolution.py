"""The grid event times were recorded on, and the jitter that undoes it.

``time_resolution`` derives the recording resolution from the gaps between a session's events;
``dequantize`` spreads tied times uniformly inside their recording interval (training's jitter).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from aaren.formats.errors import DataError
from aaren.formats.times import TIME_UNITS
from aaren_core.tasks.event.sequences import EventSequence

__all__ = ["GRID_TOLERANCE", "ON_GRID", "RESOLUTION_LADDER_S", "TimeResolution", "dequantize", "time_resolution"]

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
