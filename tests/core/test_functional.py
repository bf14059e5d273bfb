"""Invariant 1 and 2 of docs/architecture.md for the functional math: naive == scan == step loop, and resume."""

from __future__ import annotations

import pytest
import torch

from aaren_core.attention import (
    ScanState,
    attention_naive,
    attention_scan,
    attention_step,
    empty_state,
)

METHODS = ["chunked", "hillis_steele"]
TOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def inputs(b, n, h, d, dtype, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(b, n, h, generator=g, dtype=torch.float64) * scale).to(dtype)
    v = torch.randn(b, n, h, d, generator=g, dtype=torch.float64).to(dtype)
    return s, v


def step_loop(s, v, state=None):
    b, n, h = s.shape
    state = empty_state(b, h, v.shape[-1], dtype=s.dtype) if state is None else state
    outs = []
    for t in range(n):
        o, state = attention_step(s[:, t], v[:, t], state)
        outs.append(o)
    return torch.stack(outs, dim=1), state


def direct_final_state(s, v):
    """The final (m, u, w) written out from the definition, in float64."""
    s, v = s.double(), v.double()
    m = s.amax(dim=1)
    e = torch.exp(s - m.unsqueeze(1))
    return ScanState(m, e.sum(1), (e.unsqueeze(-1) * v).sum(1))


SHAPES = [(1, 1, 1), (2, 3, 5), (3, 4, 16)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("n", [1, 2, 63, 257, 1000])
@pytest.mark.parametrize("bhd", SHAPES, ids=lambda x: "B{}H{}D{}".format(*x))
def test_naive_scan_step_agree(dtype, n, bhd):
    b, h, d = bhd
    s, v = inputs(b, n, h, d, dtype, seed=n * 7 + d)
    reference = attention_naive(s.double(), v.double())
    tol = TOL[dtype]

    o_naive = attention_naive(s, v)
    assert o_naive.dtype == dtype
    assert rel_err(o_naive, reference) < tol

    o_step, st_step = step_loop(s, v)
    assert o_step.dtype == dtype
    assert rel_err(o_step, reference) < tol

    truth = direct_final_state(s, v)
    for method in METHODS:
        o_scan, st_scan = attention_scan(s, v, method=method)
        assert o_scan.dtype == dtype
        assert rel_err(o_scan, reference) < tol, method
        for got, want, other in zip(st_scan, truth, st_step, strict=True):
            assert rel_err(got, want) < tol, method
            assert rel_err(got, other) < tol, method


def grads(fn, s, v, weight):
    s = s.detach().clone().requires_grad_(True)
    v = v.detach().clone().requires_grad_(True)
    out = fn(s, v)
    (out * weight).sum().backward()
    return s.grad, v.grad


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("n", [1, 2, 63, 257, 1000])
def test_output_gradients_agree(dtype, n):
    b, h, d = 2, 3, 4
    s, v = inputs(b, n, h, d, dtype, seed=n)
    weight = torch.randn(b, n, h, d, dtype=torch.float64)
    ref_ds, ref_dv = grads(attention_naive, s.double(), v.double(), weight)
    candidates = {
        "naive": attention_naive,
        "step": lambda s, v: step_loop(s, v)[0],
        **{m: (lambda s, v, m=m: attention_scan(s, v, method=m)[0]) for m in METHODS},
    }
    for name, fn in candidates.items():
        ds, dv = grads(fn, s, v, weight.to(dtype))
        assert torch.isfinite(ds).all() and torch.isfinite(dv).all(), name
        assert rel_err(ds, ref_ds) < TOL[dtype], name
        assert rel_err(dv, ref_dv) < TOL[dtype], name


@pytest.mark.parametrize("n", [1, 63, 257])
def test_final_state_gradients_agree(n):
    """Gradients through the final state (u, w) of the scan equal those of the step loop."""
    s, v = inputs(2, n, 3, 4, torch.float64, seed=n + 1)

    def through_state(fn):
        ss = s.clone().requires_grad_(True)
        vv = v.clone().requires_grad_(True)
        st = fn(ss, vv)
        (st.u.sum() + (st.w * 0.5).sum()).backward()
        return ss.grad, vv.grad

    want = through_state(lambda a, b: step_loop(a, b)[1])
    for method in METHODS:
        got = through_state(lambda a, b, m=method: attention_scan(a, b, method=m)[1])
        for g, w in zip(got, want, strict=True):
            assert rel_err(g, w) < 1e-10, method


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [2, 63, 257, 1000])
def test_resume_from_state_equals_whole(method, n):
    s, v = inputs(2, n, 3, 5, torch.float64, seed=3 * n)
    o_all, st_all = attention_scan(s, v, method=method)
    g = torch.Generator().manual_seed(n)
    for j in [0, n, *torch.randint(1, n, (3,), generator=g).tolist()]:
        o1, st1 = attention_scan(s[:, :j], v[:, :j], method=method)
        o2, st2 = attention_scan(s[:, j:], v[:, j:], st1, method=method)
        assert rel_err(torch.cat([o1, o2], dim=1), o_all) < 1e-12, j
        for a, b in zip(st2, st_all, strict=True):
            assert torch.allclose(a, b, rtol=1e-12, atol=0), j


