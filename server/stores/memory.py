"""In-process session store: one preallocated tensor pool per state field on the model's device,
and the sessions' metadata as columns beside it.

Rows are addressed by slot: a batch is one gather per field on load and one scatter per field on
save, whatever the number of layers or sessions. Slot 0 permanently holds the fresh row (and the
metadata of a session that does not exist), so a new session is read by gathering slot 0. The
metadata are arrays by slot (last seq, last time, created, updated, a model-version code), so a
batch reads and writes them with one array operation each, and no Python object is kept per session:
the ids live as bytes in ``IdIndex`` (below), which finds a batch's slots in one compiled call.
The pool grows by doubling up to ``capacity``; past it the least recently written session is evicted. Sessions idle past
``idle_ttl_s`` are evicted by ``sweep``. Evicted ids are remembered (bounded) so that a late event
can be told why.

Write order (for eviction) is a log of slots in the order they were written: writing a session
appends its slot and records the position (``_at[slot]``); an entry is live while its slot's
recorded position is still its own, so a rewrite or a removal leaves a stale entry that the scans
skip and the next compaction drops (amortized O(1) a write, no object per session).
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from aaren.jit import compiled
from aaren.server.stores.base import (
    ABSENT_LAST_TIME,
    LoadedBatch,
    Rows,
    SaveBatch,
    SessionMeta,
    SessionStore,
    StateLayout,
    as_arrays,
    as_tensors,
    take_rows,
)

__all__ = ["IdIndex", "MemoryStore"]

INITIAL_ROWS = 1024
_NOTHING_LOOKED_UP: tuple[Sequence[str], int, np.ndarray] = ((), -1, np.zeros(0, np.int64))
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
        #: numpy's fancy indexing (a fraction of a microsecond) where torch's index ops cost about three.
        self._arrays: dict[str, np.ndarray] | None = None
        #: the same pools as matrices ``[S, W]`` (views): what ``_put_rows`` writes through
        self._matrices: dict[str, np.ndarray] = {}
        self._view_pools()
        for k, array in (self._arrays or {}).items():  # _put_rows compiled (or loaded) for each field's rows now
            _put_rows(self._matrices[k], np.zeros(0, np.int64), np.ascontiguousarray(array[:0]))
        #: the ids of the last load, the index's changes then, and their slots (``load``, ``save``)
        self._looked_up: tuple[Sequence[str], int, np.ndarray] = _NOTHING_LOOKED_UP
        #: session id -> slot (and back, for eviction), with no Python object per session
        _warm()  # the compiled passes, ready before the first request
        self._index = IdIndex(rows)
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
        slots = self._index.lookup(session_ids)
        # a save of the same ids (the same list) before the index changes finds them here, not again
        self._looked_up = (session_ids, self._index.changes, slots)
        if self._arrays is not None:
            tensors: Rows = {k: array.take(slots, axis=0) for k, array in self._arrays.items()}  # (a third of [slots])
        else:
            index = self._positions(slots)
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
        ids, changes, slots = self._looked_up
        if ids is not session_ids or changes != self._index.changes:
            slots = self._index.lookup(session_ids)
        self._looked_up = _NOTHING_LOOKED_UP
        # Compare-and-set: slot 0's seq is 0, so a new session is written iff 0 was expected.
        ok, n_ok, n_new = _compare(slots, np.asarray(batch.expected_seqs, dtype=np.int64), self._seq)
        self._mark = self._tail
        written = None if n_ok == len(slots) else np.flatnonzero(ok)  # None: every session, in order
        dst = slots if written is None else slots[written]  # [W] their slots (0: new)
        if not n_new:
            self._append(dst)
        else:
            is_new = dst == 0
            # Existing sessions first, so that making room for new ones never evicts a row being written.
            new = np.flatnonzero(is_new)
            self._append(dst[~is_new])
            taken = self._take(len(new))
            dst[new] = taken
            self._append(taken)
            new_ids = [session_ids[i] for i in (new if written is None else written[new]).tolist()]
            self._index.insert(new_ids, taken)
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
            if self._arrays is not None:  # the pool is in host memory: rows from anywhere land there
                given = as_arrays(batch.tensors)
                for k, array in self._arrays.items():
                    rows = given[k] if written is None else given[k][written]
                    if rows.dtype == array.dtype and rows.flags.c_contiguous:  # a version compiled at start
                        _put_rows(self._matrices[k], dst, rows)
                    else:
                        array[dst] = rows
            else:
                rows_written = as_tensors(batch.tensors if written is None else take_rows(batch.tensors, written))
                index = self._positions(dst)
                for k, pool in self._pool.items():
                    pool.index_copy_(0, index, rows_written[k].to(pool.device, pool.dtype))
        self._shrink()  # back to capacity, sparing what this call wrote
        return ok.tolist()

    def _view_pools(self) -> None:
        """``_arrays``: the pools as numpy arrays sharing their memory (None off the CPU), and ``_matrices``: the
        same as ``[S, W]`` views (made again whenever the pools are)."""
        self._arrays = None if self._device.type != "cpu" else {k: pool.numpy() for k, pool in self._pool.items()}
        self._matrices = {k: _matrix(array) for k, array in (self._arrays or {}).items()}

    def _positions(self, positions: np.ndarray) -> Tensor:
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
        self._tail = _log_writes(self._log, self._at, self._tail, slots)

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
        self._view_pools()  # the same fields' types: _put_rows is compiled for them already
        self._index.grow(rows + 1)
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
        excess = len(self._index) - self.capacity
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
        ids = self._index.remove(slots)
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

    def _slot(self, session_id: str) -> int | None:
        slot = int(self._index.lookup((session_id,))[0])
        return slot or None

    async def get(self, session_id: str) -> tuple[SessionMeta, dict[str, Tensor]] | None:
        slot = self._slot(session_id)
        if slot is None:
            return None
        return self._meta(slot), {k: pool[slot : slot + 1].clone() for k, pool in self._pool.items()}

    async def delete(self, session_id: str) -> SessionMeta | None:
        slot = self._slot(session_id)
        if slot is None:
            return None
        meta = self._meta(slot)
        self._remove(np.array([slot], dtype=np.int64))
        return meta

    def was_evicted(self, session_id: str) -> bool:
        return session_id in self._evicted

    async def count(self) -> int:
        return len(self._index)

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


# -- session ids -> slots ------------------------------------------------------------------------
# Session ids -> slots for the memory store, without a Python object per session.
#
# A ``dict[str, int]`` costs a session about 150 bytes besides its state: the id ``str`` (72 bytes for 16
# ASCII characters), the dict's entry (about 40 bytes at a million entries) and the slot ``int`` (32 bytes
# past 256). ``IdIndex`` keeps the ids as UTF-8 bytes in one arena and finds them with an open-addressing
# table of slots (linear probing) keyed by each id's ``hash()``, the id's bytes compared on a hit: about 50
# bytes a session. Lookups, inserts and removals of a batch are one compiled call each (numba); the id
# ``str`` of a slot is made again only where one is asked for (eviction's tombstones, the cold paths).
#
# Slot 0 is never an id's: a lookup answers 0 for an id it does not hold (the memory store keeps the fresh
# row there). The caller owns the slots: ``insert`` takes ids it knows are absent and the free slots for them.

_EMPTY, _DELETED = -1, -2
#: the table is rebuilt (at most half full) when live and deleted entries fill more than this part of it
_MAX_LOAD = 0.7
#: the arena's room for the held ids' bytes after a compaction, as a multiple of them
_ARENA_SLACK = 1.5
_ENCODING = ("utf-8", "surrogatepass")


def _hashes(ids: Sequence[str]) -> np.ndarray:
    """Each id's ``hash()`` (int64 ``[n]``), read into the array as the iterator yields them (``np.fromiter``: no
    list of ints for numpy to inspect, about 15 % under ``np.array(list(...))`` at 64-256 ids)."""
    return np.fromiter(map(hash, ids), np.int64, len(ids))


def _encoded(ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The ids' bytes one after another (uint8, read-only) and each one's length in bytes (int64 ``[n]``), in
    ``_ENCODING``. Ids all ASCII (the common case) are encoded once, joined (a character is a byte): no Python
    loop an id, where an ``encode`` each took about 0.2 us an event of a 64-session batch."""
    joined = "".join(ids)
    if joined.isascii():
        return np.frombuffer(joined.encode("ascii"), np.uint8), np.fromiter(map(len, ids), np.int64, len(ids))
    encoded = [sid.encode(*_ENCODING) for sid in ids]
    return np.frombuffer(b"".join(encoded), np.uint8), np.fromiter(map(len, encoded), np.int64, len(encoded))


