"""docs/notebook.md runs as written: its python blocks in one namespace, its bash blocks in a shell,
in order, against a real server (the tiny model: 5 marks m0..m4, values a and b); so does the
README's "From a notebook or script" example, against the bundled flights model it is written for."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "notebook.md"
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_the_notebook_guide_runs(start_server, tmp_path, monkeypatch):
    srv = start_server()
    monkeypatch.setenv("AAREN_TARGET", srv.address)
    monkeypatch.chdir(tmp_path)
    blocks = BLOCK.findall(GUIDE.read_text())
    assert [kind for kind, _ in blocks].count("bash") == 1 and len(blocks) >= 6
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    namespace: dict = {"__name__": "__notebook__"}
    for i, (kind, code) in enumerate(blocks):
        if kind == "python":
            exec(compile(code, f"{GUIDE.name} block {i}", "exec"), namespace)
        else:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "on test:" in done.stdout and "top-3" not in done.stdout  # two marks
            assert "wrote" in done.stdout and "my_test.csv" in done.stdout

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


def test_the_readme_notebook_example_runs_on_the_bundled_model(start_server, capsys):
    srv = start_server(checkpoint=ROOT / "models" / "default")
    section = re.search(r"^## From a notebook or script\n(.*?)^## ", (ROOT / "README.md").read_text(), re.S | re.M)
    assert section is not None
    (kind, code), *_ = BLOCK.findall(section.group(1))
    assert kind == "python" and "127.0.0.1:50051" in code
    namespace: dict = {}
    exec(compile(code.replace("127.0.0.1:50051", srv.address), "README.md", "exec"), namespace)
    forecasts = namespace["forecasts"]
    assert (forecasts["outcome"] == "forecast").all() and forecasts["seq"].tolist() == [1, 2, 3]
    assert "dep_delay_mean" in capsys.readouterr().out
