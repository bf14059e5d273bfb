"""docs/notebook.md runs as written: its python blocks in one namespace, its bash blocks in a shell,
in order, against a real server (the tiny model: 5 marks m0..m4, values a and b). The README's
examples run in test_readme.py."""

from __future__ import annotations

import shutil

from examples import ROOT, examples, run_bash, run_python

GUIDE = ROOT / "docs" / "notebook.md"


def test_the_notebook_guide_runs(start_server, tmp_path, monkeypatch):
    srv = start_server()
    monkeypatch.setenv("AAREN_TARGET", srv.address)
    monkeypatch.chdir(tmp_path)
    blocks = examples(GUIDE)
    assert [b.lang for b in blocks].count("bash") == 1 and len(blocks) >= 6
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
    for png in ("gaps.png", "marks.png"):
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
