"""``numba.njit`` with numba's disk cache where one can be written: the project's compiled loops.

The serving kernel (``aaren_core.tasks.event.kernel``), the batch's plan (``aaren.server.core.batcher``),
the memory store's id index and the aaren.v1 request reader are compiled with numba. Each is cached on
disk (in ``NUMBA_CACHE_DIR`` where set, else in ``__pycache__`` beside its module, else in numba's
user-wide directory), so that a process loads its machine code instead of compiling it; where none is
writable (a read-only install, a user without a home) it is compiled once per process instead. numba
is imported when a function is compiled, not when this module is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["compiled"]


def compiled(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``numba.njit(fn, cache=True, nogil=True, **options)``, uncached where numba finds no place for a
    cache; as ``@compiled`` or ``@compiled(error_model="numpy", ...)``."""
    import numba

    def compile_(function: Callable[..., Any]) -> Any:
        try:
            return numba.njit(cache=True, nogil=True, **options)(function)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            return numba.njit(cache=False, nogil=True, **options)(function)

    return compile_ if fn is None else compile_(fn)
