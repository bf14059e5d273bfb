"""``aaren train --task series|class`` and ``aaren evaluate`` of their checkpoints (typer's CliRunner).

The data sets are tiny generated ones standing in under real data set names: ``load_task_data`` is
replaced, so nothing reads a wheel, and training takes 1-2 epochs of a tiny model.
"""

from __future__ import annotations

import json
import re
import shlex

import numpy as np
import pytest
from typer.testing import CliRunner

from aaren.cli.app import app
from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks import run as task_run
from aaren_core.tasks.classify.data import ClassData, ClassSet
from aaren_core.tasks.series.data import SeriesData, ratio_borders

runner = CliRunner()

TINY = ("--d-model", "8", "--n-layers", "1", "--n-heads", "2", "--batch-size", "8", "--set", "threads=1")
SERIES = ("--task", "series", "--data", "electricity", "--epochs", "2", *TINY)
SERIES_SETS = ("--set", "horizon=6", "--set", "lookback=24", "--set", "window=48", "--set", "loss_stride=4")
CLASS = ("--task", "class", "--data", "JapaneseVowels", "--epochs", "2", *TINY, "--set", "aux_weight=0.5")


def daily_series(n: int = 600) -> SeriesData:
    """Two channels with a daily cycle, hourly steps from 2020-01-01."""
    rng = np.random.default_rng(0)
    t = np.arange(n)
    cycle = np.stack([np.sin(2 * np.pi * t / 24), np.cos(2 * np.pi * t / 24)], 1)
    values = 10 + 3 * cycle + 0.1 * rng.standard_normal((n, 2))
    return SeriesData("electricity", 1_577_836_800.0 + 3600.0 * t, values, ("a", "b"), ratio_borders(n), 3600.0, "gen")


