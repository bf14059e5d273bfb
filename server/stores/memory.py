"""In-process session store: one preallocated tensor pool per state field on the model's device.

Rows are addressed by slot: a batch is one gather per field on load and one scatter per field on
save, whatever the number of layers or sessions. Slot 0 permanently holds the fresh row, so a
new session is read by gathering slot 0. The pool grows by doubling up to ``capacity``; past it
the least recently written session is evicted. Sessions idle past ``idle_ttl_s`` are evicted by
``sweep``. Evicted ids are remembered (bounded) so that a late event can be told why.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor

from aaren.server.stores.base import LoadedBatch, SaveBatch, SessionMeta, SessionStore, StateLayout

__all__ = ["MemoryStore"]

INITIAL_ROWS = 1024
TOMBSTONES = 100_000


class MemoryStore(SessionStore):
    def __init__(self, layout: StateLayout, *, capacity: int, idle_ttl_s: float) -> None:
        super().__init__(layout)
        self.capacity = capacity
        self.idle_ttl_s = idle_ttl_s
        rows = min(capacity, INITIAL_ROWS) + 1
        self._pool: dict[str, Tensor] = layout.empty(rows)
        self._device = layout.device
        self._free: list[int] = list(range(rows - 1, 0, -1))
        self._slots: dict[str, int] = {}
        #: Session id -> metadata, least recently written first.
        self._metas: OrderedDict[str, SessionMeta] = OrderedDict()
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._writing: set[str] = set()
        self._groups: Counter[str] = Counter()

    @property
    def pool_rows(self) -> int:
        return next(iter(self._pool.values())).shape[0] - 1

    async def load(self, session_ids: Sequence[str]) -> LoadedBatch:
        slots = [self._slots.get(sid, 0) for sid in session_ids]
        index = torch.tensor(slots, dtype=torch.long, device=self._device)
        return LoadedBatch(
            metas=[self._metas.get(sid) for sid in session_ids],
            tensors={k: pool.index_select(0, index) for k, pool in self._pool.items()},
        )

    async def save(self, batch: SaveBatch) -> list[bool]:
        session_ids, tensors, metas, expected_seqs = batch.session_ids, batch.tensors, batch.metas, batch.expected_seqs
        written = [False] * len(session_ids)
        self._writing = set(session_ids)
        rows: list[int] = []
        slots: list[int] = []
        new: list[int] = []
        # Existing sessions first, so that allocating for new ones never evicts a row being written.
        for i, (sid, expected) in enumerate(zip(session_ids, expected_seqs, strict=True)):
            current = self._metas.get(sid)
            if (current.last_seq if current else 0) != expected:
                continue
            if current is None:
                new.append(i)
                continue
            self._metas[sid] = metas[i]
            self._metas.move_to_end(sid)
            rows.append(i)
            slots.append(self._slots[sid])
            written[i] = True
        for i in new:
            sid = session_ids[i]
            slot = self._allocate()
            self._slots[sid] = slot
            self._metas[sid] = metas[i]
            self._groups[_group(sid)] += 1
            self._evicted.pop(sid, None)
            written[i] = True
            rows.append(i)
            slots.append(slot)
        if rows:
            device = self._device
            # Every row written, in order (the common batch): scatter the tensors as they are.
            src = None if rows == list(range(len(session_ids))) else torch.tensor(rows, dtype=torch.long, device=device)
            dst = torch.tensor(slots, dtype=torch.long, device=device)
            for k, pool in self._pool.items():
                row = tensors[k] if src is None else tensors[k].index_select(0, src)
                pool.index_copy_(0, dst, row if row.dtype == pool.dtype else row.to(pool.dtype))
        self._shrink()  # back to capacity, sparing what this call wrote
        self._writing = set()
        return written

    def _allocate(self) -> int:
        """A free slot. Past capacity, the least recently written session makes room, unless it was
        written in the current call (answered as stored): then the pool grows past capacity for
        now and ``_shrink`` restores it later."""
        if not self._free:
            oldest = next(iter(self._metas), None)
            if self.pool_rows >= self.capacity and oldest is not None and oldest not in self._writing:
                self._evict(oldest, "capacity")
            else:
                self._grow(max(self.pool_rows + 1, min(self.capacity, 2 * self.pool_rows)))
        return self._free.pop()

    def _evict(self, session_id: str, cause: str) -> None:
        self._remove(session_id)
        self._tombstone(session_id)
        self.on_evict(cause)

    def _shrink(self) -> None:
        """Evict least recently written sessions down to capacity (never those being written)."""
        while len(self._metas) > self.capacity:
            oldest = next(iter(self._metas))
            if oldest in self._writing:
                break
            self._evict(oldest, "capacity")

    def _grow(self, rows: int) -> None:
        old = self.pool_rows
        extra = self.layout.empty(rows - old)
        self._pool = {k: torch.cat([pool, extra[k]]) for k, pool in self._pool.items()}
        self._free.extend(range(rows, old, -1))

    def _remove(self, session_id: str) -> SessionMeta | None:
        meta = self._metas.pop(session_id, None)
        if meta is not None:
            group = _group(session_id)
            self._groups[group] -= 1
            if not self._groups[group]:
                del self._groups[group]
        slot = self._slots.pop(session_id, None)
        if slot is not None:
            for k, pool in self._pool.items():
                pool[slot] = self.layout.rows[k]
            self._free.append(slot)
        return meta

    def _tombstone(self, session_id: str) -> None:
        self._evicted[session_id] = None
        if len(self._evicted) > TOMBSTONES:
            self._evicted.popitem(last=False)

    async def get(self, session_id: str) -> tuple[SessionMeta, dict[str, Tensor]] | None:
        meta = self._metas.get(session_id)
        if meta is None:
            return None
        slot = self._slots[session_id]
        return meta, {k: pool[slot : slot + 1].clone() for k, pool in self._pool.items()}

    async def delete(self, session_id: str) -> SessionMeta | None:
        return self._remove(session_id)

    def was_evicted(self, session_id: str) -> bool:
        return session_id in self._evicted

    async def count(self) -> int:
        return len(self._metas)

    async def count_group(self, group: str) -> int:
        return self._groups.get(group, 0)

    async def sweep(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        expired = []
        for sid, meta in self._metas.items():  # least recently written first
            if now - meta.updated_at < self.idle_ttl_s:
                break
            expired.append(sid)
        for sid in expired:
            self._evict(sid, "ttl")
        return len(expired)


def _group(session_id: str) -> str:
    head, slash, _ = session_id.partition("/")
    return head if slash else ""
