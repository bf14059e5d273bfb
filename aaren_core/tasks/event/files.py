"""Event sequences from and to events files (CSV or Parquet, ``aaren.formats.events``).

``load_events`` reads a file into one ``EventSequence`` per session and the ``EventSchema`` of its
marks and values; ``write_events`` writes a part of a split back as a file that ``load_events`` and
``aaren replay`` read, each session's context rows marked.
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from aaren.formats.errors import DataError
from aaren.formats.events import CONTEXT_COLUMN, REQUIRED_COLUMNS, EventLayout, read_event_rows
from aaren.formats.times import TIME_UNITS
from aaren_core.tasks.event.schema import EventSchema, moments
from aaren_core.tasks.event.sequences import EventSequence

__all__ = ["load_events", "write_events"]


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
      With ``schema`` (inference) a mark is one of its names or an id below ``schema.num_marks``;
      anything else is an error.
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
    values = None if value_columns is None else tuple(value_columns)
    if values is not None:
        bad = [c for c in values if c in REQUIRED_COLUMNS]
        if bad or len(set(values)) != len(values):
            raise DataError(f"{path}: value_columns {list(values)} must be distinct and not {list(REQUIRED_COLUMNS)}")
        if schema is not None and set(values) != set(schema.value_names):
            raise DataError(
                f"{path}: value_columns {list(values)} are not the schema's value columns {list(schema.value_names)}"
            )
    layout = EventLayout(
        time_unit=time_unit,
        value_names=schema.value_names if schema is not None else values,
        select_values=values is not None,
        mark_names=schema.mark_names if schema is not None else (),
        learn_marks=schema is None,
    )
    rows = read_event_rows(path, layout)
    times = np.asarray(rows.times, dtype=np.float64)
    marks = np.asarray(rows.marks, dtype=np.int64)
    values_of = np.asarray(rows.values, dtype=np.float64).reshape(len(rows), len(rows.value_names))
    rows_of: dict[str, list[int]] = {}
    for i, s in enumerate(rows.session_ids):
        rows_of.setdefault(s, []).append(i)
    sequences = [
        EventSequence(
            session_id=s,
            times=times[index],
            marks=marks[index],
            values=values_of[index],
            context=sum(rows.context[i] for i in index),  # the reader checked they lead
        )
        for s, index in rows_of.items()
    ]
    if schema is None:
        mean, std = moments(values_of)
        schema = EventSchema(rows.mark_names, rows.value_names, time_unit, mean, std)
    return sequences, schema


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
