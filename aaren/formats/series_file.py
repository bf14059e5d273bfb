"""A series from a table file: a time column and numeric channels, put on its regular step grid.

The file is a CSV (plain, ``.gz``, ``.xz``) or Parquet (``aaren.formats.tables.read_rows``) with a
time column (ISO-8601 datetimes or Unix seconds, ``aaren.formats.times``) and one column per
channel. Rows may come in any order (they are sorted); NA cells (empty, ``NA``, ``NaN``, ``null``,
``?``...) are missing values. The grid (the one rule of ``SERIES_PROTOCOL``): step ``D`` seconds
(given, or the most common gap between consecutive times), ``t_i = t_0 + i D`` for ``i < T`` up to
the last row's time; a row exists at step ``i`` when ``real[i]``. Every time must lie on the grid
(within 1 ms).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aaren.formats.errors import DataError
from aaren.formats.tables import read_rows
from aaren.formats.times import iso_utc, time_reader

__all__ = ["NA_CELLS", "SeriesFile", "read_series_file"]

#: Cell texts read as a missing value (case-insensitive, after stripping).
NA_CELLS = frozenset({"", "na", "nan", "n/a", "null", "none", "?", "-nan"})
#: How far (seconds) a time may lie from its grid step, as the server allows.
GRID_TOLERANCE = 1e-3
#: Most grid steps a file may span (a step far too small for the times would need more memory).
MAX_STEPS = 50_000_000


@dataclasses.dataclass(frozen=True)
class SeriesFile:
    """A series on its grid: ``times [T]`` float64 seconds (``t_0 + i step``), ``values [T, C]``
    float64 raw with NaN where missing (NA cells, and every channel of a step with no row),
    ``real [T]`` bool (a row exists), ``channels`` the column names, ``step`` seconds, ``rows``
    the file's row count."""

    path: str
    times: np.ndarray
    values: np.ndarray
    real: np.ndarray
    channels: tuple[str, ...]
    step: float
    rows: int


def _number(cell: Any) -> float | None:
    """A channel cell as a float (NaN for NA), or None when it is not a number."""
    if cell is None:
        return math.nan
    if isinstance(cell, bool):
        return None
    if isinstance(cell, int | float):
        return float(cell)
    text = str(cell).strip()
    if text.lower() in NA_CELLS:
        return math.nan
    try:
        return float(text)
    except ValueError:
        return None


def read_series_file(
    path: str | Path, time_column: str = "time", channels: Sequence[str] = (), step_seconds: float = 0.0
) -> SeriesFile:
    """Read ``path`` into a ``SeriesFile`` (module docstring).

    ``channels``: the columns to read (default: every column but the time; then a column of text
    is an error saying to leave it out with ``--channels``). ``step_seconds`` 0: the most common
    gap. Raises ``DataError`` naming the file and the row for a missing column, no rows, a bad
    time, a value that is not a number, a duplicate time, or a time off the grid.
    """
    path = Path(path)
    expected = f"of {time_column!r} and channel columns"
    header, rows = read_rows(path, expected)
    if time_column not in header:
        raise DataError(f"{path}: no time column {time_column!r} in {header}; name it with --time-column")
    if channels:
        missing = [c for c in channels if c not in header]
        if missing:
            raise DataError(f"{path}: no column {missing[0]!r} in {header}; expected --channels to name columns")
        if time_column in channels:
            raise DataError(f"{path}: {time_column!r} is the time column; leave it out of --channels")
        names = list(channels)
    else:
        names = [h for h in header if h != time_column]
        if not names:
            raise DataError(f"{path}: no channel columns beside {time_column!r}; expected at least one")
    t_at, c_at = header.index(time_column), [header.index(c) for c in names]
    read_time = time_reader("seconds")
    wheres: list[str] = []
    times: list[float] = []
    kinds: set[str] = set()
    cells: list[list[Any]] = [[] for _ in names]
    for where, row in rows:
        try:
            t, kind = read_time(row[t_at])
        except ValueError as e:
            raise DataError(f"{path}: {where}: column {time_column!r}: {e}") from None
        kinds.add(kind)
        wheres.append(where)
        times.append(t)
        for j, at in enumerate(c_at):
            cells[j].append(row[at])
    if not times:
        raise DataError(f"{path}: no rows; expected a header and rows {expected}")
    if len(kinds) > 1:
        raise DataError(f"{path}: column {time_column!r} mixes numbers and datetimes; expected one kind")
    values = np.empty((len(times), len(names)), dtype=np.float64)
    for j, (name, column) in enumerate(zip(names, cells, strict=True)):
        numbers = [_number(x) for x in column]
        bad = [i for i, x in enumerate(numbers) if x is None]
        if bad:
            i = bad[0]
            if not channels and len(bad) == sum(1 for x in numbers if x is None or not math.isnan(x)):
                raise DataError(
                    f"{path}: column {name!r} holds text ({str(column[i])[:20]!r} at {wheres[i]}); "
                    f"leave it out with --channels (the numeric columns)"
                )
            raise DataError(f"{path}: {wheres[i]}: column {name!r}: {str(column[i])[:20]!r} is not a number or NA")
        values[:, j] = numbers
    if np.isinf(values).any():
        i, j = np.argwhere(np.isinf(values))[0]
        raise DataError(f"{path}: {wheres[i]}: column {names[j]!r}: {values[i, j]} is not finite; expected a number")
    return _on_grid(path, np.asarray(times), values, wheres, tuple(names), step_seconds)


def _on_grid(
    path: Path, times: np.ndarray, values: np.ndarray, wheres: list[str], names: tuple[str, ...], step: float
) -> SeriesFile:
    order = np.argsort(times, kind="stable")
    times, values = times[order], values[order]
    gaps = np.diff(times)
    if gaps.size and (gaps == 0).any():
        i = int(np.flatnonzero(gaps == 0)[0])
        raise DataError(
            f"{path}: duplicate time {iso_utc(times[i])} ({wheres[order[i]]} and {wheres[order[i + 1]]}); "
            "expected one row per time"
        )
    if not step:
        if not gaps.size:
            raise DataError(f"{path}: one row; expected at least two to infer the step (or give step_seconds)")
        # Most common gap, read to the millisecond; ties go to the shorter.
        rounded, counts = np.unique(np.round(gaps, 3), return_counts=True)
        step = float(rounded[np.argmax(counts)])
    if step < 2 * GRID_TOLERANCE:
        raise DataError(f"{path}: a step of {step:g} s; expected at least {2 * GRID_TOLERANCE:g} s between times")
    steps = (times - times[0]) / step
    index = np.round(steps)
    off = np.abs(times - (times[0] + index * step)) > GRID_TOLERANCE
    if off.any():
        i = int(np.flatnonzero(off)[0])
        raise DataError(
            f"{path}: {wheres[order[i]]}: time {iso_utc(times[i])} is off the step grid (every {step:g} s from "
            f"{iso_utc(times[0])}); expected regular steps (set step_seconds if the step is not the most common gap)"
        )
    n = int(index[-1]) + 1
    if n > MAX_STEPS:
        raise DataError(f"{path}: {n:,} steps of {step:g} s; expected at most {MAX_STEPS:,} (is the step right?)")
    grid = np.full((n, len(names)), np.nan)
    real = np.zeros(n, dtype=bool)
    at = index.astype(np.int64)
    grid[at], real[at] = values, True
    return SeriesFile(str(path), times[0] + step * np.arange(n), grid, real, names, step, len(times))
