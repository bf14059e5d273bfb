"""A class model trained from files, served, and replayed from its test file (issue 22).

``aaren train --task class`` on JapaneseVowels written as ``.ts`` files, a real server with the
checkpoint, ``aaren replay TEST --model NAME``: the final accuracy and the accuracy after each
fraction seen equal ``aaren evaluate``'s exactly, for the ``.ts`` test file and for the CSV one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from labelled_files import write_table, write_ts
from typer.testing import CliRunner

from aaren.cli.app import app
from aaren.client.events_file import ModelSchema, read_events
from aaren.client.task_scores import FRACTIONS
from aaren.formats.errors import DataError
from aaren_core.datasets import load_class
from aaren_core.tasks.classify.metrics import DEFAULT_FRACTIONS

runner = CliRunner()
NAME = "vowels-from-files"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """JapaneseVowels as .ts and CSV files, and a tiny model trained on the .ts ones."""
    try:
        vowels = load_class("JapaneseVowels")
    except DataError as exc:
        pytest.fail(f"the sktime wheel is not in the cache ({exc}); run `python -m aaren_core.datasets fetch`")
    root = tmp_path_factory.mktemp("replay-files")
    names = {part: [vowels.class_names[k] for k in getattr(vowels, part).labels] for part in ("train", "test")}
    files = {
        "train.ts": write_ts(root / "vowels_train.ts", vowels.train.series, names["train"], vowels.class_names),
        "test.ts": write_ts(root / "vowels_test.ts", vowels.test.series, names["test"], vowels.class_names),
        "test.csv": write_table(root / "vowels_test.csv", vowels.test.series, names["test"], vowels.channels, "t"),
    }
    result = runner.invoke(app, [
        "train", "--task", "class", "--data", str(files["train.ts"]), "--test-data", str(files["test.ts"]),
        "--epochs", "2", "--d-model", "8", "--n-layers", "1", "--n-heads", "2", "--batch-size", "32", "--lr", "0.01",
        "--set", "threads=1", "--set", "aux_weight=0.5", "--name", NAME, "--out-dir", str(root / "run"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return {**files, "run": root / "run"}


def test_the_replay_scores_the_fractions_the_offline_scores_do():
    assert FRACTIONS == DEFAULT_FRACTIONS


def test_replay_of_the_test_file_prints_what_evaluate_does(start_server, trained, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(
        app, ["evaluate", str(trained["run"] / "best"), "--out", str(tmp_path / "eval"), "--no-plots"]
    )
    assert result.exit_code == 0, result.output
    offline = json.loads((tmp_path / "eval" / "metrics.json").read_text())["test"]
    srv = start_server(checkpoint=trained["run"] / "best")
    for test_file in ("test.ts", "test.csv"):
        replay = ["replay", str(trained[test_file]), "-t", srv.address, "--model", NAME, "--no-progress"]
        result = runner.invoke(app, [*replay, "--json"])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert summary["errors"] == 0 and summary["events"] == 5687
        scores = summary["class"]
        assert scores["sequences"] == 370
        assert scores["accuracy"] == offline["accuracy"]
        assert scores["accuracy_by_fraction"] == offline["accuracy_by_fraction"]
    # The table a person reads: every fraction's accuracy as evaluate's report has it (a fresh server:
    # the first one has seen these sessions' steps already, and refuses them as stale).
    fresh = start_server(checkpoint=trained["run"] / "best")
    result = runner.invoke(
        app, ["replay", str(trained["test.ts"]), "-t", fresh.address, "--model", NAME, "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    for fraction, accuracy in offline["accuracy_by_fraction"].items():
        assert re.search(rf"accuracy after {float(fraction):.0%} seen +{accuracy:.3f}\b", result.stdout), result.stdout


def test_a_ts_file_becomes_sessions_of_steps(tmp_path):
    import numpy as np

    series = [np.array([[1.0, 2.0], [3.0, np.nan]], np.float32), np.array([[5.0, 6.0]], np.float32)]
    path = write_ts(tmp_path / "trials.ts", series, ["b", "a"], ["a", "b"])
    schema = ModelSchema(time_unit="steps", value_names=("x", "y"), task="class", class_names=("a", "b"))
    source = read_events(path, schema)
    got = [(e.session_id, e.seq, e.time, e.values) for e in source.events]
    assert got[:2] == [("trials-0", 1, 0.0, [1.0, 2.0]), ("trials-1", 1, 0.0, [5.0, 6.0])]
    assert got[2][:3] == ("trials-0", 2, 1.0) and got[2][3][0] == 3.0 and np.isnan(got[2][3][1])
    assert source.labels == {"trials-0": "b", "trials-1": "a"} and source.n_sessions == 2
    with pytest.raises(DataError, match="2 dimensions; the model has 3 channels"):
        read_events(path, ModelSchema(value_names=("x", "y", "z"), task="class"))
    with pytest.raises(DataError, match=r"labels \['b'\] are not classes of the model"):
        read_events(path, ModelSchema(value_names=("x", "y"), task="class", class_names=("a", "c")))
    with pytest.raises(DataError, match=r"a \.ts file is for class models"):
        read_events(path, ModelSchema(value_names=("x", "y"), task="series"))
