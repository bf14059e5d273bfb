"""``aaren train --task series --data FILE``: the reader, the gap rule in training and scoring, the CLI.

The acceptance tests write the built-in stand-in ``power-hourly`` (read from the wheel cache) to a
CSV and train from it; the others use small generated files. Tiny models, a few steps, one thread.
"""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import numpy as np
import pytest
import torch
from generated import T0, gappy_file, write_csv
from typer.testing import CliRunner

from aaren.cli.app import app
from aaren.formats.errors import DataError
from aaren.formats.series_file import read_series_file
from aaren.formats.times import iso_utc
from aaren_core.checkpoint import load_checkpoint
from aaren_core.datasets import load_series
from aaren_core.tasks.config import TaskTrainConfig, load_task_data
from aaren_core.tasks.run import evaluate, train_task, write_task_report
from aaren_core.tasks.series.data import SeriesData, calendar_features, ratio_borders
from aaren_core.tasks.series.metrics import ErrorSums
from aaren_core.tasks.series.model import SeriesForecast, series_loss

H, L = 6, 24


def tiny(**changes) -> TaskTrainConfig:
    base = TaskTrainConfig(
        task="series", d_model=8, n_layers=1, n_heads=2, batch_size=8, horizon=H, lookback=L, window=48,
        loss_stride=4, epochs=1, steps_per_epoch=3, threads=1, seed=3,
    )  # fmt: skip
    return base.replace(**changes)


def daily_file(path: Path, n: int = 400) -> Path:
    """Two hourly channels with a daily cycle, ISO times from 2020-01-01."""
    t = np.arange(n)
    a, b = 10 + 3 * np.sin(2 * np.pi * t / 24), 5 + np.cos(2 * np.pi * t / 24)
    return write_csv(
        path, [iso_utc(T0 + 3600 * i) for i in t], {"a": [f"{x:.6f}" for x in a], "b": [f"{x:.6f}" for x in b]}
    )


# --- the reader ---------------------------------------------------------------------------------


def test_reader_sorts_puts_rows_on_the_grid_and_reads_na(tmp_path):
    path = write_csv(
        tmp_path / "s.csv",
        [str(T0 + 7200), str(T0), str(T0 + 3600), str(T0 + 5 * 3600), str(T0 + 6 * 3600)],
        {"x": ["3", "1", "NA", "6", "7"], "y": ["30", "10", "20", "", "70"]},
    )
    table = read_series_file(path)
    assert table.step == 3600.0 and table.channels == ("x", "y") and table.rows == 5
    np.testing.assert_array_equal(table.times, T0 + 3600.0 * np.arange(7))
    np.testing.assert_array_equal(table.real, [1, 1, 1, 0, 0, 1, 1])
    np.testing.assert_array_equal(table.values[:, 0], [1, np.nan, 3, np.nan, np.nan, 6, 7])
    np.testing.assert_array_equal(table.values[:, 1], [10, 20, 30, np.nan, np.nan, np.nan, 70])
    # --channels picks columns; a given step overrides the inference.
    only = read_series_file(path, channels=["y"], step_seconds=1800)
    assert only.channels == ("y",) and len(only.times) == 13 and only.real.sum() == 5


def test_reader_infers_the_most_common_gap(tmp_path):
    # Gaps of 2 steps and 3 steps exist, one step is the most common.
    offsets = [0, 1, 2, 3, 5, 6, 7, 10, 11]
    table = read_series_file(
        write_csv(tmp_path / "g.csv", [iso_utc(T0 + 900 * k) for k in offsets], {"v": ["1"] * len(offsets)})
    )
    assert table.step == 900.0 and len(table.times) == 12 and np.flatnonzero(~table.real).tolist() == [4, 8, 9]


