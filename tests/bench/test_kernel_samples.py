"""``python -m bench.kernel_samples`` samples the kernel with ``perf`` and names numba's compiled functions through
the perf map its process writes. Only the names and the shares' arithmetic are asserted, never a time or a share's
size."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _perf_can_sample() -> bool:
    if shutil.which("perf") is None or shutil.which("nm") is None:
        return False
    done = subprocess.run(["perf", "record", "-e", "cpu-clock", "-o", "/dev/null", "--", "true"], capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not _perf_can_sample(), reason="perf cannot sample here (not installed, or perf_event_paranoid)")
def test_kernel_samples_name_the_compiled_functions(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench.kernel_samples", "--rows", "16", "--seconds", "1", "--top", "40"]
    proc = subprocess.run([*cmd, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [line.split("|") for line in (tmp_path / "kernel_samples.md").read_text().splitlines() if "%" in line]
    shares = {cells[1].strip(): float(cells[2].strip().rstrip("%")) / 100 for cells in rows}
    # the kernel's own functions are named (the perf map resolved numba's machine code), not left as addresses
    assert {"_step_forecast_rows", "phi_many"} & shares.keys(), shares
    assert 0 < sum(shares.values()) <= 1.0 + 1e-6
