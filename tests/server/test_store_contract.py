"""The session-store contract: every backend passes the same suite (memory and a real Redis)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import torch

from aaren.server.stores import SaveBatch, SessionMeta, StateLayout, as_tensors, open_store

LAYOUT = StateLayout(
    {
        "m": torch.full((2, 3), float("-inf")),
        "w": torch.zeros(2, 3, 4),
        "n_events": torch.zeros((), dtype=torch.long),
    }
)


def run_on(store, coro):
    """Run ``coro`` and close ``store`` on the same loop (a Redis client belongs to one event loop)."""

    async def go():
        try:
            return await coro
        finally:
            await store.close()

    return asyncio.run(go())


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def store_factory(request):
    if request.param == "memory":
        url = "memory://"
    elif request.param == "redis":
        url = request.getfixturevalue("redis_url")
    else:
        url = f"{request.getfixturevalue('redis_cluster').url}?prefix=c{uuid.uuid4().hex[:8]}:"

    def make(capacity: int = 100, idle_ttl_s: float = 3600.0):
        return open_store(url, LAYOUT, capacity=capacity, idle_ttl_s=idle_ttl_s)

    return make


def needs_capacity(store) -> None:
    if not store.bounded_by_capacity:
        pytest.skip(f"{type(store).__name__} is bounded by its server's memory limit, not a session count")


def meta(seq: int, updated: float | None = None) -> SessionMeta:
    now = time.time() if updated is None else updated
    return SessionMeta(last_seq=seq, last_time=float(seq), created_at=now, updated_at=now, model_version="v1")


def rows(n: int, fill: float) -> dict[str, torch.Tensor]:
    out = LAYOUT.empty(n)
    out["m"].fill_(fill)
    out["w"].fill_(fill * 2)
    out["n_events"].fill_(int(fill))
    return out


def test_unknown_sessions_load_fresh_rows(store_factory):
    store = store_factory()
    loaded = run_on(store, store.load(["a", "b"]))
    assert loaded.metas == [None, None]
    assert torch.isneginf(as_tensors(loaded.tensors)["m"]).all() and (as_tensors(loaded.tensors)["w"] == 0).all()
    assert as_tensors(loaded.tensors)["w"].shape == (2, 2, 3, 4)


def test_save_then_load_round_trips_rows_and_meta(store_factory):
    store = store_factory()

    async def go():
        assert await store.save(SaveBatch.of(["a", "b"], rows(2, 1.5), [meta(1), meta(1)], [0, 0])) == [True, True]
        loaded = await store.load(["b", "x", "a"])
        got = await store.get("a")
        return loaded, got, await store.count()

    loaded, got, count = run_on(store, go())
    assert [m.last_seq if m else None for m in loaded.metas] == [1, None, 1]
    read = as_tensors(loaded.tensors)
    assert (read["m"][[0, 2]] == 1.5).all() and torch.isneginf(read["m"][1]).all()
    assert (read["n_events"] == torch.tensor([1, 0, 1])).all()
    assert got is not None and got[0].last_seq == 1 and (got[1]["w"] == 3.0).all() and got[1]["w"].shape == (1, 2, 3, 4)
    assert count == 2


def test_compare_and_set_refuses_stale_writes(store_factory):
    store = store_factory()

    async def go():
        await store.save(SaveBatch.of(["a"], rows(1, 1.0), [meta(1)], [0]))
        stale_new = await store.save(SaveBatch.of(["a"], rows(1, 9.0), [meta(1)], [0]))  # as if "a" did not exist
        stale_old = await store.save(SaveBatch.of(["a"], rows(1, 9.0), [meta(3)], [2]))  # wrong expected seq
        ok = await store.save(SaveBatch.of(["a"], rows(1, 2.0), [meta(2)], [1]))
        return stale_new, stale_old, ok, await store.get("a")

    stale_new, stale_old, ok, (m, r) = run_on(store, go())
    assert stale_new == [False] and stale_old == [False] and ok == [True]
    assert m.last_seq == 2 and (r["m"] == 2.0).all()


def test_two_writers_of_identical_bytes_have_one_winner(store_factory):
    """Two replicas stepping the same state with the same events at the same wall-clock time save
    byte-identical rows and metas from the same expected seq: only the first write wins."""
    store = store_factory()
    same = meta(1, updated=1_900_000_000.0)

    async def go():
        first = await store.save(SaveBatch.of(["a"], rows(1, 3.0), [same], [0]))
        second = await store.save(SaveBatch.of(["a"], rows(1, 3.0), [same], [0]))
        return first, second, await store.get("a")

    first, second, (m, r) = run_on(store, go())
    assert first == [True] and second == [False]
    assert m.last_seq == 1 and (r["m"] == 3.0).all()


def test_mixed_batch_writes_only_the_rows_that_match(store_factory):
    store = store_factory()

    async def go():
        await store.save(SaveBatch.of(["a"], rows(1, 1.0), [meta(1)], [0]))
        written = await store.save(SaveBatch.of(["a", "b", "c"], rows(3, 5.0), [meta(2), meta(1), meta(1)], [7, 0, 0]))
        return written, await store.load(["a", "b", "c"])

    written, loaded = run_on(store, go())
    assert written == [False, True, True]
    assert (as_tensors(loaded.tensors)["m"][0] == 1.0).all() and (as_tensors(loaded.tensors)["m"][1:] == 5.0).all()


def test_delete_returns_what_was_there(store_factory):
    store = store_factory()

    async def go():
        await store.save(SaveBatch.of(["a"], rows(1, 1.0), [meta(1)], [0]))
        first = await store.delete("a")
        second = await store.delete("a")
        return first, second, await store.get("a"), await store.load(["a"]), await store.count()

    first, second, got, loaded, count = run_on(store, go())
    assert first is not None and first.last_seq == 1 and second is None and got is None
    assert loaded.metas == [None] and torch.isneginf(as_tensors(loaded.tensors)["m"]).all() and count == 0


def test_ttl_sweep_evicts_idle_sessions_and_remembers_them(store_factory):
    store = store_factory(idle_ttl_s=10.0)
    causes = []
    store.on_evict = causes.append

    async def go():
        now = time.time()
        await store.save(SaveBatch.of(["old", "new"], rows(2, 1.0), [meta(1, now - 60), meta(1, now)], [0, 0]))
        n = await store.sweep(now)
        return n, await store.get("old"), await store.get("new")

    n, old, new = run_on(store, go())
    # A backend that expires sessions itself reports the eviction when it first sees it gone.
    assert n == (0 if store.expires_by_itself else 1)
    assert old is None and new is not None and causes == ["ttl"]
    assert store.was_evicted("old") and not store.was_evicted("new")


def test_capacity_evicts_least_recently_written(store_factory):
    store = store_factory(capacity=2)
    needs_capacity(store)
    causes = []
    store.on_evict = causes.append

    async def go():
        await store.save(SaveBatch.of(["a"], rows(1, 1.0), [meta(1)], [0]))
        await store.save(SaveBatch.of(["b"], rows(1, 2.0), [meta(1)], [0]))
        await store.save(SaveBatch.of(["a"], rows(1, 3.0), [meta(2)], [1]))  # "b" is now the least recent
        await store.save(SaveBatch.of(["c"], rows(1, 4.0), [meta(1)], [0]))
        return await store.get("a"), await store.get("b"), await store.get("c"), await store.count()

    a, b, c, count = run_on(store, go())
    assert b is None and a is not None and c is not None and count == 2 and causes == ["capacity"]
    assert (a[1]["m"] == 3.0).all() and (c[1]["m"] == 4.0).all()
    assert store.was_evicted("b")


def test_many_sessions_grow_the_pool_without_losing_rows(store_factory):
    store = store_factory(capacity=5000)
    ids = [f"s{i}" for i in range(3000)]

    async def go():
        data = rows(3000, 0.0)
        data["m"] = torch.arange(3000, dtype=torch.float32).view(-1, 1, 1).expand(-1, 2, 3).clone()
        await store.save(SaveBatch.of(ids, data, [meta(1) for _ in ids], [0] * 3000))
        return await store.load(ids[::-1])

    loaded = run_on(store, go())
    assert torch.equal(as_tensors(loaded.tensors)["m"][:, 0, 0], torch.arange(2999, -1, -1, dtype=torch.float32))


def test_every_item_of_every_field_comes_back_as_saved(store_factory):
    """Distinct values in every item of every field (a session's rows of 1, 2 and 3 dimensions), saved over earlier
    rows of some sessions, in an order other than the slots', then loaded: each session's rows as last saved."""
    store = store_factory(capacity=100)
    ids = [f"q{i}" for i in range(40)]
    g = torch.Generator().manual_seed(3)

    def random_rows(n: int) -> dict[str, torch.Tensor]:
        return {
            "m": torch.randn(n, 2, 3, generator=g),
            "w": torch.randn(n, 2, 3, 4, generator=g),
            "n_events": torch.randint(0, 1 << 40, (n,), generator=g),
        }

    async def go():
        first, second = random_rows(40), random_rows(25)
        await store.save(SaveBatch.of(ids, first, [meta(1) for _ in ids], [0] * 40))
        again = ids[::-3] + [ids[i] for i in (1, 2, 4, 5, 7, 8, 10, 11, 13, 14, 16)]  # distinct, out of slot order
        await store.save(SaveBatch.of(again, second, [meta(2) for _ in again], [1] * 25))
        want = {k: v.clone() for k, v in first.items()}
        for j, sid in enumerate(again):
            for k in want:
                want[k][ids.index(sid)] = second[k][j]
        return want, await store.load(ids)

    want, loaded = run_on(store, go())
    got = as_tensors(loaded.tensors)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_unknown_store_url_is_refused():
    with pytest.raises(ValueError, match="unsupported store URL 'sqlite://x'"):
        open_store("sqlite://x", LAYOUT, capacity=1, idle_ttl_s=1)


def test_batch_larger_than_capacity_keeps_every_row_it_wrote(store_factory):
    """A write answered as stored stays readable: a batch wider than the capacity is kept whole,
    and the next write brings the store back to capacity, least recently written first."""
    store = store_factory(capacity=2)
    needs_capacity(store)
    causes = []
    store.on_evict = causes.append

    async def go():
        data = rows(3, 0.0)
        data["m"] = torch.tensor([1.0, 2.0, 3.0]).view(-1, 1, 1).expand(-1, 2, 3).clone()
        written = await store.save(SaveBatch.of(["a", "b", "c"], data, [meta(1)] * 3, [0, 0, 0]))
        after_batch = [await store.get(s) for s in "abc"]
        await store.save(SaveBatch.of(["d"], rows(1, 4.0), [meta(1)], [0]))
        return written, after_batch, [await store.get(s) for s in "abcd"], await store.count()

    written, after_batch, later, count = run_on(store, go())
    assert written == [True, True, True]
    assert [float(got[1]["m"].flatten()[0]) for got in after_batch] == [1.0, 2.0, 3.0]
    assert [got is not None for got in later] == [False, False, True, True] and count == 2
    assert causes == ["capacity", "capacity"]


def test_bad_capacity_in_url_is_refused():
    for raw in ("0", "-5", "x"):
        with pytest.raises(ValueError, match="capacity must be a whole number >= 1"):
            open_store(f"memory://?capacity={raw}", LAYOUT, capacity=10, idle_ttl_s=1)
