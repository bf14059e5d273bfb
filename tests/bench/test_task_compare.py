"""``bench.task_compare``: parameter matching, stop reasons, and a tiny resumable campaign on synthetic
data (the wheels are not read). Only counts and table contents are asserted, never a time."""

import json

import numpy as np
import pytest

import bench.task_compare as tc
from aaren_core.tasks.config import TaskTrainConfig
from aaren_core.tasks.series.data import ClassData, ClassSet, SeriesData, ratio_borders


def tiny_series(n: int = 1200, channels: int = 2) -> SeriesData:
    rng = np.random.default_rng(0)
    t = np.arange(n)
    values = np.stack([np.sin(2 * np.pi * t / 24) * (c + 1) + 0.1 * rng.standard_normal(n) for c in range(channels)], 1)
    return SeriesData("tiny", 3600.0 * t, values, tuple(f"c{c}" for c in range(channels)), ratio_borders(n), 3600.0)


def tiny_class(channels: int = 3) -> ClassData:
    rng = np.random.default_rng(1)

    def part(n: int) -> ClassSet:
        labels = np.arange(n) % 2
        series = [rng.standard_normal((int(rng.integers(10, 20)), channels)).astype(np.float32) + y for y in labels]
        return ClassSet(series, labels)

    return ClassData("tiny", part(20), part(10), ("a", "b"), tuple(f"c{c}" for c in range(channels)))


@pytest.mark.parametrize("task", ["series", "class"])
def test_match_d_model_is_the_closest_width(task):
    data = tiny_series() if task == "series" else tiny_class()
    base = TaskTrainConfig(task=task, horizon=24)
    target = tc.count_parameters(base, data)
    for kind in ("transformer", "gru"):
        d, params, aaren = tc.match_d_model(base, kind, data)
        assert aaren == target
        assert params == tc.count_parameters(base.replace(model=kind, d_model=d), data)
        step = base.n_heads if kind == "transformer" else 1
        assert d % step == 0
        for other in (d - step, d + step):
            if base.d_model // 2 <= other <= 2 * base.d_model:
                assert abs(tc.count_parameters(base.replace(model=kind, d_model=other), data) - target) >= abs(
                    params - target
                )
    # The Transformer differs from Aaren only by Aaren's learned queries: same width.
    assert tc.match_d_model(base, "transformer", data)[0] == base.d_model


def _record(task, history, epochs=10, patience=2):
    return {"task": task, "config": {"epochs": epochs, "patience": patience}, "history": history}


def test_stop_info_replays_the_training_rules():
    series = [{"val_mse": v, "train_loss": 1.0} for v in (1.0, 0.8, 0.9, 0.85)]
    assert tc.stop_info(_record("series", series)) == (4, 1, "patience")
    assert tc.stop_info(_record("series", series[:3])) == (3, 1, "time cap")
    assert tc.stop_info(_record("series", series[:3], epochs=3)) == (3, 1, "epoch cap")
    # Class: ties in accuracy go to the lower train loss.
    acc = [{"val_accuracy": 0.5, "train_loss": 2.0}, {"val_accuracy": 0.5, "train_loss": 1.0}]
    assert tc.stop_info(_record("class", acc, epochs=2)) == (2, 1, "epoch cap")


def test_mean_std_and_loss_stride():
    assert tc.mean_std([]) == "-"
    assert tc.mean_std([0.5], 1, 100) == "50.0"
    assert tc.mean_std([1.0, 2.0, 3.0], 2) == "2.00 ± 1.00"
    assert [tc.loss_stride(h) for h in (96, 192, 336, 720, 8)] == [4, 8, 14, 30, 1]


def test_scored_phases_counts_the_hours_of_day_trained():
    # Windows start every 48 steps (a multiple of the 24-step day), so only the stride sets the phases.
    assert [tc.scored_phases(192, s, 24) for s in (1, 4, 8, 14, 30, 7)] == [24, 6, 3, 12, 4, 24]


def test_tiny_campaign_is_resumable(tmp_path, monkeypatch):
    series, labelled = tiny_series(), tiny_class()
    monkeypatch.setattr(tc, "load_series", lambda name, cache=None: series)
    monkeypatch.setattr(tc, "load_class", lambda name, cache=None: labelled)
    one = tc.Budget(epochs=1, patience=1, max_minutes=0.0)
    monkeypatch.setattr(tc, "CLASS_SETS", ("JapaneseVowels",))
    monkeypatch.setattr(tc, "CLASS_BUDGETS", {"JapaneseVowels": one})
    monkeypatch.setattr(tc, "SERIES_BUDGET", one)
    monkeypatch.setattr(tc, "DLINEAR_BUDGET", one)
    runs, s_out, c_out = tmp_path / "runs", tmp_path / "series.md", tmp_path / "class.md"
    argv = ["--runs-dir", str(runs), "--groups", "class", "series", "--seeds", "0", "--horizons", "8",
            "--series-out", str(s_out), "--class-out", str(c_out)]  # fmt: skip
    tc.main(argv)
    metrics = sorted(runs.rglob("metrics.json"))
    assert len(metrics) == 3 + 4  # 3 class models, 4 series models
    for path in metrics:
        side = json.loads((path.parent / tc.RUN_FILE).read_text())
        assert side["command"].startswith("python -m aaren_core.tasks.run")
        assert "threads=1" in side["command"]
    stamps = {p: p.stat().st_mtime_ns for p in metrics}
    tc.main(argv)  # everything done: nothing retrained
    assert {p: p.stat().st_mtime_ns for p in metrics} == stamps
    text = s_out.read_text()
    assert "| 8 | " in text and "stand-in for ETTh1/ETTh2" in text and "not run" not in text
    assert "Aaren/Transformer MSE (L=96)" in text and "within 2%" in text
    klass = c_out.read_text()
    assert "| JapaneseVowels | Aaren | 32 |" in klass and "| JapaneseVowels | GRU |" in klass
    # The GRU's width is matched, so its parameter count is near Aaren's.
    gru = json.loads((runs / "class" / "JapaneseVowels" / "gru-s0" / "metrics.json").read_text())
    aaren = json.loads((runs / "class" / "JapaneseVowels" / "aaren-s0" / "metrics.json").read_text())
    assert abs(gru["parameters"] - aaren["parameters"]) / aaren["parameters"] < 0.05


def test_budget_stops_new_runs(tmp_path, monkeypatch):
    labelled = tiny_class()
    monkeypatch.setattr(tc, "load_class", lambda name, cache=None: labelled)
    monkeypatch.setattr(tc, "CLASS_SETS", ("JapaneseVowels",))
    monkeypatch.setattr(tc, "CLASS_BUDGETS", {"JapaneseVowels": tc.Budget(epochs=1, patience=1, max_minutes=0.0)})
    runs = tmp_path / "runs"
    tc.main(["--runs-dir", str(runs), "--groups", "class", "--seeds", "0", "--budget-minutes", "0",
             "--class-out", str(tmp_path / "class.md")])  # fmt: skip
    assert not list(runs.rglob("metrics.json"))
    assert "not run" in (tmp_path / "class.md").read_text()
