"""The policy data sets' generator (``aaren_core.tasks.policy.generate``) at a tiny budget, on a real
Hopper-v5: D4RL's layout, episodes that end with a flag, medium-expert made of the medium set, the
recorded transitions a real environment's (replaying an episode's actions from its reset seed gives
its observations and rewards back), and sidecars that describe the files they sit beside."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from aaren.formats.policy import DATASET_KINDS, dataset_path, normalized_score, read_policy_dataset

gym = pytest.importorskip("gymnasium")
pytest.importorskip("stable_baselines3")

from aaren_core.tasks.policy.generate import generate  # noqa: E402

ENV = "Hopper-v5"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    cache = tmp_path_factory.mktemp("policy")
    out = generate(ENV, seed=3, timesteps=3072, steps_per_set=400, eval_every=1024, eval_episodes=1, cache=cache)
    return cache, out


def test_every_kind_is_written_in_d4rl_layout_with_its_sidecar(generated):
    cache, out = generated
    assert set(out) == set(DATASET_KINDS)
    for kind in DATASET_KINDS:
        path = dataset_path(ENV, kind, cache)
        data = read_policy_dataset(path)
        side = json.loads(path.with_suffix(".json").read_text())
        assert side["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert (data.obs_dim, data.act_dim) == (11, 3)
        assert np.all(np.abs(data.actions) <= 1.0)
        assert data.terminals[-1] or data.timeouts[-1]
        returns = data.episode_returns()
        assert side["data"]["steps"] == len(data.rewards)
        assert side["data"]["episodes"] == len(returns) == len(data.episode_bounds())
        assert side["data"]["return_mean"] == pytest.approx(returns.mean())
        assert side["data"]["score_mean"] == pytest.approx(np.mean(normalized_score(ENV, returns)))
        assert side["kind"] == kind and side["env"] == ENV and side["reference_returns"]["expert"] == 3234.3
        assert side["versions"]["gymnasium"] == gym.__version__


def test_sizes_follow_the_budget_and_medium_expert_starts_with_medium(generated):
    cache, _ = generated
    medium = read_policy_dataset(dataset_path(ENV, "medium", cache))
    expert = read_policy_dataset(dataset_path(ENV, "medium-expert", cache))
    replay = read_policy_dataset(dataset_path(ENV, "medium-replay", cache))
    assert len(medium.rewards) == 400 and len(expert.rewards) == 800
    assert 0 < len(replay.rewards) <= 400
    np.testing.assert_array_equal(expert.observations[:400], medium.observations)
    np.testing.assert_array_equal(expert.actions[:400], medium.actions)


def test_a_stored_episode_replays_in_the_environment(generated):
    """The medium set's first episode was reset with seed 30,000: its actions, stepped from that
    reset, give its observations and rewards back (MuJoCo is deterministic)."""
    cache, _ = generated
    data = read_policy_dataset(dataset_path(ENV, "medium", cache))
    start, end = data.episode_bounds()[0]
    env = gym.make(ENV)
    obs, _ = env.reset(seed=30_000)
    for t in range(start, end):
        np.testing.assert_allclose(data.observations[t], obs, rtol=0, atol=1e-6)
        obs, reward, terminated, _, _ = env.step(data.actions[t])
        assert reward == pytest.approx(float(data.rewards[t]), abs=1e-5)
        assert bool(terminated) == bool(data.terminals[t])
    env.close()
