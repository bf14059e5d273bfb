"""Files of events: one row per event, columns ``session_id, time, mark`` and one per value.

``read_event_rows`` reads a CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``) file
into checked columns (``EventRows``, file order); training (``aaren_core.tasks.event.files``) and
the client (``aaren.client.events_file``) both read through it. What a file must hold
(``EventLayout``):

- ``session_id``: a non-empty id (a series file may leave the column out: one session, named after
  the file).
- ``time``: numbers, already in the time unit; or ISO-8601 datetimes (Parquet timestamps and dates
  too), converted to the unit since the Unix epoch (naive ones read as UTC); one kind per file.
  Within a session, times must not decrease in file order.
- ``mark``: a name or an integer id of the model's marks (``aaren.formats.marks.mark_reader``), or,
  to train, the file's own marks (``learn_marks``); series and class files may leave it out (mark 0).
- value columns: the model's ``value_names`` exactly (any order; or chosen by name), finite numbers
  (with ``EventLayout.missing_values``, a missing cell reads as NaN).
- ``context`` (optional, as ``aaren split export`` writes it): 1 (or ``true``) for a session's
  history rows, which must come before its other rows, 0 for held-out rows. A model value named
  ``context`` makes it a value column instead.
- ``label`` (class files, optional): the session's true class, one of the model's class names (to
  train, ``learn_labels``: any non-empty name).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aaren.formats.errors import DataError
from aaren.formats.marks import learn_marks, mark_reader, mark_text
from aaren.formats.tables import read_rows
from aaren.formats.times import time_reader

__all__ = [
    "CONTEXT_COLUMN",
    "LABEL_COLUMN",
    "MISSING",
    "REQUIRED_COLUMNS",
    "EventLayout",
    "EventRows",
    "read_event_rows",
]

REQUIRED_COLUMNS = ("session_id", "time", "mark")
#: 1 for a context (history only) row, 0 for a held-out one.
CONTEXT_COLUMN = "context"
#: Class files: the sequence's true class.
LABEL_COLUMN = "label"
#: Cells that mean "no value".
MISSING = ("", "NA", "NaN", "nan")


@dataclasses.dataclass(frozen=True)
class EventLayout:
    """What ``read_event_rows`` expects of a file.

    ``time_unit``: the unit times are read in (one of ``TIME_UNITS``; any other: numbers only).
    ``value_names``: the value columns (None: every column but session_id, time, mark and context);
    with ``select_values`` they are picked from the file, else the file's other columns must be
    exactly these. Marks: the model's ``mark_names`` / ``num_marks``, or ``learn_marks`` from the
    file. ``mark_optional`` / ``session_optional``: the column may be left out. ``class_names``
    (not None): a ``label`` column may name one of them per session; ``learn_labels``: a ``label``
    column may name any class (a train file's own classes), one per session.
    """

    time_unit: str = ""
    value_names: tuple[str, ...] | None = None
    select_values: bool = False
    mark_names: tuple[str, ...] = ()
    num_marks: int = 0
    learn_marks: bool = False
    mark_optional: bool = False
    session_optional: bool = False
    class_names: tuple[str, ...] | None = None
    learn_labels: bool = False
    #: A missing value cell (empty, ``NA``, ``NaN``, a null or NaN) reads as NaN rather than being
    #: refused (a series file's gaps: the server fills them); +-inf is still refused.
    missing_values: bool = False


@dataclasses.dataclass(frozen=True, eq=False)
class EventRows:
    """A file's events in file order, one entry per row: ``where[i]`` names row ``i`` for messages,
    ``values[i]`` holds one float per ``value_names``, ``context[i]`` is True for a history row.
    ``mark_names`` names the ids (the model's, or those learned); ``labels``: session -> class name."""

    path: Path
    where: list[str]
    session_ids: list[str]
    times: list[float]
    marks: list[int]
    values: list[list[float]]
    context: list[bool]
    mark_names: tuple[str, ...]
    value_names: tuple[str, ...]
    labels: dict[str, str]

    def __len__(self) -> int:
        return len(self.times)


def read_event_rows(path: Path | str, layout: EventLayout) -> EventRows:
    """Read and check an events file (module docstring); every rejection is a ``DataError`` naming
    the file, the line (CSV, the header is line 1) or row (Parquet, from 0), and what was expected."""
    path = Path(path)
    columns, rows = read_rows(path, "session_id,time,mark[,values...]")
    optional = {"mark"} if layout.mark_optional else set()
    if layout.session_optional:
        optional.add("session_id")
    required = [c for c in REQUIRED_COLUMNS if c not in optional]
    value_names = _value_columns(path, columns, layout, required)
    i_sid, i_time, i_mark = (columns.index(c) if c in columns else -1 for c in REQUIRED_COLUMNS)
    i_values = [columns.index(v) for v in value_names]
    i_context = columns.index(CONTEXT_COLUMN) if _has_context(columns, value_names) else -1
    i_label = columns.index(LABEL_COLUMN) if _has_label(columns, layout, value_names) else -1
    class_names = layout.class_names or ()
    default_session = path.name.split(".")[0]
    read_time = time_reader(layout.time_unit)
    read_mark = mark_reader(layout.mark_names, layout.num_marks)

    out = EventRows(path, [], [], [], [], [], [], layout.mark_names, value_names, {})
    mark_texts: list[str] = []
    held_out: set[str] = set()  # sessions that have had a held-out row
    last: dict[str, int] = {}  # session -> its last row
    time_kind: tuple[str, str] | None = None  # (kind, where it was first seen)
    for where, row in rows:
        cell = default_session if i_sid < 0 else row[i_sid]
        sid = "" if cell is None else str(cell).strip()
        if not sid:
            raise DataError(f"{path}: {where}: empty session_id; expected a non-empty id")
        try:
            t, kind = read_time(row[i_time])
            if i_mark < 0:
                mark = 0
            elif layout.learn_marks:
                mark_texts.append(mark_text(row[i_mark]))
                mark = -1  # the ids come from all of the file's marks, once they are read
            else:
                mark = read_mark(row[i_mark])
            values = [_number(row[k], columns[k], layout.missing_values) for k in i_values]
        except ValueError as e:
            raise DataError(f"{path}: {where}: {e}") from None
        if i_label >= 0:
            _check_label(row[i_label], sid, None if layout.learn_labels else class_names, out.labels, path, where)
        if time_kind is None:
            time_kind = (kind, where)
        elif kind != time_kind[0]:
            raise DataError(
                f"{path}: {where}: time {row[i_time]!r} is a {kind} but {time_kind[1]} has a {time_kind[0]}; "
                "expected all times of one kind"
            )
        prev = last.get(sid)
        if prev is not None and t < out.times[prev]:
            raise DataError(
                f"{path}: {where}: session {sid!r} has time {t} after {out.times[prev]} at {out.where[prev]}; "
                "expected non-decreasing times within a session (sort the file by time)"
            )
        context = i_context >= 0 and _context_flag(row[i_context], path, where)
        if context and sid in held_out:
            raise DataError(
                f"{path}: {where}: session {sid!r} has a context row after a held-out row; "
                "expected each session's context (history) rows first"
            )
        if not context:
            held_out.add(sid)
        last[sid] = len(out.times)
        out.where.append(where)
        out.session_ids.append(sid)
        out.times.append(t)
        out.marks.append(mark)
        out.values.append(values)
        out.context.append(context)
    if not out.times:
        raise DataError(f"{path}: no events; expected at least one row after the header")
    if layout.learn_marks and i_mark >= 0:
        ids, names = learn_marks(mark_texts, lambda i: f"{path}: {out.where[i]}")
        out.marks[:] = ids
        return dataclasses.replace(out, mark_names=names)
    return out


def _has_context(columns: Sequence[str], value_names: Sequence[str]) -> bool:
    return CONTEXT_COLUMN in columns and CONTEXT_COLUMN not in value_names


def _has_label(columns: Sequence[str], layout: EventLayout, value_names: Sequence[str]) -> bool:
    wanted = layout.class_names is not None or layout.learn_labels
    return wanted and LABEL_COLUMN in columns and LABEL_COLUMN not in value_names


def _value_columns(path: Path, columns: list[str], layout: EventLayout, required: list[str]) -> tuple[str, ...]:
    """The value columns of the file, in ``layout.value_names`` order (else in file order)."""
    expected = layout.value_names
    missing = [c for c in required if c not in columns]
    if missing:
        shown = ", ".join([*required, *(expected or ["values..."])])
        raise DataError(f"{path}: missing required column(s) {missing}; expected columns {shown}, found {columns}")
    if expected is not None and layout.select_values:
        absent = [c for c in expected if c not in columns]
        if absent:
            raise DataError(f"{path}: value column(s) {absent} not in the file; found {columns}")
        return tuple(expected)
    names = expected or ()
    own = {*REQUIRED_COLUMNS}
    if _has_context(columns, names):
        own.add(CONTEXT_COLUMN)
    if _has_label(columns, layout, names):
        own.add(LABEL_COLUMN)
    file_values = [c for c in columns if c not in own]
    if expected is None:
        return tuple(file_values)
    if set(file_values) != set(expected):
        lacking = [c for c in expected if c not in file_values]
        extra = [c for c in file_values if c not in expected]
        detail = ", ".join([f"missing {lacking}"] * bool(lacking) + [f"unexpected {extra}"] * bool(extra))
        raise DataError(
            f"{path}: value columns {file_values} do not match the model's {list(expected)} ({detail}); "
            "expected one column per model value, named as the model names them"
        )
    return tuple(expected)


def _check_label(
    cell: Any, sid: str, class_names: Sequence[str] | None, labels: dict[str, str], path: Path, where: str
) -> None:
    """``class_names`` None: any non-empty label."""
    label = "" if cell is None else str(cell).strip()
    if class_names is None and not label:
        raise DataError(f"{path}: {where}: empty label; expected the sequence's class name")
    if class_names is not None and label not in class_names:
        raise DataError(
            f"{path}: {where}: label {label!r} is not a class of the model; expected one of {list(class_names)}"
        )
    if labels.setdefault(sid, label) != label:
        raise DataError(
            f"{path}: {where}: session {sid!r} has label {label!r} after {labels[sid]!r}; expected one "
            "label per sequence"
        )


def _context_flag(cell: Any, path: Path, where: str) -> bool:
    s = "" if cell is None else str(cell).strip().lower()
    if s in ("1", "true", "1.0"):
        return True
    if s in ("0", "false", "0.0"):
        return False
    raise DataError(f"{path}: {where}: column {CONTEXT_COLUMN!r} is {cell!r}; expected 1 (history) or 0")


def _number(cell: Any, column: str, missing_values: bool = False) -> float:
    try:
        v = float(cell)
    except (TypeError, ValueError):
        v = math.nan
    if v - v == 0.0 and cell is not True and cell is not False:  # finite: the common case, first
        return v
    if cell is None or (isinstance(cell, str) and cell.strip() in MISSING) or (isinstance(cell, float) and v != v):
        if missing_values:
            return math.nan
        raise ValueError(f"value column {column!r} is missing; expected a finite number")
    raise ValueError(f"value column {column!r} is {cell!r}; expected a finite number")
