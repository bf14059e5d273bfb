"""The session store interface: per-session metadata plus rows of named state tensors.

A store knows nothing of the model beyond the shapes of the tensors it keeps (``StateLayout``).
Writes are compare-and-set on the session's last applied seq, so a write built from a stale read
is refused instead of overwriting newer state.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["LoadedBatch", "SaveBatch", "SessionMeta", "SessionStore", "StateLayout", "StoreUnavailableError"]


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


@dataclasses.dataclass(frozen=True)
class LoadedBatch:
    """Sessions read for one batch: ``metas[i]`` is None for a session without state;
    ``tensors[name] [B, ...]`` holds its fresh row then."""

    metas: list[SessionMeta | None]
    tensors: dict[str, Tensor]


@dataclasses.dataclass(frozen=True, slots=True)
class SaveBatch:
    """What one ``save`` writes: rows ``tensors[name][i]`` ``[B, ...]`` and ``metas[i]`` of
    ``session_ids[i]``, if its stored last seq still equals ``expected_seqs[i]`` (0: it must not exist)."""

    session_ids: Sequence[str]
    tensors: dict[str, Tensor]
    metas: Sequence[SessionMeta]
    expected_seqs: Sequence[int]


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
