"""The policy model: forward on an episode == step by step with its own actions == chunked prefill;
constant state size for Aaren and the GRU; checkpoints; state bytes."""

from __future__ import annotations

import pytest
import torch

from aaren_core.checkpoint import load_checkpoint, save_checkpoint
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.policy.model import (
    BCModel,
    BCModelConfig,
    PolicyAarenState,
    PolicyKVState,
    PolicyModel,
    PolicyModelConfig,
    step_gaps,
)

S, A = 5, 3  # odd sizes


def _model(kind: str, time_decay: bool = False, seed: int = 0, max_timestep: int = 1000) -> PolicyModel:
    torch.manual_seed(seed)
    backbone = BackboneConfig(kind=kind, d_model=16, n_layers=2, n_heads=2, time_decay=time_decay)
    model = PolicyModel(PolicyModelConfig(backbone=backbone, obs_dim=S, act_dim=A, max_timestep=max_timestep))
    model.set_normalization(torch.randn(S), torch.rand(S) + 0.5)
    return model.double().eval()


def _run_steps(model: PolicyModel, obs: torch.Tensor, rewards: torch.Tensor, target: torch.Tensor):
    """Step ``obs [B, T, S]`` with ``rewards [B, T]`` (reward after each step) from ``target [B]``."""
    b, t = rewards.shape
    state = model.init_state(b)
    actions, rtgs = [], []
    fed = target
    for i in range(t):
        a, r, state = model.step(obs[:, i], fed, state)
        actions.append(a)
        rtgs.append(r)
        fed = rewards[:, i]
    return torch.stack(actions, 1), torch.stack(rtgs, 1), state


@pytest.mark.parametrize(("kind", "decay"), [("aaren", False), ("aaren", True), ("gru", False), ("transformer", False)])
def test_forward_equals_steps_with_own_actions(kind: str, decay: bool) -> None:
    model = _model(kind, decay)
    b, t = 3, 13
    obs = torch.randn(b, t, S, dtype=torch.float64) * 2
    rewards = torch.rand(b, t, dtype=torch.float64) * 3
    target = torch.tensor([3600.0, 1000.0, 10.0], dtype=torch.float64)
    with torch.no_grad():
        actions, rtgs, state = _run_steps(model, obs, rewards, target)
        # R_t = R_0 - sum_{j<t} r_j
        want_rtg = target[:, None] - torch.cat([torch.zeros(b, 1, dtype=torch.float64), rewards[:, :-1]], 1).cumsum(1)
        torch.testing.assert_close(rtgs, want_rtg)
        steps = torch.arange(t).expand(b, -1)
        parallel = model(rtgs, obs, actions, steps)
        torch.testing.assert_close(parallel, actions, atol=1e-5, rtol=1e-5)
        assert actions.abs().max() <= 1
        assert int(state.timestep[0]) == t and int(state.n_events[0]) == t
        # The backbone's prefill over the tokens in chunks ends in the same backbone state.
        x = model.tokens(rtgs, obs, actions, steps)[:, : 3 * t - 1]
        dt = step_gaps(t)[: 3 * t - 1].expand(b, -1) if decay else None
        inner = None
        for lo in range(0, x.shape[1], 7):
            _, inner = model.backbone.prefill(x[:, lo : lo + 7], inner, None if dt is None else dt[:, lo : lo + 7])
        stepped = model._inner(state)
        for k, v in inner.tensors().items():
            if k != "n_events":
                torch.testing.assert_close(stepped.tensors()[k], v, atol=1e-6, rtol=1e-6)
        assert inner.n_events.tolist() == stepped.n_events.tolist()


