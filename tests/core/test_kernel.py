"""The compiled kernel (aaren_core.tasks.event.kernel) equals the fused torch path, and through it the reference.

Step after step at odd sizes (the state evolving in each path separately), with and without time decay and
a time resolution; the float64 gap summaries against the torch float64 functions on the same float32
mixture; the special functions against torch. The first run in a fresh checkout compiles the kernel:
about 15 s for the file on 2 busy cores, 2 s once numba has cached it (``aaren_core/tasks/event/__pycache__``,
or ``NUMBA_CACHE_DIR``).
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import math
from pathlib import Path

import numba
import numpy as np
import pytest
import torch
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from test_fused import bisection_quantiles, random_mixture

from aaren_core.checkpoint import load_checkpoint
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.event import blas as blas_module
from aaren_core.tasks.event.blas import ILP64, LP64, MKL, NO_BLAS, available, find_sgemm, product
from aaren_core.tasks.event.borrow import borrowed
from aaren_core.tasks.event.fused import FusedEventModel
from aaren_core.tasks.event.heads import discrete_quantiles, truncated_mean
from aaren_core.tasks.event.kernel import EventKernel, KernelOutputs, erf32, gap_summaries, log_ndtr
from aaren_core.tasks.event.model import EventModel, EventModelConfig

LEVELS = (0.01, 0.1, 0.5, 0.9, 0.99)
LEVELS32 = tuple(float(np.float32(p)) for p in LEVELS)  # the numbers the kernel (and torch) compare with
BUNDLED = Path(__file__).resolve().parents[2] / "models" / "default"
#: float32 rounding, a few ulps through a few layers (the fused path is within about 5e-7 of the kernel)
TOL = 1e-5
#: the fused float32 quantile search's own error (tests/core/test_fused.py: typically 5e-7, up to a few 1e-5
#: where the CDF is flat); the kernel's float64 search is checked at TOL against the fused path in float64
FUSED32_QUANTILE_TOL = 1e-4


def model_of(
    *,
    d_model: int = 15,
    n_heads: int = 5,
    num_marks: int = 7,
    value_width: int = 3,
    n_components: int = 5,
    time_decay: bool = True,
    time_resolution: float = 0.0,
    seed: int = 0,
) -> EventModel:
    """A tiny Aaren event model with spread-out heads and layer norms whose eps matter (1e-2 and up)."""
    torch.manual_seed(seed)
    cfg = EventModelConfig(
        backbone=BackboneConfig(kind="aaren", d_model=d_model, n_layers=2, n_heads=n_heads, time_decay=time_decay),
        num_marks=num_marks,
        value_width=value_width,
        n_components=n_components,
        time_features=6,
        gap_max=30.0 if time_resolution else 0.0,
        time_resolution=time_resolution,
    )
    model = EventModel(cfg).eval()
    value_mean = torch.tensor([3.0, -1.0, 40.0])[:value_width]
    value_std = torch.tensor([2.0, 0.5, 15.0])[:value_width]
    model.set_normalization(0.7, 0.9, value_mean, value_std)
    with torch.no_grad():
        model.heads.time.bias.add_(torch.randn(3 * n_components) * 1.5)  # uneven weights, spread locs and scales
        model.heads.mark.bias.add_(torch.randn(num_marks))
        for i, layer in enumerate(model.backbone.layers):
            layer.norm1.eps, layer.norm2.eps = 1e-2 * (i + 1), 3e-2
        model.backbone.norm.eps = 5e-2
    return model


def events(b: int, value_width: int, num_marks: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dt = torch.rand(b, generator=g) * 8
    dt[::4] = 0.0  # ties: the gap's clamp and log1p at 0
    return dt, torch.randint(0, num_marks, (b,), generator=g), torch.randn(b, value_width, generator=g) * 3


def rel_err(got: np.ndarray | torch.Tensor, want: np.ndarray | torch.Tensor, floor: float = 1.0) -> float:
    """``max |got - want| / max(|want|, floor)`` (0 for empty arrays)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    if want.size == 0:
        return 0.0
    return float((np.abs(got - want) / np.maximum(np.abs(want), floor)).max())


def fused_forecast_numpy(fused: FusedEventModel, y: torch.Tensor, top_k: int) -> tuple[np.ndarray, ...]:
    return tuple(t.numpy() for t in fused.forecast(y, LEVELS, top_k))