@compiled
def _same(arena: np.ndarray, start: int, query: np.ndarray, q_start: int, n: int) -> bool:
    for i in range(n):  # noqa: SIM110 (a loop numba compiles; all() of a generator it does not)
        if arena[start + i] != query[q_start + i]:
            return False
    return True


@compiled
def _lookup(
    table: np.ndarray,
    hashes: np.ndarray,
    offsets: np.ndarray,
    lengths: np.ndarray,
    arena: np.ndarray,
    q_hashes: np.ndarray,
    q_bytes: np.ndarray,
    q_lengths: np.ndarray,
) -> np.ndarray:
    """The slot of each query id ``q`` (its hash ``q_hashes[q]``, its ``q_lengths[q]`` bytes next in ``q_bytes``),
    0 where none holds it."""
    mask = table.shape[0] - 1
    out = np.zeros(q_hashes.shape[0], np.int64)
    start = 0
    for q in range(q_hashes.shape[0]):
        h = q_hashes[q]
        n = q_lengths[q]
        i = h & mask
        while True:
            slot = table[i]
            if slot == _EMPTY:
                break
            same = slot >= 0 and hashes[slot] == h and lengths[slot] == n
            if same and _same(arena, offsets[slot], q_bytes, start, n):
                out[q] = slot
                break
            i = (i + 1) & mask
        start += n
    return out


