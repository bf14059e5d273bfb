"""``bench.policy_serving``: a tiny run (the tiny policy checkpoint, 1 and 4 episodes, a few rounds)
prints one JSON row per run with every number; no time is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from policy_served import NAME, policy_repository

import bench.policy_serving as ps


def test_the_benchmark_measures_each_episode_count(tmp_path: Path, capsys) -> None:
    threads = torch.get_num_threads()
    try:
        root = policy_repository(tmp_path / "models")
        assert (
            ps.main(
                [
                    "--checkpoint",
                    str(root / "policy"),
                    "--episodes",
                    "1",
                    "4",
                    "--rounds",
                    "5",
                    "--warmup",
                    "2",
                    "--json",
                ]
            )
            == 0
        )
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(r["model"], r["episodes"], r["rounds"]) for r in rows] == [(NAME, 1, 5), (NAME, 4, 5)]
    for r in rows:
        assert r["events_per_s"] > 0 and r["us_per_action"] > 0 and r["server_cpu_us_per_action"] >= 0
        assert r["us_per_round"] == pytest.approx(r["us_per_action"] * r["episodes"])
