"""The event kernel's wall time by compiled function, sampled: where a batch's model time goes, atomics included.

    python -m bench.kernel_samples                    # the bundled model, 256 rows a call, 8 s
    python -m bench.kernel_samples --rows 64 --seconds 4 --top 20 --out bench/out

``bench.kernel_functions`` counts instructions; an atomic add (numba's reference counts, ``NRT_incref`` /
``NRT_decref``) counts as one there however long it takes, and a cache miss as nothing. This samples time instead:
a process of its own calls ``EventKernel.step_forecast`` on ``--rows`` rows (``bench.kernel.session_inputs``) in a
loop while ``perf record -e cpu-clock`` (a timer, not a hardware counter: it works in VMs where ``perf stat``
does not) samples it. perf names numba's machine code through a perf map (``/tmp/perf-PID.map``) that the process
writes: the address its JIT engine gives each function of numba's cache files (``nm -S``: their sizes), as
``bench.kernel_functions`` looks them up, and numba's own ``NRT_incref`` / ``NRT_decref``. The table gives each
function's share of the samples (``perf report --sort symbol``; a function LLVM inlined is counted in its caller).

Needs Linux ``perf`` allowed to sample the process (root, or ``kernel.perf_event_paranoid`` <= 1) and ``nm``.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.instructions import ROOT
from bench.kernel_functions import _object_symbols, _short, bundled_kernel

__all__ = ["main", "sample"]

#: where numba keeps the kernel's compiled code: beside its modules, or under ``NUMBA_CACHE_DIR``
_CACHE_GLOBS = ("aaren_core/tasks/event/__pycache__/*.nbc",)
_READY = "ready"


def _cache_files() -> list[str]:
    found = [p for pattern in _CACHE_GLOBS for p in glob.glob(str(ROOT / pattern))]
    if os.environ.get("NUMBA_CACHE_DIR"):
        found += glob.glob(os.path.join(os.environ["NUMBA_CACHE_DIR"], "**", "*.nbc"), recursive=True)
    return found


def _perf_map(symbols: dict[str, int], dispatchers: list[object]) -> list[str]:
    """perf map lines (``START SIZE name``, hex) of the compiled functions ``dispatchers`` loaded, and numba's
    reference count functions."""
    lines = set()
    for dispatcher in dispatchers:
        for compiled in dispatcher.overloads.values():  # type: ignore[attr-defined]
            engine = compiled.library._codegen._engine  # numba internals, as bench.kernel_functions
            for symbol, size in symbols.items():
                address = engine.get_function_address(symbol)
                if address and size:
                    lines.add(f"{address:x} {size:x} {_short(symbol)}")
            for name in ("NRT_incref", "NRT_decref"):
                address = engine.get_function_address(name)
                if address:
                    lines.add(f"{address:x} 10 {name}")
    return sorted(lines)


def _inside(rows: int, seconds: float) -> None:
    """The sampled process: the kernel warmed up, the perf map written, ``ready`` printed, then the loop."""
    import gc

    from aaren_core.tasks.event import kernel as kernel_module

    kernel, arrays, top_k = bundled_kernel(rows)
    kernel.step_forecast(*arrays, top_k)  # compiled (or loaded) before the map is read
    symbols = {name: size for path in _cache_files() for name, size in _object_symbols(path).items()}
    lines = _perf_map(symbols, [kernel_module._step_forecast_packed])
    Path(f"/tmp/perf-{os.getpid()}.map").write_text("\n".join(lines) + "\n")
    gc.collect()
    gc.freeze()  # as the server does: no collection of the startup's objects inside the loop
    print(_READY, len(lines), flush=True)
    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        kernel.step_forecast(*arrays, top_k)
        calls += 1
    print("calls", calls, flush=True)


def sample(rows: int, seconds: float, frequency: int = 4000) -> dict[str, float]:
    """``{function: share of the samples}`` of the kernel's loop at ``rows`` rows a call (the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="aaren-kernel-samples-") as tmp:
        data = Path(tmp) / "perf.data"
        inside = [sys.executable, "-m", "bench.kernel_samples", "--inside", str(rows), "--seconds", str(seconds + 2)]
        child = subprocess.Popen(inside, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            if not line.startswith(_READY):
                raise SystemExit(f"the sampled process did not start: {line}{child.stderr.read()[-4000:]}")
            time.sleep(0.5)  # into the loop
            record = ["perf", "record", "-e", "cpu-clock", "-F", str(frequency), "-p", str(child.pid), "-o", str(data)]
            done = subprocess.run([*record, "--", "sleep", str(seconds)], capture_output=True, text=True)
            if done.returncode or not data.exists():
                raise SystemExit(f"perf record failed ({done.returncode}): {done.stderr[-2000:]}")
            child.wait(timeout=seconds + 60)
            report = ["perf", "report", "-i", str(data), "--stdio", "--sort", "symbol", "-g", "none"]
            listed = subprocess.run(report, capture_output=True, text=True).stdout  # the map read here
        finally:
            if child.poll() is None:
                child.kill()
            Path(f"/tmp/perf-{child.pid}.map").unlink(missing_ok=True)
    shares: dict[str, float] = {}
    for line in listed.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[[.k]\]\s+(.+?)(\s+-)*\s*$", line)
        if m:
            shares[m.group(2)] = shares.get(m.group(2), 0.0) + float(m.group(1)) / 100
    return shares


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=256, help="rows a call")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds sampled")
    p.add_argument("--top", type=int, default=16, help="functions shown")
    p.add_argument("--out", type=Path, default=None, help="also write kernel_samples.md here")
    p.add_argument("--inside", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.inside is not None:
        _inside(a.inside, a.seconds)
        return 0
    shares = sample(a.rows, a.seconds)
    lines = [
        f"`EventKernel.step_forecast` at {a.rows} rows a call, {a.seconds:g} s sampled (`perf record -e cpu-clock`)",
        "",
        "| function | share of the samples |",
        "|---|---:|",
        *(f"| {name} | {share:.1%} |" for name, share in sorted(shares.items(), key=lambda kv: -kv[1])[: a.top]),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "kernel_samples.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
