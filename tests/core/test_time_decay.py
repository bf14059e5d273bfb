"""Time-aware Aaren: scores decay with each event's age, and every invariant still holds.

Reference: ``o_k = sum_{i<=k} softmax_i(s_i - lambda (t_k - t_i)) v_i`` written out as an O(N^2)
masked softmax (no scan, no state). The scan, the step, a resumed scan, the fused serving step
and the engine's history path must all equal it.
"""

from __future__ import annotations

import pytest
import torch
from generated import decay_model

from aaren_core.nn.layers import AarenAttention
from aaren_core.tasks.event.fused import FusedEventModel


def decay_reference(attn: AarenAttention, x: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    """``x [B, N, d]``, ``dt [B, N]`` -> ``y [B, N, d]`` by an explicit masked softmax over ages."""
    b, n, d = x.shape
    h, dh = attn.n_heads, attn.head_dim
    q = attn._query() / dh**0.5  # [H, Dh]
    k = attn.k_proj(x).view(b, n, h, dh)
    v = attn.v_proj(x).view(b, n, h, dh)
    s = torch.einsum("hd,bnhd->bhn", q, k)  # [B, H, N]
    t = torch.cumsum(dt, dim=1)  # [B, N]
    age = t.unsqueeze(2) - t.unsqueeze(1)  # [B, N(k), N(i)]: t_k - t_i
    logits = s.unsqueeze(2) - attn.decay_rate().view(1, h, 1, 1) * age.unsqueeze(1)  # [B, H, N, N]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    weights = torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1)
    o = torch.einsum("bhki,bihd->bkhd", weights, v).reshape(b, n, d)
    return attn.out_proj(o)


def decay_attention(d_model=16, n_heads=4, seed=0) -> AarenAttention:
    torch.manual_seed(seed)
    attn = AarenAttention(d_model, n_heads, time_decay=True).double()
    with torch.no_grad():
        attn.query.normal_(0, 1.0)  # scores of order 1, so the decay competes with them
        attn.log_rate.copy_(torch.linspace(-3.0, 1.0, n_heads))
    return attn


def random_gaps(b, n, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    dt = torch.rand(b, n, generator=g, dtype=torch.float64) * 2 * scale
    dt[:, 0] = 0.0
    return dt


@pytest.mark.parametrize("n", [1, 2, 63, 257])
def test_decay_scan_and_step_equal_the_masked_softmax(n):
    attn = decay_attention()
    x = torch.randn(3, n, 16, dtype=torch.float64)
    dt = random_gaps(3, n, seed=n)
    want = decay_reference(attn, x, dt)
    got, final = attn(x, None, dt)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    state = attn.init_state(3)
    stepped = []
    for i in range(n):
        y, state = attn.step(x[:, i], state, dt[:, i])
        stepped.append(y)
    torch.testing.assert_close(torch.stack(stepped, 1), want, rtol=1e-10, atol=1e-10)
    for a, b in zip(state, final, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("split", [1, 30, 62])
def test_decay_resumed_scan_equals_the_whole(split):
    attn = decay_attention(seed=1)
    x = torch.randn(2, 63, 16, dtype=torch.float64)
    dt = random_gaps(2, 63, seed=7)
    whole, final = attn(x, None, dt)
    first, state = attn(x[:, :split], None, dt[:, :split])
    second, state = attn(x[:, split:], state, dt[:, split:])
    torch.testing.assert_close(torch.cat([first, second], 1), whole, rtol=1e-10, atol=1e-10)
    for a, b in zip(state, final, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_decay_gradients_of_scan_and_step_agree():
    attn = decay_attention(seed=2)
    x = torch.randn(2, 40, 16, dtype=torch.float64)
    dt = random_gaps(2, 40, seed=3)
    grads = []
    for mode in ("scan", "step"):
        attn.zero_grad()
        if mode == "scan":
            y = attn(x, None, dt)[0]
        else:
            state, ys = attn.init_state(2), []
            for i in range(40):
                out, state = attn.step(x[:, i], state, dt[:, i])
                ys.append(out)
            y = torch.stack(ys, 1)
        (y * torch.linspace(-1, 1, 16, dtype=torch.float64)).sum().backward()
        grads.append({k: p.grad.clone() for k, p in attn.named_parameters()})
    assert grads[0]["log_rate"].abs().sum() > 0
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], rtol=1e-9, atol=1e-10, msg=k)


def test_decay_weights_recent_events_more_and_survives_huge_gaps():
    """A fast-decaying head sees mostly the last event; a year of gaps in float32 stays finite."""
    attn = AarenAttention(8, 1, time_decay=True)
    with torch.no_grad():
        attn.log_rate.fill_(2.0)  # lambda = e^2 per unit of time
    x = torch.randn(1, 50, 8)
    dt = torch.full((1, 50), 3.0)
    dt[0, 0] = 0
    y, _ = attn(x, None, dt)
    last_only, _ = attn(x[:, -1:], None, dt[:, -1:])
    torch.testing.assert_close(y[:, -1], last_only[:, 0], rtol=1e-4, atol=1e-5)
    dt_huge = torch.full((4, 300), 5.0e4)
    y_huge, state = attn(torch.randn(4, 300, 8), None, dt_huge)
    assert torch.isfinite(y_huge).all() and all(torch.isfinite(t).all() for t in state)
    y_step, _ = attn.step(torch.randn(4, 8), state, torch.full((4,), 1.0e6))
    assert torch.isfinite(y_step).all()


def test_model_prefill_equals_steps_and_state_size_is_constant():
    model = decay_model()
    g = torch.Generator().manual_seed(0)
    dt = torch.rand(2, 30, generator=g) * 10
    dt[:, 0] = 0
    marks = torch.randint(0, 5, (2, 30), generator=g)
    values = torch.randn(2, 30, 2, generator=g)
    with torch.no_grad():
        y, state = model.prefill(dt, marks, values)
        s, ys = model.init_state(2), []
        for i in range(30):
            out, s = model.step(dt[:, i], marks[:, i], values[:, i], s)
            ys.append(out)
    torch.testing.assert_close(torch.stack(ys, 1), y, rtol=1e-4, atol=1e-5)
    assert model.backbone.state_nbytes(state) == model.backbone.state_nbytes(model.init_state(1))


def test_fused_decay_step_equals_model_step():
    model = decay_model(seed=1)
    fused = FusedEventModel.from_model(model)
    state = model.init_state(7)
    tensors = tuple(state.tensors().values())
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for t in range(12):
            dt = torch.zeros(7) if t == 0 else torch.rand(7, generator=g) * 20
            marks, values = torch.randint(0, 5, (7,), generator=g), torch.randn(7, 2, generator=g)
            y, state = model.step(dt, marks, values, state)
            y_fused, *tensors = fused.step(dt, marks, values, *tensors)
            torch.testing.assert_close(y_fused, y, rtol=1e-5, atol=1e-5)
    for got, want in zip(tensors, state.tensors().values(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
