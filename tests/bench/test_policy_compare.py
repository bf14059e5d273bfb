"""``bench.policy_compare``: a tiny resumable campaign (random-action Hopper-v5 data, a budget of a
second, 1-2 short episodes) split over two workers, then its report. Counts and table contents only."""

from __future__ import annotations

import json
from pathlib import Path

from policy_generated import write_random_dataset

import bench.policy_compare as pc


def test_campaign_workers_resume_and_report(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_random_dataset(data / "hopper-v5-medium.npz", 300, seed=0)
    out = tmp_path / "runs"
    common = [
        "--envs", "Hopper-v5", "--kinds", "medium,medium-replay", "--models", "aaren,transformer,bc",
        "--seeds", "0,1", "--time-budget", "0.5", "--episodes", "2", "--max-steps", "20",
        "--data-dir", str(data), "--out", str(out),
        "--set", "d_model=16", "--set", "n_layers=1", "--set", "steps_per_epoch=3", "--set", "bc_hidden=16",
    ]  # fmt: skip
    pc.main([*common, "--worker", "1/2"])
    done = sorted(p.parent.relative_to(out).as_posix() for p in out.rglob("metrics.json"))
    # Worker 1 of 2 takes the odd planned runs of the set that exists (medium-replay has no file).
    assert done == ["hopper-v5-medium/aaren/seed1", "hopper-v5-medium/bc/seed1", "hopper-v5-medium/transformer/seed0"]
    assert "no policy data set" in capsys.readouterr().out
    pc.main([*common, "--worker", "0/2"])
    pc.main([*common, "--worker", "0/2"])  # resumed: everything is done
    assert capsys.readouterr().out.count("done, skipped") == 3
    record = json.loads((out / "hopper-v5-medium/aaren/seed0/metrics.json").read_text())
    assert len(record["rollout"]["returns"]) == 2 and record["config"]["max_minutes"] == 0.5 / 60
    report_path = tmp_path / "policy_d4rl.md"
    pc.main([*common, "--report", "--report-out", str(report_path)])
    text = report_path.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `hopper-v5-medium`")]
    assert len(rows) == 1 + 6  # the summary row and 3 models x 2 seeds
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[4] == "2" and " ± " in cells[1] and cells[6] == "3600" and cells[-1].split()[0] in ("yes", "no")
    assert "Hopper random -20.2723, expert 3234.3" in text
    assert "| Aaren |" in text and "| BC |" in text
    assert "python -m bench.policy_compare" in text and "--worker I/N" in text
