"""Classification from a user's files (issue 22): ``aaren train --task class --data TRAIN [--test-data TEST]``.

JapaneseVowels (from the wheel cache) written out as ``.ts`` files and as replay-format CSVs must
read back as the named set exactly and train to the same metrics; without a test file a stratified,
seeded 20% is the test part; every bad file is one ``error:`` line, exit 1, nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from labelled_files import table_rows, write_table, write_ts
from typer.testing import CliRunner

from aaren.cli.app import app
from aaren.formats.errors import DataError
from aaren_core.datasets import load_class
from aaren_core.tasks.classify.data import ClassData, ClassSet
from aaren_core.tasks.classify.files import load_class_files
from aaren_core.tasks.config import TaskTrainConfig

runner = CliRunner()
TINY = ("--d-model", "8", "--n-layers", "1", "--n-heads", "2", "--batch-size", "32", "--lr", "0.01")
SHORT = ("--task", "class", "--epochs", "2", *TINY, "--set", "threads=1", "--set", "aux_weight=0.5")


@pytest.fixture(scope="module")
def vowels() -> ClassData:
    try:
        return load_class("JapaneseVowels")
    except DataError as exc:
        pytest.fail(f"the sktime wheel is not in the cache ({exc}); run `python -m aaren_core.datasets fetch`")


def _names(data: ClassData, part: ClassSet) -> list[str]:
    return [data.class_names[k] for k in part.labels]


@pytest.fixture(scope="module")
def vowel_files(vowels: ClassData, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """JapaneseVowels' train and test parts as .ts files, CSVs and Parquet."""
    root = tmp_path_factory.mktemp("vowels")
    out = {}
    for part in ("train", "test"):
        data = getattr(vowels, part)
        out[f"{part}.ts"] = write_ts(root / f"vowels_{part}.ts", data.series, _names(vowels, data), vowels.class_names)
        for suffix in ("csv", "parquet"):
            out[f"{part}.{suffix}"] = write_table(
                root / f"vowels_{part}.{suffix}", data.series, _names(vowels, data), vowels.channels, part
            )
    return out


def _same_sets(a: ClassSet, b: ClassSet) -> bool:
    return (
        len(a) == len(b)
        and all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a.series, b.series, strict=True))
        and np.array_equal(a.labels, b.labels)
    )


@pytest.mark.parametrize("suffix", ["ts", "csv", "parquet"])
def test_japanese_vowels_written_out_reads_back_as_the_named_set(vowels, vowel_files, suffix):
    config = TaskTrainConfig(task="class", data=str(vowel_files[f"train.{suffix}"]))
    got = load_class_files(config.replace(test_data=str(vowel_files[f"test.{suffix}"])))
    assert _same_sets(got.train, vowels.train) and _same_sets(got.test, vowels.test)
    assert got.class_names == vowels.class_names == tuple("123456789")
    assert got.channels == vowels.channels  # .ts: dim_i; the tables name their columns so
    assert np.array_equal(got.mean, vowels.mean) and np.array_equal(got.std, vowels.std)
    assert f"test: the file vowels_test.{suffix} (370 sequences)" in got.source


def _train(tmp_path: Path, out: str, *args: str) -> dict:
    result = runner.invoke(app, ["train", *SHORT, "--out-dir", str(tmp_path / out), *args])
    assert result.exit_code == 0, result.output
    return json.loads((tmp_path / out / "metrics.json").read_text())


def test_training_from_ts_files_and_from_csvs_scores_exactly_as_the_named_set(vowel_files, tmp_path):
    named = _train(tmp_path, "named", "--data", "JapaneseVowels")
    ts = _train(tmp_path, "ts", "--data", str(vowel_files["train.ts"]), "--test-data", str(vowel_files["test.ts"]))
    csv = _train(tmp_path, "csv", "--data", str(vowel_files["train.csv"]), "--test-data", str(vowel_files["test.csv"]))
    for run in (ts, csv):
        assert run["test"] == named["test"] and run["baselines"] == named["baselines"]
        assert run["best_epoch"] == named["best_epoch"] and run["val_accuracy"] == named["val_accuracy"]
    assert named["test"]["accuracy"] > named["baselines"]["majority_class"]["accuracy"]  # it learned something
    report = (tmp_path / "csv" / "report.md").read_text()
    assert (
        f"Files: train `{vowel_files['train.csv']}`, test `{vowel_files['test.csv']}` (given with --test-data)"
        in report
    )
    assert (
        csv["config"]["test_data"] == str(vowel_files["test.csv"]) and "test: the file vowels_test.csv" in csv["source"]
    )

    # aaren evaluate reads the files again and scores the same.
    result = runner.invoke(app, ["evaluate", str(tmp_path / "csv" / "best"), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "csv" / "best" / "metrics.json").read_text())["test"] == csv["test"]


