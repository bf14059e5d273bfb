"""Backbones: parallel == step-by-step, prefill + step == forward, state size, parameter parity."""

from __future__ import annotations

import pytest
import torch

from aaren_core import AarenModel, BackboneConfig, TransformerModel, build_backbone
from aaren_core.attention.state import State

KINDS = ["aaren", "transformer", "gru"]


def tiny(kind: str, d_model: int = 16, n_layers: int = 2, n_heads: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    return build_backbone(BackboneConfig(kind=kind, d_model=d_model, n_layers=n_layers, n_heads=n_heads)).eval()


def step_all(model, x, state=None):
    state = model.init_state(x.shape[0]) if state is None else state
    ys = []
    for t in range(x.shape[1]):
        y, state = model.step(x[:, t], state)
        ys.append(y)
    return torch.stack(ys, dim=1), state


def assert_states_close(a: State, b: State, atol: float = 1e-5) -> None:
    assert type(a) is type(b)
    for (name, x), y in zip(a.tensors().items(), b.tensors().values(), strict=True):
        assert x.shape == y.shape, name
        assert torch.allclose(x, y, rtol=1e-5, atol=atol), name


@pytest.mark.parametrize("kind", KINDS)
def test_forward_equals_step_by_step(kind):
    model = tiny(kind)
    x = torch.randn(3, 41, 16)
    with torch.no_grad():
        y = model(x)
        y_step, state = step_all(model, x)
    assert y.shape == (3, 41, 16)
    assert (y - y_step).abs().max().item() < 1e-5
    assert state.n_events.tolist() == [41, 41, 41]


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_then_step_equals_forward(kind):
    model = tiny(kind, seed=1)
    x = torch.randn(2, 50, 16)
    with torch.no_grad():
        y = model(x)
        _, full_state = model.prefill(x)
        for j in (1, 17, 49):
            y_pre, state = model.prefill(x[:, :j])
            y_rest, state = step_all(model, x[:, j:], state)
            assert (torch.cat([y_pre, y_rest], dim=1) - y).abs().max().item() < 1e-5, j
            assert_states_close(state, full_state)


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_in_two_chunks_equals_forward(kind):
    model = tiny(kind, seed=2)
    x = torch.randn(2, 70, 16)
    with torch.no_grad():
        y = model(x)
        y1, st = model.prefill(x[:, :33])
        y2, st = model.prefill(x[:, 33:], st)
    assert (torch.cat([y1, y2], dim=1) - y).abs().max().item() < 1e-5
    assert st.n_events.tolist() == [70, 70]


def test_aaren_forward_matches_float64_step_reference():
    """The float32 parallel forward equals a float64 step-by-step run of the same weights."""
    model = tiny("aaren", seed=3)
    x = torch.randn(2, 64, 16)
    ref = tiny("aaren", seed=3).double()
    with torch.no_grad():
        y = model(x)
        y_ref, _ = step_all(ref, x.double())
    assert (y.double() - y_ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_batched_step_equals_per_session_steps(kind):
    """Sessions with different histories stacked into one batch step exactly as they would alone."""
    model = tiny(kind, seed=4)
    with torch.no_grad():
        histories = (
            [torch.randn(1, n, 16) for n in (3, 3, 3)]
            if kind == "transformer"
            else [torch.randn(1, n, 16) for n in (1, 5, 12)]
        )
        states = [model.prefill(h)[1] for h in histories]
        x_t = torch.randn(3, 16)
        y_batch, st_batch = model.step(x_t, type(states[0]).stack(states))
        for i, st in enumerate(states):
            y_one, st_one = model.step(x_t[i : i + 1], st)
            assert (y_batch[i : i + 1] - y_one).abs().max().item() < 1e-5
            assert_states_close(st_batch.split()[i], st_one)


@pytest.mark.parametrize("kind", ["aaren", "gru"])
def test_state_size_is_constant(kind):
    model = tiny(kind, d_model=8, n_heads=2)
    x = torch.randn(1, 8)
    state = model.init_state(1)
    sizes = {}
    with torch.no_grad():
        for t in range(1, 10_001):
            _, state = model.step(x, state)
            if t in (1, 100, 10_000):
                sizes[t] = model.state_nbytes(state)
    assert state.n_events.item() == 10_000
    assert sizes[1] == sizes[100] == sizes[10_000] > 0
    assert torch.isfinite(state.tensors()[next(iter(state.tensors()))]).all()


def test_transformer_state_grows_linearly():
    model = tiny("transformer", d_model=8, n_heads=2)
    c = model.config
    per_event = 2 * c.n_layers * c.d_model * 4  # k and v, every layer, float32
    sizes = {}
    with torch.no_grad():
        for n in (1, 100, 10_000):
            _, state = model.prefill(torch.randn(1, n - 1, 8))
            _, state = model.step(torch.randn(1, 8), state)
            sizes[n] = model.state_nbytes(state)
            assert state.n_events.item() == n
    assert sizes[100] - sizes[1] == 99 * per_event
    assert sizes[10_000] - sizes[100] == 9_900 * per_event


def test_parameter_parity_with_the_paper():
    """Per layer, Aaren has exactly d_model more parameters (its query token) than the Transformer."""
    cfg = {"d_model": 512, "n_layers": 1, "n_heads": 8, "d_ff": 2048}
    aaren = AarenModel(BackboneConfig(kind="aaren", **cfg))
    transformer = TransformerModel(BackboneConfig(kind="transformer", **cfg))
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    assert count(aaren.layers) == 3_152_896
    assert count(transformer.layers) == 3_152_384
    for d_model, n_layers in [(16, 3), (64, 2)]:
        small = {"d_model": d_model, "n_layers": n_layers, "n_heads": 4}
        a = AarenModel(BackboneConfig(kind="aaren", **small))
        t = TransformerModel(BackboneConfig(kind="transformer", **small))
        assert count(a) - count(t) == n_layers * d_model


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_flow_through_parallel_forward(kind):
    model = tiny(kind).train()
    x = torch.randn(2, 20, 16, requires_grad=True)
    model(x).pow(2).mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_bad_input_shapes_are_rejected():
    model = tiny("aaren")
    with pytest.raises(ValueError, match=r"expected input \[B, N, d_model\] with d_model=16"):
        model(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"expected input \[B, d_model\]"):
        model.step(torch.randn(2, 3, 16), model.init_state(2))
    with pytest.raises(ValueError, match="divisible"):
        BackboneConfig(kind="aaren", d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="unknown backbone kind"):
        BackboneConfig(kind="lstm")  # type: ignore[arg-type]


def test_serving_cache_follows_parameter_updates():
    """The fused score/value projection cached for serving is rebuilt when a weight changes."""
    model = tiny("aaren", seed=5)
    x = torch.randn(2, 16)
    history = torch.randn(2, 5, 16)  # scores only matter once there is more than one event
    with torch.no_grad():
        _, state = model.prefill(history)
        before, _ = model.step(x, state)
        model.layers[0].mixer.k_proj.weight.mul_(1.5)
        _, state = model.prefill(history)
        after, _ = model.step(x, state)
        fresh = tiny("aaren", seed=5)
        fresh.layers[0].mixer.k_proj.weight.mul_(1.5)
        want, _ = fresh.step(x, fresh.prefill(history)[1])
    assert not torch.allclose(before, after)
    assert torch.allclose(after, want, atol=1e-6)
