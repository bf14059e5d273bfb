"""A series model trained from a file with gaps, served, and replayed from that file (issue 22).

``aaren train --task series --data FILE`` on an hourly file missing 3% of its rows and 5% of one
channel's cells, ``aaren evaluate``, a real server with the checkpoint (both process layouts),
``aaren replay FILE --model NAME --score-from <test_from>``: the server fills the gaps by the
stored rule, and the replay's raw-unit MSE and MAE over the test part equal evaluate's
``test.streaming_raw`` (the same origins, the same observed targets).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from generated import gappy_file
from typer.testing import CliRunner

from aaren.cli.app import app

runner = CliRunner()
NAME = "meter-from-file"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("series-replay")
    path, _, _ = gappy_file(root / "meter.csv", n=500, seed=2)
    result = runner.invoke(app, [
        "train", "--task", "series", "--data", str(path), "--epochs", "1", "--d-model", "8", "--n-layers", "1",
        "--n-heads", "2", "--batch-size", "8", "--set", "horizon=6", "--set", "lookback=24", "--set", "window=48",
        "--set", "loss_stride=4", "--set", "steps_per_epoch=3", "--set", "threads=1", "--name", NAME,
        "--out-dir", str(root / "run"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return {"file": path, "run": root / "run"}


@pytest.mark.layouts
def test_replay_of_the_file_scores_what_evaluate_does(start_server, trained, tmp_path):
    result = runner.invoke(app, ["evaluate", str(trained["run"] / "best"), "--out", str(tmp_path), "--no-plots"])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert f"aaren replay --score-from {metrics['test_from']}" in result.output  # evaluate says how to compare
    offline = metrics["test"]["streaming_raw"]
    srv = start_server(checkpoint=trained["run"] / "best")
    replay = runner.invoke(app, [
        "replay", str(trained["file"]), "-t", srv.address, "--model", NAME, "--no-progress", "--json",
        "--score-from", metrics["test_from"],
    ])  # fmt: skip
    assert replay.exit_code == 0, replay.output
    summary = json.loads(replay.stdout)
    assert summary["errors"] == 0
    scores = summary["series"]
    assert scores["targets"] == offline["targets"]
    assert scores["mse"] == pytest.approx(offline["mse"], rel=1e-6)
    assert scores["mae"] == pytest.approx(offline["mae"], rel=1e-6)