@compiled
def _place(table: np.ndarray, hashes: np.ndarray, slots: np.ndarray) -> int:
    """Enter ``slots`` (their hashes set) into ``table`` at the first free place of each probe; returns how
    many deleted places were reused."""
    mask = table.shape[0] - 1
    reused = 0
    for slot in slots:
        i = hashes[slot] & mask
        while table[i] >= 0:
            i = (i + 1) & mask
        if table[i] == _DELETED:
            reused += 1
        table[i] = slot
    return reused


@compiled
def _unplace(table: np.ndarray, hashes: np.ndarray, slots: np.ndarray) -> None:
    """Mark the places of ``slots`` (each in the table) deleted."""
    mask = table.shape[0] - 1
    for slot in slots:
        i = hashes[slot] & mask
        while table[i] != slot:
            i = (i + 1) & mask
        table[i] = _DELETED


@compiled
def _compact(arena: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, out: np.ndarray) -> int:
    """Copy the bytes of every held id (``lengths > 0``) into ``out``, one after another, their offsets moved
    there; returns the bytes used."""
    at = 0
    for slot in range(offsets.shape[0]):
        n = lengths[slot]
        if n > 0:
            start = offsets[slot]
            out[at : at + n] = arena[start : start + n]
            offsets[slot] = at
            at += n
    return at


class IdIndex:
    """Session ids of up to ``rows`` slots (slot 0 kept free) -> their slots (module docstring)."""

    def __init__(self, rows: int) -> None:
        self._hashes = np.zeros(rows, np.int64)
        self._offsets = np.zeros(rows, np.int64)
        self._lengths = np.zeros(rows, np.int32)  # 0: the slot holds no id
        self._arena = np.zeros(256, np.uint8)
        self._used = 0  # arena bytes written, the bytes of removed ids among them
        self._garbage = 0
        self._table = np.full(_table_size(rows), _EMPTY, np.int32)
        self._live = 0
        self._deleted = 0
        #: inserts and removals so far: a slot looked up before is still the id's while this is unchanged
        self.changes = 0

    def __len__(self) -> int:
        return self._live

    def grow(self, rows: int) -> None:
        """Room for slots up to ``rows`` (the store's pool grew)."""
        extra = rows - len(self._hashes)
        if extra > 0:
            self._hashes = np.concatenate([self._hashes, np.zeros(extra, np.int64)])
            self._offsets = np.concatenate([self._offsets, np.zeros(extra, np.int64)])
            self._lengths = np.concatenate([self._lengths, np.zeros(extra, np.int32)])

    def lookup(self, ids: Sequence[str]) -> np.ndarray:
        """The slot of each id (int64 ``[n]``), 0 where the index holds none."""
        if not self._live:
            return np.zeros(len(ids), np.int64)
        query, lengths = _encoded(ids)
        hashes = _hashes(ids)
        return _lookup(self._table, self._hashes, self._offsets, self._lengths, self._arena, hashes, query, lengths)

    def insert(self, ids: Sequence[str], slots: np.ndarray) -> None:
        """Enter ``ids`` (none held now, distinct) at ``slots`` (free ones)."""
        if not len(ids):
            return
        encoded, lengths = _encoded(ids)
        size = len(encoded)
        if self._used + size > len(self._arena):
            self._make_room(size)
        if self._live + self._deleted + len(ids) > _MAX_LOAD * len(self._table):
            self._rebuild(self._live + len(ids))  # the held ids only: the new ones are entered below
        starts = self._used + np.concatenate(([0], np.cumsum(lengths)[:-1]))
        self._arena[self._used : self._used + size] = encoded
        self._used += size
        self._offsets[slots] = starts
        self._lengths[slots] = lengths
        self._hashes[slots] = _hashes(ids)
        self._deleted -= _place(self._table, self._hashes, slots)
        self._live += len(ids)
        self.changes += 1

    def remove(self, slots: np.ndarray) -> list[str]:
        """Take the ids at ``slots`` (held ones) out; returns them."""
        ids = [self.id_of(int(slot)) for slot in slots.tolist()]
        _unplace(self._table, self._hashes, slots)
        self._garbage += int(self._lengths[slots].sum())
        self._lengths[slots] = 0
        self._live -= len(ids)
        self._deleted += len(ids)
        self.changes += 1
        return ids

    def id_of(self, slot: int) -> str:
        """The id at ``slot`` (a held one)."""
        start, n = int(self._offsets[slot]), int(self._lengths[slot])
        return self._arena[start : start + n].tobytes().decode(*_ENCODING)

    def _make_room(self, size: int) -> None:
        """Room for ``size`` more bytes: the held ids' bytes copied into an arena ``_ARENA_SLACK`` times their
        size (and ``size``), the removed ids' bytes left behind."""
        live = self._used - self._garbage
        arena = np.zeros(max(int(_ARENA_SLACK * (live + size)), 256), np.uint8)
        self._used = _compact(self._arena, self._offsets, self._lengths, arena)
        self._arena, self._garbage = arena, 0

    def _rebuild(self, live: int) -> None:
        """A table for ``live`` ids (every held slot entered again; the deleted places gone)."""
        self._table = np.full(_table_size(live), _EMPTY, np.int32)
        self._deleted = 0
        held = np.flatnonzero(self._lengths > 0)
        _place(self._table, self._hashes, held)


