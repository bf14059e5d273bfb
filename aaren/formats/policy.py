"""Offline RL data sets and scores, torch-free: what the policy task's trainer, its generator and the
client's ``aaren rollout`` share.

A data set (``PolicyDataset``) is D4RL's layout (Fu et al. 2020) as one NumPy ``.npz`` file: ``N``
transitions in episode order, ``observations [N, S]`` float32, ``actions [N, A]`` float32 (as
executed, inside the action space), ``rewards [N]`` float32 (the reward of that action),
``terminals [N]`` bool (the episode ended in a terminal state after it) and ``timeouts [N]`` bool
(it was cut by the time limit, or by the end of the recording). Every episode ends with one of the
two flags. Beside it, ``<file>.json`` says how it was made (``aaren_core.tasks.policy.generate``).

Scores are D4RL's normalised score, ``100 (R - R_random) / (R_expert - R_random)`` with D4RL's
published reference returns per environment (``REFERENCE_RETURNS``: the ``REF_MIN_SCORE`` and
``REF_MAX_SCORE`` of its v2 MuJoCo sets). D4RL measured them in the v2 environments; gymnasium's v5
ones keep the bodies and the reward terms (their changes are fixes, e.g. the healthy reward of a
terminal step), so scores here are comparable to D4RL's in kind, not to the decimal.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from aaren.formats.errors import DataError

__all__ = [
    "CACHE_ENV",
    "DATASET_KINDS",
    "POLICY_ENVS",
    "REFERENCE_RETURNS",
    "PolicyDataset",
    "dataset_path",
    "normalized_score",
    "policy_cache_dir",
    "read_policy_dataset",
    "write_policy_dataset",
]

#: (random, expert) returns per environment: D4RL's references (``d4rl/infos.py``, v2 sets).
REFERENCE_RETURNS: dict[str, tuple[float, float]] = {
    "Hopper": (-20.272305, 3234.3),
    "HalfCheetah": (-280.178953, 12135.0),
    "Walker2d": (1.629008, 4592.3),
}

#: The gymnasium environments the policy task knows (``<name>-v5``).
POLICY_ENVS = tuple(f"{name}-v5" for name in REFERENCE_RETURNS)

#: D4RL's kinds of data set that ``aaren_core.tasks.policy.generate`` writes.
DATASET_KINDS = ("medium", "medium-replay", "medium-expert")

#: Where generated data sets live: ``$AAREN_POLICY_CACHE``, else ``~/.cache/aaren/policy``.
CACHE_ENV = "AAREN_POLICY_CACHE"

_FIELDS = ("observations", "actions", "rewards", "terminals", "timeouts")


def _family(env: str) -> str:
    family = env.split("-")[0]
    if family not in REFERENCE_RETURNS:
        raise DataError(f"no reference returns for environment {env!r}; known: {', '.join(POLICY_ENVS)}")
    return family


def policy_cache_dir(path: str | Path | None = None) -> Path:
    """The data sets' folder: ``path``, else ``$AAREN_POLICY_CACHE``, else ``~/.cache/aaren/policy``."""
    if path is not None:
        return Path(path)
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "aaren" / "policy")


def dataset_path(env: str, kind: str, cache: str | Path | None = None) -> Path:
    """The file of data set ``kind`` (``DATASET_KINDS``) of ``env`` (e.g. ``Hopper-v5``):
    ``<cache>/hopper-v5-medium.npz``; its sidecar is the same path with ``.json``."""
    _family(env)
    if kind not in DATASET_KINDS:
        raise DataError(f"unknown policy data set kind {kind!r}; expected one of {', '.join(DATASET_KINDS)}")
    return policy_cache_dir(cache) / f"{env.lower()}-{kind}.npz"


def normalized_score(env: str, episode_return: float | np.ndarray) -> float | np.ndarray:
    """D4RL's normalised score of a return in ``env`` (e.g. ``Hopper-v5``): 0 random, 100 expert."""
    low, high = REFERENCE_RETURNS[_family(env)]
    return 100.0 * (np.asarray(episode_return, dtype=np.float64) - low) / (high - low)


@dataclasses.dataclass(frozen=True)
class PolicyDataset:
    """``N`` transitions (module docstring); ``episodes()`` cuts them at the end flags."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    timeouts: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.rewards)
        shapes = {k: getattr(self, k).shape for k in _FIELDS}
        if (
            self.observations.ndim != 2
            or self.actions.ndim != 2
            or any(len(getattr(self, k)) != n for k in _FIELDS)
            or any(getattr(self, k).ndim != 1 for k in ("rewards", "terminals", "timeouts"))
        ):
            raise DataError(f"a policy data set needs [N, S], [N, A] and three [N] arrays; got {shapes}")
        if n and not (self.terminals[-1] or self.timeouts[-1]):
            raise DataError("a policy data set's last transition must end its episode (terminal or timeout)")

    @property
    def obs_dim(self) -> int:
        return int(self.observations.shape[1])

    @property
    def act_dim(self) -> int:
        return int(self.actions.shape[1])

    def episode_bounds(self) -> list[tuple[int, int]]:
        """``(start, end)`` of every episode, ``end`` exclusive, in file order."""
        ends = np.flatnonzero(self.terminals | self.timeouts) + 1
        starts = np.concatenate(([0], ends[:-1]))
        return list(zip(starts.tolist(), ends.tolist(), strict=True))

    def episode_returns(self) -> np.ndarray:
        """The undiscounted return of every episode ``[E]`` (float64)."""
        ends = np.flatnonzero(self.terminals | self.timeouts) + 1
        starts = np.concatenate(([0], ends[:-1]))
        return np.add.reduceat(self.rewards.astype(np.float64), starts) if len(starts) else np.zeros(0)


def write_policy_dataset(path: str | Path, data: PolicyDataset) -> None:
    """Write ``data`` to ``path`` (a compressed ``.npz``)."""
    np.savez_compressed(Path(path), **{k: getattr(data, k) for k in _FIELDS})


def read_policy_dataset(path: str | Path) -> PolicyDataset:
    """Read a data set written by ``write_policy_dataset`` (or any ``.npz`` with D4RL's five arrays)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no policy data set at {path}")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            missing = [k for k in _FIELDS if k not in arrays]
            if missing:
                raise DataError(f"{path}: a policy data set needs arrays {list(_FIELDS)}; missing {missing}")
            return PolicyDataset(
                observations=arrays["observations"].astype(np.float32),
                actions=arrays["actions"].astype(np.float32),
                rewards=arrays["rewards"].astype(np.float32),
                terminals=arrays["terminals"].astype(bool),
                timeouts=arrays["timeouts"].astype(bool),
            )
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a policy data set (.npz): {exc}") from exc
