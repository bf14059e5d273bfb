"""The session store interface: per-session metadata plus rows of named state tensors.

A store knows nothing of the model beyond the shapes of the tensors it keeps (``StateLayout``).
Writes are compare-and-set on the session's last applied seq, so a write built from a stale read
is refused instead of overwriting newer state.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "ABSENT_LAST_TIME",
    "LoadedBatch",
    "Rows",
    "SaveBatch",
    "SessionMeta",
    "SessionStore",
    "StateLayout",
    "StoreUnavailableError",
    "as_arrays",
    "as_tensors",
    "take_rows",
]

#: A batch's state rows, ``name -> [B, ...]``: torch tensors, or numpy arrays where the rows live in host
#: memory (the memory store on the CPU hands out numpy rows and the compiled event kernel makes them: a
#: batch of single events then wraps no field in a tensor and back, some 19 conversions a batch that were
#: a fifth of a one-event batch's time in the engine core). Every reader takes either kind: ``as_tensors``
#: (the torch paths), ``as_arrays`` (a store writing host memory), ``take_rows``.
Rows = dict[str, Tensor | np.ndarray]


def as_tensors(rows: Rows) -> dict[str, Tensor]:
    """``rows`` as torch tensors (numpy rows wrapped, their memory shared)."""
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in rows.items()}


def as_arrays(rows: Rows) -> dict[str, np.ndarray]:
    """``rows`` as numpy arrays (CPU tensors' memory shared; a tensor elsewhere is copied to the host)."""
    return {k: v if isinstance(v, np.ndarray) else v.detach().cpu().numpy() for k, v in rows.items()}


def take_rows(rows: Rows, index: np.ndarray) -> Rows:
    """Rows ``index [K]`` (int64) of every field, each field staying the kind it is."""
    taken: Rows = {}
    on_device: Tensor | None = None  # the index as a tensor, made once (every field is on one device)
    for k, v in rows.items():
        if isinstance(v, np.ndarray):
            taken[k] = v[index]
            continue
        if on_device is None:
            on_device = torch.from_numpy(index).to(v.device)
        taken[k] = v.index_select(0, on_device)
    return taken


class StoreUnavailableError(RuntimeError):
    """The store cannot be reached or answered too slowly; nothing was written."""


@dataclasses.dataclass(slots=True)
class SessionMeta:
    """What the service knows of a session besides its tensors. Times are unix seconds."""

    last_seq: int
    last_time: float
    created_at: float
    updated_at: float
    model_version: str

    @classmethod
    def at(
        cls, i: int, last_seq: np.ndarray, last_time: np.ndarray, created: np.ndarray, updated: np.ndarray, version: str
    ) -> SessionMeta:
        """Entry ``i`` of metadata columns ``[N]`` as one object, numpy scalars made plain (cold paths)."""
        return cls(int(last_seq[i]), float(last_time[i]), float(created[i]), float(updated[i]), version)


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """Per-session tensors: name -> one row (the value of a session that has seen nothing)."""

    rows: dict[str, Tensor]

    @property
    def device(self) -> torch.device:
        return next(iter(self.rows.values())).device

    @property
    def row_nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.rows.values())

    def empty(self, n: int) -> dict[str, Tensor]:
        """``n`` fresh rows of every tensor: ``name -> [n, *row_shape]``."""
        return {k: t.unsqueeze(0).expand(n, *t.shape).clone() for k, t in self.rows.items()}


#: What a batch's columns hold for a session the store does not have (``LoadedBatch``).
ABSENT_LAST_TIME = -math.inf


@dataclasses.dataclass(slots=True)
class LoadedBatch:
    """Sessions read for one batch, as columns ``[B]``: ``present`` (whether the store has the
    session), its ``last_seq`` (int64), ``last_time``, ``created_at``, ``updated_at`` (float64, unix
    seconds) and model version ``versions[version[i]]`` (``version`` int16 codes into the batch's
    small table ``versions``). A session without state reads ``last_seq`` 0, ``last_time``
    ``ABSENT_LAST_TIME``, times 0 and code -1; ``tensors[name] [B, ...]`` holds its fresh row (``Rows``:
    tensors or numpy arrays)."""

    present: np.ndarray
    last_seq: np.ndarray
    last_time: np.ndarray
    created_at: np.ndarray
    updated_at: np.ndarray
    version: np.ndarray
    versions: tuple[str, ...]
    tensors: Rows

    @classmethod
    def of(cls, metas: Sequence[SessionMeta | None], tensors: Rows) -> LoadedBatch:
        """Columns from one ``SessionMeta`` (or None) per session (a cold path: a store that reads
        records one by one)."""
        codes: dict[str, int] = {}
        n = len(metas)
        present = np.zeros(n, dtype=bool)
        last_seq = np.zeros(n, dtype=np.int64)
        last_time = np.full(n, ABSENT_LAST_TIME)
        created, updated = np.zeros(n), np.zeros(n)
        version = np.full(n, -1, dtype=np.int16)
        for i, m in enumerate(metas):
            if m is not None:
                present[i] = True
                last_seq[i], last_time[i], created[i], updated[i] = m.last_seq, m.last_time, m.created_at, m.updated_at
                version[i] = codes.setdefault(m.model_version, len(codes))
        return cls(present, last_seq, last_time, created, updated, version, tuple(codes), tensors)

    def meta(self, i: int) -> SessionMeta | None:
        """Session ``i``'s metadata as one object, or None (cold paths: ``get``, tests)."""
        if not self.present[i]:
            return None
        version = self.versions[int(self.version[i])]
        return SessionMeta.at(i, self.last_seq, self.last_time, self.created_at, self.updated_at, version)

    @property
    def metas(self) -> list[SessionMeta | None]:
        """Every session's ``meta`` (cold paths and tests; the batcher reads the columns)."""
        return [self.meta(i) for i in range(len(self.present))]


