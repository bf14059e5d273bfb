"""The memory store's id index (``aaren.server.stores.memory.IdIndex``) against a dict, over random inserts,
removals and lookups: ids of every kind of character (accents, emoji, a lone surrogate, NUL), ids that are
prefixes of each other, the pool growing under it, the table rebuilt and the byte arena compacted many
times over."""

from __future__ import annotations

import random

import numpy as np
import pytest

from aaren.server.stores.memory import IdIndex

ALPHABET = ["a", "ab", "é", "🙂", "x\x00y", "\ud800", "s" * 300, ""]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_index_agrees_with_a_dict(seed: int) -> None:
    rng = random.Random(seed)
    index, held, rows = IdIndex(8), {}, 8
    free = list(range(rows - 1, 0, -1))  # slot 0 is never an id's
    for step in range(6000):
        if rng.random() < 0.55 or not held:
            drawn = [rng.choice(ALPHABET) + str(rng.randint(0, 2000)) for _ in range(rng.randint(1, 6))]
            new = [sid for sid in dict.fromkeys(drawn) if sid not in held]
            while len(free) < len(new):
                index.grow(2 * rows)
                free = list(range(2 * rows - 1, rows - 1, -1)) + free
                rows *= 2
            slots = np.array([free.pop() for _ in new], dtype=np.int64)
            index.insert(new, slots)
            held.update(zip(new, slots.tolist(), strict=True))
        else:
            gone = rng.sample(sorted(held), min(len(held), rng.randint(1, 5)))
            assert index.remove(np.array([held[sid] for sid in gone], dtype=np.int64)) == gone
            free += [held.pop(sid) for sid in gone]
        asked = [*rng.sample(sorted(held), min(len(held), 4)), f"absent-{step}", "a"]
        assert index.lookup(asked).tolist() == [held.get(sid, 0) for sid in asked]
        assert len(index) == len(held)
    for sid, slot in held.items():
        assert index.id_of(slot) == sid
    assert index.lookup([]).tolist() == []


def test_ids_of_one_hash_are_told_apart_by_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every id hashed alike (probing past each other), and ids that differ only in their length or last byte."""
    from aaren.server.stores import memory

    monkeypatch.setattr(memory, "hash", lambda sid: 12345, raising=False)
    index = IdIndex(64)
    names = ["s", "s1", "s2", "t2", "s22", "é", "e"]
    index.insert(names, np.arange(1, len(names) + 1))
    assert index.lookup([*names, "s3", "ss"]).tolist() == [*range(1, len(names) + 1), 0, 0]
    assert index.remove(np.array([2, 5])) == ["s1", "s22"]
    assert index.lookup(names).tolist() == [1, 0, 3, 4, 0, 6, 7]
    index.insert(["s22"], np.array([9]))
    assert index.lookup(["s22", "s1"]).tolist() == [9, 0]


def test_the_stores_torch_path_keeps_what_its_numpy_path_keeps() -> None:
    """Off the CPU the memory store gathers and scatters with torch's index ops (on the CPU, through numpy
    views of its pools): the same rows and metadata either way, as sessions come, change and go."""
    import asyncio

    import torch

    from aaren.server.stores.base import SaveBatch, StateLayout
    from aaren.server.stores.memory import MemoryStore

    layout = StateLayout({"m": torch.zeros(2, 3), "n": torch.zeros((), dtype=torch.int64)})
    stores = [MemoryStore(layout, capacity=40, idle_ttl_s=3600.0) for _ in range(2)]
    stores[1]._arrays = None  # the torch path, as on a GPU

    async def run() -> None:
        rng = np.random.default_rng(0)
        seqs: dict[str, int] = {}
        for step in range(60):
            ids = sorted({f"s{int(i)}" for i in rng.integers(0, 60, 8)})
            expected = np.array([seqs.get(sid, 0) for sid in ids], dtype=np.int64)
            rows = {"m": torch.randn(len(ids), 2, 3), "n": torch.arange(len(ids), dtype=torch.int64) + step}
            saved = SaveBatch(ids, rows, expected + 1, np.full(len(ids), float(step)), np.zeros(len(ids)),
                              np.full(len(ids), float(step)), "v1", expected)  # fmt: skip
            assert await stores[0].save(saved) == await stores[1].save(saved)
            for sid in ids:
                seqs[sid] = seqs.get(sid, 0) + 1
            if step % 7 == 3:
                gone = ids[0]
                await stores[0].delete(gone)
                await stores[1].delete(gone)
                seqs.pop(gone)
            asked = [f"s{i}" for i in range(60)]
            a, b = await stores[0].load(asked), await stores[1].load(asked)
            assert a.present.tolist() == b.present.tolist() and a.last_seq.tolist() == b.last_seq.tolist()
            assert all(torch.equal(torch.as_tensor(a.tensors[k]), torch.as_tensor(b.tensors[k])) for k in ("m", "n"))

    asyncio.run(run())
