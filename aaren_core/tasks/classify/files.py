"""A classification task from a user's files: ``aaren train --task class --data TRAIN [--test-data TEST]``.

Two formats, read by the torch-free readers the client uses too:

- a UEA / sktime ``.ts`` file (``aaren.formats.ts.parse_ts``): equal or unequal lengths, ``?`` for a
  missing value (NaN), ``@timeStamps true`` too; the class names in ``@classLabel`` order (else the
  sorted labels), channels ``dim_0, dim_1, ...``;
- a CSV / Parquet file as ``aaren replay`` reads one for a class model (``aaren.formats.events``):
  ``session_id, time, <channels...>, label``, one row per step. A sequence is a session's rows in
  file order (times must not decrease within a session; sessions may interleave), in the order the
  sessions first appear; its label is one per session. The channels are every column but
  ``session_id``, ``time``, ``label`` (and ``mark`` / ``context`` if present), by their names. The
  class names are the sorted labels (by value when every label is a number: ``2`` before ``10``).

``test_data`` (``--test-data``) names the test file, in the same format, with the train file's
channels and labels among its classes. Without it, ``TEST_FRACTION`` of each class of the train
file (per class, rounded; seeded by ``seed``) is held out as the test part, so every run of one
config scores the same sequences; ``ClassData.source`` says which.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from aaren.formats.errors import DataError
from aaren.formats.events import LABEL_COLUMN, EventLayout, read_event_rows
from aaren.formats.tables import CSV_SUFFIXES, PARQUET_SUFFIXES
from aaren.formats.ts import parse_ts
from aaren_core.tasks.classify.data import ClassData, ClassSet, stratified_holdout

if TYPE_CHECKING:
    from aaren_core.tasks.config import TaskTrainConfig

__all__ = ["TEST_FRACTION", "TS_SUFFIX", "LabelledFile", "load_class_files", "read_class_file"]

#: The stratified fraction of the train file held out as test when no test file is given.
TEST_FRACTION = 0.2
TS_SUFFIX = ".ts"


@dataclasses.dataclass(frozen=True)
class LabelledFile:
    """One file's sequences ``series[i] [n_i, C]`` float32 (NaN where missing) with their label
    names, in file order; ``class_names`` the classes the file declares (``.ts``; else empty),
    ``channels`` its channel names, ``kind`` ``"ts"`` or ``"table"``."""

    path: Path
    kind: str
    series: list[np.ndarray]
    labels: list[str]
    class_names: tuple[str, ...]
    channels: tuple[str, ...]


def read_class_file(path: str | Path) -> LabelledFile:
    """Read a ``.ts``, ``.csv``, ``.csv.gz``, ``.parquet`` or ``.pq`` file of labelled sequences
    (module docstring); ``DataError`` naming the file and what was expected otherwise."""
    path = Path(path).expanduser()
    name = path.name.lower()
    if not path.is_file():
        raise DataError(f"{path}: no such file; expected a .ts, .csv, .csv.gz, .parquet or .pq file")
    if name.endswith(TS_SUFFIX):
        return _read_ts(path)
    if name.endswith((*CSV_SUFFIXES, *PARQUET_SUFFIXES)):
        return _read_table(path)
    raise DataError(f"{path}: unsupported file type; expected .ts, .csv, .csv.gz, .parquet or .pq")


def _read_ts(path: Path) -> LabelledFile:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not readable as UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror})") from None
    ts = parse_ts(text, source=str(path))
    if not ts.labels:
        raise DataError(f"{path}: no labels; expected @classLabel true and a label after each instance")
    channels = tuple(f"dim_{i}" for i in range(ts.n_channels))
    return LabelledFile(path, "ts", ts.series, ts.labels, ts.class_names, channels)


def _read_table(path: Path) -> LabelledFile:
    layout = EventLayout(
        time_unit="seconds", mark_optional=True, learn_marks=True, learn_labels=True, missing_values=True
    )
    rows = read_event_rows(path, layout)
    if not rows.labels:
        raise DataError(
            f"{path}: no {LABEL_COLUMN!r} column; expected columns session_id, time, <channels...>, {LABEL_COLUMN}"
        )
    if not rows.value_names:
        raise DataError(f"{path}: no channel columns; expected session_id, time, <channels...>, {LABEL_COLUMN}")
    steps: dict[str, list[list[float]]] = {}
    for sid, values in zip(rows.session_ids, rows.values, strict=True):
        steps.setdefault(sid, []).append(values)
    series = [np.array(v, dtype=np.float32).reshape(len(v), len(rows.value_names)) for v in steps.values()]
    return LabelledFile(path, "table", series, [rows.labels[sid] for sid in steps], (), rows.value_names)


def _sorted_labels(labels: list[str]) -> tuple[str, ...]:
    """The distinct labels sorted: by value when every one is a number, else as text."""
    distinct = set(labels)
    try:
        values = {label: float(label) for label in distinct}
    except ValueError:
        return tuple(sorted(distinct))
    if all(math.isfinite(v) for v in values.values()):
        return tuple(sorted(distinct, key=lambda label: (values[label], label)))
    return tuple(sorted(distinct))


def _checked(f: LabelledFile) -> LabelledFile:
    empty = [i for i, s in enumerate(f.series) if len(s) == 0]
    if empty:
        raise DataError(f"{f.path}: sequence {empty[0]} has no steps (length 0); expected at least one step")
    return f


def load_class_files(config: TaskTrainConfig) -> ClassData:
    """``config.data`` (and ``config.test_data``) as a ``ClassData`` (module docstring)."""
    train = _checked(read_class_file(config.data))
    class_names = train.class_names or _sorted_labels(train.labels)
    if len(set(train.labels)) < 2:
        raise DataError(
            f"{train.path}: every sequence has label {train.labels[0]!r}; expected at least two classes to tell apart"
        )
    index = {c: i for i, c in enumerate(class_names)}
    train_set = ClassSet(train.series, np.array([index[label] for label in train.labels], dtype=np.int64))
    kind = "a .ts file" if train.kind == "ts" else "a table of session_id, time, channels, label"
    if config.test_data:
        test = _checked(read_class_file(config.test_data))
        test = _matching(test, train)
        unknown = sorted(set(test.labels) - set(index))
        if unknown:
            raise DataError(
                f"{test.path}: labels {unknown[:5]} are not classes of the train file; expected some of "
                f"{list(class_names)}"
            )
        test_set = ClassSet(test.series, np.array([index[label] for label in test.labels], dtype=np.int64))
        split = f"test: the file {test.path.name} ({len(test_set)} sequences)"
    else:
        held = stratified_holdout(train_set.labels, len(class_names), TEST_FRACTION, config.seed)
        if not held.any():
            raise DataError(
                f"{train.path}: too few sequences per class to hold out {TEST_FRACTION:.0%} of each as test; "
                "expected more sequences, or a test file (--test-data)"
            )
        train_set, test_set = train_set.subset(np.flatnonzero(~held)), train_set.subset(np.flatnonzero(held))
        split = f"test: a stratified {TEST_FRACTION:.0%} of its sequences held out (per class, seed {config.seed})"
    source = f"{train.path.name} ({kind}); {split}"
    return ClassData(train.path.name.split(".")[0], train_set, test_set, class_names, train.channels, source)


def _matching(test: LabelledFile, train: LabelledFile) -> LabelledFile:
    """``test`` with ``train``'s channels in ``train``'s order; ``DataError`` if they differ."""
    if test.kind != train.kind:
        raise DataError(
            f"{test.path}: the test file is {'a .ts file' if test.kind == 'ts' else 'a table'} but the train file "
            f"{train.path.name} is not; expected both in one format"
        )
    if test.channels == train.channels:
        return test
    if set(test.channels) != set(train.channels) or len(test.channels) != len(train.channels):
        raise DataError(
            f"{test.path}: channels {list(test.channels)} differ from the train file's {list(train.channels)}; "
            "expected the same channels"
        )
    order = [test.channels.index(c) for c in train.channels]
    return dataclasses.replace(test, series=[s[:, order] for s in test.series], channels=train.channels)
