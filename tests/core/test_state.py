"""States: immutable, stackable, movable, and bit-exact bytes that refuse the wrong model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from aaren_core import AarenState, BackboneConfig, GRUState, KVCacheState, StateFormatError, build_backbone
from aaren_core.attention.state import state_from_bytes

KINDS = ["aaren", "transformer", "gru"]


def model_and_state(kind: str, d_model: int = 16, batch: int = 3, n: int = 9, seed: int = 0):
    torch.manual_seed(seed)
    model = build_backbone(BackboneConfig(kind=kind, d_model=d_model, n_layers=2, n_heads=4)).eval()
    with torch.no_grad():
        _, state = model.prefill(torch.randn(batch, n, d_model))
    return model, state


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        view = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16}[a.dtype]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_bytes_round_trip_is_bit_exact(kind):
    model, state = model_and_state(kind)
    for st in (state, state.select([1]), model.init_state(2)):
        data = st.to_bytes(model_version="v-test")
        back = model.state_from_bytes(data, model_version="v-test")
        assert type(back) is type(st)
        for name, t in st.tensors().items():
            assert bits_equal(back.tensors()[name], t), name
        assert state_from_bytes(data).tensors().keys() == st.tensors().keys()


def test_init_state_survives_bytes_with_its_infinities():
    model, _ = model_and_state("aaren")
    back = model.state_from_bytes(model.init_state(1).to_bytes())
    assert torch.isneginf(back.m).all() and (back.u == 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_other_model_shape_is_refused(kind):
    _, state = model_and_state(kind, d_model=16)
    other, _ = model_and_state(kind, d_model=32)
    with pytest.raises(StateFormatError, match="does not match this model's state shape"):
        other.state_from_bytes(state.select([0]).to_bytes())


def test_other_state_kind_is_refused():
    _, gru_state = model_and_state("gru")
    aaren, _ = model_and_state("aaren")
    with pytest.raises(StateFormatError, match="hold a 'gru' state; expected 'aaren'"):
        aaren.state_from_bytes(gru_state.to_bytes())


def test_other_model_version_is_refused():
    model, state = model_and_state("aaren")
    data = state.to_bytes(model_version="aaren-aaaa")
    expected = "written by model version 'aaren-aaaa'; this model is version 'aaren-bbbb'"
    with pytest.raises(StateFormatError, match=expected):
        model.state_from_bytes(data, model_version="aaren-bbbb")


@pytest.mark.parametrize("cut", [0, 4, 8, 40, -1, -17])
def test_truncated_bytes_are_refused(cut):
    model, state = model_and_state("aaren")
    data = state.to_bytes()
    with pytest.raises(StateFormatError, match="damaged or truncated"):
        model.state_from_bytes(data[:cut])


def test_garbage_and_foreign_safetensors_are_refused():
    from safetensors.torch import save

    model, _ = model_and_state("aaren")
    with pytest.raises(StateFormatError):
        model.state_from_bytes(b"\x00" * 64)
    with pytest.raises(StateFormatError, match="not an 'aaren-state'"):
        model.state_from_bytes(save({"m": torch.zeros(1, 2, 4)}))
    with pytest.raises(StateFormatError, match="expected bytes"):
        model.state_from_bytes("not bytes")  # type: ignore[arg-type]


def test_header_that_lies_about_shapes_is_refused():
    import json

    from safetensors.torch import save

    model, state = model_and_state("aaren")
    row = state.select([0])
    header = {
        "format": "aaren-state",
        "format_version": 1,
        "kind": "aaren",
        "model_version": "",
        "spec": {**row.spec(), "m": [3, 4, "float32"]},
    }
    forged = save({k: t.contiguous() for k, t in row.tensors().items()}, metadata={"aaren": json.dumps(header)})
    with pytest.raises(StateFormatError, match="do not match their own header"):
        model.state_from_bytes(forged)


def test_bytes_are_deterministic():
    _, state = model_and_state("aaren")
    assert len({state.to_bytes("v") for _ in range(20)}) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_stack_and_split_round_trip(kind):
    _, state = model_and_state(kind, batch=4)
    rows = state.split()
    assert [r.batch_size for r in rows] == [1, 1, 1, 1]
    again = type(state).stack(rows)
    for name, t in state.tensors().items():
        assert torch.equal(again.tensors()[name], t), name
    picked = state.select(torch.tensor([3, 1]))
    for name, t in state.tensors().items():
        assert torch.equal(picked.tensors()[name], t[[3, 1]]), name


def test_stack_refuses_mixed_shapes_and_kinds():
    _, a = model_and_state("transformer", n=3)
    _, b = model_and_state("transformer", n=5)
    with pytest.raises(ValueError, match="field 'k' has shape"):
        KVCacheState.stack([a, b])
    _, g = model_and_state("gru")
    with pytest.raises(TypeError, match="cannot stack"):
        AarenState.stack([model_and_state("aaren")[1], g])
    with pytest.raises(ValueError, match="empty"):
        GRUState.stack([])


def test_state_is_immutable_and_steps_do_not_mutate():
    model, state = model_and_state("aaren")
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.m = torch.zeros(1)  # type: ignore[misc]
    before = {k: t.clone() for k, t in state.tensors().items()}
    with torch.no_grad():
        model.step(torch.randn(3, 16), state)
        model.prefill(torch.randn(3, 4, 16), state)
    for name, t in state.tensors().items():
        assert torch.equal(t, before[name]), name


def test_state_moves_between_devices():
    _, state = model_and_state("aaren")
    meta = state.to("meta")
    assert meta.device.type == "meta" and meta.m.shape == state.m.shape
    back = state.to("cpu")
    assert all(torch.equal(back.tensors()[k], t) for k, t in state.tensors().items())
    if torch.cuda.is_available():
        on_gpu = state.to("cuda")
        assert on_gpu.device.type == "cuda"
        assert all(torch.equal(on_gpu.to("cpu").tensors()[k], t) for k, t in state.tensors().items())


def test_nbytes_counts_every_tensor():
    model, state = model_and_state("aaren", batch=2)
    c = model.config
    head_dim = c.d_model // c.n_heads
    per_row = c.n_layers * c.n_heads * (2 + head_dim) * 4 + 8  # m, u, w in float32; n_events int64
    assert state.nbytes == 2 * per_row
    assert model.state_nbytes(state) == per_row