@pytest.mark.parametrize(
    ("times", "columns", "kwargs", "message"),
    [
        (["0", "3600", "3600", "7200"], {"v": ["1", "2", "3", "4"]}, {}, "duplicate time 1970-01-01T01:00:00Z"),
        (["0", "3600", "5400", "9000", "12600"], {"v": ["1"] * 5}, {}, "time 1970-01-01T01:30:00Z is off the step"),
        (["0", "3600"], {"v": ["1", "2"], "who": ["ann", "bob"]}, {}, "column 'who' holds text"),
        (["0", "3600", "7200"], {"v": ["1", "x2", "3"]}, {}, "line 3: column 'v': 'x2' is not a number"),
        (["0", "3600"], {"v": ["1", "2"], "who": ["ann", "bob"]}, {"channels": ["who"]}, "'ann' is not a number"),
        ([], {"v": []}, {}, "no rows"),
        (["0", "nope"], {"v": ["1", "2"]}, {}, "line 3: column 'time': time 'nope' is neither"),
        (["0", "3600"], {"v": ["1", "2"]}, {"time_column": "ts"}, "no time column 'ts'"),
        (["0", "3600"], {"v": ["1", "2"]}, {"channels": ["w"]}, "no column 'w'"),
    ],
)
def test_reader_refuses_bad_files_clearly(tmp_path, times, columns, kwargs, message):
    path = write_csv(tmp_path / "bad.csv", times, columns)
    with pytest.raises(DataError, match=message) as info:
        read_series_file(path, **kwargs)
    assert str(path) in str(info.value)
    if "holds text" in message:
        assert "--channels" in str(info.value)