def assert_forecasts_match(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...], resolution: float) -> None:
    """``(time_mean, time_quantiles, top_marks, top_probs, value_mean, value_std)`` of kernel and fused."""
    names = ("time_mean", "time_quantiles", "top_marks", "top_probs", "value_mean", "value_std")
    for name, g, w in zip(names, got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
    mean, quantiles, marks, probs, value_mean, value_std = got
    # the float32 head outputs differ by rounding, so the float64 summaries of them by about as much
    assert rel_err(mean, want[0], floor=0.0) < TOL
    if resolution:
        assert np.array_equal(quantiles, want[1])  # on the grid: the same multiples of the resolution
    else:
        assert rel_err(quantiles, want[1], floor=0.0) < FUSED32_QUANTILE_TOL
    assert np.array_equal(marks, want[2])
    assert rel_err(probs, want[3]) < TOL and (np.diff(probs, axis=-1) <= 0).all()
    assert rel_err(value_mean, want[4]) < TOL and rel_err(value_std, want[5], floor=0.0) < TOL


def state_arrays(state: tuple[torch.Tensor, ...]) -> tuple[np.ndarray, ...]:
    return tuple(t.numpy() for t in state)


CASES = [  # (batch, d_model, n_heads, num_marks, value_width, n_components, time_decay, time_resolution)
    (1, 15, 5, 7, 3, 5, True, 0.0),
    (3, 9, 3, 5, 1, 3, False, 0.25),
    (17, 7, 1, 3, 0, 1, True, 1.0),
    (17, 15, 3, 7, 3, 5, False, 0.0),
    (3, 15, 5, 7, 0, 3, True, 1 / 60),
    (300, 16, 4, 7, 2, 4, True, 1.0),  # more rows than a chunk (kernel.CHUNK): two chunks of 150
]


@pytest.mark.parametrize(
    ("batch", "d_model", "n_heads", "num_marks", "value_width", "n_components", "decay", "res"), CASES
)
def test_kernel_steps_and_forecasts_equal_the_fused_path(
    batch: int,
    d_model: int,
    n_heads: int,
    num_marks: int,
    value_width: int,
    n_components: int,
    decay: bool,
    res: float,
) -> None:
    model = model_of(
        d_model=d_model,
        n_heads=n_heads,
        num_marks=num_marks,
        value_width=value_width,
        n_components=n_components,
        time_decay=decay,
        time_resolution=res,
        seed=batch + d_model,
    )
    fused = FusedEventModel.from_model(model)
    fused64 = FusedEventModel.from_model(copy.deepcopy(model).double())  # its quantile search: float64-exact
    kernel = EventKernel.from_fused(fused, LEVELS)
    top_k = 4
    state = tuple(model.init_state(batch).tensors().values())
    kstate = state_arrays(state)
    with torch.inference_mode():
        for t in range(5):
            dt, marks, values = events(batch, value_width, num_marks, seed=t)
            y, *state = fused.step(dt, marks, values, *state)
            out = kernel.step_forecast(dt.numpy(), marks.numpy(), values.numpy(), *kstate, top_k)
            assert isinstance(out, KernelOutputs)
            assert out.y.dtype == np.float32 and rel_err(out.y, y) < TOL, t
            for name, got, want in zip(("m", "u", "w", "n_events"), out[1:5], state, strict=True):
                assert got.shape == want.shape and got.dtype == want.numpy().dtype, name
                assert rel_err(got, want) < TOL, (t, name)
            assert_forecasts_match(out.forecast, fused_forecast_numpy(fused, y, top_k), res)
            if not res:
                exact = fused64.forecast(torch.from_numpy(out.y).double(), LEVELS)[1].numpy()
                assert rel_err(out.forecast[1], exact, floor=0.0) < TOL
            kstate = out[1:5]
        assert_forecasts_match(
            kernel.forecast(out.y, top_k), fused_forecast_numpy(fused, torch.from_numpy(out.y), top_k), res
        )


def test_kernel_equals_the_reference_model() -> None:
    """EventModel.step and .forecast, module by module: the same features, state and forecast."""
    model = model_of(time_resolution=0.5)
    kernel = EventKernel.from_fused(FusedEventModel.from_model(model), LEVELS)
    state = model.init_state(6)
    kstate = state_arrays(tuple(state.tensors().values()))
    with torch.inference_mode():
        for t in range(3):
            dt, marks, values = events(6, 3, 7, seed=10 + t)
            y, state = model.step(dt, marks, values, state)
            out = kernel.step_forecast(dt.numpy(), marks.numpy(), values.numpy(), *kstate, 9)
            kstate = out[1:5]
        ref = model.forecast(y, LEVELS, top_k=9)
    assert rel_err(out.y, y) < TOL
    for got, want in zip(kstate, state.tensors().values(), strict=True):
        assert rel_err(got, want) < TOL
    want = tuple(getattr(ref, f).numpy() for f in ("time_mean", "time_quantiles", "top_marks", "top_probs"))
    assert want[2].shape == (6, 7)  # k = min(top_k, M)
    want += (ref.value_mean.numpy(), ref.value_std.numpy())
    assert_forecasts_match(kernel.forecast(out.y, 9), want, 0.5)


def test_kernel_on_the_bundled_model() -> None:
    """models/default (time decay, a 1-minute resolution, 8 components): flights-like gaps, marks and values."""
    model = load_checkpoint(BUNDLED).model.eval()
    fused = FusedEventModel.from_model(model)
    kernel = EventKernel.from_fused(fused, (0.1, 0.5, 0.9))
    g = torch.Generator().manual_seed(3)
    state = tuple(model.init_state(3).tensors().values())
    kstate = state_arrays(state)
    levels = (0.1, 0.5, 0.9)
    with torch.inference_mode():
        for t in range(6):
            dt = torch.tensor([0.0, 1.0, 17.0]) if t == 0 else torch.rand(3, generator=g) * 60
            marks = torch.randint(0, 16, (3,), generator=g)
            values = torch.stack([torch.randn(3, generator=g) * 40, 200 + torch.rand(3, generator=g) * 2000], -1)
            y, *state = fused.step(dt, marks, values, *state)
            out = kernel.step_forecast(dt.numpy(), marks.numpy(), values.numpy(), *kstate, 3)
            kstate = out[1:5]
            assert rel_err(out.y, y) < TOL
            for got, want in zip(kstate, state, strict=True):
                assert rel_err(got, want) < TOL
            want = tuple(x.numpy() for x in fused.forecast(y, levels, 3))
            assert_forecasts_match(out.forecast, want, 1.0)


def test_a_rows_forecast_is_the_same_bits_in_any_batch() -> None:
    """A row's forecast from ``step_forecast`` in a batch of any size equals ``forecast`` of its features alone,
    bit for bit (the unary Forecast computes it again from the stored features; a consumer's sink keeps the
    first copy): the heads' products do not depend on the rows beside them."""
    model = load_checkpoint(BUNDLED).model.eval()
    kernel = EventKernel.from_fused(FusedEventModel.from_model(model), (0.1, 0.5, 0.9))
    rng = np.random.default_rng(5)
    for b in (1, 3, 4, 9, 70):
        state = state_arrays(tuple(model.init_state(b).tensors().values()))
        values = np.stack([rng.normal(0, 40, b), rng.uniform(200, 2200, b)], -1).astype(np.float32)
        out = kernel.step_forecast(rng.exponential(30.0, b), rng.integers(0, 16, b), values, *state, 16)
        for r in range(b):
            alone = kernel.forecast(out.y[r : r + 1], 16)
            for got, want in zip(alone, out.forecast, strict=True):
                assert np.array_equal(got, want[r : r + 1]), (b, r)


def test_the_comparisons_catch_a_dropped_decay_a_wrong_eps_and_a_wrong_bound() -> None:
    """Kernels built from altered snapshots disagree with the true fused path beyond the tolerances."""
    model = model_of(time_resolution=0.25)
    fused = FusedEventModel.from_model(model)
    assert fused.layers is not None
    altered = {
        "no decay": dataclasses.replace(
            fused, layers=tuple(dataclasses.replace(lay, rate=None) for lay in fused.layers)
        ),
        "default eps": dataclasses.replace(
            fused, layers=tuple(dataclasses.replace(lay, eps=(1e-5, 1e-5)) for lay in fused.layers)
        ),
        "bound": dataclasses.replace(fused, gap_bound=fused.gap_bound * 0.9),
    }
    state = tuple(model.init_state(5).tensors().values())
    with torch.inference_mode():
        for t in range(2):
            dt, marks, values = events(5, 3, 7, seed=20 + t)
            y, *state = fused.step(dt, marks, values, *state)
        dt, marks, values = events(5, 3, 7, seed=30)
        y, *new = fused.step(dt, marks, values, *state)
        mean = fused.forecast(y, LEVELS)[0].numpy()
    args = (dt.numpy(), marks.numpy(), values.numpy(), *state_arrays(tuple(state)))
    good = EventKernel.from_fused(fused, LEVELS).step_forecast(*args, 3)
    assert rel_err(good.y, y) < TOL and rel_err(good.m, new[0]) < TOL
    no_decay = EventKernel.from_fused(altered["no decay"], LEVELS).step_forecast(*args, 3)
    assert rel_err(no_decay.m, new[0]) > 100 * TOL
    eps = EventKernel.from_fused(altered["default eps"], LEVELS).step_forecast(*args, 3)
    assert rel_err(eps.y, y) > 100 * TOL
    bound = EventKernel.from_fused(altered["bound"], LEVELS).step_forecast(*args, 3)
    assert rel_err(bound.forecast[0], mean, floor=0.0) > 100 * TOL


def test_kernel_leaves_its_inputs_alone_and_refuses_what_it_cannot_serve() -> None:
    model = model_of()
    kernel = EventKernel.from_fused(FusedEventModel.from_model(model), LEVELS)
    with torch.inference_mode():
        _, state = model.step(*events(4, 3, 7, seed=1), model.init_state(4))
    arrays = state_arrays(tuple(state.tensors().values()))
    before = [a.copy() for a in arrays]
    dt, marks, values = (t.numpy() for t in events(4, 3, 7, seed=2))
    out = kernel.step_forecast(dt, marks, values, *arrays, 20)
    assert all(np.array_equal(a, b) for a, b in zip(arrays, before, strict=True))
    assert np.array_equal(out.n_events, before[3] + 1) and out.forecast[2].shape == (4, 7)
    assert kernel.forecast(out.y, 0)[2].shape == (4, 0)
    with pytest.raises(ValueError, match="mark is outside"):
        kernel.step_forecast(dt, np.array([0, 1, 7, 2]), values, *arrays, 3)
    with pytest.raises(ValueError, match="mark is outside"):
        kernel.step_forecast(dt, np.array([0, -1, 2, 2]), values, *arrays, 3)
    with pytest.raises(ValueError, match="dt: expected float32 or float64, got int64"):
        kernel.step_forecast(dt.astype(np.int64), marks, values, *arrays, 3)
    # float64 gaps are rounded to float32 first: the same numbers; one past float32's range overflows its row
    wide = kernel.step_forecast(dt.astype(np.float64), marks, values, *arrays, 3)
    assert np.array_equal(wide.y, kernel.step_forecast(dt, marks, values, *arrays, 3).y)
    huge = dt.astype(np.float64)
    huge[1] = 1e300
    overflowed = kernel.step_forecast(huge, marks, values, *arrays, 3)
    rows = overflowed.w.reshape(4, -1)
    assert np.isfinite(rows[[0, 2, 3]]).all() and not np.isfinite(rows[1]).all()
    assert overflowed.finite is not None and overflowed.finite.tolist() == [True, False, True, True]
    assert wide.finite is None  # every row finite
    with pytest.raises(ValueError, match="values: not the model's value width"):
        kernel.step_forecast(dt, marks, np.ascontiguousarray(values[:, :2]), *arrays, 3)
    with pytest.raises(ValueError, match="one row per event"):
        kernel.step_forecast(dt[:3], marks[:3], values[:3], *arrays, 3)
    with pytest.raises(ValueError, match="m, u: not"):
        kernel.step_forecast(dt, marks, values, arrays[0][:, :1].copy(), *arrays[1:], 3)
    with pytest.raises(ValueError, match="y: "):
        kernel.forecast(out.y[:, :-1], 3)
    with pytest.raises(ValueError, match="levels in"):
        EventKernel.from_fused(FusedEventModel.from_model(model), (0.5, 1.0))
    torch.manual_seed(0)
    gru = EventModel(EventModelConfig(backbone=BackboneConfig(kind="gru", d_model=8, n_layers=1), num_marks=3))
    with pytest.raises(ValueError, match="no fused step"):
        EventKernel.from_fused(FusedEventModel.from_model(gru), LEVELS)


@pytest.mark.parametrize(
    ("k", "min_log_scale", "seed", "mean_tol"),
    [(1, -1.5, 0, 1e-10), (5, -1.5, 1, 1e-10), (8, -7.0, 2, 1e-10), (1, -7.0, 3, 1e-7)],
)
def test_gap_summaries_equal_the_float64_reference_on_the_same_mixture(
    k: int, min_log_scale: float, seed: int, mean_tol: float
) -> None:
    """On one float32 mixture: the truncated mean as heads.truncated_mean (bounds far inside and far past
    the mixtures, so log_ndtr runs deep into its tail), the continuous quantiles as a float64 bisection
    rounded to float32, and on a grid exactly heads.discrete_quantiles of the bisection's quantiles.

    The mean agrees to 1e-10 (2e-12 seen) but where one narrow component lies thousands of sigmas past the
    bound: both sums are then exp(-1e7)-small, and the rounding of their logs alone (1e-16 of 1e7) moves
    the mean by up to 3e-8 between two log_ndtr implementations, either as good."""
    mix = random_mixture(800, k, seed, min_log_scale)
    arrays = tuple(t.numpy() for t in (mix.logits, mix.loc, mix.log_scale))
    lw, loc, ls = torch.log_softmax(mix.logits.double(), -1), mix.loc.double(), mix.log_scale.double()
    for bound in (0.05, 3.0, 877.0):
        mean, quantiles = gap_summaries(*arrays, LEVELS, bound, 0.0)
        want = truncated_mean(lw, loc, ls, bound).numpy()
        assert (mean <= bound).all() and rel_err(mean, want, floor=0.0) < mean_tol, bound
    exact = bisection_quantiles(mix, LEVELS32)
    assert quantiles.dtype == np.float64 and np.array_equal(quantiles, quantiles.astype(np.float32))
    assert rel_err(quantiles, exact.float(), floor=0.0) < 2.5e-7  # within an ulp of the root rounded to float32
    levels = torch.tensor(LEVELS, dtype=torch.float32)
    for resolution in (1.0, 0.05):
        _, grid = gap_summaries(*arrays, LEVELS, 877.0, resolution)
        want = discrete_quantiles(lw, loc, ls, exact, levels, resolution).numpy()
        assert np.array_equal(grid, want), resolution


def test_special_functions_match_torch_far_into_the_tails() -> None:
    x = np.concatenate([np.linspace(-40.0, 40.0, 4001), -np.logspace(0.0, 7.0, 400), [-20.0, -19.999, -20.001]])
    want_log = torch.special.log_ndtr(torch.from_numpy(x)).numpy()
    got_log = np.array([log_ndtr(v) for v in x])
    assert rel_err(got_log, want_log, floor=1e-300) < 2e-15
    # Phi itself (special.phi_many) is held to torch and mpmath in tests/core/test_special.py
    z = np.linspace(-6.0, 6.0, 12001).astype(np.float32)
    err = max(abs(float(erf32(v)) - math.erf(float(v))) for v in z)
    assert err < 1.6e-7, err  # torch's own vectorized float32 erf in GELU: up to 1.5e-7


def test_discrete_quantiles_recover_a_quantile_some_cells_off() -> None:
    """On a grid the kernel's quantile search stops early (mixture_quantile's resolution), so the candidates'
    cell is found from the CDF: a quantile 1 or 3 cells too low or too high gives heads.discrete_quantiles'
    answer for the exact one all the same (a q off by more than a cell would fail without that walk). The
    bounded walk's fallback (a full search) is covered by the narrow components (sigma e^-7) of
    test_gap_summaries_equal_the_float64_reference_on_the_same_mixture, where the short search lands far off."""
    from aaren_core.tasks.event.kernel import _ANSWER, _SEARCH_MAX, MIX_ROWS, _discrete_quantiles, _gap_work, _mixture

    mix = random_mixture(200, 5, 5, -1.5)
    lw, loc, ls = torch.log_softmax(mix.logits.double(), -1), mix.loc.double(), mix.log_scale.double()
    exact = bisection_quantiles(mix, LEVELS32)
    table = np.empty((MIX_ROWS, 5), np.float64)
    work = _gap_work(5, len(LEVELS32))
    levels = np.array(LEVELS32)
    moved = 0
    for resolution in (1.0, 0.05):
        want = discrete_quantiles(lw, loc, ls, exact, torch.tensor(LEVELS, dtype=torch.float32), resolution).numpy()
        heads = torch.cat([mix.logits, mix.loc, mix.log_scale], dim=1).numpy()  # [200, 3 K], the heads' columns
        args, phi, density, state, points = work
        for b in range(200):
            _mixture(heads, b, table)
            for cells in (-3.0, -1.0, 1.0, 3.0):  # every level off by the same cells, walked side by side
                off = exact[b].numpy() + cells * resolution
                state[_ANSWER, : len(off)] = off
                _discrete_quantiles(table, args, phi, density, state, points, levels, resolution, _SEARCH_MAX)
                assert np.array_equal(state[_ANSWER], want[b]), (resolution, b, cells)
                # a walk cut short says so (-1), and then the kernel runs its full search instead
                state[_ANSWER, : len(off)] = off
                _discrete_quantiles(table, args, phi, density, state, points, levels, resolution, 0)
                assert all(got in (w, -1.0) for got, w in zip(state[_ANSWER], want[b], strict=True))
                moved += int((off > 0).sum())
    assert moved > 2000  # most of the shifted quantiles stay positive: the walk runs both ways


@pytest.mark.parametrize("choice", ["mkl", "openblas"])
def test_blas_products_equal_the_kernels_loops(choice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The layers' matrices by each BLAS found here (MKL inside torch's x86 wheels, OpenBLAS inside numpy's) and by
    the kernel's own loops: the same products within float32 rounding, and so the same step and forecast; MKL's
    product leaves the calling thread's MKL thread count as it found it."""
    monkeypatch.setenv("AAREN_KERNEL_BLAS", choice)
    monkeypatch.setattr(blas_module, "_found", None)
    found = find_sgemm()
    monkeypatch.setattr(blas_module, "_found", None)  # the next kernel finds its own
    if choice == "mkl" and found[1] == NO_BLAS:
        pytest.skip("no MKL here (a torch built without it: not x86, or not PyPI's wheel)")
    assert found[1] in ((MKL,) if choice == "mkl" else (ILP64, LP64)) and found[0]
    rng = np.random.default_rng(3)
    for m, n, p in ((4, 7, 5), (9, 64, 68), (64, 256, 64), (256, 64, 256)):
        a = rng.standard_normal((m, n)).astype(np.float32)
        b = rng.standard_normal((n, p)).astype(np.float32)
        c = np.full((m + 2, p), 7.0, np.float32)  # added to the products; rows past m are left alone
        product(found, a, b, c)
        assert np.abs(c[:m] - (a.astype(np.float64) @ b + 7.0)).max() < 1e-5 * n and (c[m:] == 7.0).all()
    outs = set()  # the same product whatever the arrays' alignment (MKL's kernels may peel by it): the same bits
    for offset in range(0, 64, 4):
        c = _at_offset(np.zeros((m, p), np.float32), offset)
        product(found, _at_offset(a, (3 * offset) % 64), _at_offset(b, (5 * offset) % 64), c)
        outs.add(c.tobytes())
    assert len(outs) == 1
    if found[1] == MKL:
        set_local = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(found[2])
        set_local(2)
        product(found, a, b, c)
        assert set_local(0) == 2  # given back as it was
    model = model_of(d_model=16, n_heads=4, num_marks=7, value_width=2, n_components=4, time_resolution=1.0, seed=5)
    blas = EventKernel.from_fused(FusedEventModel.from_model(model), LEVELS, found)
    loops = EventKernel.from_fused(FusedEventModel.from_model(model), LEVELS, (0, NO_BLAS, 0))
    assert blas._blas == found and loops._blas == (0, NO_BLAS, 0)
    state = state_arrays(tuple(model.init_state(40).tensors().values()))
    dt, marks, values = (t.numpy() for t in events(40, 2, 7, seed=9))
    a, b = (k.step_forecast(dt, marks, values, *state, 3) for k in (blas, loops))
    assert rel_err(a.y, b.y) < TOL and rel_err(a.w, b.w) < TOL
    assert_forecasts_match(a.forecast, b.forecast, 1.0)


def test_auto_takes_mkl_first_on_intel_and_openblas_first_elsewhere(tmp_path: Path, monkeypatch) -> None:
    """The vendor as /proc/cpuinfo writes it; this machine's own choice follows the rule."""
    info = tmp_path / "cpuinfo"
    for vendor, first in (("GenuineIntel", "mkl"), ("AuthenticAMD", "openblas"), ("HygonGenuine", "openblas")):
        info.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 25\n\nprocessor\t: 1\n")
        assert blas_module.cpu_vendor(str(info)) == vendor
        assert blas_module.auto_order(vendor)[0] == first
    assert blas_module.cpu_vendor(str(tmp_path / "none")) == "" and blas_module.auto_order("")[0] == "mkl"
    monkeypatch.setenv("AAREN_KERNEL_BLAS", "auto")
    monkeypatch.setattr(blas_module, "_found", None)
    chosen = find_sgemm()
    monkeypatch.setattr(blas_module, "_found", None)
    found = available()
    first = next(name for name in blas_module.auto_order(blas_module.cpu_vendor()) if name in found)
    assert chosen == found[first]


def test_an_unknown_blas_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AAREN_KERNEL_BLAS", "atlas")
    monkeypatch.setattr(blas_module, "_found", None)
    with pytest.raises(ValueError, match=r"AAREN_KERNEL_BLAS='atlas': expected one of auto, mkl, openblas, 0"):
        find_sgemm()
    monkeypatch.setattr(blas_module, "_found", None)


def _at_offset(a: np.ndarray, offset: int) -> np.ndarray:
    """A C-contiguous copy of ``a`` starting ``offset`` bytes past a 64-byte boundary."""
    buf = np.empty(a.nbytes + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    out = buf[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def test_marks_rank_descending_with_the_lower_mark_first_among_equal_probabilities() -> None:
    """The marks' top ``k`` (the kernel counts each mark's place) for probabilities with ties: the order of a stable
    sort, descending, for every ``k``, the probabilities the softmax's, and nothing past ``k`` written."""
    model = model_of(num_marks=7)
    with torch.no_grad():
        model.heads.mark.weight.zero_()  # the logits are the bias alone: tied where the bias is
        model.heads.mark.bias.copy_(torch.tensor([0.5, 2.0, -1.0, 2.0, 0.5, 2.0, -1.0]))
    kernel = EventKernel.from_fused(FusedEventModel.from_model(model), LEVELS)
    y = np.random.default_rng(2).standard_normal((3, 15)).astype(np.float32)
    probs = torch.softmax(model.heads.mark.bias.detach(), -1).numpy()
    order = np.argsort(-probs, kind="stable")
    assert order.tolist() == [1, 3, 5, 0, 4, 2, 6]
    for k in (0, 1, 2, 4, 7, 9):
        _, _, marks, top, _, _ = kernel.forecast(y, k)
        want = order[: min(k, 7)]
        assert marks.shape == (3, len(want)) and (marks == want).all(), (k, marks[0])
        np.testing.assert_allclose(top, np.broadcast_to(probs[want], top.shape), rtol=1e-6)


@intrinsic
def _has_meminfo(typingctx, array):  # type: ignore[no-untyped-def]
    """Whether ``array`` carries a ``meminfo`` (a reference count numba keeps)."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        meminfo = context.make_array(sig.args[0])(context, builder, args[0]).meminfo
        return builder.icmp_unsigned("!=", meminfo, cgutils.get_null_value(meminfo.type))

    return types.boolean(array), codegen


@numba.njit
def _borrow_and_write(a: np.ndarray) -> tuple[float, int, bool, bool, bool]:
    owned = a[:, :]  # a view numba counts: the same memory with the array's meminfo
    view = borrowed(owned)
    row = view[1]  # a view sliced from a borrowed one borrows too
    row[2] = 5.0
    counted = _has_meminfo(owned), _has_meminfo(view), _has_meminfo(row)
    return view[0, 1], view.shape[0] * view.shape[1], *counted


def test_a_borrowed_view_reads_and_writes_the_arrays_memory() -> None:
    """``borrow.borrowed``: the same data, shape and strides (a write through it lands in the array, strided ones
    included), and no ``meminfo``, neither on it nor on the views sliced from it, where the array it borrows has
    one: numba counts no reference on them."""
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    assert _borrow_and_write(a) == (1.0, 12, True, False, False)
    assert a[1, 2] == 5.0
    strided = np.arange(24, dtype=np.float64).reshape(3, 8)[:, ::2]  # not contiguous: strides carried over
    assert _borrow_and_write(strided) == (2.0, 12, True, False, False) and strided[1, 2] == 5.0
