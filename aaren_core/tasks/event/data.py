"""Event sequences as padded tensors for training and scoring: ``EventBatch``, ``pad_batch``, ``iterate_batches``.

The event task's data lives in one module per job: ``schema`` (``EventSchema``: mark and value
names, standardization), ``sequences`` (``EventSequence``), ``splits`` (train / val / test and
``EventData``), ``resolution`` (the recording grid, dequantization), ``files`` (``load_events``,
``write_events``), ``flights`` (the built-in data sets); the readers under them are torch-free in
``aaren.formats``. This module is the one that needs torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from aaren.formats.errors import DataError
from aaren_core.tasks.event.schema import EventSchema
from aaren_core.tasks.event.sequences import EventSequence

__all__ = ["EventBatch", "iterate_batches", "pad_batch"]


@dataclasses.dataclass(frozen=True, eq=False)
class EventBatch:
    """Sequences padded to the longest one (``N``), as tensors.

    times   [B, N]    float64  absolute event times (0 where padded)
    dt      [B, N]    float32  gap since the previous event of the same sequence (0 for the first, 0 where padded)
    marks   [B, N]    int64    mark ids (0 where padded)
    values  [B, N, V] float32  standardized with the schema, or raw with ``raw_values`` (0 where padded)
    mask    [B, N]    bool     True for real events
    scored  [B, N]    bool     True for events to predict: real, not a sequence's first, not context
    lengths [B]       int64    events per sequence
    """

    times: Tensor
    dt: Tensor
    marks: Tensor
    values: Tensor
    mask: Tensor
    scored: Tensor
    lengths: Tensor
    session_ids: tuple[str, ...]

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_events(self) -> int:
        return int(self.lengths.sum())

    def to(self, device: torch.device | str) -> EventBatch:
        moved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in moved.items():
            if isinstance(value, Tensor):
                moved[name] = value.to(device)
        return EventBatch(**moved)


def pad_batch(sequences: Sequence[EventSequence], schema: EventSchema, *, raw_values: bool = False) -> EventBatch:
    """Pad ``sequences`` into one ``EventBatch`` (values standardized with ``schema``, or left raw
    with ``raw_values``: ``EventModel`` takes raw values and standardizes them itself).

    ``DataError`` if a sequence has a mark id outside ``[0, schema.num_marks)`` or values of the
    wrong width.
    """
    if not sequences:
        raise DataError("pad_batch: no sequences; expected at least one")
    b = len(sequences)
    n = max(len(s) for s in sequences)
    v = schema.value_width
    times = np.zeros((b, n), dtype=np.float64)
    gaps = np.zeros((b, n), dtype=np.float64)
    marks = np.zeros((b, n), dtype=np.int64)
    values = np.zeros((b, n, v), dtype=np.float32)
    mask = np.zeros((b, n), dtype=bool)
    scored = np.zeros((b, n), dtype=bool)
    lengths = np.zeros(b, dtype=np.int64)
    for i, seq in enumerate(sequences):
        k = len(seq)
        if seq.values.shape[1] != v:
            raise DataError(
                f"session {seq.session_id!r}: {seq.values.shape[1]} value columns; expected {v} "
                f"({list(schema.value_names)})"
            )
        if k and int(seq.marks.max()) >= schema.num_marks:
            raise DataError(
                f"session {seq.session_id!r}: mark id {int(seq.marks.max())}; expected ids in [0, {schema.num_marks})"
            )
        times[i, :k] = seq.times
        gaps[i, 1:k] = np.diff(seq.times)
        marks[i, :k] = seq.marks
        values[i, :k] = seq.values if raw_values else schema.standardize(seq.values)
        mask[i, :k] = True
        scored[i, max(seq.context, 1) : k] = True
        lengths[i] = k
    return EventBatch(
        times=torch.from_numpy(times),
        dt=torch.from_numpy(gaps.astype(np.float32)),
        marks=torch.from_numpy(marks),
        values=torch.from_numpy(values),
        mask=torch.from_numpy(mask),
        scored=torch.from_numpy(scored),
        lengths=torch.from_numpy(lengths),
        session_ids=tuple(s.session_id for s in sequences),
    )


def iterate_batches(
    sequences: Sequence[EventSequence],
    schema: EventSchema,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int = 0,
    drop_last: bool = False,
    raw_values: bool = False,
) -> Iterator[EventBatch]:
    """Padded batches of ``batch_size`` sequences (the last one smaller unless ``drop_last``).

    With ``shuffle`` the order is a permutation drawn from ``numpy.random.default_rng(seed)``:
    the same seed gives the same batches (pass e.g. ``seed + epoch`` for a new order each epoch).
    """
    if batch_size < 1:
        raise DataError(f"batch_size is {batch_size}; expected >= 1")
    order = np.arange(len(sequences))
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(sequences))
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    for start in range(0, stop, batch_size):
        yield pad_batch([sequences[int(i)] for i in order[start : start + batch_size]], schema, raw_values=raw_values)
