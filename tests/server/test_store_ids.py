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
