"""docs/notebook.md runs as written: its python blocks in one namespace, its bash blocks in a shell,
in order, against a real server of the bundled models, as `aaren serve` serves them (the flights event
model the default, `series-power` and `class-vowels` by name). The README's examples run in
test_readme.py."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from examples import ROOT, examples, run_bash, run_python

GUIDE = ROOT / "docs" / "notebook.md"


def test_the_notebook_guide_runs(start_server, tmp_path, monkeypatch):
    srv = start_server(checkpoint=None)  # no checkpoint, no models_dir: the bundled repository
    monkeypatch.setenv("AAREN_TARGET", srv.address)
    monkeypatch.chdir(tmp_path)
    blocks = examples(GUIDE)
    assert [b.lang for b in blocks].count("bash") == 1 and len(blocks) >= 10
    assert [b.where for b in blocks if b.skip] == []  # the whole guide runs
    namespace: dict = {"__name__": "__notebook__"}
    for block in blocks:
        if block.lang == "python":
            run_python(block, namespace, srv.address)
        else:
            out = run_bash(block, tmp_path, srv.address)
            assert "on test:" in out and "top-3" not in out  # two marks
            assert "wrote" in out and "my_test.csv" in out

    forecasts, step, out = namespace["forecasts"], namespace["step"], namespace["out"]
    assert len(forecasts) == 40 and (forecasts["outcome"] == "forecast").all()
    assert forecasts["seq"].tolist() == list(range(1, 41)) and step["seq"].item() == 41
    series, readings, power = namespace["series"], namespace["readings"], namespace["power"]
    assert len(series) == len(readings) * power.horizon and (series["outcome"] == "forecast").all()
    assert (series["session_id"] == "my-house").all() and series["seq"].max() == len(readings)
    assert namespace["latest"]["target_time"].iloc[-1] == readings["time"].iloc[-1] + pd.Timedelta(days=1)
    classes, utterances = namespace["classes"], namespace["utterances"]
    assert len(classes) == len(utterances) and (classes["outcome"] == "forecast").all()
    assert set(classes["predicted"]) <= set(namespace["vowels"].class_names)
    assert classes[namespace["probability_columns"]].sum(axis=1).to_numpy() == pytest.approx(1.0, abs=1e-5)
    for png in ("gaps.png", "marks.png", "fan.png", "classes.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    shutil.rmtree(out)  # the guide's own temp folder
    report = (tmp_path / "runs" / "mine" / "best" / "report.md").read_text()
    assert "Point forecast of the next gap (hours)" in report
    # What training derived, as the guide says: two decimals of an hour, and the split it chose.
    assert "recorded to a resolution of 0.01 hours (derived from the training times" in report
    assert "Split by event time at" in report and "so sessions are long" in report
    test_part = namespace["test_part"]
    assert list(test_part.columns) == ["session_id", "time", "mark", "load", "context"]
    assert set(test_part["context"]) == {0, 1}  # history rows, then held-out ones
    assert namespace["client"].closed