def test_resume_then_step_equals_scan():
    s, v = inputs(2, 100, 2, 3, torch.float32, seed=5)
    o_all, st_all = attention_scan(s, v)
    _, st = attention_scan(s[:, :40], v[:, :40])
    o_rest, st_end = step_loop(s[:, 40:], v[:, 40:], st)
    assert rel_err(o_rest, o_all[:, 40:]) < 1e-5
    for a, b in zip(st_end, st_all, strict=True):
        assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_shifted_scores_give_same_output(dtype):
    """Softmax is shift-invariant; a wrong max-rescaling would break this or overflow."""
    s, v = inputs(2, 300, 3, 4, dtype, seed=11)
    shifted = s + 1000.0
    tol = TOL[dtype] if dtype == torch.float64 else 1e-3  # 1000 + s loses ~3e-5 of s in float32
    for method in METHODS:
        o, _ = attention_scan(s, v, method=method)
        o_shift, _ = attention_scan(shifted, v, method=method)
        assert torch.isfinite(o_shift).all()
        assert rel_err(o_shift, o) < tol, method
    o, _ = step_loop(s, v)
    o_shift, _ = step_loop(shifted, v)
    assert rel_err(o_shift, o) < tol


@pytest.mark.parametrize("method", METHODS)
def test_extreme_scores_are_safe(method):
    g = torch.Generator().manual_seed(0)
    sign = torch.randint(0, 2, (2, 129, 3), generator=g).double() * 2 - 1
    s = sign * 1e4 + torch.randn(2, 129, 3, generator=g, dtype=torch.float64)
    v = torch.randn(2, 129, 3, 4, generator=g, dtype=torch.float64)
    for dtype in (torch.float64, torch.float32):
        # The reference sees the same rounded inputs: 1e4 in float32 is only good to ~1e-3.
        reference = attention_naive(s.to(dtype).double(), v.to(dtype).double())
        ss = s.to(dtype).detach().clone().requires_grad_(True)
        vv = v.to(dtype).detach().clone().requires_grad_(True)
        o, st = attention_scan(ss, vv, method=method)
        o.sum().backward()
        assert torch.isfinite(o).all() and torch.isfinite(st.u).all() and torch.isfinite(st.w).all()
        assert torch.isfinite(ss.grad).all() and torch.isfinite(vv.grad).all()
        assert rel_err(o, reference) < TOL[dtype]


def test_all_equal_scores_give_running_mean():
    v = torch.randn(2, 50, 3, 4, dtype=torch.float64)
    s = torch.full((2, 50, 3), 7.0, dtype=torch.float64)
    running_mean = v.cumsum(1) / torch.arange(1, 51, dtype=torch.float64).view(1, -1, 1, 1)
    for method in METHODS:
        o, _ = attention_scan(s, v, method=method)
        assert rel_err(o, running_mean) < 1e-12
    assert rel_err(step_loop(s, v)[0], running_mean) < 1e-12


def test_single_token_returns_its_value_and_finite_gradient():
    s = torch.tensor([[[5.0, -3.0]]], requires_grad=True)
    v = torch.randn(1, 1, 2, 3, requires_grad=True)
    o, st = attention_scan(s, v)
    assert torch.equal(o, v.detach())
    assert torch.equal(st.m, s.detach()[:, 0]) and torch.equal(st.u, torch.ones(1, 2))
    (o.sum() + st.u.sum()).backward()
    assert torch.isfinite(s.grad).all() and torch.isfinite(v.grad).all()


def test_step_from_empty_state_has_finite_gradient():
    st = empty_state(1, 2, 3)
    s = torch.randn(1, 2, requires_grad=True)
    v = torch.randn(1, 2, 3, requires_grad=True)
    o, new = attention_step(s, v, st)
    (o.sum() + new.u.sum() + new.w.sum()).backward()
    assert torch.isfinite(s.grad).all() and torch.isfinite(v.grad).all()
    assert torch.equal(o, v.detach())


def test_state_is_not_mutated():
    s, v = inputs(1, 10, 2, 3, torch.float32)
    _, st = attention_scan(s, v)
    before = [t.clone() for t in st]
    attention_scan(s, v, st)
    attention_step(s[:, 0], v[:, 0], st)
    for a, b in zip(st, before, strict=True):
        assert torch.equal(a, b)


def test_empty_sequence_keeps_state():
    s, v = inputs(2, 5, 2, 3, torch.float64)
    _, st = attention_scan(s, v)
    o, st2 = attention_scan(s[:, :0], v[:, :0], st)
    assert o.shape == (2, 0, 2, 3)
    for a, b in zip(st, st2, strict=True):
        assert torch.equal(a, b)


def test_low_precision_inputs_compute_in_float32():
    s, v = inputs(1, 64, 2, 8, torch.float32, seed=2)
    o32, _ = attention_scan(s, v)
    o16, st16 = attention_scan(s.bfloat16(), v.bfloat16())
    assert o16.dtype == torch.bfloat16 and st16.w.dtype == torch.float32
    assert rel_err(o16.float(), o32) < 2e-2


def test_bad_shapes_are_rejected_with_expected_shapes():
    with pytest.raises(ValueError, match=r"expected scores s \[B, N, H\]"):
        attention_scan(torch.zeros(2, 3), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="expected a state"):
        attention_scan(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2, 4), empty_state(1, 2, 5))
    with pytest.raises(ValueError, match="unknown scan method"):
        attention_scan(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2, 4), method="cumsum")  # type: ignore[arg-type]


def test_empty_segments_combine_without_nan():
    """-inf - -inf must never appear: empty with empty stays empty, empty with x is x."""
    from aaren_core.attention import combine

    empty = empty_state(2, 3, 4, dtype=torch.float64)
    both = combine(empty, empty)
    assert torch.isneginf(both.m).all() and (both.u == 0).all() and (both.w == 0).all()
    s = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    x = ScanState(s, torch.ones_like(s), torch.randn(2, 3, 4, dtype=torch.float64))
    for merged in (combine(empty, x), combine(x, empty)):
        assert torch.equal(merged.m, s) and torch.equal(merged.u, x.u) and torch.equal(merged.w, x.w)
    (combine(empty, x).u.sum() + combine(x, empty).w.sum()).backward()
    assert torch.isfinite(s.grad).all()
