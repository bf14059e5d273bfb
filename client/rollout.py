"""Episodes of a gymnasium environment played against a served policy (task ``policy``): ``aaren rollout``.

A session is an episode. Episode ``i`` starts from ``env.reset(seed=seed + i)`` under a session id of
its own; every environment step ``t`` is one event on one bidirectional stream, ``seq = t + 1``,
``time = t``, values ``[R_0, s_0]`` on the first step (the target return) and ``[r_{t-1}, s_t]``
afterwards (the reward of the last action); the answer's action, clipped to the action space, is the
next step's. An episode ends at a terminal state, at the environment's time limit or after
``max_steps`` steps; then its session is ended. Scores are D4RL's normalised score
(``aaren.formats.policy.normalized_score``).

Torch-free; gymnasium (the ``rl`` extra) is imported only when an episode is played.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from aaren.client.client import AarenClient, AarenError, EventErrorOut, EventIn, EventStream, PolicyForecastOut
from aaren.formats.policy import normalized_score

__all__ = [
    "EpisodeOut",
    "RolloutError",
    "RolloutOut",
    "actions_checksum",
    "make_env",
    "play",
    "play_episode",
    "policy_event",
]


class RolloutError(Exception):
    """A rollout cannot run (gymnasium missing, a model that is no policy, sizes that disagree)."""


@dataclasses.dataclass(frozen=True)
class EpisodeOut:
    """One played episode: its ``seed`` (``env.reset(seed=...)``), ``session_id``, undiscounted
    ``episode_return``, ``length`` (steps), normalised ``score`` and the ``actions [T][A]`` taken."""

    seed: int
    session_id: str
    episode_return: float
    length: int
    score: float
    actions: list[list[float]]

    @property
    def actions_sha256(self) -> str:
        return actions_checksum(self.actions)


@dataclasses.dataclass(frozen=True)
class RolloutOut:
    """Every episode of one rollout, with the model and target return they ran under."""

    env: str
    model: str
    target_return: float
    episodes: list[EpisodeOut]

    def summary(self) -> dict[str, Any]:
        """Means and standard deviations (population, as D4RL reports) of returns, lengths and scores."""
        r = np.array([e.episode_return for e in self.episodes])
        s = np.array([e.score for e in self.episodes])
        n = np.array([e.length for e in self.episodes])
        return {
            "return_mean": float(r.mean()),
            "return_std": float(r.std()),
            "score_mean": float(s.mean()),
            "score_std": float(s.std()),
            "length_mean": float(n.mean()),
        }

    def to_json(self, with_actions: bool = True) -> dict[str, Any]:
        """A machine-readable result: the summary and every episode (its actions and their checksum)."""
        episodes = []
        for e in self.episodes:
            row: dict[str, Any] = {
                "seed": e.seed,
                "session_id": e.session_id,
                "return": e.episode_return,
                "length": e.length,
                "score": e.score,
                "actions_sha256": e.actions_sha256,
            }
            if with_actions:
                row["actions"] = e.actions
            episodes.append(row)
        return {
            "env": self.env,
            "model": self.model,
            "target_return": self.target_return,
            **self.summary(),
            "episodes": episodes,
        }


def actions_checksum(actions: list[list[float]] | np.ndarray) -> str:
    """SHA-256 of the actions as little-endian float32 ``[T, A]`` (equal actions, equal checksum)."""
    return hashlib.sha256(np.asarray(actions, dtype="<f4").tobytes()).hexdigest()


def make_env(env_id: str) -> Any:
    """``gymnasium.make(env_id)``, saying how to install gymnasium when it is missing."""
    try:
        import gymnasium as gym
    except ImportError:
        raise RolloutError(
            "playing episodes needs gymnasium with MuJoCo: install the rl extra (pip install 'aaren[rl]')"
        ) from None
    try:
        return gym.make(env_id)
    except Exception as exc:
        raise RolloutError(f"cannot make the environment {env_id!r}: {exc}") from None


def policy_event(session_id: str, t: int, first_value: float, observation: np.ndarray) -> EventIn:
    """The event of step ``t``: ``seq = t + 1``, ``time = t``, values ``[first_value, *observation]``
    (``first_value``: the target return at ``t = 0``, else the last action's reward)."""
    values = [float(first_value), *np.asarray(observation, dtype=np.float64).reshape(-1).tolist()]
    return EventIn(session_id, t + 1, float(t), 0, values)


async def play_episode(
    stream: EventStream,
    env: Any,
    *,
    session_id: str,
    seed: int,
    target_return: float,
    max_steps: int = 1000,
    model: str = "",
    on_step: Callable[[], None] | None = None,
) -> tuple[float, list[list[float]]]:
    """Play one episode on ``stream`` (module docstring): its return and actions ``[T][A]``."""
    low, high = env.action_space.low, env.action_space.high
    obs, _ = env.reset(seed=seed)
    first, total, actions = float(target_return), 0.0, []
    for t in range(max_steps):
        (outcome,) = (await stream.apply([policy_event(session_id, t, first, obs)], model=model)).results
        if isinstance(outcome, EventErrorOut):
            raise AarenError(outcome.code, outcome.reason, f"step {t} of session {session_id!r}: {outcome.message}")
        if not isinstance(outcome, PolicyForecastOut):
            raise RolloutError(f"the model answered {type(outcome).__name__}, not a policy's action: is it a policy?")
        action = np.clip(np.asarray(outcome.action, dtype=np.float32), low, high)
        actions.append(action.tolist())
        obs, reward, terminated, truncated, _ = env.step(action)
        first = float(reward)
        total += float(reward)
        if on_step is not None:
            on_step()
        if terminated or truncated:
            break
    return total, actions


async def play(
    client: AarenClient,
    env_id: str,
    *,
    episodes: int,
    seed: int = 0,
    target_return: float | None = None,
    max_steps: int = 1000,
    model: str = "",
    on_step: Callable[[], None] | None = None,
    on_episode: Callable[[EpisodeOut], None] | None = None,
) -> RolloutOut:
    """Play ``episodes`` episodes of ``env_id`` against the served policy ``model`` ("" the default)
    on one stream; ``target_return`` None: the model's (``ModelInfoOut.target_return``)."""
    info = await client.describe_model(model)
    if info.task != "policy":
        raise RolloutError(f"model {info.name!r} serves task {info.task!r}; a rollout needs a policy model")
    env = make_env(env_id)
    try:
        width = int(np.prod(env.observation_space.shape))
        if info.value_width != 1 + width or info.action_width != int(np.prod(env.action_space.shape)):
            raise RolloutError(
                f"{env_id} has {width} observations and {env.action_space.shape} actions; model {info.name!r} takes "
                f"{info.value_width - 1} observations and gives {info.action_width} actions (it was trained on "
                f"{info.env or 'an unnamed environment'})"
            )
        target = info.target_return if target_return is None else float(target_return)
        run = uuid.uuid4().hex[:12]
        played = []
        async with client.stream(model) as stream:
            for i in range(episodes):
                session_id = f"rollout-{run}-{i}"
                total, actions = await play_episode(
                    stream, env, session_id=session_id, seed=seed + i, target_return=target, max_steps=max_steps,
                    model=model, on_step=on_step,
                )  # fmt: skip
                await client.end_session(session_id, model=model)
                score = float(normalized_score(env_id, total)) if _has_reference(env_id) else float("nan")
                episode = EpisodeOut(seed + i, session_id, total, len(actions), score, actions)
                played.append(episode)
                if on_episode is not None:
                    on_episode(episode)
    finally:
        env.close()
    return RolloutOut(env_id, info.name, target, played)


def _has_reference(env_id: str) -> bool:
    try:
        normalized_score(env_id, 0.0)
    except (KeyError, ValueError):
        return False
    return True