def test_compressed_and_parquet_files_read_the_same(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    plain = daily_file(tmp_path / "d.csv", 60)
    (tmp_path / "d.csv.gz").write_bytes(gzip.compress(plain.read_bytes()))
    (tmp_path / "d.csv.xz").write_bytes(lzma.compress(plain.read_bytes()))
    want = read_series_file(plain)
    stamps = pa.array((want.times * 1e6).astype(np.int64), pa.timestamp("us", tz="UTC"))
    table = pa.table({"when": stamps, "a": want.values[:, 0], "b": pa.array([None, *want.values[1:, 1]])})
    pq.write_table(table, tmp_path / "d.parquet")
    for name in ("d.csv.gz", "d.csv.xz"):
        got = read_series_file(tmp_path / name)
        np.testing.assert_array_equal(got.values, want.values)
        np.testing.assert_array_equal(got.times, want.times)
    got = read_series_file(tmp_path / "d.parquet", time_column="when")
    np.testing.assert_array_equal(got.times, want.times)
    np.testing.assert_array_equal(got.values[:, 0], want.values[:, 0])
    assert np.isnan(got.values[0, 1]) and np.array_equal(got.values[1:, 1], want.values[1:, 1])


def test_a_damaged_compressed_file_is_a_data_error(tmp_path):
    for name, data in (("x.csv.xz", lzma.compress(b"time,v\n0,1\n")[:-8]), ("x.csv.gz", b"\x1f\x8b not gzip")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DataError, match="not readable as CSV"):
            read_series_file(tmp_path / name)


def test_splits_of_a_file(tmp_path):
    path = daily_file(tmp_path / "d.csv", 400)
    data = load_task_data(tiny(data=str(path)))
    assert data.borders == ratio_borders(400) and data.split.startswith("ratio")
    at = load_task_data(tiny(data=str(path), split_at=iso_utc(T0 + 3600 * 300.5)))
    assert at.borders == (301 - 301 // 8, 301, 400) and at.test_from == iso_utc(T0 + 3600 * 301)
    assert load_task_data(tiny(data=str(path), split_at=str(T0 + 3600 * 300))).borders[1] == 300
    with pytest.raises(DataError, match="ETT-style split needs 14400 steps"):
        load_task_data(tiny(data=str(path), split="ett"))
    with pytest.raises(DataError, match="expected a time inside it"):
        load_task_data(tiny(data=str(path), split_at="2030-01-01"))


# --- the gap rule: fill, masks, counts ----------------------------------------------------------


def test_with_gaps_fills_forward_and_leads_with_the_train_mean():
    values = np.array([[np.nan, 1.0], [2.0, np.nan], [np.nan, np.nan], [4.0, 3.0], [5.0, 6.0], [6.0, 7.0]])
    real = np.array([1, 1, 0, 1, 1, 1], dtype=bool)
    data = SeriesData.with_gaps("g", T0 + 3600.0 * np.arange(6), values, real, ("a", "b"), (3, 4, 6), 3600.0)
    assert data.mean[0] == 2.0 and data.mean[1] == 1.0  # observed train values only
    np.testing.assert_array_equal(data.values[:, 0], [2, 2, 2, 4, 5, 6])
    np.testing.assert_array_equal(data.values[:, 1], [1, 1, 1, 3, 6, 7])
    assert data.missing_steps == 1 and data.missing_values == 2
    assert data.observed.sum() == 8 and not data.observed[2].any()
    # Origins follow real rows only: step 3 follows the missing step 2.
    assert data.forecast_origins("test", 1, 1).tolist() == [4, 5]
    assert (
        SeriesData.with_gaps("g", data.times, np.ones((6, 2)), np.ones(6, bool), ("a", "b"), (3, 4, 6), 1.0).observed
        is None
    )


def test_masked_entries_neither_score_nor_train():
    rng = np.random.default_rng(0)
    pred, target = rng.standard_normal((4, 3, 2)), rng.standard_normal((4, 3, 2))
    mask = rng.random((4, 3, 2)) > 0.3
    sums, spoiled = ErrorSums(3), ErrorSums(3)
    sums.update(pred, target, mask)
    spoiled.update(pred, np.where(mask, target, 1e6), mask)
    assert sums.result() == spoiled.result() and sums.result()["targets"] == mask.sum()
    assert np.isclose(sums.result()["mse"], np.square(pred - target)[mask].mean())
    full = ErrorSums(3)
    full.update(pred, target)
    assert full.result()["targets"] == pred.size and np.isclose(full.result()["mse"], np.square(pred - target).mean())

    mean = torch.randn(2, 5, 3, 2)
    forecast = SeriesForecast(mean, mean.unsqueeze(-1) + torch.tensor([-1.0, 0.0, 1.0]))
    y = torch.randn(2, 5, 3, 2)
    keep = torch.rand(2, 5, 3, 2) > 0.4
    levels = torch.tensor([0.1, 0.5, 0.9])
    loss = series_loss(forecast, y, keep, levels)[0]
    assert torch.equal(loss, series_loss(forecast, torch.where(keep, y, 1e6), keep, levels)[0])
    assert not torch.equal(loss, series_loss(forecast, y, torch.ones(2, 5, dtype=torch.bool), levels)[0])


@pytest.mark.parametrize("model", ["aaren", "gru", "dlinear"])
def test_a_gappy_file_trains_every_model_on_observed_targets(tmp_path, model):
    path, real, observed = gappy_file(tmp_path / "g.csv")
    config = tiny(data=str(path), model=model, out_dir=str(tmp_path / "run"))
    data = load_task_data(config)
    np.testing.assert_array_equal(data.observed, observed)
    assert data.values[0, 1] == data.mean[1]  # before any value: the train mean
    m = train_task(config, data, verbose=False).metrics
    _, b, c = data.borders
    origins = np.arange(max(b, L), c - H + 1)
    origins = origins[real[origins - 1]]
    targets = int(observed[origins[:, None] + np.arange(H)].sum())
    assert m["test"]["restricted"]["targets"] == targets and m["test"]["restricted"]["windows"] == len(origins)
    assert ("streaming_raw" in m["test"]) == (model != "dlinear") and np.isfinite(m["test"]["restricted"]["mse"])


def test_streaming_raw_is_what_a_replay_of_the_rows_measures(tmp_path):
    """The protocol's replay, row by row through ``SeriesModel.step``: k missing steps stepped with
    the last filled values, NA filled likewise (the first rows: the train mean), a forecast after
    each row scored from ``test_from`` against the later rows' observed cells, in raw units."""
    path, _, _ = gappy_file(tmp_path / "g.csv", seed=1)
    config = tiny(data=str(path), out_dir=str(tmp_path / "run"))
    data = load_task_data(config)
    result = train_task(config, data, verbose=False)
    model, raw = result.model, result.metrics["test"]["streaming_raw"]
    table = read_series_file(path)
    rows = np.flatnonzero(table.real)
    score_from = T0 + 3600.0 * data.borders[1]
    assert iso_utc(score_from) == result.metrics["test_from"]
    last_time = table.times[rows[-1]]
    state, filled = model.init_state(1), data.mean.astype(np.float32).copy()
    feats = torch.from_numpy(calendar_features(table.times))
    se = ae = 0.0
    n = 0
    previous = -1
    with torch.no_grad():
        for i in rows:
            for j in range(previous + 1, i):  # the missing steps, no forecast
                _, state = model.step(torch.from_numpy(filled)[None], feats[j : j + 1], state)
            cells = table.values[i]
            filled = np.where(np.isnan(cells), filled, cells).astype(np.float32)
            y, state = model.step(torch.from_numpy(filled)[None], feats[i : i + 1], state)
            previous = i
            t = table.times[i]
            if t + 3600 >= score_from and t + H * 3600 <= last_time:
                forecast = model.to_raw(model.heads(y)).mean[0].numpy()  # [H, C]
                for h in range(H):
                    k = i + h + 1
                    for ch in range(2):
                        if table.real[k] and not np.isnan(table.values[k, ch]):
                            err = float(forecast[h, ch]) - table.values[k, ch]
                            se, ae, n = se + err * err, ae + abs(err), n + 1
    assert n == raw["targets"]
    assert se / n == pytest.approx(raw["mse"], rel=1e-6) and ae / n == pytest.approx(raw["mae"], rel=1e-6)


# --- power-hourly through a file ----------------------------------------------------------------


@pytest.fixture(scope="module")
def power():
    try:
        return load_series("power-hourly")
    except DataError as e:
        pytest.skip(f"power-hourly is not in the wheel cache: {e}")


def write_series(path: Path, data: SeriesData, rows: np.ndarray, na: dict[int, np.ndarray] | None = None) -> Path:
    """``data``'s ``rows`` as a CSV of ISO times and channels, NA at ``na[channel]`` (step indices)."""
    cells = {c: [repr(float(x)) for x in data.values[rows, j]] for j, c in enumerate(data.channels)}
    for j, steps in (na or {}).items():
        at = np.flatnonzero(np.isin(rows, steps))
        for i in at:
            cells[data.channels[j]][i] = "NA"
    return write_csv(path, [iso_utc(t) for t in data.times[rows]], cells)


def assert_close(got, want, where: str) -> None:
    """Nested metrics equal: the same keys, numbers to 1e-6 relative."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for k in want:
            assert_close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12), where
    else:
        assert got == want, where


def test_power_hourly_from_a_file_scores_as_the_named_set(tmp_path, power):
    path = write_series(tmp_path / "power.csv", power, np.arange(len(power.times)))
    named = train_task(tiny(data="power-hourly", out_dir=str(tmp_path / "named")), verbose=False).metrics
    config = tiny(data=str(path), split="ett", out_dir=str(tmp_path / "file"))
    data = load_task_data(config)
    assert data.borders == power.borders and data.observed is None
    np.testing.assert_array_equal(data.values, power.values)
    filed = train_task(config, data, verbose=False).metrics
    for key in ("test", "baselines", "val_mse", "best_epoch", "test_from"):
        assert_close(filed[key], named[key], key)
    assert filed["gaps"]["missing_steps"] == 0 and filed["test_from"] == iso_utc(power.times[power.borders[1]])
    raw = filed["test"]["streaming_raw"]
    assert raw["targets"] == filed["test"]["streaming"]["targets"] and raw["mse"] > filed["test"]["streaming"]["mse"]

    meta = load_checkpoint(tmp_path / "file" / "best").metadata
    assert meta["channels"] == list(power.channels) and meta["step_seconds"] == 3600.0
    assert meta["fill"] == "forward" and meta["max_gap_steps"] == 168 and meta["test_from"] == filed["test_from"]
    # evaluate re-reads the file from the stored config: the same numbers.
    again = evaluate(tmp_path / "file" / "best", out_dir=tmp_path / "again", plots=False).metrics
    assert again["test"] == filed["test"] and again["baselines"] == filed["baselines"]


def test_power_hourly_with_gaps_trains_and_scores_only_real_targets(tmp_path, power):
    rng = np.random.default_rng(7)
    n, c = power.values.shape
    dropped = rng.choice(np.arange(1, n - 1), size=n // 50, replace=False)
    rows = np.setdiff1d(np.arange(n), dropped)
    na = rng.choice(rows, size=len(rows) // 20, replace=False)
    path = write_series(tmp_path / "gappy.csv", power, rows, {2: na})
    # The mask, built here from what was written.
    real = np.ones(n, dtype=bool)
    real[dropped] = False
    observed = np.repeat(real[:, None], c, axis=1)
    observed[na, 2] = False

    config = tiny(data=str(path), split="ett", out_dir=str(tmp_path / "run"))
    data = load_task_data(config)
    assert data.missing_steps == len(dropped) and data.missing_values == len(na)
    np.testing.assert_array_equal(data.observed, observed)
    assert np.isfinite(data.values).all()
    result = train_task(config, data, verbose=False)
    m = result.metrics

    a, b = power.borders[1], power.borders[2]
    origins = np.arange(max(a, L), b - H + 1)
    origins = origins[real[origins - 1]]
    targets = int(observed[origins[:, None] + np.arange(H)].sum())
    assert targets < len(origins) * H * c
    for scores in (m["test"]["restricted"], m["test"]["streaming"], m["baselines"]["last_value"]):
        assert scores["targets"] == targets and np.isfinite(scores["mse"])
    assert m["test"]["restricted"]["windows"] == len(origins) and m["test"]["streaming_raw"]["targets"] == targets
    assert m["gaps"] == {"missing_steps": len(dropped), "missing_values": len(na), "fill": "forward"}

    write_task_report(m, result.model, data, tmp_path / "run", plots=False)
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"{len(dropped):,} steps had no row and {len(na):,} values of the rows were NA" in report
    assert "split ett" in report and f", {targets:,} targets counted" in report and m["test_from"] in report


# --- the command line ---------------------------------------------------------------------------

runner = CliRunner()
TINY = ("--d-model", "8", "--n-layers", "1", "--n-heads", "2", "--batch-size", "8", "--epochs", "1")
SETS = ("horizon=6", "lookback=24", "window=48", "steps_per_epoch=2", "threads=1")


def train_cli(*args: str):
    argv = ["train", "--task", "series", *TINY, "--out-dir", "run", *args]
    for s in SETS:
        argv += ["--set", s]
    result = runner.invoke(app, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_cli_trains_from_a_file_and_evaluate_rereads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    daily_file(tmp_path / "d.csv", 400)
    result = train_cli("--data", "d.csv", "--channels", "b,a", "--time-column", "time")
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    meta = load_checkpoint(tmp_path / "run" / "best").metadata
    assert meta["data"] == str(tmp_path / "d.csv") and meta["channels"] == ["b", "a"]
    assert metrics["name"] == "aaren-series-d" and metrics["split"].startswith("ratio")
    assert "A file: split ratio (70/10/20)" in (tmp_path / "run" / "report.md").read_text()
    monkeypatch.chdir(tmp_path / "run")  # the stored path is absolute
    again = runner.invoke(app, ["evaluate", "best", "--out", "again"])
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "run" / "again" / "metrics.json").read_text())["test"] == metrics["test"]


@pytest.mark.parametrize(
    ("times", "columns", "args", "message"),
    [
        (["0", "3600", "3600"], {"v": ["1", "2", "3"]}, (), "duplicate time"),
        (["0", "3600", "5400", "9000", "12600"], {"v": ["1"] * 5}, (), "off the step grid"),
        (["0", "3600"], {"v": ["1", "2"], "who": ["a", "b"]}, (), "column 'who' holds text"),
        (["0", "3600"], {"v": ["1", "2"]}, ("--channels", "w"), "no column 'w'"),
        ([], {"v": []}, (), "no rows"),
        ([str(3600 * i) for i in range(30)], {"v": ["1"] * 30}, (), "too few"),
    ],
)
def test_cli_bad_files_fail_cleanly(tmp_path, monkeypatch, times, columns, args, message):
    monkeypatch.chdir(tmp_path)
    write_csv(tmp_path / "bad.csv", times, columns)
    result = train_cli("--data", "bad.csv", *args)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()
