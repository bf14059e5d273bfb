"""``python -m bench.gpu_check`` runs on the CPU with small sizes, so that it never rots.

Only its checks are asserted (equality within tolerance, every event forecast end to end); its
timings are printed by the benchmark and never asserted here.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_cpu(tmp_path):
    # One multi-process layout (two front ends) keeps the run short; the benchmark's own default
    # on the CPU is one and two front ends.
    cmd = [sys.executable, "-m", "bench.gpu_check", "--small", "--device", "cpu", "--frontends", "2",
           "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["ok"] and result["small"]
    checks = result["equality"]
    phases = {c["phase"] for c in checks}
    assert len(phases) == 3  # fresh-state scan, one step, stored-state scan
    assert all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    assert {c["pair"] for c in checks} >= {"device vs float64", "CPU float32 vs float64"}
    assert {r["kind"] for r in result["throughput"]} == {"step", "step + forecast", "64-event scan + forecast"}
    e2e = result["e2e"]
    assert [(r["frontends"], r["clients"]) for r in e2e] == [(2, 2), (2, 2)]
    assert all(r["errors"] == 0 and r["forecasts"] == r["events"] > 0 for r in e2e)
    assert "(a) equality" in (tmp_path / "gpu_check.md").read_text()
