"""The policy task's data windows, training, rollouts, ``aaren train --task policy`` and ``aaren evaluate``,
on a tiny random-action Hopper-v5 data set (real MuJoCo)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from policy_generated import random_rollout_dataset, write_random_dataset
from typer.testing import CliRunner

from aaren.cli.app import app
from aaren.formats.errors import DataError
from aaren_core.checkpoint import load_checkpoint
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.policy.data import PolicyData, resolve_dataset
from aaren_core.tasks.policy.model import PolicyModel, PolicyModelConfig
from aaren_core.tasks.policy.rollout import rollout
from aaren_core.tasks.policy.train import PolicyTrainConfig, evaluate_policy, train_policy

TINY = {"d_model": 16, "n_layers": 1, "n_heads": 2, "steps_per_epoch": 5, "epochs": 2, "batch_size": 8}


@pytest.fixture(scope="module")
def data() -> PolicyData:
    return PolicyData.build(random_rollout_dataset(300, seed=0), "Hopper-v5", name="tiny", val_fraction=0.2)


def test_returns_to_go_and_windows(data: PolicyData) -> None:
    d = data.dataset
    for lo, hi in data.bounds[:3]:
        assert data.returns_to_go[lo] == pytest.approx(float(d.rewards[lo:hi].sum()), rel=1e-5)
        assert data.returns_to_go[hi - 1] == pytest.approx(float(d.rewards[hi - 1]))
        assert data.timesteps[lo:hi].tolist() == list(range(hi - lo))
    lo, hi = data.bounds[0]
    k = hi - lo + 3  # longer than the episode: padded after its end
    w = data.windows(np.array([lo]), k)
    assert w.mask[0].tolist() == [True] * (hi - lo) + [False] * 3
    np.testing.assert_array_equal(w.observations[0, : hi - lo], d.observations[lo:hi])
    assert (w.observations[0, hi - lo :] == 0).all() and (w.timesteps[0, hi - lo :] == 0).all()
    starts = data.starts(data.train_episodes, 5, "episode")
    assert sorted(starts.tolist()) == sorted(data.bounds[e][0] for e in data.train_episodes)
    randoms = data.starts(data.train_episodes, 5, "random")
    ends = np.array([hi for _, hi in data.bounds])
    # A random window never crosses into the next episode unless the episode is shorter than K.
    for s in randoms:
        end = ends[np.searchsorted(ends, s, side="right")]
        start = max(lo for lo, _ in data.bounds if lo <= s)
        assert s + 5 <= end or s == start
    assert set(data.train_episodes.tolist()).isdisjoint(data.val_episodes.tolist())
    np.testing.assert_allclose(data.obs_mean, d.observations.mean(0), rtol=1e-4, atol=1e-5)


def test_resolve_dataset(tmp_path: Path) -> None:
    path, env = resolve_dataset("walker2d-v5-medium-replay")
    assert env == "Walker2d-v5" and path.name == "walker2d-v5-medium-replay.npz"
    f = tmp_path / "x.npz"
    (tmp_path / "x.json").write_text(json.dumps({"env": "HalfCheetah-v5"}))
    assert resolve_dataset(str(f)) == (f, "HalfCheetah-v5")
    with pytest.raises(DataError, match="expected <env>-<kind>"):
        resolve_dataset("hopper-v5-expert")
    with pytest.raises(DataError, match="env="):
        resolve_dataset(str(tmp_path / "unknown.npz"))


@pytest.mark.parametrize("backbone", ["aaren", "bc"])
def test_train_and_evaluate(backbone: str, data: PolicyData, tmp_path: Path) -> None:
    config = PolicyTrainConfig(
        backbone=backbone, data="tiny", env="Hopper-v5", time_decay=backbone == "aaren", **TINY,
        eval_episodes=2, eval_max_steps=15, out_dir=str(tmp_path / backbone), max_minutes=0,
    )  # fmt: skip
    run = train_policy(config, data, verbose=False)
    m = run.metrics
    assert m["updates"] == 10 and len(m["history"]) == 2
    assert m["us_per_update"] > 0 and m["us_per_action_batch1"] > 0 and m["us_per_action_batch64"] > 0
    assert len(m["rollout"]["returns"]) == 2 and max(m["rollout"]["lengths"]) <= 15
    ckpt = load_checkpoint(tmp_path / backbone / "best")
    assert ckpt.metadata["env"] == "Hopper-v5" and ckpt.metadata["target_return"] == 3600.0
    assert ckpt.metadata["context"] == 20 and ckpt.metadata["task"] == "policy"
    assert (tmp_path / backbone / "report.md").read_text().count("normalised score") >= 1
    # The checkpoint's rollout repeats training's (same seeds, same arithmetic).
    ev = evaluate_policy(tmp_path / backbone / "best", out_dir=tmp_path / backbone, episodes=2, max_steps=15)
    assert ev["evaluation"]["returns"] == m["rollout"]["returns"]
    assert "rollout" in json.loads((tmp_path / backbone / "metrics.json").read_text())


def test_rollout_parallel_matches_one_by_one() -> None:
    torch.manual_seed(0)
    for kind in ("aaren", "transformer"):
        model = PolicyModel(
            PolicyModelConfig(
                backbone=BackboneConfig(kind=kind, d_model=16, n_layers=1, n_heads=2), obs_dim=11, act_dim=3
            )
        )
        model.eval()
        one = rollout(model, "Hopper-v5", 2, 100.0, seed=3, max_steps=25)
        both = rollout(model, "Hopper-v5", 2, 100.0, seed=3, max_steps=25, parallel=True)
        np.testing.assert_allclose(both.returns, one.returns, rtol=1e-4)
        assert both.lengths.tolist() == one.lengths.tolist()
        assert one.actions[0].shape == (one.lengths[0], 3) and np.abs(one.actions[0]).max() <= 1


def test_cli_train_and_evaluate(tmp_path: Path) -> None:
    data = write_random_dataset(tmp_path / "hopper-v5-random.npz", 200, seed=1)
    out = tmp_path / "run"
    sets = [f"--set={k}={v}" for k, v in {**TINY, "eval_episodes": 1, "eval_max_steps": 10}.items()]
    args = ["train", "--task", "policy", "--data", str(data), "--backbone", "gru", "--out-dir", str(out), *sets]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "normalised score" in result.output
    result = CliRunner().invoke(app, ["evaluate", str(out), "--episodes", "2", "--max-steps", "10"])
    assert result.exit_code == 0, result.output
    assert "over 2 episodes" in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["env"] == "Hopper-v5" and len(metrics["evaluation"]["returns"]) == 2
    bad = CliRunner().invoke(app, ["train", "--task", "policy", "--data", str(data), "--set", "backbone=lstm"])
    assert bad.exit_code == 1 and "backbone in" in bad.output
