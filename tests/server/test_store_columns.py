"""The stores' columnar batches (``LoadedBatch``, ``SaveBatch``) and the memory store's write order
(a log of slots, compacted as it goes) keeping eviction by capacity and the TTL sweep exact."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest
import torch

from aaren.server.stores import LoadedBatch, SaveBatch, SessionMeta, StateLayout, open_store

LAYOUT = StateLayout({"m": torch.zeros(2, 3), "n_events": torch.zeros((), dtype=torch.long)})


def rows(n: int, fill: float) -> dict[str, torch.Tensor]:
    out = LAYOUT.empty(n)
    out["m"].fill_(fill)
    out["n_events"].fill_(int(fill))
    return out


def saved(ids: list[str], seqs: list[int], expected: list[int], updated: float, version: str = "v1") -> SaveBatch:
    n = len(ids)
    return SaveBatch(
        ids,
        rows(n, float(seqs[0])),
        np.array(seqs, dtype=np.int64),
        np.array(seqs, dtype=np.float64) + 0.5,
        np.full(n, 7.0),
        np.full(n, updated),
        version,
        np.array(expected, dtype=np.int64),
    )


def run(store, body):
    async def go():
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(go())


@pytest.fixture(params=["memory", "redis"])
def store_url(request):
    return "memory://" if request.param == "memory" else request.getfixturevalue("redis_url")


def test_loaded_columns_say_what_is_held(store_url):
    store = open_store(store_url, LAYOUT, capacity=10, idle_ttl_s=3600.0)
    now = time.time()  # Redis expires a record idle_ttl_s after its updated_at

    async def body(store):
        assert await store.save(saved(["a", "b"], [3, 1], [0, 0], updated=now)) == [True, True]
        assert await store.save(saved(["b"], [2], [5], updated=now + 1)) == [False]  # a stale expectation
        return await store.load(["x", "b", "a"])

    loaded: LoadedBatch = run(store, body)
    assert loaded.present.tolist() == [False, True, True]
    assert loaded.last_seq.tolist() == [0, 1, 3]
    assert loaded.last_time[0] == -math.inf and loaded.last_time[1:].tolist() == [1.5, 3.5]
    assert loaded.created_at[1:].tolist() == [7.0, 7.0] and loaded.updated_at[1:].tolist() == [now, now]
    assert loaded.version[0] == -1 and [loaded.versions[c] for c in loaded.version[1:]] == ["v1", "v1"]
    assert loaded.metas == [None, SessionMeta(1, 1.5, 7.0, now, "v1"), SessionMeta(3, 3.5, 7.0, now, "v1")]


def test_one_save_writes_one_model_version():
    with pytest.raises(ValueError, match="one model version"):
        SaveBatch.of(["a", "b"], rows(2, 1.0), [SessionMeta(1, 1, 1, 1, "v1"), SessionMeta(1, 1, 1, 1, "v2")], [0, 0])


@pytest.mark.parametrize("rewrites", range(14))
def test_capacity_eviction_order_survives_log_compactions(rewrites):
    """Capacity 2, whatever the number of rewrites before (the log of 6 entries compacts at
    different points, also in the middle of a save): a save of one rewrite and two new sessions
    evicts the older untouched session and keeps all three (answered as stored); the next new
    session evicts the least recently written, and the store is back to two."""
    store = open_store("memory://", LAYOUT, capacity=2, idle_ttl_s=3600.0)
    causes: list[str] = []
    store.on_evict = causes.append

    async def body(store):
        await store.save(saved(["a", "b"], [1, 1], [0, 0], updated=1.0))
        seq = {"a": 1, "b": 1}
        for i in range(rewrites):
            sid = "ab"[i % 2]
            assert await store.save(saved([sid], [seq[sid] + 1], [seq[sid]], updated=1.0)) == [True]
            seq[sid] += 1
        older = "a" if rewrites % 2 == 0 else "b"  # the one written longest ago
        newer = "b" if older == "a" else "a"
        written = await store.save(saved([newer, "c", "d"], [seq[newer] + 1, 1, 1], [seq[newer], 0, 0], updated=2.0))
        after = {s: await store.get(s) is not None for s in ("a", "b", "c", "d")}
        count = await store.count()
        await store.save(saved(["e"], [1], [0], updated=3.0))
        held = {s: await store.get(s) is not None for s in ("a", "b", "c", "d", "e")}
        return older, newer, written, after, count, held, await store.count()

    older, newer, written, after, count, held, count_after = run(store, body)
    assert written == [True, True, True]
    assert after == {older: False, newer: True, "c": True, "d": True} and count == 3
    assert held == {older: False, newer: False, "c": False, "d": True, "e": True} and count_after == 2
    assert causes == ["capacity"] * 3
    assert store.was_evicted(older) and store.was_evicted(newer) and store.was_evicted("c")


def test_sweep_goes_in_write_order_and_stops_at_the_first_fresh_session():
    """The sweep evicts from the least recently written and stops at the first session not idle
    past the TTL, also after many rewrites (log compactions): a session rewritten with an old
    ``updated_at`` behind a fresh one waits for it."""
    store = open_store("memory://", LAYOUT, capacity=4, idle_ttl_s=100.0)
    causes: list[str] = []
    store.on_evict = causes.append

    async def body(store):
        await store.save(saved(["a"], [1], [0], updated=0.0))
        await store.save(saved(["b"], [1], [0], updated=10.0))
        for s in range(1, 40):
            await store.save(saved(["a"], [s + 1], [s], updated=0.0))
        early = await store.sweep(105.0)  # b (idle 95 s) leads and is fresh: nothing goes
        held = await store.count()
        late = await store.sweep(120.0)
        return early, held, late, await store.count()

    early, held, late, count = run(store, body)
    assert (early, held, late, count) == (0, 2, 2, 0)
    assert causes == ["ttl", "ttl"]


def test_many_sessions_keep_their_metadata_through_growth_and_eviction():
    """3,000 sessions through a store of capacity 1,000 in batches of 256: the last 1,000 stay,
    each with its own seq and times, and loads of held and evicted ones agree with ``get``."""
    store = open_store("memory://", LAYOUT, capacity=1000, idle_ttl_s=3600.0)
    ids = [f"s{i}" for i in range(3000)]

    async def body(store):
        for lo in range(0, 3000, 256):
            part = ids[lo : lo + 256]
            seqs = [1 + i % 7 for i in range(lo, lo + len(part))]
            batch = saved(part, seqs, [0] * len(part), updated=float(lo))
            assert await store.save(batch) == [True] * len(part)
        loaded = await store.load(ids)
        got = [await store.get(s) for s in ids[::97]]
        return loaded, got, await store.count()

    loaded, got, count = run(store, body)
    assert count == 1000 and loaded.present.tolist() == [False] * 2000 + [True] * 1000
    assert loaded.last_seq[2000:].tolist() == [1 + i % 7 for i in range(2000, 3000)]
    assert (loaded.last_time[2000:] == loaded.last_seq[2000:] + 0.5).all()
    for sid, found in zip(ids[::97], got, strict=True):
        i = ids.index(sid)
        assert (found is None) == (i < 2000)
        if found is not None:
            assert found[0] == loaded.meta(i)
