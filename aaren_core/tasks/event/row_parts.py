"""One kernel call's rows in parts on several threads: a large batch uses the CPUs the process has.

The event kernel computes each row of a batch from that row's inputs alone (``kernel.EventKernel``), and its
compiled code runs without the GIL (``aaren.jit.compiled``: ``nogil``). So a batch of ``B`` rows can be cut into
``P`` consecutive parts, each part computed by its own call on its own thread, writing its rows of one set of
output arrays: the same numbers, bit for bit, where the kernel's BLAS sums a row's products in the same order
whatever the rows beside it (``blas.rows_exact``, which the kernel's own choice passes; tests/core/test_row_parts.py).

Off by default (``set_threads(1)``), as ``torch.set_num_threads`` leaves a library's caller to choose: the server
sets it from ``kernel_threads`` (``aaren.server.settings``). A part has at least ``min_rows`` rows: a call's fixed
cost (its arguments, its scratch, the weights packed again by the BLAS, a worker's wake-up: some 30 µs on a 2-CPU
VM) makes small parts slower than one call. Measured on 2 AMD EPYC (Zen 4) vCPUs, the bundled model, one call
against two parts on two threads (``bench.kernel``, ``bench/results/round_row_parts.md``): 64 rows 257 -> 296 µs
(slower), 128 rows 497 -> 466 µs, 256 rows 1,001 -> 684 µs, 512 rows 1,978 -> 1,318 µs. Two parts take more than
half of one call's time: the two vCPUs slow each other (two processes of single-threaded ``sgemm`` each ran at 0.82
of one alone).

The calling thread computes the first part itself; the others go to a pool of ``threads - 1`` workers that wait
on a queue (no spinning: a worker takes no CPU from gRPC's threads between batches).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["MIN_PART_ROWS", "in_parts", "parts", "set_threads", "threads"]

T = TypeVar("T")

#: The fewest rows a part has: a batch of fewer than 256 rows is one call. Two parts of 64 rows took 0.91-0.94 of one
#: call's time, and served (batched messages, 64-256 rows a batch) parts of 64 rows cost 12-16 % more server CPU an
#: event for the same events/s; two parts of 128 rows take 0.68-0.73 of one call's time
MIN_PART_ROWS = 128


class _Config:
    """The process's setting: threads, the fewest rows a part, the workers (None while ``threads`` is 1)."""

    def __init__(self) -> None:
        self.threads = 1
        self.min_rows = MIN_PART_ROWS
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.lock = threading.Lock()


_config = _Config()


def set_threads(count: int, min_rows: int = MIN_PART_ROWS) -> None:
    """Split a call of ``B`` rows into ``min(count, B // min_rows)`` parts, each on its own thread (the caller's
    among them); ``count = 1``: every call in one part, on the caller's thread. The workers of the same count are
    kept (a new ``min_rows`` alone costs nothing). Raises ``ValueError`` for a count or ``min_rows`` under 1."""
    if count < 1 or min_rows < 1:
        raise ValueError(f"kernel threads: expected a count and a part's rows of 1 or more, got {count}, {min_rows}")
    with _config.lock:
        _config.min_rows = min_rows
        if count == _config.threads:
            return  # the same workers serve
        old = _config.pool
        _config.pool = (
            concurrent.futures.ThreadPoolExecutor(count - 1, thread_name_prefix="aaren-kernel") if count > 1 else None
        )
        _config.threads = count
    if old is not None:
        old.shutdown(wait=True)


def threads() -> int:
    """The threads a large call is split across (``set_threads``)."""
    return _config.threads


def parts(rows: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: ``rows`` cut into consecutive parts of nearly equal size, as many as the
    threads allow with ``min_rows`` rows or more each (at least one part)."""
    count = min(_config.threads, rows // _config.min_rows)
    if count <= 1:  # every batch on one thread, and every small one: no list of bounds to build
        return [(0, rows)]
    bounds = [rows * i // count for i in range(count + 1)]
    return list(itertools.pairwise(bounds))


def in_parts(run: Callable[[int, int], T], bounds: list[tuple[int, int]]) -> list[T]:
    """``[run(start, stop) for each part]``, the first on this thread and the others on the workers, all
    finished before it returns (or raises the first part's error, in part order)."""
    pool = _config.pool
    if len(bounds) == 1 or pool is None:
        return [run(start, stop) for start, stop in bounds]
    futures = [pool.submit(run, start, stop) for start, stop in bounds[1:]]
    try:
        first = run(*bounds[0])
    finally:
        concurrent.futures.wait(futures)  # no part outlives the call, whatever the first part raised
    return [first, *(f.result() for f in futures)]