@dataclasses.dataclass(frozen=True, slots=True)
class SaveBatch:
    """What one ``save`` writes, as columns ``[B]``: rows ``tensors[name][i]`` ``[B, ...]`` of
    ``session_ids[i]`` with metadata ``last_seq[i]`` (int64), ``last_time[i]``, ``created_at[i]``,
    ``updated_at[i]`` (float64) and the batch's ``model_version``, if its stored last seq still
    equals ``expected_seqs[i]`` (int64; 0: it must not exist)."""

    session_ids: Sequence[str]
    tensors: Rows
    last_seq: np.ndarray
    last_time: np.ndarray
    created_at: np.ndarray
    updated_at: np.ndarray
    model_version: str
    expected_seqs: np.ndarray

    @classmethod
    def of(
        cls,
        session_ids: Sequence[str],
        tensors: Rows,
        metas: Sequence[SessionMeta],
        expected: Sequence[int],
    ) -> SaveBatch:
        """Columns from one ``SessionMeta`` per session, all of one model version (cold paths, tests)."""
        versions = {m.model_version for m in metas}
        if len(versions) > 1:
            raise ValueError(f"one save writes one model version, not {sorted(versions)}")
        return cls(
            session_ids,
            tensors,
            np.array([m.last_seq for m in metas], dtype=np.int64),
            np.array([m.last_time for m in metas], dtype=np.float64),
            np.array([m.created_at for m in metas], dtype=np.float64),
            np.array([m.updated_at for m in metas], dtype=np.float64),
            versions.pop() if versions else "",
            np.array(expected, dtype=np.int64),
        )

    def meta(self, i: int) -> SessionMeta:
        """Session ``i``'s metadata as one object (cold paths)."""
        return SessionMeta.at(i, self.last_seq, self.last_time, self.created_at, self.updated_at, self.model_version)


class SessionStore(abc.ABC):
    """The interface every backend implements (the contract suite in tests/server runs on each)."""

    #: Whether ``count`` is cheap enough to call after every batch (else the engine core calls it now and then).
    cheap_count = True
    #: Whether the backend expires idle sessions by itself (then ``sweep`` finds nothing to do).
    expires_by_itself = False
    #: Whether the backend bounds the number of sessions (``capacity``) by evicting the least recent.
    bounded_by_capacity = True

    def __init__(self, layout: StateLayout) -> None:
        self.layout = layout
        #: Called with the cause ("ttl" or "capacity") of every eviction, for metrics.
        self.on_evict: Callable[[str], None] = lambda cause: None

    @abc.abstractmethod
    async def load(self, session_ids: Sequence[str]) -> LoadedBatch:
        """Read many sessions at once (distinct ids)."""

    @abc.abstractmethod
    async def save(self, batch: SaveBatch) -> list[bool]:
        """Write each session of ``batch`` whose stored last seq still equals its expected one:
        compare-and-set per session. Returns, per session, whether it was written; nothing is
        written for a False."""

    @abc.abstractmethod
    async def get(self, session_id: str) -> tuple[SessionMeta, dict[str, Tensor]] | None:
        """One session's metadata and rows ``[1, ...]``, or None."""

    @abc.abstractmethod
    async def delete(self, session_id: str) -> SessionMeta | None:
        """Remove a session; returns what it was, or None if there was none."""

    @abc.abstractmethod
    def was_evicted(self, session_id: str) -> bool:
        """Whether the session is known to have been evicted (best effort)."""

    @abc.abstractmethod
    async def count(self) -> int:
        """Number of sessions held."""

    @abc.abstractmethod
    async def count_group(self, group: str) -> int:
        """Sessions whose id starts with ``group + "/"`` (the engine core puts the tenant there)."""

    @abc.abstractmethod
    async def sweep(self, now: float | None = None) -> int:
        """Evict sessions idle past the TTL; returns how many."""

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        return None