def _table_size(entries: int) -> int:
    """A power of two with ``entries`` at most half of it (rebuilt at ``_MAX_LOAD``)."""
    size = 16
    while size < 2 * entries:
        size *= 2
    return size


def _warm() -> None:
    """Compile (or load from numba's cache) the store's passes now, not on a first request: the index's and
    a save's."""
    index = IdIndex(4)
    index.insert(["a", "b"], np.array([1, 2]))
    index.lookup(["a", "c"])
    index.remove(np.array([1]))
    index.insert(["c"], np.array([1]))
    index._make_room(0)
    one = np.zeros(1, np.int64)
    _compare(one, one, one)
    _log_writes(np.zeros(2, np.int32), np.zeros(2, np.int32), 0, one)


# -- a save's compiled steps --------------------------------------------------------------------------
# The compare-and-set and the write order in one call each, where numpy's reductions (``all``, ``any``)
# cost a batch of one session about a microsecond each (numpy's gathers and scatters of a few rows stay:
# a fraction of that).


@compiled
def _compare(slots: np.ndarray, expected: np.ndarray, seq: np.ndarray) -> tuple[np.ndarray, int, int]:
    """The compare-and-set of a save: ``ok[i]`` where the stored seq of ``slots[i]`` is ``expected[i]``; how
    many are, and how many of those are new (slot 0)."""
    ok = np.empty(slots.shape[0], np.bool_)
    n_ok = n_new = 0
    for i in range(slots.shape[0]):
        ok[i] = seq[slots[i]] == expected[i]
        if ok[i]:
            n_ok += 1
            if slots[i] == 0:
                n_new += 1
    return ok, n_ok, n_new


def _matrix(rows: np.ndarray) -> np.ndarray:
    """A C-contiguous ``rows [n, ...]`` as ``[n, W]``, a view of the same memory (``_put_rows`` writes through it)."""
    if not rows.flags.c_contiguous:
        raise ValueError("_matrix: the rows must be C-contiguous (a reshape would copy them)")
    return rows.reshape(rows.shape[0], math.prod(rows.shape[1:]))


@compiled
def _put_rows(target: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> None:
    """``target[slots] = rows`` for a field's pool as a matrix, ``target [S, W]`` (``_matrix``), and its rows
    ``rows [n, ...]`` (C-contiguous, ``target``'s dtype, ``W`` items a row): one compiled call where numpy's
    assignment through an index array costs about 1.3 us a field for a few rows. Row by row, a loop over the row's
    items: it vectorizes (an assignment of an N-d array's row, ``target[s] = rows[i]``, copied item by item
    through its strides: 1,700 instructions a session for the event model's 5 fields, against 245 so)."""
    flat = rows.reshape((rows.shape[0], target.shape[1]))
    for i in range(slots.shape[0]):
        s = slots[i]
        for j in range(target.shape[1]):
            target[s, j] = flat[i, j]


@compiled
def _log_writes(log: np.ndarray, at: np.ndarray, tail: int, slots: np.ndarray) -> int:
    """Append ``slots`` to the write-order ``log`` at ``tail`` (room made), each slot's position in ``at``;
    the new tail."""
    for i in range(slots.shape[0]):
        log[tail + i] = slots[i]
        at[slots[i]] = tail + i
    return tail + slots.shape[0]