def test_step_mixes_first_and_later_rows() -> None:
    model = _model("aaren", True)
    obs = torch.randn(2, 4, S, dtype=torch.float64)
    rewards = torch.rand(2, 4, dtype=torch.float64)
    with torch.no_grad():
        ref, _, _ = _run_steps(model, obs, rewards, torch.tensor([50.0, 50.0], dtype=torch.float64))
        # Row 1 starts one step late: a batch of a first and a later step.
        state = model.init_state(2)
        _, _, state = model.step(obs[:, 0], torch.tensor([50.0, 0.0], dtype=torch.float64), state)
        row1 = model.init_state(1)
        state = PolicyAarenState.stack([state.select([0]), row1])
        a1, _, state = model.step(
            torch.stack([obs[0, 1], obs[1, 0]]), torch.tensor([rewards[0, 0], 50.0], dtype=torch.float64), state
        )
    torch.testing.assert_close(a1[0], ref[0, 1])
    torch.testing.assert_close(a1[1], ref[1, 0])


def test_transformer_refuses_mixed_rows() -> None:
    model = _model("transformer")
    state = model.init_state(1)
    _, _, state = model.step(torch.randn(1, S, dtype=torch.float64), torch.tensor([5.0], dtype=torch.float64), state)
    state = PolicyKVState(**{k: v.repeat(2, *([1] * (v.dim() - 1))) for k, v in state.tensors().items()})
    state = PolicyKVState(**{**state.tensors(), "timestep": torch.tensor([1, 0])})
    with pytest.raises(ValueError, match="same timestep"):
        model.step(torch.randn(2, S, dtype=torch.float64), torch.zeros(2, dtype=torch.float64), state)


@pytest.mark.parametrize("kind", ["aaren", "gru"])
def test_state_bytes_constant_over_an_episode(kind: str) -> None:
    model = _model(kind, max_timestep=50).float()
    state = model.init_state(1)
    sizes = set()
    with torch.no_grad():
        for i in range(1000):
            _, _, state = model.step(torch.randn(1, S), torch.tensor([100.0 if i == 0 else 1.0]), state)
            if i % 100 == 0:
                sizes.add(len(state.to_bytes()))
                sizes.add(model.state_nbytes(state))
    assert len(sizes) == 2, sizes
    assert int(state.timestep) == 1000
    back = model.state_from_bytes(state.to_bytes())
    for k, v in state.tensors().items():
        assert torch.equal(back.tensors()[k], v)


def test_transformer_state_grows() -> None:
    model = _model("transformer").float()
    state = model.init_state(1)
    sizes = []
    for i in range(3):
        _, _, state = model.step(torch.randn(1, S), torch.tensor([10.0 if i == 0 else 1.0]), state)
        sizes.append(model.state_nbytes(state))
    assert sizes[0] < sizes[1] < sizes[2]
    assert model.init_state(1).growing == ("k", "v")


def test_checkpoints_round_trip(tmp_path) -> None:
    model = _model("aaren", True).float()
    version = save_checkpoint(tmp_path / "p", model, {"name": "p", "env": "Hopper-v5", "target_return": 3600.0})
    ckpt = load_checkpoint(tmp_path / "p")
    assert ckpt.kind == "policy_model" and ckpt.model_version == version
    assert ckpt.metadata["env"] == "Hopper-v5"
    obs, rtg = torch.randn(2, 4, S), torch.rand(2, 4) * 100
    act, steps = torch.rand(2, 4, A) * 2 - 1, torch.arange(4).expand(2, -1)
    torch.testing.assert_close(ckpt.model(rtg, obs, act, steps), model(rtg, obs, act, steps))
    bc = BCModel(BCModelConfig(obs_dim=S, act_dim=A, hidden=8)).eval()
    save_checkpoint(tmp_path / "bc", bc)
    loaded = load_checkpoint(tmp_path / "bc")
    assert loaded.kind == "policy_bc_model"
    torch.testing.assert_close(loaded.model(obs), bc(obs))
    assert bc(obs).abs().max() <= 1


def test_errors_name_the_shapes() -> None:
    model = _model("gru")
    with pytest.raises(ValueError, match=r"observations \[B, N, 5\]"):
        model(torch.zeros(1, 2), torch.zeros(1, 2, 4), torch.zeros(1, 2, A), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"observations \[1, 5\]"):
        model.step(torch.zeros(1, 4), torch.zeros(1), model.init_state(1))
