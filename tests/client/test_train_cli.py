"""``aaren train`` and ``aaren evaluate`` as a new user meets them (typer's CliRunner, tiny runs on a
tiny CSV in hours, two marks): issue 15's frictions 1, 4, 5, 6 and 8."""

from __future__ import annotations

import csv
import json
import random
import re
import shutil

import pytest
from typer.testing import CliRunner

from aaren.cli.app import app
from aaren.cli.training import CONFIG_FLAGS
from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.config import TaskTrainConfig
from aaren_core.tasks.event.config import CLI_FLAGS, SET_KEYS, TrainConfig

runner = CliRunner()

TINY = (
    "--d-model", "8", "--n-layers", "1", "--n-heads", "2", "--batch-size", "4",
    "--set", "n_components=2", "--set", "time_features=2", "--set", "threads=1", "--set", "progress=false",
    "--set", "warmup_steps=2", "--set", "eval_batch_size=8",
)  # fmt: skip


def write_events(path, sessions: int = 20, length: int = 8) -> None:
    """Two marks (``open``, ``close``), one value, times in hours."""
    rng = random.Random(0)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["session_id", "time", "mark", "load"])
        for s in range(sessions):
            t = s * 3.0
            for i in range(length):
                t += rng.expovariate(1.0)
                writer.writerow([f"s{s}", round(t, 3), "open" if i % 2 == 0 else "close", round(rng.gauss(5, 1), 3)])


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_help_lists_every_set_key_and_the_time_unit(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert set(SET_KEYS) == {f for f in TrainConfig().to_dict() if f not in CLI_FLAGS}
    result = invoke("train", "--help")
    assert result.exit_code == 0
    assert "--time-unit" in result.output and "hours" in result.output
    for key, text in SET_KEYS.items():
        assert f"{key}: {text}" in result.output, key
    assert "max_minutes: time budget in minutes" in result.output


def test_every_flag_is_a_config_key_and_a_written_command_uses_only_flags_the_command_has(monkeypatch):
    """The flags of ``CONFIG_FLAGS`` (built into the command, with their help) set the event config's
    keys of their names, and the series and class configs' (``backbone`` is their ``model``; the
    time unit is the event task's); the commands the event config writes (``CLI_FLAGS``) name
    only these flags."""
    monkeypatch.setenv("COLUMNS", "200")
    assert set(CONFIG_FLAGS) <= set(TrainConfig().to_dict())
    task_keys = {"model" if k == "backbone" else k for k in CONFIG_FLAGS if k != "time_unit"}
    assert task_keys <= set(TaskTrainConfig().to_dict())
    assert set(CLI_FLAGS) <= set(CONFIG_FLAGS)
    output = invoke("train", "--help").output
    for key, (kind, text) in CONFIG_FLAGS.items():
        assert re.search(rf"--{key.replace('_', '-')} +<{kind.__name__}> +{re.escape(text[:30])}", output), key


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "time_unit=hour"), "time_unit in ['days', 'hours', 'minutes', 'seconds']"),
        (("--time-unit", "hour"), "time_unit in ['days', 'hours', 'minutes', 'seconds']"),
        (("--set", "max_minutes=-1"), "max_minutes >= 0"),
        (("--set", "epochs=many"), "epochs='many'; expected int"),
        (("--set", "no_such_key=1"), "unknown keys ['no_such_key']"),
        (("--data", "missing.csv"), "missing.csv"),
    ],
)
def test_bad_values_get_the_clean_error_box(tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.chdir(tmp_path)
    result = invoke("train", "--out-dir", "run", *args)
    assert result.exit_code == 2, result.output
    assert "Invalid value" in result.output and message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_train_in_hours_on_a_relative_path_with_a_budget_then_evaluate_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    work = tmp_path / "work"
    work.mkdir()
    write_events(work / "events.csv")
    monkeypatch.chdir(work)
    # A budget far shorter than one epoch: the first epoch finishes, no second one starts.
    result = invoke(
        "train", "--data", "events.csv", "--time-unit", "hours", "--epochs", "5", "--out-dir", "run",
        "--set", "max_minutes=0.000001", *TINY,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "time budget of 1e-06 min spent after epoch 1" in result.output
    history = json.loads((work / "run" / "history.json").read_text())
    assert len(history) == 1
    config = TrainConfig.from_dict(load_checkpoint(work / "run" / "best").metadata["train_config"])
    assert config.data == str(work / "events.csv") and config.time_unit == "hours"

    # evaluate from another directory: the stored path is absolute.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = invoke("evaluate", str(work / "run" / "best"), "--out", "report", "--no-plots")
    assert result.exit_code == 0, result.output
    assert "top-3" not in result.output  # two marks: top-3 accuracy is always 1
    report = (elsewhere / "report" / "report.md").read_text()
    assert "Point forecast of the next gap (hours)" in report and "top-3" not in report

    # The file moved: a clean error that points at --data, and --data takes the new place.
    shutil.move(work / "events.csv", elsewhere / "moved.csv")
    result = invoke("evaluate", str(work / "run" / "best"), "--out", "report", "--no-plots")
    assert result.exit_code == 2 and "--data" in result.output and "Traceback" not in result.output
    result = invoke("evaluate", str(work / "run" / "best"), "--data", "moved.csv", "--out", "again", "--no-plots")
    assert result.exit_code == 0, result.output
    assert json.loads((elsewhere / "again" / "metrics.json").read_text())["train_config"]["data"] == str(
        elsewhere / "moved.csv"
    )


def test_train_logs_its_split_and_resolution_and_exports_the_test_part_from_the_checkpoint(tmp_path, monkeypatch):
    """Friction 2, 3 and 7 from the command line: long sessions on a quarter-hour grid."""
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.chdir(tmp_path)
    rng = random.Random(2)
    with (tmp_path / "long.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["session_id", "time", "mark", "load"])
        for s in range(6):
            t = 0.0
            for i in range(40):
                t += round(rng.expovariate(0.5) * 4) / 4 + 0.25
                writer.writerow([f"s{s}", t, "open" if i % 2 == 0 else "close", round(rng.gauss(5, 1), 3)])
    result = invoke("train", "--data", "long.csv", "--time-unit", "hours", "--epochs", "1", "--out-dir", "run", *TINY)
    assert result.exit_code == 0, result.output
    assert "split by event time at" in result.output and "so sessions are long" in result.output
    assert (
        "dequantization: uniform jitter U(0, 0.25) hours; resolution derived from the training times" in result.output
    )
    config = TrainConfig.from_dict(load_checkpoint(tmp_path / "run" / "best").metadata["train_config"])
    assert config.split == "time" and config.jitter == 0.25
    c1, c2 = (float(c) for c in config.split_at)

    result = invoke("split", "export", "run/best", "--split", "test", "--out", "test.csv")
    assert result.exit_code == 0, result.output
    assert f"by event time at {c1:.10g} and {c2:.10g} hours" in result.output
    with (tmp_path / "test.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert all((float(r["time"]) < c2) == (r["context"] == "1") for r in rows)
    assert {r["mark"] for r in rows} == {"open", "close"}
