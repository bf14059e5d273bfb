"""The aaren side of ``python -m bench.layouts`` runs end to end in quick mode (TorchServe is not
installed in CI). Only that every event got a forecast is asserted, never a time."""

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import layouts

ROOT = Path(__file__).resolve().parents[2]


def test_layouts_quick_without_torchserve(tmp_path):
    cmd = [sys.executable, "-m", "bench.layouts", "--quick", "--no-torchserve", "--layouts", "0", "--levels", "1,4",
           "--events", "30", "--reps", "1", "--batched-streams", "2", "--batched-messages", "3",
           "--core-rounds", "3", "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "layouts.json").read_text())
    cells = result["cells"]
    single = [c for c in cells if c["phase"] == "single"]
    assert {(c["server"], c["sessions"]) for c in single} == {(s, n) for s in ("aaren f0", "echo") for n in (1, 4)}
    for c in single:
        assert c["errors"] == 0 and c["forecasts"] == c["sessions"] * 30, c
        assert c["cpu_s"], c  # the server's processes were found
        # each process's main thread (its event loop) is a part of that process's CPU
        assert c["main_thread_cpu_s"].keys() == c["cpu_s"].keys(), c
        assert all(0 <= c["main_thread_cpu_s"][k] <= c["cpu_s"][k] + 0.02 for k in c["cpu_s"]), c
        assert c["channels"] == 1, c  # one connection to a one-process server, as the TorchServe kit's client
    batched = [c for c in cells if c["phase"] == "batched"]
    assert {(c["server"], c["mode"]) for c in batched} == {
        (s, m) for s in ("aaren f0", "echo") for m in ("batch", "run")
    }
    for c in batched:
        assert c["errors"] == 0 and c["forecasts"] == c["events"] == 2 * 64 * 3, c
    core = result["core"]
    assert {c["kind"] for c in core} == {"b1", "b64", "b256", "run64"}
    assert all(c["errors"] == 0 and c["forecasts"] == c["events"] > 0 for c in core)
    text = (tmp_path / "layouts.md").read_text()
    assert "Issue 21's aims in this run" in text and "TorchServe not run" in text
    assert "server cores busy" in text
    for c in single:  # the cores a server kept busy: its CPU seconds over the cell's wall seconds, at most two here
        busy = layouts.server_cores(c)
        assert busy is not None and 0 < busy <= (os.cpu_count() or 1) + 0.1, c
