"""``aaren rollout`` as a subprocess against a served tiny Hopper-v5 policy: its episodes' returns
and actions equal the offline rollout's (``aaren_core.tasks.policy.rollout.rollout``, same seeds);
the table form prints every episode and the mean ± std; ``aaren model`` states the policy's facts;
a model that is no policy is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from policy_served import ENV, NAME, TARGET_RETURN, offline_rollout, policy_repository
from servers import ServerThread

from aaren.client.rollout import actions_checksum

SEED, EPISODES, MAX_STEPS = 5, 2, 150


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = policy_repository(tmp_path_factory.mktemp("rollout") / "models")
    os.symlink(tiny_checkpoint, root / "event")  # an event model beside it: not a policy
    with ServerThread(checkpoint=None, models_dir=root, metrics_port=-1) as srv:
        yield srv
    torch.set_num_threads(threads)


def _rollout(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from aaren.cli.app import app; app()", "rollout", "--env", ENV, "-t", address]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)


def test_rollout_json_equals_the_offline_rollout(served):
    done = _rollout(
        served.address, "--model", NAME, "--episodes", str(EPISODES), "--seed", str(SEED),
        "--max-steps", str(MAX_STEPS), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    offline = offline_rollout(EPISODES, SEED, MAX_STEPS)
    assert (result["env"], result["model"], result["target_return"]) == (ENV, NAME, TARGET_RETURN)
    assert [e["seed"] for e in result["episodes"]] == [SEED, SEED + 1]
    assert len({e["session_id"] for e in result["episodes"]}) == EPISODES
    for e, actions, ret, score in zip(
        result["episodes"], offline.actions, offline.returns, offline.scores, strict=True
    ):
        assert e["length"] == len(actions)
        np.testing.assert_allclose(np.array(e["actions"]), actions, atol=1e-5, rtol=0)
        assert e["actions_sha256"] == actions_checksum(e["actions"])
        assert e["return"] == pytest.approx(float(ret), rel=1e-9)
        assert e["score"] == pytest.approx(float(score), rel=1e-9)
    assert result["return_mean"] == pytest.approx(float(offline.returns.mean()), rel=1e-9)


def test_rollout_prints_each_episode_and_refuses_a_model_that_is_no_policy(served):
    done = _rollout(served.address, "--model", NAME, "--episodes", "1", "--max-steps", "20", "--target-return", "100")
    assert done.returncode == 0, done.stderr
    assert "episode 0: return" in done.stderr and "length 20" in done.stderr
    assert f"{ENV} on '{NAME}', target return 100, 1 episodes: return" in done.stdout and "±" in done.stdout
    described = subprocess.run(
        [sys.executable, "-c", "from aaren.cli.app import app; app()", "model", "-t", served.address, "--model", NAME],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert described.returncode == 0, described.stderr
    assert f"{ENV}: 3 actions, target return 360" in described.stdout
    refused = _rollout(served.address, "--model", "tiny", "--episodes", "1")
    assert refused.returncode == 2
    assert "model 'tiny' serves task 'event'; a rollout needs a policy model" in refused.stderr
