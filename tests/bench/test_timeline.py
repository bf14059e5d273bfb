"""``python -m bench.timeline`` runs end to end on the tiny model: every event of the counted run passes
every point of the chain in order (each segment from one point to the next, and from the reply to the
next request, counted once an event but the first), and every reply's send is counted. Only that is
asserted, never a time."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

from bench.timeline import CHAIN

ROOT = Path(__file__).resolve().parents[2]


def test_timeline_counts_each_segment_of_every_round_trip(tmp_path, tiny_checkpoint):
    events = 30
    cmd = [sys.executable, "-m", "bench.timeline", "--events", str(events), "--warmup", "10",
           "--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "timeline.json").read_text())
    assert result["client"]["events"] == result["client"]["forecasts"] == events
    pairs = {(s["from"], s["to"]): s for s in result["segments"]}
    assert set(pairs) == {*itertools.pairwise(CHAIN), (CHAIN[-1], CHAIN[0])}
    assert all(s["n"] == events - 1 and s["mean_us"] >= 0 for s in pairs.values()), pairs
    assert result["send"]["n"] == events and result["warm_probe_us"] > 0
    assert "| finish -> wake |" in (tmp_path / "timeline.md").read_text()
