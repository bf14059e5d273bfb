"""The rows of a table file: CSV (plain, ``.gz``, ``.xz``, or the one CSV inside a ``.zip``) or Parquet.

``read_rows`` gives the header and an iterator of ``(where, cells)``: ``where`` names the row for
messages (``line 7`` in a CSV, counting the header as line 1; ``row 6`` in Parquet, from 0). CSV
cells are text; Parquet cells are Python values, timestamps and dates as ``Instant``. Reading
Parquet needs pyarrow, imported only then.
"""

from __future__ import annotations

import csv
import gzip
import io
import lzma
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from aaren.formats.errors import DataError
from aaren.formats.times import Instant, epoch_seconds

__all__ = ["CSV_SUFFIXES", "PARQUET_SUFFIXES", "Rows", "open_text", "read_rows"]

CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.xz")
PARQUET_SUFFIXES = (".parquet", ".pq")
#: What a damaged compressed file raises while it is read (``gzip.BadGzipFile`` is an ``OSError``).
_BAD_STREAM = (OSError, EOFError, lzma.LZMAError)
#: ``(where, cells)`` per row.
Rows = Iterator[tuple[str, list[Any]]]


def open_text(path: Path) -> TextIO:
    """A text stream of a CSV file, a gzipped or xz-compressed one, or the single CSV inside a zip."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    name = path.name.lower()
    if name.endswith(".zip"):
        archive = zipfile.ZipFile(path)
        members = [m for m in archive.namelist() if m.lower().endswith(".csv")]
        if len(members) != 1:
            archive.close()
            raise DataError(f"{path}: holds CSV members {members}; expected exactly one")
        return io.TextIOWrapper(archive.open(members[0]), encoding="utf-8-sig", newline="")
    if name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    if name.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


def read_rows(path: Path, expected_header: str) -> tuple[list[str], Rows]:
    """The header of ``path`` (``.csv``, ``.csv.gz``, ``.csv.xz``, ``.parquet``, ``.pq``) and its rows.

    ``expected_header`` describes the columns for the message about an empty file. Duplicate column
    names, a CSV row with the wrong number of fields and unreadable bytes are ``DataError``s.
    """
    name = path.name.lower()
    if not name.endswith((*PARQUET_SUFFIXES, *CSV_SUFFIXES)):
        raise DataError(f"{path}: unsupported file type; expected .csv, .csv.gz, .csv.xz, .parquet or .pq")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if name.endswith(PARQUET_SUFFIXES):
        columns, rows = _parquet_rows(path)
    else:
        columns, rows = _csv_rows(path, expected_header)
    if len(set(columns)) != len(columns):
        raise DataError(f"{path}: duplicate column names {columns}")
    return columns, rows


def _csv_rows(path: Path, expected_header: str) -> tuple[list[str], Rows]:
    f = open_text(path)
    reader = csv.reader(f)
    try:
        header = next(reader, None)
    except (csv.Error, UnicodeDecodeError, *_BAD_STREAM) as e:
        f.close()
        raise DataError(f"{path}: line 1: not readable as CSV ({e})") from None
    if header is None:
        f.close()
        raise DataError(f"{path}: empty file; expected a header line {expected_header}")
    header = [h.strip() for h in header]

    def rows() -> Rows:
        with f:
            line = 1
            try:
                for row in reader:
                    line = reader.line_num
                    if not row or (len(row) == 1 and not row[0].strip()):
                        continue
                    if len(row) != len(header):
                        raise DataError(
                            f"{path}: line {line} has {len(row)} fields; expected {len(header)} ({', '.join(header)})"
                        )
                    yield f"line {line}", row
            except (csv.Error, UnicodeDecodeError, *_BAD_STREAM) as e:
                raise DataError(f"{path}: after line {line}: not readable as CSV ({e})") from None

    return header, rows()


def _parquet_rows(path: Path) -> tuple[list[str], Rows]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow; install it with `pip install pyarrow`") from None
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    columns = list(table.column_names)
    data = []
    for c in columns:
        col = table.column(c)
        if pa.types.is_timestamp(col.type):
            # Integer ticks since the epoch in UTC, whatever the column's time zone.
            per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[col.type.unit]
            data.append([None if x is None else Instant(x / per_second) for x in col.cast(pa.int64()).to_pylist()])
        elif pa.types.is_date(col.type):
            data.append([None if x is None else Instant(epoch_seconds(x)) for x in col.to_pylist()])
        else:
            data.append(col.to_pylist())

    def rows() -> Rows:
        for i, row in enumerate(zip(*data, strict=True)):
            yield f"row {i}", list(row)

    return columns, rows()
