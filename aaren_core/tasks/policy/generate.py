"""D4RL-style offline data sets, generated here: ``python -m aaren_core.tasks.policy.generate --env Hopper-v5``.

D4RL (Fu et al. 2020) made its MuJoCo sets from one SAC run per environment: **medium** is 1M
steps of a policy stopped at about a third of the final (expert) policy's return, **medium-replay**
is that run's replay buffer up to the moment it was stopped, **medium-expert** is the medium set and
as many steps of the expert policy, concatenated. D4RL's files cannot be fetched here, so this
module makes the same three kinds from a behaviour policy trained here:

1. train a stable-baselines3 PPO policy for ``timesteps`` steps (a fixed seed; one core). A
   recording wrapper keeps every transition the training environment sees (the executed, clipped
   action), and every ``eval_every`` steps the policy is evaluated (``eval_episodes`` stochastic
   episodes on their own seeds) and kept as a snapshot;
2. **medium**: the snapshot whose evaluated return is closest to a third of the final policy's,
   rolled out (stochastic actions, as D4RL's medium policy) for ``steps_per_set`` steps;
3. **medium-replay**: the transitions recorded up to that snapshot (the last ``steps_per_set`` of
   them, cut at an episode start): PPO keeps no replay buffer, so the recording is what SAC's
   buffer would have held: everything the learner saw until then;
4. **medium-expert**: medium followed by ``steps_per_set`` steps of the final policy.

PPO rather than SAC: SAC updates after every environment step and ran at 43 updates/s on Hopper
here with the other core busy (1M steps: 6.5 hours); PPO runs at about 1,600 steps/s on one core,
so a behaviour policy costs minutes. Its final return is lower than D4RL's SAC expert, which the
normalised scores of the data (in the sidecar) make visible.

Each set is ``aaren.formats.policy.dataset_path(env, kind)`` (``.npz``) with a ``.json`` sidecar:
the command, package versions, seed, budget, hyperparameters, sizes, the data's returns and
normalised scores, the two policies' evaluated returns, the references, and the file's sha256.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from aaren.formats.policy import (
    REFERENCE_RETURNS,
    PolicyDataset,
    dataset_path,
    normalized_score,
    write_policy_dataset,
)

__all__ = ["PPO_SETTINGS", "generate", "main"]

#: PPO's settings (stable-baselines3 defaults but a shorter rollout, so that snapshots come often).
PPO_SETTINGS: dict[str, Any] = {
    "n_steps": 1024,
    "batch_size": 64,
    "n_epochs": 10,
    "learning_rate": 3e-4,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_range": 0.2,
    "ent_coef": 0.0,
}


class _Recorder:
    """Transitions ``(s_t, a_t, r_t, terminal, timeout)`` of one environment, in order."""

    def __init__(self) -> None:
        self.obs: list[np.ndarray] = []
        self.actions: list[np.ndarray] = []
        self.rewards: list[float] = []
        self.terminals: list[bool] = []
        self.timeouts: list[bool] = []

    def add(self, obs: np.ndarray, action: np.ndarray, reward: float, terminal: bool, timeout: bool) -> None:
        self.obs.append(np.asarray(obs, np.float32))
        self.actions.append(np.asarray(action, np.float32))
        self.rewards.append(float(reward))
        self.terminals.append(bool(terminal))
        self.timeouts.append(bool(timeout))

    def __len__(self) -> int:
        return len(self.rewards)

    def dataset(self, start: int = 0, stop: int | None = None) -> PolicyDataset:
        """Transitions ``start:stop``; the last one ends its episode (cut: a timeout)."""
        stop = len(self) if stop is None else stop
        timeouts = np.array(self.timeouts[start:stop], bool)
        terminals = np.array(self.terminals[start:stop], bool)
        if len(timeouts) and not (terminals[-1] or timeouts[-1]):
            timeouts[-1] = True
        return PolicyDataset(
            observations=np.stack(self.obs[start:stop]),
            actions=np.stack(self.actions[start:stop]),
            rewards=np.array(self.rewards[start:stop], np.float32),
            terminals=terminals,
            timeouts=timeouts,
        )


def _recording_env(env_id: str, recorder: _Recorder) -> Any:
    import gymnasium as gym

    class Recording(gym.Wrapper):
        """Records every step the learner takes (the action as executed, inside the action space)."""

        def reset(self, **kwargs: Any) -> Any:
            obs, info = self.env.reset(**kwargs)
            self._obs = obs
            return obs, info

        def step(self, action: Any) -> Any:
            action = np.clip(action, self.action_space.low, self.action_space.high)
            obs, reward, terminated, truncated, info = self.env.step(action)
            recorder.add(self._obs, action, reward, terminated, truncated)
            self._obs = obs
            return obs, reward, terminated, truncated, info

    return Recording(gym.make(env_id))


def _rollouts(
    policy: Any, env_id: str, seed: int, *, steps: int = 0, episodes: int = 0, deterministic: bool = False
) -> PolicyDataset:
    """Transitions of ``policy``: ``steps`` of them (whole episodes, the last one cut) or ``episodes`` whole
    episodes; episode ``i`` reset with ``seed + i``."""
    import gymnasium as gym

    env, rec, episode = gym.make(env_id), _Recorder(), 0
    obs, _ = env.reset(seed=seed)
    while (len(rec) < steps) if steps else (episode < episodes):
        action, _ = policy.predict(obs, deterministic=deterministic)
        action = np.clip(action, env.action_space.low, env.action_space.high)
        nxt, reward, terminated, truncated, _ = env.step(action)
        rec.add(obs, action, reward, terminated, truncated)
        obs = nxt
        if terminated or truncated:
            episode += 1
            obs, _ = env.reset(seed=seed + episode)
    env.close()
    return rec.dataset()


def _mean_return(policy: Any, env_id: str, episodes: int, seed: int) -> float:
    """The mean return of ``episodes`` whole episodes of ``policy`` (``_rollouts``)."""
    return float(np.mean(_rollouts(policy, env_id, seed, episodes=episodes).episode_returns()))


def _concat(a: PolicyDataset, b: PolicyDataset) -> PolicyDataset:
    return PolicyDataset(
        *(
            np.concatenate([getattr(a, k), getattr(b, k)])
            for k in ("observations", "actions", "rewards", "terminals", "timeouts")
        )
    )


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in ("gymnasium", "mujoco", "stable_baselines3", "torch", "numpy"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _summary(env_id: str, data: PolicyDataset) -> dict[str, Any]:
    returns = data.episode_returns()
    scores = normalized_score(env_id, returns)
    return {
        "steps": len(data.rewards),
        "episodes": len(returns),
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "return_min": float(returns.min()),
        "return_max": float(returns.max()),
        "score_mean": float(np.mean(scores)),
        "score_std": float(np.std(scores)),
    }


def generate(
    env_id: str,
    *,
    seed: int = 0,
    timesteps: int = 600_000,
    steps_per_set: int = 100_000,
    eval_every: int = 30_720,
    eval_episodes: int = 3,
    cache: str | Path | None = None,
    command: str = "",
    progress: bool = False,
) -> dict[str, Any]:
    """Train the behaviour policy and write the three sets (module docstring); returns what the sidecars hold."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    started = time.monotonic()
    recorder = _Recorder()
    env = _recording_env(env_id, recorder)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **PPO_SETTINGS)
    snapshots: list[dict[str, Any]] = []

    class Snapshots(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every == 0 or self.num_timesteps == timesteps:
                ret = _mean_return(self.model, env_id, eval_episodes, seed=10_000 + len(snapshots) * eval_episodes)
                snapshots.append(
                    {
                        "timesteps": int(self.num_timesteps),
                        "recorded": len(recorder),
                        "return": ret,
                        "weights": copy.deepcopy(self.model.policy.state_dict()),
                    }
                )
                if progress:
                    print(f"{env_id}: {self.num_timesteps} steps, return {ret:.1f}", flush=True)
            return True

    model.learn(timesteps, callback=Snapshots())
    train_s = time.monotonic() - started
    final_weights = copy.deepcopy(model.policy.state_dict())
    final_return = _mean_return(model, env_id, 10, seed=20_000)
    target = final_return / 3
    medium = min(snapshots[:-1] or snapshots, key=lambda s: abs(s["return"] - target))
    model.policy.load_state_dict(medium["weights"])
    medium_return = _mean_return(model, env_id, 10, seed=20_000)

    sets: dict[str, PolicyDataset] = {}
    sets["medium"] = _rollouts(model, env_id, 30_000, steps=steps_per_set)
    stop = medium["recorded"]
    begin = max(0, stop - steps_per_set)
    if begin:
        ends = np.flatnonzero(np.array(recorder.terminals[:stop]) | np.array(recorder.timeouts[:stop])) + 1
        begin = int(ends[np.searchsorted(ends, begin)]) if (ends >= begin).any() else begin
    sets["medium-replay"] = recorder.dataset(begin, stop)
    model.policy.load_state_dict(final_weights)
    sets["medium-expert"] = _concat(sets["medium"], _rollouts(model, env_id, 40_000, steps=steps_per_set))

    low, high = REFERENCE_RETURNS[env_id.split("-")[0]]
    common = {
        "env": env_id,
        "command": command,
        "versions": _versions(),
        "seed": seed,
        "algorithm": "PPO (stable-baselines3, MlpPolicy, no observation normalisation)",
        "ppo": PPO_SETTINGS,
        "timesteps": timesteps,
        "steps_per_set": steps_per_set,
        "eval_every": eval_every,
        "eval_episodes": eval_episodes,
        "train_seconds": round(train_s, 1),
        "final_policy": {"return": final_return, "score": float(normalized_score(env_id, final_return))},
        "medium_policy": {
            "timesteps": medium["timesteps"],
            "evaluated_return": medium["return"],
            "return": medium_return,
            "score": float(normalized_score(env_id, medium_return)),
        },
        "snapshots": [{"timesteps": s["timesteps"], "return": round(s["return"], 1)} for s in snapshots],
        "reference_returns": {"random": low, "expert": high, "source": "D4RL REF_MIN_SCORE / REF_MAX_SCORE (v2)"},
    }
    out: dict[str, Any] = {}
    for kind, data in sets.items():
        path = dataset_path(env_id, kind, cache)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_policy_dataset(path, data)
        side = {**common, "kind": kind, "data": _summary(env_id, data)}
        side["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        side["wall_seconds"] = round(time.monotonic() - started, 1)
        path.with_suffix(".json").write_text(json.dumps(side, indent=2) + "\n")
        out[kind] = side
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m aaren_core.tasks.policy.generate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--env", required=True, help="a gymnasium MuJoCo environment, e.g. Hopper-v5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timesteps", type=int, default=600_000, help="PPO training steps")
    parser.add_argument("--steps-per-set", type=int, default=100_000)
    parser.add_argument("--cache", default=None, help="folder (default $AAREN_POLICY_CACHE or ~/.cache/aaren/policy)")
    args = parser.parse_args(argv)
    command = "python -m aaren_core.tasks.policy.generate " + " ".join(sys.argv[1:] if argv is None else argv)
    out = generate(
        args.env,
        seed=args.seed,
        timesteps=args.timesteps,
        steps_per_set=args.steps_per_set,
        cache=args.cache,
        command=command,
        progress=True,
    )
    for kind, side in out.items():
        d = side["data"]
        print(f"{args.env} {kind}: {d['steps']} steps, {d['episodes']} episodes, score {d['score_mean']:.1f}")


if __name__ == "__main__":
    main()
