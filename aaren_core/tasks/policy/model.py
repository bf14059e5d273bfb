"""The policy model (task ``policy``): a return-conditioned policy in the Decision Transformer layout
(Chen et al. 2021; the defaults of min-decision-transformer) on any backbone, and a BC baseline.

An episode is a sequence of environment steps ``t = 0, 1, ...``; step ``t`` contributes three tokens,
return-to-go ``R_t``, observation ``s_t`` and action ``a_t``, interleaved as
``R_0, s_0, a_0, R_1, s_1, a_1, ...`` (``3 N`` tokens for ``N`` steps)::

    e(R_t) = W_R (R_t / rtg_scale) + b_R + E[t]             [d_model]
    e(s_t) = W_s ((s_t - obs_mean) / obs_std) + b_s + E[t]
    e(a_t) = W_a a_t + b_a + E[t]                          (E: timestep embedding, max_timestep + 1 rows;
                                                             later steps use the last row)
    x      = LayerNorm(e)                                  (DT's embedding LayerNorm)
    y      = backbone(x)                                   [B, 3N, d_model]
    a_hat_t = tanh(W_o y(s_t) + b_o)                        [A], from the observation token's output

``R_t = R_0 - r_0 - ... - r_{t-1}``: the return still wanted after step ``t``'s reward history.
Trained with the squared error of ``a_hat_t`` against the data's ``a_t`` (``aaren_core.tasks.policy.train``).

Serving steps one environment step per row (``init_state`` / ``step``): the state is the backbone's
plus the last predicted action, the current return-to-go and the next timestep; a step feeds the tokens
``a_{t-1}`` (its own last action; not on the first step), ``R_t`` and ``s_t`` and reads the action off
``s_t``'s output. So ``step`` over an episode computes exactly ``forward`` on the tokens of that
episode with the model's own actions (``tests/core/test_policy_model.py``). For Aaren and the GRU the
state has a constant size; the Transformer's is its KV cache, which grows (its state class says so
by ``growing``), so the server refuses it and rollouts re-run its last ``context`` steps instead.

Time decay (an Aaren backbone with ``time_decay``): the gap of a token is 1 for ``R_t`` with
``t > 0`` (a new environment step) and 0 for every other token (tokens of one step, and a window's
first token), so the state ages by one per environment step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from aaren_core.attention.state import AarenState, GRUState, KVCacheState, State
from aaren_core.config import ConfigRecord
from aaren_core.nn.backbones import Backbone, BackboneConfig, build_backbone

__all__ = [
    "BCModel",
    "BCModelConfig",
    "EnvWidths",
    "PolicyAarenState",
    "PolicyGRUState",
    "PolicyKVState",
    "PolicyModel",
    "PolicyModelConfig",
    "PolicySteps",
    "step_gaps",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvWidths:
    """An environment's widths, observation ``obs_dim`` (S) and action ``act_dim`` (A): the fields
    that the policy's and the BC baseline's model configs take from here. Keyword-only, as are those
    configs: their fields' order is the bases' first, not the order a positional call would expect."""

    obs_dim: int = 11
    act_dim: int = 3

    def width_checks(self) -> dict[str, bool]:
        """What the widths must hold, for ``ConfigRecord.require``."""
        return {"obs_dim >= 1, act_dim >= 1": self.obs_dim >= 1 and self.act_dim >= 1}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicySteps:
    """How a policy reads an episode's steps, declared once for the model config and the train config
    (which passes them on): the train window ``context`` (K steps; the Transformer's rollout window),
    ``max_timestep`` (rows of the timestep embedding less one; later steps share the last) and
    ``rtg_scale`` (returns are divided by it)."""

    context: int = 20
    max_timestep: int = 1000
    rtg_scale: float = 1000.0

    def step_checks(self) -> dict[str, bool]:
        """What these fields must hold, for ``ConfigRecord.require``."""
        return {
            "context >= 1, max_timestep >= 1": self.context >= 1 and self.max_timestep >= 1,
            "rtg_scale > 0": self.rtg_scale > 0,
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyModelConfig(EnvWidths, PolicySteps, ConfigRecord):
    """Backbone, ``EnvWidths`` (observation S, action A) and ``PolicySteps`` (context, max_timestep,
    rtg_scale)."""

    CONFIG_NAME: ClassVar[str] = "policy model config"
    #: the order records were written in before the steps' fields came from a base
    RECORD_LEADS: ClassVar[tuple[str, ...]] = ("backbone", "obs_dim", "act_dim")

    backbone: BackboneConfig = dataclasses.field(
        default_factory=lambda: BackboneConfig(d_model=128, n_layers=3, n_heads=1, dropout=0.1)
    )

    def __post_init__(self) -> None:
        self.require({**self.width_checks(), **self.step_checks()})


#: The fields a policy adds to its backbone's state, each ``[B, ...]``: the last action ``action [B, A]``,
#: ``return_to_go [B]`` (raw units, ``R_t`` of the last step) and the next ``timestep [B]`` (int64).
_POLICY_OWN = ("action", "return_to_go", "timestep")
_POLICY_FIELDS = (*_POLICY_OWN, "n_events")


def _policy_state(name: str, backbone_state: type[State]) -> type[State]:
    """The policy state over a backbone's: its fields but ``n_events``, then ``_POLICY_OWN``, then
    ``n_events`` (environment steps seen); kind ``policy-<kind>``, growing where the backbone's grows.
    Derived, not declared, so that every backbone's policy state has the same policy fields."""
    backbone = [f.name for f in dataclasses.fields(backbone_state) if f.name != "n_events"]  # type: ignore[arg-type]
    cls = dataclasses.make_dataclass(
        name,
        [(field, Tensor) for field in (*backbone, *_POLICY_OWN, "n_events")],
        bases=(State,),
        namespace={"kind": f"policy-{backbone_state.kind}", "growing": backbone_state.growing},
        frozen=True,
        eq=False,
    )
    cls.__module__ = __name__
    cls.__doc__ = (
        f"A policy's state over ``{backbone_state.__name__}`` (``{', '.join(backbone)}``): then "
        f"``action [B, A]``, ``return_to_go [B]``, ``timestep [B]`` and ``n_events [B]``."
    )
    return cls


#: An Aaren policy's state (constant size), a GRU policy's (constant size) and a Transformer
#: policy's (its KV cache grows by up to three tokens a step, so the server refuses it).
PolicyAarenState = _policy_state("PolicyAarenState", AarenState)
PolicyGRUState = _policy_state("PolicyGRUState", GRUState)
PolicyKVState = _policy_state("PolicyKVState", KVCacheState)

_POLICY_STATES: dict[type[State], type[State]] = {
    AarenState: PolicyAarenState,
    GRUState: PolicyGRUState,
    KVCacheState: PolicyKVState,
}


def step_gaps(n_steps: int, device: torch.device | str | None = None) -> Tensor:
    """The gaps of the ``3 n_steps`` tokens of a window: 1 on ``R_t`` for ``t > 0``, else 0 ``[3N]``."""
    dt = torch.zeros(n_steps, 3, device=device)
    dt[1:, 0] = 1.0
    return dt.flatten()


class PolicyModel(nn.Module):
    """Embeddings, backbone and action head (module docstring)."""

    def __init__(self, config: PolicyModelConfig) -> None:
        super().__init__()
        self.config = config
        d, s, a = config.backbone.d_model, config.obs_dim, config.act_dim
        self.register_buffer("obs_mean", torch.zeros(s))
        self.register_buffer("obs_std", torch.ones(s))
        self.embed_return = nn.Linear(1, d)
        self.embed_obs = nn.Linear(s, d)
        self.embed_action = nn.Linear(a, d)
        self.embed_timestep = nn.Embedding(config.max_timestep + 1, d)
        self.embed_norm = nn.LayerNorm(d)
        self.backbone: Backbone[Any] = build_backbone(config.backbone)
        self.action_head = nn.Linear(d, a)
        self.state_type = _POLICY_STATES[self.backbone.state_type]

    def set_normalization(self, mean: Tensor, std: Tensor) -> None:
        """Fix the observations' standardization (the data's statistics, ``[S]`` each) before training."""
        self.obs_mean.copy_(torch.as_tensor(mean, dtype=self.obs_mean.dtype))
        self.obs_std.copy_(torch.as_tensor(std, dtype=self.obs_std.dtype).clamp_min(1e-6))

    @property
    def _decays(self) -> bool:
        return self.config.backbone.time_decay

    # Embeddings ------------------------------------------------------------------------------
    def _time(self, timesteps: Tensor) -> Tensor:
        return self.embed_timestep(timesteps.clamp(0, self.config.max_timestep))

    def _embed_return(self, rtg: Tensor, time: Tensor) -> Tensor:
        dtype = self.embed_return.weight.dtype
        return self.embed_norm(self.embed_return((rtg.to(dtype) / self.config.rtg_scale).unsqueeze(-1)) + time)

    def _embed_obs(self, obs: Tensor, time: Tensor) -> Tensor:
        z = (obs.to(self.obs_mean.dtype) - self.obs_mean) / self.obs_std
        return self.embed_norm(self.embed_obs(z) + time)

    def _embed_action(self, action: Tensor, time: Tensor) -> Tensor:
        return self.embed_norm(self.embed_action(action.to(self.embed_action.weight.dtype)) + time)

    def tokens(self, returns_to_go: Tensor, observations: Tensor, actions: Tensor, timesteps: Tensor) -> Tensor:
        """``R [B, N]``, ``s [B, N, S]``, ``a [B, N, A]``, ``t [B, N]`` -> tokens ``[B, 3N, d_model]``
        interleaved ``R_0, s_0, a_0, R_1, ...``."""
        b, n = returns_to_go.shape
        c = self.config
        if observations.shape != (b, n, c.obs_dim) or actions.shape != (b, n, c.act_dim) or timesteps.shape != (b, n):
            raise ValueError(
                f"expected returns_to_go [B, N], observations [B, N, {c.obs_dim}], actions [B, N, {c.act_dim}], "
                f"timesteps [B, N]; got {tuple(returns_to_go.shape)}, {tuple(observations.shape)}, "
                f"{tuple(actions.shape)}, {tuple(timesteps.shape)}"
            )
        time = self._time(timesteps)
        x = torch.stack(
            [
                self._embed_return(returns_to_go, time),
                self._embed_obs(observations, time),
                self._embed_action(actions, time),
            ],
            dim=2,
        )  # [B, N, 3, d]
        return x.reshape(b, 3 * n, -1)

    def head(self, y: Tensor) -> Tensor:
        """Features of observation tokens ``[..., d_model]`` -> actions ``[..., A]`` in [-1, 1]."""
        return torch.tanh(self.action_head(y))

    # Training --------------------------------------------------------------------------------
    def forward(self, returns_to_go: Tensor, observations: Tensor, actions: Tensor, timesteps: Tensor) -> Tensor:
        """Actions predicted at every step ``[B, N, A]`` (a_t from the tokens up to ``s_t``; module docstring)."""
        x = self.tokens(returns_to_go, observations, actions, timesteps)
        dt = step_gaps(returns_to_go.shape[1], x.device).expand(x.shape[0], -1) if self._decays else None
        y, _ = self.backbone.prefill(x, None, dt)
        return self.head(y[:, 1::3])

    # Serving ---------------------------------------------------------------------------------
    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        """The state before an episode's first step (``timestep`` 0)."""
        inner = self.backbone.init_state(batch, device)
        dev, dtype = inner.device, self.action_head.weight.dtype
        fields = {k: v for k, v in inner.tensors().items() if k != "n_events"}
        return self.state_type(
            **fields,
            action=torch.zeros(batch, self.config.act_dim, dtype=dtype, device=dev),
            return_to_go=torch.zeros(batch, dtype=dtype, device=dev),
            timestep=torch.zeros(batch, dtype=torch.long, device=dev),
            n_events=torch.zeros(batch, dtype=torch.long, device=dev),
        )

    def _inner(self, state: State) -> State:
        fields = {k: v for k, v in state.tensors().items() if k not in _POLICY_FIELDS}
        # Tokens the backbone has seen: 2 on the first step, 3 on every later one.
        tokens = (3 * state.timestep - 1).clamp_min(0)
        return self.backbone.state_type(**fields, n_events=tokens)

    def _outer(self, inner: State, action: Tensor, rtg: Tensor, timestep: Tensor) -> State:
        fields = {k: v for k, v in inner.tensors().items() if k != "n_events"}
        return self.state_type(**fields, action=action, return_to_go=rtg, timestep=timestep, n_events=timestep.clone())

    def _feed(self, x: Tensor, inner: State, gap: Tensor, rows: Tensor | None = None) -> tuple[Tensor, State]:
        """One token per row with its gap ``[B]``; with ``rows`` (bool ``[B]``) only those rows take it
        (the others keep their state)."""
        y, new = self.backbone.step(x, inner, gap if self._decays else None)
        if rows is None:
            return y, new
        if inner.growing:
            raise ValueError(
                "a Transformer policy steps rows at the same timestep only (its KV cache is shared in length); "
                "got a batch mixing first and later steps"
            )
        kept = {}
        for k, old in inner.tensors().items():
            keep = rows.view(-1, *([1] * (old.dim() - 1)))
            kept[k] = torch.where(keep, new.tensors()[k], old)
        return y, type(inner)(**kept)

    @torch.no_grad()
    def step(self, observations: Tensor, rewards: Tensor, state: State) -> tuple[Tensor, Tensor, State]:
        """One environment step per row: ``observations [B, S]`` raw, ``rewards [B]`` (the target return
        ``R_0`` on a row's first step, else the reward of the last action) -> ``(actions [B, A]`` in
        [-1, 1], ``returns_to_go [B]`` (``R_t``), the new state)``."""
        b = state.batch_size
        if observations.shape != (b, self.config.obs_dim) or rewards.shape != (b,):
            raise ValueError(
                f"expected observations [{b}, {self.config.obs_dim}] and rewards [{b}] for a state of batch {b}; "
                f"got {tuple(observations.shape)} and {tuple(rewards.shape)}"
            )
        t = state.timestep  # [B]
        first = t == 0
        rewards = rewards.to(state.return_to_go.dtype)
        rtg = torch.where(first, rewards, state.return_to_go - rewards)
        inner = self._inner(state)
        later = ~first
        time = self._time(t)
        now = [self._embed_return(rtg, time), self._embed_obs(observations, time)]
        if bool(later.all()) or not bool(later.any()):
            # Every row in the same phase: the step's 2 or 3 tokens in one prefill (the same numbers as
            # token by token; one pass through the layers).
            gaps = [0.0, 0.0]
            if bool(later.all()):
                now.insert(0, self._embed_action(state.action, self._time(t - 1)))
                gaps = [0.0, 1.0, 0.0]  # R_t's gap: one environment step after the last one
            x = torch.stack(now, dim=1)  # [B, 2|3, d]
            dt = torch.tensor(gaps, device=x.device).expand(b, -1) if self._decays else None
            y_all, inner = self.backbone.prefill(x, inner, dt)
            y = y_all[:, -1]
        else:
            zero = torch.zeros(b, device=rtg.device)
            prev = self._embed_action(state.action, self._time(t - 1))
            _, inner = self._feed(prev, inner, zero, later)
            # R_t's gap: one environment step after an earlier step (a fresh state has nothing to age).
            _, inner = self._feed(now[0], inner, later.to(zero.dtype))
            y, inner = self._feed(now[1], inner, zero)
        action = self.head(y).to(state.action.dtype)
        return action, rtg, self._outer(inner, action, rtg, t + 1)

    def state_nbytes(self, state: State) -> int:
        """Bytes of ``state`` per row (per episode)."""
        return state.nbytes // max(1, state.batch_size)

    def state_from_bytes(self, data: bytes, model_version: str | None = None) -> State:
        """Parse a state written by ``State.to_bytes``, checking it fits this model."""
        like = self.init_state(1, device="cpu")
        device = self.obs_mean.device
        return self.state_type.from_bytes(data, like=like, model_version=model_version, device=device)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BCModelConfig(EnvWidths, ConfigRecord):
    """Behaviour cloning: an MLP of ``n_hidden`` layers of ``hidden`` units from the observation
    (``EnvWidths``: S wide) to the action (A wide)."""

    CONFIG_NAME: ClassVar[str] = "bc model config"

    hidden: int = 256
    n_hidden: int = 2
    dropout: float = 0.1

    def __post_init__(self) -> None:
        self.require({**self.width_checks(), "hidden, n_hidden >= 1": min(self.hidden, self.n_hidden) >= 1})


class BCModel(nn.Module):
    """``a = tanh(MLP((s - obs_mean) / obs_std))`` (ReLU, dropout); no history, no return."""

    def __init__(self, config: BCModelConfig) -> None:
        super().__init__()
        self.config = config
        self.register_buffer("obs_mean", torch.zeros(config.obs_dim))
        self.register_buffer("obs_std", torch.ones(config.obs_dim))
        layers: list[nn.Module] = []
        width = config.obs_dim
        for _ in range(config.n_hidden):
            layers += [nn.Linear(width, config.hidden), nn.ReLU(), nn.Dropout(config.dropout)]
            width = config.hidden
        layers.append(nn.Linear(width, config.act_dim))
        self.net = nn.Sequential(*layers)

    def set_normalization(self, mean: Tensor, std: Tensor) -> None:
        self.obs_mean.copy_(torch.as_tensor(mean, dtype=self.obs_mean.dtype))
        self.obs_std.copy_(torch.as_tensor(std, dtype=self.obs_std.dtype).clamp_min(1e-6))

    def forward(self, observations: Tensor) -> Tensor:
        """``observations [..., S]`` raw -> actions ``[..., A]`` in [-1, 1]."""
        return torch.tanh(self.net((observations.to(self.obs_mean.dtype) - self.obs_mean) / self.obs_std))
