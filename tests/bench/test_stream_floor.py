"""``python -m bench.stream_floor`` runs end to end in quick mode: the bare gRPC handler, the project's
StreamLoop with its next-turn codec, the echo and ``aaren serve`` each answer every event with one
forecast. Only that is asserted, never a time or a rate."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_stream_floor_quick(tmp_path):
    cmd = [sys.executable, "-m", "bench.stream_floor", "--quick", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    cells = json.loads((tmp_path / "stream_floor.json").read_text())
    assert {(c["server"], c["sessions"]) for c in cells} == {
        (s, n) for s in ("bare", "loop", "echo", "aaren f0") for n in (1, 4)
    }
    for c in cells:
        assert c["errors"] == 0 and c["forecasts"] == c["events"] == c["sessions"] * 30, c
        assert c["cpu_ms"] is not None, c
    text = (tmp_path / "stream_floor.md").read_text()
    assert "| 4 | aaren f0 |" in text and "| loop |" in text