def test_without_a_test_file_a_stratified_seeded_fifth_is_held_out(vowels, vowel_files, tmp_path):
    config = TaskTrainConfig(task="class", data=str(vowel_files["train.csv"]))
    first, again, other = (load_class_files(config.replace(seed=s)) for s in (0, 0, 1))
    assert np.bincount(first.test.labels).tolist() == [6] * 9  # 20% of each class of 30
    assert np.bincount(first.train.labels).tolist() == [24] * 9
    assert _same_sets(first.test, again.test) and _same_sets(first.train, again.train)
    assert not _same_sets(first.test, other.test)
    # Train and test split the file's sequences: every sequence is in exactly one part.
    keys = sorted(s.tobytes() for s in [*first.train.series, *first.test.series])
    assert keys == sorted(s.tobytes() for s in vowels.train.series)
    assert "a stratified 20% of its sequences held out (per class, seed 0)" in first.source
    # The .ts file holds the same sequences in the same order: the same split.
    ts = load_class_files(config.replace(data=str(vowel_files["train.ts"])))
    assert _same_sets(ts.test, first.test)

    # Uneven classes: round(20%) of each (10 -> 2, 5 -> 1, 3 -> 1, 2 -> 0).
    rng = np.random.default_rng(3)
    labels = ["a"] * 10 + ["b"] * 5 + ["c"] * 3 + ["d"] * 2
    series = [rng.standard_normal((int(rng.integers(2, 6)), 2)).astype(np.float32) for _ in labels]
    path = write_table(tmp_path / "uneven.csv", series, labels, ("x", "y"))
    uneven = load_class_files(TaskTrainConfig(task="class", data=str(path)))
    assert np.bincount(uneven.test.labels, minlength=4).tolist() == [2, 1, 1, 0]

    result = runner.invoke(
        app, ["train", *SHORT, "--epochs", "1", "--data", str(path), "--out-dir", str(tmp_path / "r")]
    )
    assert result.exit_code == 0, result.output
    report = (tmp_path / "r" / "report.md").read_text()
    assert "No test file was given: a stratified 20% of its sequences (per class, seed 0) was held out" in report
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert "held out (per class, seed 0)" in metrics["source"]
    # aaren evaluate holds out the same sequences again.
    result = runner.invoke(app, ["evaluate", str(tmp_path / "r" / "best"), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r" / "best" / "metrics.json").read_text())["test"] == metrics["test"]


def test_class_names_channels_and_missing_values(tmp_path):
    rng = np.random.default_rng(4)
    series = [rng.standard_normal((n, 3)).astype(np.float32) for n in (3, 5, 2, 4, 6, 3)]
    series[1][2, 0] = np.nan
    labels = ["10", "2", "10", "2", "9", "9"]
    # A table's classes are its labels sorted, by value when all are numbers; channels its column names.
    table = write_table(tmp_path / "t.csv", series, labels, ("ax", "ay", "az"))
    ts = write_ts(tmp_path / "t.ts", series, labels, ["9", "10", "2"])
    config = TaskTrainConfig(task="class", data=str(table), test_data=str(table))
    # A table's empty cell is a missing value (NaN), as a .ts file's '?' is.
    got = load_class_files(config)
    assert np.isnan(got.train.series[1][2, 0]) and np.isfinite(np.delete(got.train.series[1].ravel(), 6)).all()
    series[1][2, 0] = 0.5
    write_table(table, series, labels, ("ax", "ay", "az"))
    got = load_class_files(config)
    assert got.class_names == ("2", "9", "10") and got.channels == ("ax", "ay", "az")
    assert got.train.labels.tolist() == [2, 0, 2, 0, 1, 1]
    # A .ts file's classes are in @classLabel order; its '?' values stay NaN.
    series[1][2, 0] = np.nan
    write_ts(ts, series, labels, ["9", "10", "2"])
    got = load_class_files(config.replace(data=str(ts), test_data=str(ts)))
    assert got.class_names == ("9", "10", "2") and got.channels == ("dim_0", "dim_1", "dim_2")
    assert np.isnan(got.train.series[1][2, 0]) and np.isnan(got.mean).sum() == 0
    # Test columns in another order are put in train's order.
    series[1][2, 0] = 0.5
    header = ["session_id", "time", "az", "ax", "ay", "label"]
    rows = [[r[0], r[1], r[4], r[2], r[3], r[5]] for r in table_rows(series[:2], labels[:2], ("ax", "ay", "az"))]
    (tmp_path / "swapped.csv").write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    got = load_class_files(TaskTrainConfig(task="class", data=str(table), test_data=str(tmp_path / "swapped.csv")))
    assert np.array_equal(got.test.series[0], series[0]) and np.array_equal(got.test.series[1], series[1])


def test_interleaved_sessions_keep_their_first_appearance_order(tmp_path):
    lines = ["session_id,time,x,label", "b,0,1,n", "a,0,5,p", "b,1,2,n", "a,1,6,p", "c,0,7,p", "d,0,0,n"]
    (tmp_path / "i.csv").write_text("\n".join(lines) + "\n")
    got = load_class_files(
        TaskTrainConfig(task="class", data=str(tmp_path / "i.csv"), test_data=str(tmp_path / "i.csv"))
    )
    assert [s[:, 0].tolist() for s in got.test.series] == [[1, 2], [5, 6], [7], [0]]
    assert got.test.labels.tolist() == [0, 1, 1, 0]


def test_a_timestamped_ts_file_orders_each_instance_by_its_stamps(tmp_path):
    lines = ["@problemName stamped", "@timeStamps true", "@univariate true", "@classLabel true up down", "@data"]
    for i in range(10):
        sign = 1.0 if i % 2 else -1.0
        pairs = ",".join(f"({t},{sign * v})" for t, v in ((2, 3.0), (0, 1.0), (1, 2.0)))
        lines.append(f"{pairs}:{'up' if sign > 0 else 'down'}")
    (tmp_path / "s.ts").write_text("\n".join(lines) + "\n")
    got = load_class_files(TaskTrainConfig(task="class", data=str(tmp_path / "s.ts")))
    assert got.class_names == ("up", "down") and len(got.train) == 8 and len(got.test) == 2
    for part in (got.train, got.test):
        for s, k in zip(part.series, part.labels, strict=True):
            assert s[:, 0].tolist() == ([1.0, 2.0, 3.0] if k == 0 else [-1.0, -2.0, -3.0])


GOOD = ["session_id,time,x,y,label", "a,0,1,2,p", "a,1,1,2,p", "b,0,3,4,q", "b,1,3,4,q", "c,0,1,1,p", "d,0,2,2,q"]


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


BAD_FILES = {
    "no rows": (["session_id,time,x,y,label"], None, "no events; expected at least one row"),
    "no sequences in a .ts": (["@classLabel true p q", "@data"], None, "no instances after @data"),
    "one class only": (["session_id,time,x,label", "a,0,1,p", "b,0,2,p"], None, "every sequence has label 'p'"),
    "length 0 in a .ts": (["@classLabel true p q", "@data", "1,2:p", ":q"], None, "dimension 0 has no values"),
    "channels differ": (
        GOOD,
        [*(line.replace("y", "z", 1) for line in GOOD[:1]), *GOOD[1:]],
        "channels ['x', 'z'] differ",
    ),
    "ts dimensions differ": (
        ["@classLabel true p q", "@data", "1,2:1,2:p", "3:3:q"],
        ["@classLabel true p q", "@data", "1:p"],
        "channels ['dim_0'] differ",
    ),
    "not a number": ([*GOOD, "e,0,1,oops,p"], None, "line 8: value column 'y' is 'oops'; expected a finite number"),
    "no label column": ([line.rsplit(",", 1)[0] for line in GOOD], None, "no 'label' column"),
    "two labels": ([*GOOD, "a,2,1,2,q"], None, "session 'a' has label 'q' after 'p'; expected one label per sequence"),
    "empty label": ([*GOOD, "e,0,1,2,"], None, "empty label"),
    "test label unknown": (GOOD, [*GOOD, "e,0,1,2,r"], "labels ['r'] are not classes of the train file"),
    "test of another format": (GOOD, ["@classLabel true p q", "@data", "1:1:p"], "expected both in one format"),
    "unlabelled .ts": (["@classLabel false", "@data", "1,2", "3"], None, "no labels; expected @classLabel true"),
    "no test file": (GOOD, "missing", "test.csv: no such file"),
    "unsupported suffix": (GOOD, None, "unsupported file type; expected .ts, .csv, .csv.gz, .parquet or .pq"),
    "too few to hold out": (["session_id,time,x,label", "a,0,1,p", "b,0,2,q"], None, "too few sequences per class"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_each_bad_file_is_one_error_line_and_writes_nothing(tmp_path, monkeypatch, case):
    monkeypatch.setenv("COLUMNS", "300")
    train_lines, test_lines, message = BAD_FILES[case]
    is_ts = train_lines[0].startswith("@")
    suffix = ".txt" if case == "unsupported suffix" else ".ts" if is_ts else ".csv"
    args = ["--data", _write(tmp_path / f"train{suffix}", train_lines)]
    if test_lines == "missing":
        args += ["--test-data", str(tmp_path / "test.csv")]
    elif test_lines is not None:
        test_suffix = ".ts" if test_lines[0].startswith("@") else ".csv"
        args += ["--test-data", _write(tmp_path / f"test{test_suffix}", test_lines)]
    result = runner.invoke(app, ["train", *SHORT, *args, "--out-dir", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert message in lines[0] and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()
