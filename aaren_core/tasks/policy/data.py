"""A policy data set as training windows: returns-to-go, timesteps, the observations' statistics and
seeded window sampling.

For the transitions of one episode ``i = 0 .. T-1`` with rewards ``r_i``::

    R_i = r_i + r_{i+1} + ... + r_{T-1}        (undiscounted return-to-go, raw units)
    t_i = i                                    (timestep within the episode)

A window is ``K = context`` consecutive steps of one episode. ``random`` windows start anywhere in an
episode (uniform over the valid starts of all episodes, so longer episodes give more windows; DT's
sampling); ``episode`` windows start at an episode's first step (what a served state always sees).
An episode shorter than ``K`` gives one window padded at its end: padding is causal (later tokens
never reach earlier outputs) and masked out of the loss. ``obs_mean``/``obs_std`` are the statistics
of all observations (DT's state normalisation).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from aaren.formats.errors import DataError
from aaren.formats.policy import (
    DATASET_KINDS,
    POLICY_ENVS,
    PolicyDataset,
    dataset_path,
    read_policy_dataset,
)

__all__ = ["WINDOWS", "PolicyData", "PolicyWindows", "load_policy_data", "resolve_dataset"]

WINDOWS = ("random", "episode")


@dataclasses.dataclass(frozen=True)
class PolicyWindows:
    """A batch of ``B`` windows of ``K`` steps: ``returns_to_go [B, K]`` f32 (raw), ``observations
    [B, K, S]`` f32 (raw), ``actions [B, K, A]`` f32, ``timesteps [B, K]`` int64, ``mask [B, K]`` bool
    (real steps)."""

    returns_to_go: np.ndarray
    observations: np.ndarray
    actions: np.ndarray
    timesteps: np.ndarray
    mask: np.ndarray


def resolve_dataset(data: str, env: str = "") -> tuple[Path, str]:
    """``data`` (a name ``hopper-v5-medium`` of the cache, or a ``.npz`` file) -> ``(path, env)``.
    The env is ``env`` when given, else the name's, else the sidecar's ``env`` field, else the file
    name's prefix (``hopper-v5-...``)."""
    known = {e.lower(): e for e in POLICY_ENVS}
    path = Path(data).expanduser()
    if not path.suffix:
        for lower, name in known.items():
            kind = data.lower().removeprefix(lower + "-")
            if data.lower().startswith(lower + "-") and kind in DATASET_KINDS:
                return dataset_path(name, kind), env or name
        raise DataError(
            f"policy data {data!r}: expected <env>-<kind> (envs {', '.join(e.lower() for e in POLICY_ENVS)}; "
            f"kinds {', '.join(DATASET_KINDS)}) or a .npz file"
        )
    if env:
        return path, env
    sidecar = path.with_suffix(".json")
    if sidecar.is_file():
        try:
            found = json.loads(sidecar.read_text()).get("env", "")
        except (ValueError, AttributeError):
            found = ""
        if found:
            return path, str(found)
    for lower, name in known.items():
        if path.name.lower().startswith(lower):
            return path, name
    raise DataError(f"{path}: cannot tell its environment (no sidecar {sidecar.name} with 'env'); give --set env=...")


@dataclasses.dataclass
class PolicyData:
    """A data set with per-transition returns-to-go and timesteps, split by episode."""

    name: str
    env: str
    source: str
    dataset: PolicyDataset
    returns_to_go: np.ndarray  # [N] f32
    timesteps: np.ndarray  # [N] int64
    bounds: list[tuple[int, int]]
    train_episodes: np.ndarray  # indices into bounds
    val_episodes: np.ndarray
    obs_mean: np.ndarray
    obs_std: np.ndarray

    @classmethod
    def build(
        cls,
        dataset: PolicyDataset,
        env: str,
        name: str = "",
        source: str = "",
        val_fraction: float = 0.05,
        seed: int = 0,
    ) -> PolicyData:
        bounds = dataset.episode_bounds()
        if not bounds:
            raise DataError(f"policy data {name or source!r} holds no episodes")
        rtg = np.empty(len(dataset.rewards), dtype=np.float32)
        steps = np.empty(len(dataset.rewards), dtype=np.int64)
        for lo, hi in bounds:
            rtg[lo:hi] = np.cumsum(dataset.rewards[lo:hi][::-1].astype(np.float64))[::-1]
            steps[lo:hi] = np.arange(hi - lo)
        order = np.random.default_rng(seed).permutation(len(bounds))
        n_val = round(val_fraction * len(bounds)) if len(bounds) > 1 else 0
        n_val = min(max(n_val, 1 if len(bounds) > 1 and val_fraction > 0 else 0), len(bounds) - 1)
        obs = dataset.observations.astype(np.float64)
        return cls(
            name=name,
            env=env,
            source=source,
            dataset=dataset,
            returns_to_go=rtg,
            timesteps=steps,
            bounds=bounds,
            train_episodes=np.sort(order[n_val:]),
            val_episodes=np.sort(order[:n_val]),
            obs_mean=obs.mean(0).astype(np.float32),
            obs_std=(obs.std(0) + 1e-6).astype(np.float32),
        )

    def starts(self, episodes: np.ndarray, context: int, windows: str) -> np.ndarray:
        """Every window start of ``episodes`` (transition indices): all ``lo .. max(lo, hi - K)`` for
        ``random`` windows, the first step ``lo`` for ``episode`` ones."""
        if windows not in WINDOWS:
            raise ValueError(f"windows={windows!r}; expected one of {WINDOWS}")
        parts = []
        for e in episodes:
            lo, hi = self.bounds[int(e)]
            parts.append(np.arange(lo, max(lo, hi - context) + 1) if windows == "random" else np.array([lo]))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def windows(self, starts: np.ndarray, context: int) -> PolicyWindows:
        """The windows of ``K = context`` steps from ``starts [B]`` (padded after an episode's end)."""
        all_ends = np.array([hi for _, hi in self.bounds])
        ends = all_ends[np.searchsorted(all_ends, starts, side="right")]  # [B]: each window's episode end
        idx = starts[:, None] + np.arange(context)[None, :]  # [B, K]
        mask = idx < ends[:, None]
        idx = np.minimum(idx, ends[:, None] - 1)
        d = self.dataset
        obs, act = d.observations[idx], d.actions[idx]
        rtg, steps = self.returns_to_go[idx], self.timesteps[idx]
        obs[~mask], act[~mask], rtg[~mask], steps[~mask] = 0.0, 0.0, 0.0, 0
        return PolicyWindows(rtg, obs, act, steps, mask)

    def transitions(self, episodes: np.ndarray) -> np.ndarray:
        """Indices of every transition of ``episodes`` (for behaviour cloning)."""
        return np.concatenate([np.arange(*self.bounds[int(e)]) for e in episodes])


def load_policy_data(data: str, env: str = "", val_fraction: float = 0.05, seed: int = 0) -> PolicyData:
    """Read ``data`` (``resolve_dataset``) as ``PolicyData``."""
    path, env = resolve_dataset(data, env)
    if env not in POLICY_ENVS:
        raise DataError(f"environment {env!r}: expected one of {', '.join(POLICY_ENVS)}")
    dataset = read_policy_dataset(path)
    name = data if not Path(data).suffix else path.name.split(".")[0]
    return PolicyData.build(dataset, env, name=name, source=str(path), val_fraction=val_fraction, seed=seed)
