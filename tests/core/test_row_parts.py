"""A kernel call's rows in parts on several threads (aaren_core.tasks.event.row_parts): the parts, the threads
they run on, and the kernel's outputs the same bits as one call's, with the BLAS the kernel chooses and every BLAS
found here whose rows pass ``blas.rows_exact``; how the kernel chooses its BLAS by that probe."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from test_kernel import events, model_of, state_arrays

from aaren_core.tasks.event import blas as blas_module
from aaren_core.tasks.event import row_parts
from aaren_core.tasks.event.blas import NO_BLAS, available, rows_exact
from aaren_core.tasks.event.fused import FusedEventModel
from aaren_core.tasks.event.kernel import EventKernel

LEVELS = (0.1, 0.5, 0.9)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One thread before and after each test (a server started in this process earlier sets its own count)."""
    row_parts.set_threads(1)
    yield
    row_parts.set_threads(1)


def test_rows_are_cut_into_as_many_parts_as_the_threads_and_the_fewest_rows_allow() -> None:
    assert row_parts.threads() == 1 and row_parts.parts(1000) == [(0, 1000)]  # one thread: one part, whatever the rows
    row_parts.set_threads(2, min_rows=3)
    assert row_parts.threads() == 2
    assert row_parts.parts(5) == [(0, 5)]  # two parts would hold fewer than 3 rows
    assert row_parts.parts(6) == [(0, 3), (3, 6)]
    assert row_parts.parts(7) == [(0, 3), (3, 7)]
    assert row_parts.parts(0) == [(0, 0)]
    row_parts.set_threads(4, min_rows=2)
    assert row_parts.parts(7) == [(0, 2), (2, 4), (4, 7)]
    assert row_parts.parts(257) == [(0, 64), (64, 128), (128, 192), (192, 257)]
    row_parts.set_threads(4)
    assert row_parts.parts(255) == [(0, 255)] and len(row_parts.parts(256)) == 2  # MIN_PART_ROWS a part
    for bad in ((0, 64), (2, 0)):
        with pytest.raises(ValueError, match="expected a count and a part's rows of 1 or more"):
            row_parts.set_threads(*bad)


def test_the_first_part_runs_on_the_caller_and_the_others_on_the_workers() -> None:
    row_parts.set_threads(3, min_rows=1)
    seen: dict[int, int] = {}

    def run(start: int, stop: int) -> tuple[int, int]:
        seen[start] = threading.get_ident()
        return start, stop

    bounds = row_parts.parts(3)
    assert row_parts.in_parts(run, bounds) == [(0, 1), (1, 2), (2, 3)]  # in part order
    assert seen[0] == threading.get_ident() and seen[1] != seen[0] and seen[2] != seen[0]


def test_the_callers_share_follows_the_parts_times() -> None:
    """The caller's part grows while the workers' parts end later than its own (a worker that starts late or runs
    slower), and shrinks the other way, within ``MIN_LEAD``-``MAX_LEAD``; ``set_threads`` starts it equal again."""

    def slow_part(slow_caller: bool) -> Callable[[int, int], int]:
        def run(start: int, stop: int) -> int:
            if (start == 0) == slow_caller:
                time.sleep(0.002)
            return stop - start

        return run

    row_parts.set_threads(2, min_rows=10)
    assert row_parts.parts(100) == [(0, 50), (50, 100)]
    for _ in range(12):
        assert sum(row_parts.in_parts(slow_part(slow_caller=False), row_parts.parts(100))) == 100
    (a, b), (c, d) = row_parts.parts(100)
    assert b - a > d - c and (b - a) / (d - c) <= row_parts.MAX_LEAD
    for _ in range(24):
        row_parts.in_parts(slow_part(slow_caller=True), row_parts.parts(100))
    (a, b), (c, d) = row_parts.parts(100)
    assert b - a < d - c and (b - a) / (d - c) >= row_parts.MIN_LEAD - 0.05
    row_parts.set_threads(2, min_rows=10)
    assert row_parts.parts(100) == [(0, 50), (50, 100)]


