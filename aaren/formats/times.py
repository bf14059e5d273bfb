"""Event times: numbers already in a time unit, or ISO-8601 datetimes converted to that unit.

A datetime becomes the unit's count since the Unix epoch (``TIME_UNITS`` gives seconds per unit);
a naive one is read as UTC. A Parquet timestamp or date arrives as an ``Instant`` (seconds since
the epoch, whatever the column's time zone).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable
from typing import Any

from aaren.formats.errors import DataError

__all__ = ["TIME_UNITS", "Instant", "epoch_seconds", "iso_utc", "parse_time", "time_reader"]

#: Seconds per unit; ISO datetimes are converted to this unit since the Unix epoch.
TIME_UNITS: dict[str, float] = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}


@dataclasses.dataclass(frozen=True, slots=True)
class Instant:
    """A point in time read from a typed column (a Parquet timestamp or date): seconds since the epoch."""

    seconds: float


def epoch_seconds(stamp: dt.datetime | dt.date) -> float:
    """Seconds since the Unix epoch; a naive datetime (or a date, at midnight) is read as UTC."""
    if not isinstance(stamp, dt.datetime):
        stamp = dt.datetime(stamp.year, stamp.month, stamp.day)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


def time_reader(unit: str) -> Callable[[Any], tuple[float, str]]:
    """A reader of one time cell: ``cell -> (time, kind)``, ``kind`` ``"number"`` or ``"datetime"``.

    Numbers pass through as they are (already in ``unit``); datetimes (ISO-8601 text or an
    ``Instant``) become ``unit`` since the epoch. With a ``unit`` not in ``TIME_UNITS`` (unknown, or
    a unit of steps) numbers still pass and a datetime is refused. Raises ``ValueError`` saying what
    the cell was and what was expected; the caller adds where it was.
    """
    per_unit = TIME_UNITS.get(unit)

    def in_unit(seconds: float, shown: Any) -> float:
        if per_unit is None:
            raise ValueError(
                f"time {shown!r} is a datetime but the time unit is unknown; give one ({', '.join(TIME_UNITS)}; "
                "`aaren replay --time-unit`) or write times as numbers"
            )
        return seconds / per_unit

    def read(cell: Any) -> tuple[float, str]:
        if isinstance(cell, Instant):
            return in_unit(cell.seconds, cell), "datetime"
        if isinstance(cell, int | float) and not isinstance(cell, bool):
            t, kind = float(cell), "number"
        else:
            s = "" if cell is None else str(cell).strip()
            if not s:
                raise ValueError("empty time; expected a number or an ISO-8601 datetime")
            try:
                t, kind = float(s), "number"
            except ValueError:
                try:
                    stamp = dt.datetime.fromisoformat(s)
                except ValueError:
                    raise ValueError(f"time {s!r} is neither a number nor an ISO-8601 datetime") from None
                t, kind = in_unit(epoch_seconds(stamp), s), "datetime"
        if not math.isfinite(t):
            raise ValueError(f"time {cell!r} is not finite; expected a finite number or an ISO-8601 datetime")
        return t, kind

    return read


def parse_time(text: str, time_unit: str) -> float:
    """A time given as text (a number in ``time_unit``, or an ISO-8601 datetime), as the events
    readers read the ``time`` column; ``DataError`` if it is neither or not finite."""
    try:
        return time_reader(time_unit)(text)[0]
    except ValueError as e:
        raise DataError(str(e)) from None


def iso_utc(seconds: float) -> str:
    """Seconds since the epoch as an ISO-8601 UTC time, ``2020-01-01T00:00:00Z`` (fractions only
    when there are any); ``parse_time`` reads it back."""
    stamp = dt.datetime.fromtimestamp(seconds, dt.UTC)
    return stamp.isoformat(timespec="microseconds" if stamp.microsecond else "seconds").replace("+00:00", "Z")
