"""Online evaluation of a policy: episodes in a gymnasium MuJoCo environment, and the cost of an action.

``rollout(model, env_id, episodes, target_return, seed, max_steps)`` plays ``episodes`` episodes;
episode ``i`` starts from ``env.reset(seed=seed + i)`` and ends at a terminal state, at gymnasium's
time limit or after ``max_steps`` steps. Per step:

- Aaren and GRU policies: ``model.step`` with the episode's one constant state (the target return on
  the first step, then the last reward): the arithmetic the server does for one session. With
  ``parallel`` all episodes step together as the rows of one batch (the same per-row arithmetic;
  finished rows are dropped from the batch);
- Transformer policies: DT's evaluation, ``forward`` over the last ``context`` steps (returns-to-go,
  observations, the actions taken, timesteps) and the action read off the last observation;
- ``BCModel``: the action of the observation.

Actions are clipped to the action space (the models' are in [-1, 1], as the MuJoCo tasks' are).
Scores are D4RL's normalised score (``aaren.formats.policy.normalized_score``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from aaren.formats.policy import normalized_score
from aaren_core.tasks.policy.model import BCModel, PolicyModel

__all__ = ["DEFAULT_TARGET_RETURNS", "RolloutResult", "action_cost_us", "default_target_return", "rollout"]

#: DT's evaluation targets (Chen et al. 2021) per environment family.
DEFAULT_TARGET_RETURNS = {"Hopper": 3600.0, "HalfCheetah": 12000.0, "Walker2d": 5000.0}


def default_target_return(env_id: str, default: float | None = None) -> float:
    """DT's target return for ``env_id`` (``Hopper-v5`` -> 3600); for an environment it names none,
    ``default``, or ``ValueError`` where that is None."""
    family = env_id.split("-")[0]
    if family not in DEFAULT_TARGET_RETURNS:
        if default is not None:
            return default
        raise ValueError(f"no default target return for {env_id!r}; known: {sorted(DEFAULT_TARGET_RETURNS)}")
    return DEFAULT_TARGET_RETURNS[family]


@dataclasses.dataclass(frozen=True)
class RolloutResult:
    """``returns [E]`` f64, ``lengths [E]`` int, ``scores [E]`` (normalised), ``actions``: per episode
    ``[T, A]`` f32, and ``model_seconds`` spent computing actions."""

    returns: np.ndarray
    lengths: np.ndarray
    scores: np.ndarray
    actions: list[np.ndarray]
    model_seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "returns": self.returns.tolist(),
            "lengths": self.lengths.tolist(),
            "scores": self.scores.tolist(),
            "return_mean": float(self.returns.mean()),
            "return_std": float(self.returns.std()),
            "score_mean": float(self.scores.mean()),
            "score_std": float(self.scores.std()),
            "us_per_action_rollout": 1e6 * self.model_seconds / max(1, int(self.lengths.sum())),
        }


class _Actor:
    """Actions for ``n`` episodes stepped together (``rows``: the episodes still running)."""

    def __init__(self, model: nn.Module, n: int, target_return: float, max_steps: int) -> None:
        self.model, self.n, self.target = model, n, target_return
        self.recurrent = isinstance(model, PolicyModel) and not model.init_state(1).growing
        if isinstance(model, PolicyModel):
            c = model.config
            self.state = model.init_state(n) if self.recurrent else None
            self.rtg = np.zeros((n, max_steps + 1), dtype=np.float32)
            self.obs = np.zeros((n, max_steps + 1, c.obs_dim), dtype=np.float32)
            self.act = np.zeros((n, max_steps + 1, c.act_dim), dtype=np.float32)

    @torch.no_grad()
    def act_on(self, rows: np.ndarray, t: int, obs: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        """Actions ``[len(rows), A]`` at step ``t`` of ``rows`` for ``obs [len(rows), S]`` and the
        last ``rewards`` (ignored at ``t = 0``)."""
        model = self.model
        x = torch.from_numpy(obs.astype(np.float32))
        if isinstance(model, BCModel):
            return model(x).numpy()
        assert isinstance(model, PolicyModel)
        if self.recurrent:
            state = self.state.select(torch.from_numpy(rows)) if len(rows) < self.state.batch_size else self.state
            fed = np.full(len(rows), self.target, np.float32) if t == 0 else rewards.astype(np.float32)
            action, _, self.state = model.step(x, torch.from_numpy(fed), state)
            return action.numpy()
        rtg = self.target if t == 0 else self.rtg[rows, t - 1] - rewards
        self.rtg[rows, t], self.obs[rows, t] = rtg, obs
        lo = max(0, t + 1 - model.config.context)
        steps = torch.arange(lo, t + 1).expand(len(rows), -1)
        out = model(
            torch.from_numpy(self.rtg[rows, lo : t + 1]),
            torch.from_numpy(self.obs[rows, lo : t + 1]),
            torch.from_numpy(self.act[rows, lo : t + 1]),
            steps,
        )[:, -1].numpy()
        self.act[rows, t] = out
        return out

    def keep(self, rows: np.ndarray, alive: np.ndarray) -> None:
        """Drop finished rows from a recurrent state (``alive``: which of ``rows`` go on)."""
        if self.recurrent and not alive.all():
            self.state = self.state.select(torch.from_numpy(np.flatnonzero(alive)))


def rollout(
    model: nn.Module,
    env_id: str,
    episodes: int,
    target_return: float,
    seed: int = 0,
    max_steps: int = 1000,
    parallel: bool = False,
) -> RolloutResult:
    """Play ``episodes`` episodes (module docstring); ``parallel`` steps them together as one batch."""
    import gymnasium as gym

    model.eval()
    groups = [list(range(episodes))] if parallel else [[i] for i in range(episodes)]
    returns = np.zeros(episodes)
    lengths = np.zeros(episodes, dtype=np.int64)
    actions: list[list[np.ndarray]] = [[] for _ in range(episodes)]
    model_seconds = 0.0
    for group in groups:
        envs = [gym.make(env_id) for _ in group]
        try:
            low, high = envs[0].action_space.low, envs[0].action_space.high
            obs = np.stack([env.reset(seed=seed + i)[0] for env, i in zip(envs, group, strict=True)])
            actor = _Actor(model, len(group), target_return, max_steps)
            rows = np.arange(len(group))
            rewards = np.zeros(len(group))
            for t in range(max_steps):
                t0 = time.perf_counter()
                acts = actor.act_on(rows, t, obs[rows], rewards[rows])
                model_seconds += time.perf_counter() - t0
                alive = np.ones(len(rows), dtype=bool)
                for j, r in enumerate(rows):
                    a = np.clip(acts[j], low, high)
                    actions[group[r]].append(a.astype(np.float32))
                    o, rew, terminated, truncated, _ = envs[r].step(a)
                    obs[r], rewards[r] = o, rew
                    returns[group[r]] += rew
                    lengths[group[r]] += 1
                    alive[j] = not (terminated or truncated)
                actor.keep(rows, alive)
                rows = rows[alive]
                if not len(rows):
                    break
        finally:
            for env in envs:
                env.close()
    return RolloutResult(
        returns=returns,
        lengths=lengths,
        scores=np.asarray(normalized_score(env_id, returns), dtype=np.float64),
        actions=[np.stack(a) if a else np.zeros((0, 0), np.float32) for a in actions],
        model_seconds=model_seconds,
    )


@torch.no_grad()
def action_cost_us(model: nn.Module, batch: int, steps: int = 100, warmup: int = 10) -> float:
    """Mean µs per batch of ``batch`` actions, measured over ``steps`` model steps on random
    observations (the rollout's computation without the environment): ``model.step`` for Aaren and
    the GRU, a ``context``-step window forward for the Transformer, the MLP for BC."""
    model.eval()
    if isinstance(model, BCModel):
        x = torch.randn(batch, model.config.obs_dim)
        for _ in range(warmup):
            model(x)
        t0 = time.perf_counter()
        for _ in range(steps):
            model(x)
        return 1e6 * (time.perf_counter() - t0) / steps
    assert isinstance(model, PolicyModel)
    c = model.config
    warmup = max(warmup, c.context)
    actor = _Actor(model, batch, 100.0, warmup + steps + 1)
    rows = np.arange(batch)
    obs = np.random.default_rng(0).standard_normal((warmup + steps, batch, c.obs_dim)).astype(np.float32)
    rewards = np.ones(batch, dtype=np.float32)
    for t in range(warmup):
        actor.act_on(rows, t, obs[t], rewards)
    # From here on the Transformer's window is full (warmup >= context).
    t0 = time.perf_counter()
    for t in range(warmup, warmup + steps):
        actor.act_on(rows, t, obs[t], rewards)
    return 1e6 * (time.perf_counter() - t0) / steps
