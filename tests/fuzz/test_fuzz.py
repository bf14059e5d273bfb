"""Run the coverage-guided fuzz targets briefly: thousands of mutated inputs, no crash allowed.

A longer campaign is the same command with ``-max_total_time=SECONDS`` (tests/fuzz/fuzz_targets.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris is a Linux-only dev dependency (pyproject)")

TARGETS = Path(__file__).with_name("fuzz_targets.py")


@pytest.mark.parametrize(("target", "runs"), [("requests", 20_000), ("state", 5_000)])
def test_fuzz_target_survives_mutated_inputs(target, runs, tmp_path):
    done = subprocess.run(
        [sys.executable, str(TARGETS), target, str(tmp_path / "corpus"), f"-runs={runs}", "-seed=1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"#{runs}\tDONE" in done.stderr, done.stderr[-2000:]
    assert any((tmp_path / "corpus").iterdir()), "the corpus was seeded"
