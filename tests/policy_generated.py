"""Generated policy data for tests: a random-action rollout of a real gymnasium environment as a
D4RL-style data set (``aaren.formats.policy``), a few hundred steps, from a seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aaren.formats.policy import PolicyDataset, write_policy_dataset


def random_rollout_dataset(steps: int = 300, seed: int = 0, env_id: str = "Hopper-v5") -> PolicyDataset:
    """``steps`` transitions of uniformly random actions in ``env_id`` (reset after every episode end;
    the last transition is marked a timeout so that the set ends an episode)."""
    import gymnasium as gym

    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    obs_l, act_l, rew_l, term_l, time_l = [], [], [], [], []
    obs, _ = env.reset(seed=seed)
    for i in range(steps):
        action = rng.uniform(env.action_space.low, env.action_space.high).astype(np.float32)
        nxt, reward, terminated, truncated, _ = env.step(action)
        obs_l.append(obs)
        act_l.append(action)
        rew_l.append(reward)
        term_l.append(terminated)
        time_l.append(truncated or (i == steps - 1 and not terminated))
        obs = env.reset()[0] if terminated or truncated else nxt
    env.close()
    return PolicyDataset(
        observations=np.asarray(obs_l, np.float32),
        actions=np.asarray(act_l, np.float32),
        rewards=np.asarray(rew_l, np.float32),
        terminals=np.asarray(term_l, bool),
        timeouts=np.asarray(time_l, bool),
    )


def write_random_dataset(path: Path, steps: int = 300, seed: int = 0, env_id: str = "Hopper-v5") -> Path:
    """``random_rollout_dataset`` written to ``path`` (.npz)."""
    write_policy_dataset(path, random_rollout_dataset(steps, seed, env_id))
    return path