def sign_sequences(n: int, seed: int) -> ClassSet:
    """Class 1 when channel 0 is positive on average; lengths 5-12."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    series = [
        (rng.standard_normal((rng.integers(5, 13), 2)) * 0.5 + [1.0 if y else -1.0, 0.0]).astype(np.float32)
        for y in labels
    ]
    return ClassSet(series, labels)


@pytest.fixture
def tiny_data(monkeypatch):
    """``electricity`` and ``JapaneseVowels`` are tiny generated sets; other names go the real way."""
    real = task_run.load_task_data
    made = {
        ("series", "electricity"): daily_series(),
        ("class", "JapaneseVowels"): ClassData(
            "JapaneseVowels", sign_sequences(64, 0), sign_sequences(30, 1), ("neg", "pos"), ("x", "y"), "gen"
        ),
    }

    def load(config):
        key = (config.task, config.data)
        return made[key] if key in made else real(config)

    monkeypatch.setattr(task_run, "load_task_data", load)
    return made


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+\.\d+", text))


def test_help_names_the_task_option_and_the_task_keys(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = invoke("train", "--help")
    assert result.exit_code == 0
    assert "--task" in result.output and "series" in result.output and "class" in result.output
    assert "horizon: series: steps forecast after each observation (H) (default: 96)" in result.output
    assert "power-hourly" in result.output and "JapaneseVowels" in result.output


def test_series_train_writes_checkpoint_metrics_report_and_fan_chart_then_evaluate_matches(
    tmp_path, monkeypatch, tiny_data
):
    monkeypatch.chdir(tmp_path)
    result = invoke("train", *SERIES, *SERIES_SETS, "--out-dir", "run")
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    for name in ("best/config.json", "best/model.safetensors", "metrics.json", "report.md", "fan_chart.png"):
        assert (run / name).is_file(), name
    assert (run / "fan_chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = json.loads((run / "metrics.json").read_text())
    report = (run / "report.md").read_text()
    test, base = metrics["test"], metrics["baselines"]
    # The report's numbers are metrics.json's, beside the baselines.
    for scores in (test["restricted"], test["streaming"], base["last_value"], base["seasonal_naive_24"]):
        assert f"| {scores['mse']:.4f} | {scores['mae']:.4f} |" in report
    assert f"{metrics['parameters']:,} parameters" in report
    assert "STAND-IN, not TSLib's ECL" in report and "Source: gen" in report
    assert "aaren train --task series --data electricity --out-dir run" in report
    assert "![fan_chart.png](fan_chart.png)" in report
    assert f"{test['restricted']['mse']:.4f}" in result.output

    # The checkpoint tells the server what it needs.
    meta = load_checkpoint(run / "best").metadata
    assert meta["name"] == "aaren-series-electricity" == metrics["name"]
    assert meta["step_seconds"] == 3600.0 and meta["time_unit"] == "seconds"
    assert meta["channels"] == ["a", "b"] and meta["horizon"] == 6 and meta["quantiles"] == [0.1, 0.5, 0.9]

    # evaluate re-scores the test split from the stored config: the same numbers, the same report.
    result = invoke("evaluate", str(run / "best"), "--out", "again")
    assert result.exit_code == 0, result.output
    again = json.loads((tmp_path / "again" / "metrics.json").read_text())
    assert again["test"] == metrics["test"] and again["baselines"] == metrics["baselines"]
    assert again["model_version"] == metrics["model_version"]
    assert (tmp_path / "again" / "report.md").read_text() == report
    assert (tmp_path / "again" / "fan_chart.png").is_file()


def test_the_reproduce_command_reproduces_the_run(tmp_path, monkeypatch, tiny_data):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    result = invoke("train", *SERIES, *SERIES_SETS, "--name", "aaren-series-tiny", "--lr", "0.01", "--out-dir", "r")
    assert result.exit_code == 0, result.output
    report = (first / "r" / "report.md").read_text()
    command = report.split("## Reproduce\n\n```\n", 1)[1].split("\n", 1)[0]
    assert command.startswith("aaren train --task series --data electricity --name aaren-series-tiny --out-dir r")
    monkeypatch.chdir(second)
    result = invoke(*shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
    a, b = (json.loads((d / "r" / "metrics.json").read_text()) for d in (first, second))
    assert a["config"] == b["config"] and a["test"] == b["test"]
    assert load_checkpoint(second / "r" / "best").metadata["name"] == "aaren-series-tiny"


def test_class_train_and_evaluate(tmp_path, monkeypatch, tiny_data):
    monkeypatch.chdir(tmp_path)
    result = invoke("train", *CLASS, "--set", "name=vowels-tiny", "--out-dir", "run")
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    assert (run / "accuracy_by_fraction.png").is_file() and not (run / "fan_chart.png").exists()
    metrics = json.loads((run / "metrics.json").read_text())
    report = (run / "report.md").read_text()
    test = metrics["test"]
    assert f"| model, after the whole sequence | {test['accuracy']:.3f} |" in report
    assert "| accuracy | " + " | ".join(f"{v:.3f}" for v in test["accuracy_by_fraction"].values()) + " |" in report
    assert f"{metrics['baselines']['majority_class']['accuracy']:.3f}" in report
    assert "STAND-IN" not in report and "horizon=" not in report  # series keys are not this run's config
    meta = load_checkpoint(run / "best").metadata
    assert meta["name"] == "vowels-tiny" and meta["class_names"] == ["neg", "pos"] and meta["channels"] == ["x", "y"]
    assert "step_seconds" not in meta

    result = invoke("evaluate", str(run / "best"), "--no-plots")
    assert result.exit_code == 0, result.output
    again = json.loads((run / "best" / "metrics.json").read_text())
    assert again["test"] == test
    assert numbers((run / "best" / "report.md").read_text()) == numbers(report)
    assert not (run / "best" / "accuracy_by_fraction.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--task", "series", "--data", "ETTh1"), "error: unknown series data set 'ETTh1'"),
        (("--task", "class", "--data", "electricity"), "error: unknown class data set 'electricity'"),
        (("--task", "series", "--set", "no_such_key=1"), "error: task config: unknown keys ['no_such_key']"),
        (("--task", "series", "--set", "horizon=0"), "horizon, lookback, window, loss_stride, val_stride >= 1"),
        (("--task", "series", "--set", "epochs=many"), "error: task config: epochs='many'; expected int"),
        (("--task", "class", "--backbone", "dlinear"), "(or 'dlinear' for series)"),
        (("--task", "series", "--name", "no spaces"), "name empty or"),
        (("--task", "series", "--set", "task=class"), "error: give the task with --task"),
        (("--task", "series", "--resume"), "error: --resume is for the event task"),
        (("--task", "events"), "error: --task 'events': expected event, series, class or policy"),
    ],
)
def test_bad_task_arguments_fail_cleanly(tmp_path, monkeypatch, tiny_data, args, message):
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.chdir(tmp_path)
    result = invoke("train", "--out-dir", "run", *args)
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_evaluate_of_a_task_checkpoint_refuses_other_splits_and_data(tmp_path, monkeypatch, tiny_data):
    monkeypatch.chdir(tmp_path)
    assert invoke("train", *CLASS, "--epochs", "1", "--out-dir", "run").exit_code == 0
    for args, message in ((("--split", "val"), "test split only"), (("--data", "x.csv"), "--data is for event")):
        result = invoke("evaluate", "run/best", *args)
        assert result.exit_code == 1 and "error: --" in result.output and message in result.output
