"""The bundled policy (``models/policy-hopper``, served as ``aaren-policy-hopper``): its checkpoint
loads, its metrics and report describe it, and its rollout numbers come back when the rollout is
played again (same seeds, same batching), in a real Hopper-v5."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aaren_core.checkpoint import load_checkpoint

gym = pytest.importorskip("gymnasium")

from aaren_core.tasks.policy.rollout import rollout  # noqa: E402

FOLDER = Path(__file__).resolve().parents[2] / "models" / "policy-hopper"


def test_the_bundled_policy_loads_and_its_report_gives_its_metrics():
    ckpt = load_checkpoint(FOLDER)
    metrics = json.loads((FOLDER / "metrics.json").read_text())
    report = (FOLDER / "report.md").read_text()
    assert ckpt.kind == "policy_model" and ckpt.metadata["task"] == "policy"
    assert ckpt.metadata["name"] == metrics["name"] == "aaren-policy-hopper"
    assert ckpt.model_version == metrics["model_version"]
    assert ckpt.metadata["env"] == metrics["env"] == "Hopper-v5" and ckpt.metadata["backbone"] == "aaren"
    assert ckpt.metadata["train_config"] == metrics["config"]
    assert f"**{metrics['rollout']['score_mean']:.1f} ± {metrics['rollout']['score_std']:.1f}**" in report
    assert f"--data {metrics['data']}" in report and "aaren_core.tasks.policy.generate --env Hopper-v5" in report
    assert "/root/" not in report and "/tmp/" not in report


def test_the_bundled_policys_rollout_is_played_again_to_the_same_returns():
    import torch

    torch.set_num_threads(1)
    ckpt = load_checkpoint(FOLDER)
    metrics = json.loads((FOLDER / "metrics.json").read_text())
    r = metrics["rollout"]
    again = rollout(
        ckpt.model,
        "Hopper-v5",
        r["episodes"],
        metrics["target_return"],
        seed=metrics["config"]["seed"],
        max_steps=r["max_steps"],
        parallel=metrics["config"]["parallel_rollouts"],
    )
    np.testing.assert_array_equal(again.lengths, r["lengths"])
    np.testing.assert_allclose(again.returns, r["returns"], rtol=1e-4)