def test_a_parts_error_is_raised_once_every_part_is_done() -> None:
    row_parts.set_threads(2, min_rows=1)
    finished = threading.Event()

    def run(start: int, stop: int) -> int:
        if start == 0:
            raise ValueError("the first part")
        finished.wait(5)  # the caller must still wait for this part after its own failed
        return stop

    def release_then_fail(start: int, stop: int) -> int:
        if start == 0:
            threading.Timer(0.2, finished.set).start()
        return run(start, stop)

    with pytest.raises(ValueError, match="the first part"):
        row_parts.in_parts(release_then_fail, row_parts.parts(2))
    assert finished.is_set()

    def second_fails(start: int, stop: int) -> int:
        if start:
            raise KeyError("the second part")
        return stop

    with pytest.raises(KeyError, match="the second part"):
        row_parts.in_parts(second_fails, row_parts.parts(2))


@pytest.mark.parametrize("blas", ["auto", *sorted(available())])
def test_a_batch_in_parts_is_the_same_bits_as_one_call(blas: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Odd batch sizes split 2 and 3 ways (a part of 5 rows or more) against one call, with the BLAS the kernel
    chooses (``auto``: one whose rows pass ``rows_exact`` on the model's shapes, or its loops) and with each BLAS
    found: bit for bit where the BLAS passes (a row's sums grouped alike whatever the rows beside it), else within
    float32 rounding; one row's step overflows."""
    monkeypatch.setenv("AAREN_KERNEL_BLAS", "auto")
    monkeypatch.setattr(blas_module, "_found", None)
    model = model_of(d_model=16, n_heads=4, num_marks=7, value_width=2, n_components=4, time_resolution=1.0, seed=7)
    kernel = EventKernel.from_fused(FusedEventModel.from_model(model), LEVELS, available().get(blas))
    exact = rows_exact(kernel._blas, kernel.shapes)
    assert exact or blas != "auto"  # the kernel's own choice always passes
    assert kernel.blas_name in ("mkl", "openblas", "loops") and blas in ("auto", kernel.blas_name)
    for b, threads in ((11, 2), (17, 3), (40, 3)):
        state = state_arrays(tuple(model.init_state(b).tensors().values()))
        dt, marks, values = (t.numpy() for t in events(b, 2, 7, seed=b))
        gaps = dt.astype(np.float64)
        gaps[b - 2] = 1e300  # past float32: this row's state overflows (finite False), in the last part
        row_parts.set_threads(1)
        whole = kernel.step_forecast(gaps, marks, values, *state, 3)
        row_parts.set_threads(threads, min_rows=5)
        assert len(row_parts.parts(b)) == threads
        split = kernel.step_forecast(gaps, marks, values, *state, 3)
        for name in ("y", "m", "u", "w", "n_events", "finite"):
            got, want = getattr(split, name), getattr(whole, name)
            assert got.dtype == want.dtype, (blas, b, name)
            if exact or name in ("n_events", "finite"):
                assert np.array_equal(got, want, equal_nan=True), (blas, b, name)
            else:
                assert np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True), (blas, b, name)
        assert whole.finite is not None and whole.finite.tolist().count(False) == 1
        if exact:
            for got, want in zip(split.forecast, whole.forecast, strict=True):
                assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True), (blas, b)
        finite = kernel.step_forecast(dt, marks, values, *state, 3)
        assert finite.finite is None  # every row of every part finite


@pytest.mark.parametrize("blas", sorted(available()))
def test_parts_that_cut_a_chunk_are_the_same_bits_as_one_call(blas: str) -> None:
    """Batches of 514 and 516 rows in two parts of the default size (257 and 258 rows): the layers take a call's rows
    in nearly equal chunks of at most ``kernel.CHUNK``, so no part leaves a chunk of 1-3 rows for the kernel's loops
    (cut as 256 rows and the rest, such rows summed otherwise than in the one call's chunks: a model of width 64,
    where MKL's sums and the loops' differ). Bit for bit where the BLAS's rows are exact."""
    model = model_of(d_model=64, n_heads=4, num_marks=7, value_width=2, n_components=4, seed=3)
    kernel = EventKernel.from_fused(FusedEventModel.from_model(model), LEVELS, available()[blas])
    exact = rows_exact(kernel._blas, kernel.shapes)
    for b in (514, 516):
        state = state_arrays(tuple(model.init_state(b).tensors().values()))
        dt, marks, values = (t.numpy() for t in events(b, 2, 7, seed=b))
        row_parts.set_threads(1)
        first = kernel.step_forecast(dt, marks, values, *state, 3)  # a state that is not the fresh one
        inputs = (dt[::-1].copy(), marks, values, first.m, first.u, first.w, first.n_events)
        whole = kernel.step_forecast(*inputs, 3)
        row_parts.set_threads(2)
        assert row_parts.parts(b) == [(0, b // 2), (b // 2, b)]
        split = kernel.step_forecast(*inputs, 3)
        for name in ("y", "m", "u", "w"):
            got, want = getattr(split, name), getattr(whole, name)
            if exact:
                assert np.array_equal(got, want), (blas, b, name, np.flatnonzero((got != want).reshape(b, -1).any(1)))
            else:
                assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (blas, b, name)


def test_auto_takes_the_first_blas_whose_rows_are_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """``find_sgemm(shapes)``: with ``auto``, the first library of its order that ``rows_exact`` passes (a host
    where one fails is played by the probe's answer), the kernel's loops where none does; a library named in
    ``AAREN_KERNEL_BLAS`` is taken unprobed; no shapes, no probe."""
    shapes = ((16, 20), (16, 64))
    monkeypatch.setenv("AAREN_KERNEL_BLAS", "auto")
    monkeypatch.setattr(blas_module, "_found", None)
    order = blas_module._candidates()[1]
    if not order:
        pytest.skip("no BLAS here")
    failing: set[tuple[int, int, int]] = set()
    monkeypatch.setattr(blas_module, "rows_exact", lambda got, _shapes: got not in failing)
    for n_failing in range(len(order) + 1):
        failing = {got for _, got in order[:n_failing]}
        want = order[n_failing][1] if n_failing < len(order) else (0, NO_BLAS, 0)
        assert blas_module.find_sgemm(shapes) == want, n_failing
        assert blas_module.find_sgemm() == order[0][1]  # no shapes: the first found
    monkeypatch.setenv("AAREN_KERNEL_BLAS", order[0][0])
    monkeypatch.setattr(blas_module, "_found", None)
    assert blas_module.find_sgemm(shapes) == order[0][1]  # named: taken though the probe fails it
    monkeypatch.setattr(blas_module, "_found", None)


def test_the_probe_windows_start_at_the_kernels_smallest_product() -> None:
    """``rows_exact`` probes the products the kernel makes: 4 rows or more (fewer go through its own loops)."""
    from aaren_core.tasks.event.kernel import BLOCK

    assert min(stop - start for start, stop in blas_module.PROBE_WINDOWS) == BLOCK
    assert max(stop for _, stop in blas_module.PROBE_WINDOWS) <= blas_module.PROBE_ROWS
    assert rows_exact((0, NO_BLAS, 0), ((16, 20),))


def test_a_batch_in_parts_refuses_arrays_of_unequal_rows() -> None:
    """The compiled check sees a part's slices only: a longer array than ``dt`` would pass it part by part."""
    model = model_of()
    kernel = EventKernel.from_fused(FusedEventModel.from_model(model), LEVELS)
    state = state_arrays(tuple(model.init_state(12).tensors().values()))
    dt, marks, values = (t.numpy() for t in events(12, 3, 7, seed=1))
    row_parts.set_threads(2, min_rows=4)
    with pytest.raises(ValueError, match="one row per event"):
        kernel.step_forecast(dt[:10], marks[:10], values[:10], *state, 3)
    with pytest.raises(ValueError, match="mark is outside"):  # a part's own error, from a worker
        kernel.step_forecast(dt, np.array([0] * 11 + [7]), values, *state, 3)
