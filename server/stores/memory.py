"""In-process session store: one preallocated tensor pool per state field on the model's device,
and the sessions' metadata as columns beside it.

Rows are addressed by slot: a batch is one gather per field on load and one scatter per field on
save, whatever the number of layers or sessions. Slot 0 permanently holds the fresh row (and the
metadata of a session that does not exist), so a new session is read by gathering slot 0. The
metadata are arrays by slot (last seq, last time, created, updated, a model-version code), so a
batch reads and writes them with one array operation each, and the only Python objects kept per
session are its id and its entry in the one id -> slot map. The pool grows by doubling up to
``capacity``; past it the least recently written session is evicted. Sessions idle past
``idle_ttl_s`` are evicted by ``sweep``. Evicted ids are remembered (bounded) so that a late event
can be told why.

Write order (for eviction) is a log of slots in the order they were written: writing a session
appends its slot and records the position (``_at[slot]``); an entry is live while its slot's
recorded position is still its own, so a rewrite or a removal leaves a stale entry that the scans
skip and the next compaction drops (amortized O(1) a write, no object per session).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from aaren.server.stores.base import ABSENT_LAST_TIME, LoadedBatch, SaveBatch, SessionMeta, SessionStore, StateLayout

__all__ = ["MemoryStore"]

INITIAL_ROWS = 1024
TOMBSTONES = 100_000
#: Log entries a scan of the write order reads at a time.
SCAN_CHUNK = 4096


class MemoryStore(SessionStore):
    def __init__(self, layout: StateLayout, *, capacity: int, idle_ttl_s: float) -> None:
        super().__init__(layout)
        self.capacity = capacity
        self.idle_ttl_s = idle_ttl_s
        rows = min(capacity, INITIAL_ROWS) + 1
        self._pool: dict[str, Tensor] = layout.empty(rows)
        self._device = layout.device
        #: On the CPU, the pools' own memory as numpy arrays: a gather or scatter of a few rows costs
        #: numpy's fancy indexing (about a microsecond) where torch's index ops cost three.
        self._arrays = self._numpy_views()
        self._slots: dict[str, int] = {}
        #: slot -> session id (None: free), for eviction.
        self._ids: list[str | None] = [None] * rows
        # Metadata by slot [rows + 1]; slot 0 keeps what a session without state reads.
        self._seq = np.zeros(rows, dtype=np.int64)
        self._last_time = np.full(rows, ABSENT_LAST_TIME)
        self._created = np.zeros(rows)
        self._updated = np.zeros(rows)
        self._version = np.full(rows, -1, dtype=np.int16)
        self._versions: tuple[str, ...] = ()
        #: Free slots: a stack, ``_free[:_n_free]``.
        self._free = np.arange(rows - 1, -1, -1, dtype=np.int64)
        self._n_free = rows - 1
        #: The write order: slots ``_log[_head:_tail]``, least recently written first; ``_at[slot]``
        #: is the position of the slot's last write (-1: free).
        self._log = np.zeros(2 * rows, dtype=np.int32)
        self._head = self._tail = 0
        self._at = np.full(rows, -1, dtype=np.int32)
        #: Where the current save call's writes start in the log (kept by compactions).
        self._mark = 0
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._groups: Counter[str] = Counter()

    @property
    def pool_rows(self) -> int:
        return len(self._seq) - 1

    async def load(self, session_ids: Sequence[str]) -> LoadedBatch:
        get = self._slots.get
        # np.array of a list: np.fromiter costs about 10 us a call whatever the length (numpy 2.4).
        slots = np.array([get(sid, 0) for sid in session_ids], dtype=np.int64)
        if self._arrays is not None:
            tensors = {k: torch.from_numpy(array[slots]) for k, array in self._arrays.items()}
        else:
            index = self._index(slots)
            tensors = {k: pool.index_select(0, index) for k, pool in self._pool.items()}
        return LoadedBatch(
            present=slots != 0,
            last_seq=self._seq[slots],
            last_time=self._last_time[slots],
            created_at=self._created[slots],
            updated_at=self._updated[slots],
            version=self._version[slots],
            versions=self._versions,
            tensors=tensors,
        )

    async def save(self, batch: SaveBatch) -> list[bool]:
        session_ids = batch.session_ids
        get = self._slots.get
        slots = np.array([get(sid, 0) for sid in session_ids], dtype=np.int64)
        # Compare-and-set: slot 0's seq is 0, so a new session is written iff 0 was expected.
        ok = self._seq[slots] == np.asarray(batch.expected_seqs, dtype=np.int64)
        self._mark = self._tail
        every = bool(ok.all())  # the common batch: every session written, in order
        written = None if every else np.flatnonzero(ok)
        dst = slots if written is None else slots[written]  # [W] their slots (0: new)
        is_new = dst == 0
        if not is_new.any():
            self._append(dst)
        else:
            # Existing sessions first, so that making room for new ones never evicts a row being written.
            new = np.flatnonzero(is_new)
            self._append(dst[~is_new])
            taken = self._take(len(new))
            dst[new] = taken
            self._append(taken)
            ids_of, slot_of = self._ids, self._slots
            new_ids = [session_ids[i] for i in (new if written is None else written[new]).tolist()]
            for sid, slot in zip(new_ids, taken.tolist(), strict=True):
                slot_of[sid] = slot
                ids_of[slot] = sid
            self._groups.update(map(_group, new_ids))
            if self._evicted:
                for sid in new_ids:
                    self._evicted.pop(sid, None)
        if len(dst):
            pick = slice(None) if written is None else written
            self._seq[dst] = batch.last_seq[pick]
            self._last_time[dst] = batch.last_time[pick]
            self._created[dst] = batch.created_at[pick]
            self._updated[dst] = batch.updated_at[pick]
            self._version[dst] = self._code(batch.model_version)
            if self._arrays is not None and all(t.device.type == "cpu" for t in batch.tensors.values()):
                for k, array in self._arrays.items():
                    rows = batch.tensors[k].numpy()
                    array[dst] = rows if written is None else rows[written]
            else:
                index = self._index(dst)
                src = None if written is None else self._index(written)
                for k, pool in self._pool.items():
                    row = batch.tensors[k] if src is None else batch.tensors[k].index_select(0, src)
                    pool.index_copy_(0, index, row.to(pool.device, pool.dtype))
        self._shrink()  # back to capacity, sparing what this call wrote
        return ok.tolist()

    def _numpy_views(self) -> dict[str, np.ndarray] | None:
        """The pools as numpy arrays sharing their memory (None off the CPU)."""
        if self._device.type != "cpu":
            return None
        return {k: pool.numpy() for k, pool in self._pool.items()}

    def _index(self, positions: np.ndarray) -> Tensor:
        """``positions`` (int64) as an index tensor on the pool's device (shared memory on the CPU)."""
        index = torch.from_numpy(positions)
        return index if self._device.type == "cpu" else index.to(self._device)

    def _code(self, version: str) -> int:
        """The code of a model version in ``_versions`` (a new one gets the next)."""
        try:
            return self._versions.index(version)
        except ValueError:
            self._versions = (*self._versions, version)
            return len(self._versions) - 1

    # -- the write order -------------------------------------------------------------------------

    def _append(self, slots: np.ndarray) -> None:
        """Record a write of ``slots`` (in this order) as the most recent."""
        m = len(slots)
        if self._tail + m > len(self._log):
            self._compact(m)
        end = self._tail + m
        self._log[self._tail : end] = slots
        self._at[slots] = np.arange(self._tail, end)
        self._tail = end

    def _compact(self, room: int) -> None:
        """Drop the stale entries of the log, leaving at least half of it (and ``room``) free."""
        positions, keep = self._live(self._head, self._tail)
        self._mark = int(np.count_nonzero(positions < self._mark))
        size = len(self._log)
        while 2 * (len(keep) + room) > size:
            size *= 2
        if size != len(self._log):
            self._log = np.zeros(size, dtype=np.int32)
        self._log[: len(keep)] = keep
        self._at[keep] = np.arange(len(keep))
        self._head, self._tail = 0, len(keep)

    def _live(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The live entries of ``_log[start:end]``: their positions and slots."""
        slots = self._log[start:end]
        live = np.flatnonzero(self._at[slots] == np.arange(start, end))
        return live + start, slots[live]

    def _oldest(self, k: int, before: int) -> np.ndarray:
        """The slots of the (up to) ``k`` least recently written sessions written before log
        position ``before``, oldest first; the head moves past the stale entries on the way."""
        found: list[np.ndarray] = []
        got, p, limit = 0, self._head, min(before, self._tail)
        while got < k and p < limit:
            end = min(limit, p + max(SCAN_CHUNK, 2 * (k - got)))
            positions, slots = self._live(p, end)
            if got == 0:  # nothing live before the first found entry
                self._head = int(positions[0]) if len(positions) else end
            found.append(slots[: k - got])
            got += len(found[-1])
            p = end
        return np.concatenate(found) if len(found) > 1 else (found[0] if found else np.zeros(0, dtype=np.int64))

    # -- room ------------------------------------------------------------------------------------

    def _take(self, k: int) -> np.ndarray:
        """``k`` free slots. Past capacity, the least recently written sessions make room, unless
        they were written in the current call (answered as stored): then the pool grows past
        capacity for now and ``_shrink`` restores it later."""
        while self._n_free < k:
            short = k - self._n_free
            rows = self.pool_rows
            if rows < self.capacity:
                target = max(rows, 1)
                while target < rows + short:
                    target *= 2
                self._grow(min(self.capacity, target))
                continue
            victims = self._oldest(short, self._mark)
            if len(victims):
                self._evict(victims, "capacity")
            else:
                self._grow(rows + short)
        self._n_free -= k
        return self._free[self._n_free : self._n_free + k].copy()

    def _grow(self, rows: int) -> None:
        rows = max(rows, self.pool_rows + 1)
        old = self.pool_rows
        extra = rows - old
        fresh = self.layout.empty(extra)
        self._pool = {k: torch.cat([pool, fresh[k]]) for k, pool in self._pool.items()}
        self._arrays = self._numpy_views()
        self._ids.extend([None] * extra)
        self._seq = np.concatenate([self._seq, np.zeros(extra, dtype=np.int64)])
        self._last_time = np.concatenate([self._last_time, np.full(extra, ABSENT_LAST_TIME)])
        self._created = np.concatenate([self._created, np.zeros(extra)])
        self._updated = np.concatenate([self._updated, np.zeros(extra)])
        self._version = np.concatenate([self._version, np.full(extra, -1, dtype=np.int16)])
        self._at = np.concatenate([self._at, np.full(extra, -1, dtype=np.int32)])
        free = np.empty(rows + 1, dtype=np.int64)
        free[: self._n_free] = self._free[: self._n_free]
        free[self._n_free : self._n_free + extra] = np.arange(rows, old, -1)
        self._free, self._n_free = free, self._n_free + extra

    def _shrink(self) -> None:
        """Evict least recently written sessions down to capacity (never those this call wrote)."""
        excess = len(self._slots) - self.capacity
        if excess > 0:
            victims = self._oldest(excess, self._mark)
            if len(victims):
                self._evict(victims, "capacity")

    def _evict(self, slots: np.ndarray, cause: str) -> None:
        ids = self._remove(slots)
        evicted = self._evicted
        for sid in ids:
            evicted[sid] = None
            self.on_evict(cause)
        while len(evicted) > TOMBSTONES:
            evicted.popitem(last=False)

    def _remove(self, slots: np.ndarray) -> list[str]:
        """Free ``slots`` (held ones); returns their session ids. The freed rows keep their values:
        a slot is read only once a save has written its whole row again."""
        ids_of = self._ids
        ids: list[str] = []
        for slot in slots.tolist():
            sid = ids_of[slot]
            assert sid is not None
            ids.append(sid)
            ids_of[slot] = None
            del self._slots[sid]
        self._groups.subtract(map(_group, ids))
        for group in {_group(sid) for sid in ids}:
            if self._groups[group] <= 0:
                del self._groups[group]
        self._at[slots] = -1
        self._seq[slots] = 0
        n = len(slots)
        self._free[self._n_free : self._n_free + n] = slots
        self._n_free += n
        return ids

    # -- cold paths ------------------------------------------------------------------------------

    def _meta(self, slot: int) -> SessionMeta:
        version = self._versions[int(self._version[slot])]
        return SessionMeta.at(slot, self._seq, self._last_time, self._created, self._updated, version)

    async def get(self, session_id: str) -> tuple[SessionMeta, dict[str, Tensor]] | None:
        slot = self._slots.get(session_id)
        if slot is None:
            return None
        return self._meta(slot), {k: pool[slot : slot + 1].clone() for k, pool in self._pool.items()}

    async def delete(self, session_id: str) -> SessionMeta | None:
        slot = self._slots.get(session_id)
        if slot is None:
            return None
        meta = self._meta(slot)
        self._remove(np.array([slot], dtype=np.int64))
        return meta

    def was_evicted(self, session_id: str) -> bool:
        return session_id in self._evicted

    async def count(self) -> int:
        return len(self._slots)

    async def count_group(self, group: str) -> int:
        return self._groups.get(group, 0)

    async def sweep(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        expired: list[np.ndarray] = []
        p = self._head
        while p < self._tail:  # least recently written first, up to the first one still fresh
            end = min(self._tail, p + SCAN_CHUNK)
            slots = self._live(p, end)[1]
            idle = now - self._updated[slots] >= self.idle_ttl_s
            if not idle.all():
                expired.append(slots[: int(np.argmin(idle))])
                break
            expired.append(slots)
            p = end
        victims = np.concatenate(expired) if expired else np.zeros(0, dtype=np.int64)
        if len(victims):
            self._evict(victims, "ttl")
        return len(victims)


def _group(session_id: str) -> str:
    head, slash, _ = session_id.partition("/")
    return head if slash else ""
