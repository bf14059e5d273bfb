"""A reader for the sktime / UEA ``.ts`` time-series classification format.

A file is a header of ``@key value`` lines (``#`` lines are comments), then ``@data`` and one line
per instance::

    @problemName JapaneseVowels
    @univariate false
    @dimensions 12
    @equalLength false
    @classLabel true 1 2 3 4 5 6 7 8 9
    @data
    1.86,1.89,1.93:-0.20,-0.19,-0.23:...:3

Dimensions (channels) are separated by ``:``, the values of one dimension by ``,``; with
``@classLabel true`` the last field is the instance's label. ``?`` is a missing value (NaN).
Instances may differ in length (``@equalLength false``); the dimensions of one instance may not.

With ``@timeStamps true`` each value is written ``(t,v)``: ``t`` a number or an ISO-8601 datetime
(one kind per instance), ``v`` a number or ``?``. An instance's steps are the union of its
dimensions' stamps in increasing order; a dimension without a value at a stamp is NaN there (as
sktime aligns them). The stamps only order the steps: ``TSFile`` keeps the values.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from aaren.formats.errors import DataError
from aaren.formats.times import time_reader

__all__ = ["TSFile", "parse_ts"]


@dataclasses.dataclass(frozen=True)
class TSFile:
    """A parsed ``.ts`` file: ``series[i]`` is instance ``i`` as ``[n_i, C]`` float32 (NaN where
    missing), ``labels[i]`` its label as written, ``class_names`` the header's declared labels."""

    problem_name: str
    series: list[np.ndarray]
    labels: list[str]
    class_names: tuple[str, ...]

    @property
    def n_channels(self) -> int:
        return self.series[0].shape[1] if self.series else 0


def _bool(value: str, key: str, where: str) -> bool:
    low = value.strip().lower()
    if low not in ("true", "false"):
        raise DataError(f"{where}: @{key} must be true or false; got {value!r}")
    return low == "true"


def parse_ts(text: str, source: str = "<ts>") -> TSFile:
    """Parse the text of a ``.ts`` file; ``source`` names it in error messages.

    Raises ``DataError`` saying the line and what was expected for a malformed header, a line
    whose dimension count differs from ``@dimensions``, dimensions of unequal length, a value that
    is not a number or ``?``, or a label the header does not declare.
    """
    header: dict[str, str] = {}
    lines = text.splitlines()
    start = None
    for i, raw in enumerate(lines):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not line.startswith("@"):
            raise DataError(
                f"{source}:{i + 1}: expected a @key header line or @data before the data; got {line[:40]!r}"
            )
        key, _, value = line[1:].partition(" ")
        key = key.lower()
        if key == "data":
            start = i + 1
            break
        header[key] = value.strip()
    if start is None:
        raise DataError(f"{source}: no @data line; expected a .ts header ending in @data")
    stamped = _bool(header.get("timestamps", "false"), "timeStamps", source)
    labelled = header.get("classlabel", "false").split()
    has_labels = bool(labelled) and _bool(labelled[0], "classLabel", source)
    class_names = tuple(labelled[1:]) if has_labels else ()
    dims = int(header["dimensions"]) if "dimensions" in header else None
    if dims is None and "univariate" in header and _bool(header["univariate"], "univariate", source):
        dims = 1
    series: list[np.ndarray] = []
    labels: list[str] = []
    for i in range(start, len(lines)):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{i + 1}"
        fields = _outside_parentheses(line, where) if stamped else line.split(":")
        if has_labels:
            label = fields.pop().strip()
            if class_names and label not in class_names:
                raise DataError(f"{where}: label {label!r} is not declared by @classLabel {list(class_names)}")
            labels.append(label)
        if dims is not None and len(fields) != dims:
            raise DataError(f"{where}: {len(fields)} dimensions; @dimensions says {dims}")
        if stamped:
            series.append(_stamped_instance(fields, where))
            continue
        channels = [_values(f, where, d) for d, f in enumerate(fields)]
        lengths = {len(c) for c in channels}
        if len(lengths) != 1:
            raise DataError(f"{where}: dimensions of one instance have lengths {sorted(lengths)}; expected one length")
        series.append(np.stack(channels, axis=1))
    if not series:
        raise DataError(f"{source}: no instances after @data")
    widths = {s.shape[1] for s in series}
    if len(widths) != 1:
        raise DataError(f"{source}: instances have {sorted(widths)} dimensions; expected one count")
    return TSFile(header.get("problemname", ""), series, labels, class_names)


def _values(field: str, where: str, dim: int) -> np.ndarray:
    if not field.strip():
        raise DataError(f"{where}: dimension {dim} has no values (a sequence of length 0); expected at least one")
    parts = field.split(",")
    try:
        return np.array(parts, dtype=np.float32)
    except ValueError:
        pass
    try:
        return np.array([np.nan if p.strip() == "?" else float(p) for p in parts], dtype=np.float32)
    except ValueError:
        bad = next(p for p in parts if p.strip() != "?" and not _is_float(p))
        raise DataError(f"{where}: dimension {dim}: {bad.strip()[:20]!r} is not a number or '?'") from None


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


_PAIR = re.compile(r"\(([^()]*)\)")


def _outside_parentheses(line: str, where: str) -> list[str]:
    """``line`` split at the ``:`` outside parentheses (a datetime stamp has colons of its own)."""
    fields, depth, start = [], 0, 0
    for k, ch in enumerate(line):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == ":" and depth == 0:
            fields.append(line[start:k])
            start = k + 1
        if depth not in (0, 1):
            raise DataError(f"{where}: unbalanced parentheses; expected values written (t,v)")
    if depth:
        raise DataError(f"{where}: unbalanced parentheses; expected values written (t,v)")
    fields.append(line[start:])
    return fields


def _stamped_instance(fields: list[str], where: str) -> np.ndarray:
    """The dimensions ``(t,v),(t,v)...`` of one instance as ``[n, C]`` on the union of their stamps."""
    read_time = time_reader("seconds")
    dims: list[dict[float, float]] = []
    kinds: set[str] = set()
    for d, field in enumerate(fields):
        pairs = _PAIR.findall(field)
        if not pairs:
            raise DataError(
                f"{where}: dimension {d} has no (t,v) values (a sequence of length 0); expected one or more"
            )
        if _PAIR.sub("", field).replace(",", "").strip():
            raise DataError(f"{where}: dimension {d}: {field.strip()[:30]!r} is not a list of (t,v) pairs")
        values: dict[float, float] = {}
        for pair in pairs:
            stamp, comma, value = pair.rpartition(",")
            if not comma:
                raise DataError(f"{where}: dimension {d}: ({pair[:20]}) is not (t,v); expected a time and a value")
            try:
                t, kind = read_time(stamp)
            except ValueError as e:
                raise DataError(f"{where}: dimension {d}: {e}") from None
            kinds.add(kind)
            if t in values:
                raise DataError(f"{where}: dimension {d}: time {stamp.strip()!r} twice; expected one value per time")
            values[t] = float(_values(value, where, d)[0])
        dims.append(values)
    if len(kinds) > 1:
        raise DataError(f"{where}: times mix numbers and datetimes; expected one kind per instance")
    stamps = sorted(set().union(*dims))
    out = np.full((len(stamps), len(dims)), np.nan, dtype=np.float32)
    at = {t: k for k, t in enumerate(stamps)}
    for d, values in enumerate(dims):
        for t, v in values.items():
            out[at[t], d] = v
    return out
