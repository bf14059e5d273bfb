"""Task training loops on tiny generated data: they learn, select, score, and save loadable checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.config import TaskTrainConfig
from aaren_core.tasks.run import main, train_task
from aaren_core.tasks.series.data import ClassData, ClassSet, SeriesData, ratio_borders
from aaren_core.tasks.series.train import shifted_starts


def daily_series(n: int = 600) -> SeriesData:
    rng = np.random.default_rng(0)
    t = np.arange(n)
    values = np.stack([np.sin(2 * np.pi * t / 24), np.cos(2 * np.pi * t / 24)], 1) + 0.05 * rng.standard_normal((n, 2))
    return SeriesData("daily", 3600.0 * t, 10 + 3 * values, ("a", "b"), ratio_borders(n), 3600.0, "generated")


def sign_sequences(n: int, seed: int) -> ClassSet:
    """Class 1 when the mean of channel 0 is positive; variable lengths 5-12."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    series = [
        (rng.standard_normal((rng.integers(5, 13), 2)) * 0.5 + [1.0 if y else -1.0, 0.0]).astype(np.float32)
        for y in labels
    ]
    return ClassSet(series, labels)


def tiny(**changes):
    base = TaskTrainConfig(d_model=8, n_layers=1, n_heads=2, batch_size=8)
    return base.replace(**changes)


@pytest.mark.parametrize("model", ["aaren", "dlinear"])
def test_series_training_beats_last_value_and_saves(tmp_path, model):
    config = tiny(
        task="series", model=model, horizon=6, lookback=24, window=48, epochs=4, lr=1e-2, out_dir=str(tmp_path)
    ).replace(loss_stride=5)
    result = train_task(config, daily_series(), verbose=False)
    m = result.metrics
    assert m["test"]["restricted"]["mse"] < m["baselines"]["last_value"]["mse"]
    assert ("streaming" in m["test"]) == (model == "aaren")
    assert len(m["test"]["restricted"]["mse_by_step"]) == 6
    ckpt = load_checkpoint(tmp_path / "best")
    assert ckpt.model_version == m["model_version"] and ckpt.metadata["channels"] == ["a", "b"]
    assert json.loads((tmp_path / "metrics.json").read_text())["task"] == "series"


def test_class_training_learns_and_reports_accuracy_by_fraction(tmp_path):
    data = ClassData("signs", sign_sequences(96, 0), sign_sequences(40, 1), ("neg", "pos"), ("x", "y"), "generated")
    config = tiny(task="class", model="gru", epochs=6, lr=1e-2, aux_weight=0.5, out_dir=str(tmp_path))
    result = train_task(config, data, verbose=False)
    test = result.metrics["test"]
    assert test["accuracy"] >= 0.8
    assert set(test["accuracy_by_fraction"]) == {str(f / 10) for f in range(1, 11)}
    assert test["accuracy_by_fraction"]["1.0"] == test["accuracy"]
    ckpt = load_checkpoint(tmp_path / "best")
    assert ckpt.metadata["class_names"] == ["neg", "pos"] and ckpt.kind == "class_model"


def test_config_checks_and_set_coercion():
    c = TaskTrainConfig().replace(quantiles="0.05,0.5,0.95", time_features="false", epochs="3")
    assert c.quantiles == (0.05, 0.5, 0.95) and c.time_features is False and c.epochs == 3
    with pytest.raises(ValueError, match=r"task config: unknown keys"):
        TaskTrainConfig().replace(nope=1)
    with pytest.raises(ValueError, match="dlinear"):
        TaskTrainConfig(task="class", model="dlinear")


def test_cli_rejects_unknown_data_clearly():
    with pytest.raises(SystemExit, match="unknown series data set 'ETTh1'"):
        main(["--task", "series", "--set", "data=ETTh1"])


def test_time_decay_is_on_by_default_for_a_series_aaren_only():
    assert TaskTrainConfig().backbone().time_decay and TaskTrainConfig().to_dict()["time_decay"] is True
    assert not TaskTrainConfig(task="class").backbone().time_decay
    assert not TaskTrainConfig(model="transformer").backbone().time_decay
    assert not TaskTrainConfig().replace(time_decay="false").backbone().time_decay
    assert TaskTrainConfig(task="class").replace(time_decay="true").backbone().time_decay
    # A stored config says what applied: an old series run without decay stays without it.
    assert not TaskTrainConfig.from_dict({**TaskTrainConfig().to_dict(), "time_decay": False}).backbone().time_decay


def test_window_offsets_start_the_train_windows_at_every_hour_of_the_day():
    """Starts every 48 steps (window 192) of hourly data always fall at the same hour; one random
    offset per epoch spreads them over the day (what the loss sees: issue 13's phase aliasing)."""
    starts = np.arange(0, 1000, 48)
    rng = np.random.default_rng(0)
    hours = set()
    for _ in range(200):
        epoch = shifted_starts(starts, 48, 1000 - 1, rng)
        assert epoch.max() <= 999 and len(epoch) >= len(starts) - 1
        assert len({int(s) % 24 for s in epoch}) == 1  # one offset per epoch: the spacing stays
        hours |= {int(s) % 24 for s in epoch}
    assert hours == set(range(24)) and {int(s) % 24 for s in starts} == {0}
    assert TaskTrainConfig().window_offsets
    assert not TaskTrainConfig.from_dict({"task": "series"}).window_offsets  # stored before they existed
