"""Marks: the kind of each event, written as a name or an integer id.

For a model (its ``mark_names``, or only its ``num_marks``) ``mark_reader`` maps a cell to the
model's id: a name of the model (``"03"`` also finds the name ``"3"``), else an integer id in
``0 .. num_marks - 1``. To train, ``learn_marks`` derives the ids from a file's own marks: all
non-negative integers are the ids themselves, anything else makes the sorted distinct names.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from aaren.formats.errors import DataError

__all__ = ["MAX_INT_MARK", "learn_marks", "mark_reader", "mark_text", "preview"]

#: Integer marks are used as ids directly; beyond this many ids they are surely codes, not ids.
MAX_INT_MARK = 1 << 20


def preview(names: Sequence[str], limit: int = 20) -> str:
    """``['a', 'b', ...] (n marks)``: the first ``limit`` names, for messages."""
    shown = ", ".join(repr(x) for x in names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}] ({len(names)} marks)"


def mark_text(cell: Any) -> str:
    """A mark cell as stripped text; ``ValueError`` when it is empty."""
    s = "" if cell is None else str(cell).strip()
    if not s:
        raise ValueError("empty mark; expected a mark name or an integer id")
    return s


def _as_int(cell: Any) -> int | None:
    if isinstance(cell, bool):
        return None
    try:
        return operator.index(cell)  # int and numpy integers, not 2.5
    except TypeError:
        pass
    try:
        return int(str(cell).strip())
    except ValueError:
        return None


def mark_reader(names: Sequence[str], num_marks: int = 0) -> Callable[[Any], int]:
    """``cell -> id`` for a model with mark ``names`` (possibly none) and ``num_marks`` ids (0: unchecked).

    A name wins over an id: with names ``("10", "20")`` the cell ``"10"`` is id 0. Raises
    ``ValueError`` for an empty cell or one that is neither a name nor an id in range.
    """
    lookup = {name: i for i, name in enumerate(names)}
    n = num_marks or len(names)

    def read(cell: Any) -> int:
        s = mark_text(cell)
        mid = lookup.get(s)
        if mid is not None:
            return mid
        k = _as_int(cell)
        if k is not None and str(k) in lookup:
            return lookup[str(k)]
        if k is not None and k >= 0 and (not n or k < n):
            return k
        ids = f"an integer id in 0..{n - 1}" if n else "a non-negative integer id"
        if lookup:
            raise ValueError(f"unknown mark {s!r}; expected one of the model's marks {preview(names)} or {ids}")
        raise ValueError(f"mark {s!r} is not a mark of the model (it has no mark names); expected {ids}")

    return read


def learn_marks(marks: Sequence[str], where: Callable[[int], str]) -> tuple[list[int], tuple[str, ...]]:
    """Ids ``[n]`` and names (id -> name) for the mark texts of a file, to train on.

    All non-negative integers: the integers are the ids (names ``"0"``, ``"1"``, ...), below
    ``MAX_INT_MARK``; otherwise the distinct texts, sorted, are the names. ``where(i)`` names row
    ``i`` in a ``DataError``.
    """
    distinct = set(marks)
    as_int = {m: _as_int(m) for m in distinct}
    if marks and all(k is not None and k >= 0 for k in as_int.values()):
        top = max(k for k in as_int.values() if k is not None)
        if top >= MAX_INT_MARK:
            first = next(i for i, m in enumerate(marks) if as_int[m] == top)
            raise DataError(
                f"{where(first)}: integer mark {top} used as an id would make {top + 1} marks; "
                f"expected ids below {MAX_INT_MARK} (write codes like this as strings, e.g. 'c{top}')"
            )
        return [as_int[m] for m in marks], tuple(str(k) for k in range(top + 1))  # type: ignore[misc]
    names = tuple(sorted(distinct))
    index = {name: k for k, name in enumerate(names)}
    return [index[m] for m in marks], names
