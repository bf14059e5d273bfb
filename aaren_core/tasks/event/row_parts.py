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
on a queue (no spinning: a worker takes no CPU from gRPC's threads between batches). A worker starts its part late
(it wakes on a CPU that idled) and runs it slower than the caller (whose caches hold the batch), so equal parts leave
the caller waiting for the workers, then waking late itself: on 2 Zen 4 vCPUs, 256 rows in two equal parts, the
worker started 86 µs after the call and took 748 µs to the caller's 681, and the caller returned 66 µs after the
worker ended (the engine core's 256-session batches, mean per call). So the caller's part is sized by what the calls
before measured (``lead``: its rows over a worker's), to end with the workers': there, in three runs of each, the
call's median wall time went from 741-823 µs (equal parts) to 686-725 µs (``lead`` settling at 1.2-1.5). Where the
parts are cut changes no bit of the numbers (rows are independent; the kernel's chunks never leave a row to its
loops, ``kernel.CHUNK``).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
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
        #: the caller's part's rows over a worker part's (``parts``), learned from the calls' times (``_learn``)
        self.lead = 1.0


_config = _Config()


def set_threads(count: int, min_rows: int = MIN_PART_ROWS) -> None:
    """Split a call of ``B`` rows into ``min(count, B // min_rows)`` parts, each on its own thread (the caller's
    among them); ``count = 1``: every call in one part, on the caller's thread. The workers of the same count are
    kept (a new ``min_rows`` alone costs nothing). Raises ``ValueError`` for a count or ``min_rows`` under 1."""
    if count < 1 or min_rows < 1:
        raise ValueError(f"kernel threads: expected a count and a part's rows of 1 or more, got {count}, {min_rows}")
    with _config.lock:
        _config.min_rows = min_rows
        _config.lead = 1.0
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
    """``[(start, stop), ...]``: ``rows`` cut into consecutive parts, as many as the threads allow with ``min_rows``
    rows or more each (at least one part); the first (the caller's) ``lead`` times a worker's, the others of nearly
    equal size. ``lead`` is 1 after ``set_threads`` and learned from then on (``in_parts``), between ``MIN_LEAD`` and
    ``MAX_LEAD``, so that a part may have as few as 2/3 of ``min_rows``."""
    count = min(_config.threads, rows // _config.min_rows)
    if count <= 1:  # every batch on one thread, and every small one: no list of bounds to build
        return [(0, rows)]
    first = min(max(1, int(rows * _config.lead / (_config.lead + count - 1))), rows - count + 1)
    rest = rows - first
    bounds = [0, *(first + rest * i // (count - 1) for i in range(count))]
    return list(itertools.pairwise(bounds))


#: the bounds of ``lead`` (the caller's part's rows over a worker part's) and the weight of each call's measure in it
MIN_LEAD, MAX_LEAD, LEAD_STEP = 0.5, 2.0, 0.25


def in_parts(run: Callable[[int, int], T], bounds: list[tuple[int, int]]) -> list[T]:
    """``[run(start, stop) for each part]``, the first on this thread and the others on the workers, all
    finished before it returns (or raises the first part's error, in part order). The parts' times move
    ``lead`` (``parts``) toward the caller's part that would have ended with the workers'."""
    pool = _config.pool
    if len(bounds) == 1 or pool is None:
        return [run(start, stop) for start, stop in bounds]
    called = time.perf_counter()
    futures = [pool.submit(_timed, run, start, stop) for start, stop in bounds[1:]]
    try:
        began = time.perf_counter()
        first = run(*bounds[0])
        ended = time.perf_counter()
    finally:
        concurrent.futures.wait(futures)  # no part outlives the call, whatever the first part raised
    done = [f.result() for f in futures]
    _learn(bounds, ended - began, [(b - called, e - b) for _, b, e in done])
    return [first, *(result for result, _, _ in done)]


def _timed(run: Callable[[int, int], T], start: int, stop: int) -> tuple[T, float, float]:
    began = time.perf_counter()
    result = run(start, stop)
    return result, began, time.perf_counter()


def _learn(bounds: list[tuple[int, int]], caller_s: float, workers: list[tuple[float, float]]) -> None:
    """Move ``lead`` a step toward the caller's share that would have ended with the workers, from this call's
    times: the caller's ``caller_s`` over its rows ``r0`` (``a0`` a row), each worker's start after the call
    (``delay``) and seconds over its rows (``aw`` a row): ``r0 a0 = delay + (R - r0) aw / (P - 1)`` for the
    ``R`` rows of ``P`` parts."""
    sizes = [stop - start for start, stop in bounds]
    r0, rest, others = sizes[0], sum(sizes[1:]), len(sizes) - 1
    worker_s = sum(seconds for _, seconds in workers)
    if r0 <= 0 or rest <= 0 or caller_s <= 0 or worker_s <= 0:
        return
    a0, aw = caller_s / r0, worker_s / rest
    delay = sum(d for d, _ in workers) / others
    total = r0 + rest
    ideal = (delay + total * aw / others) / (a0 + aw / others)  # the caller's rows
    ideal = min(max(ideal, 1.0), total - others)
    target = min(max(ideal / ((total - ideal) / others), MIN_LEAD), MAX_LEAD)
    _config.lead += LEAD_STEP * (target - _config.lead)
