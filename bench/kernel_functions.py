"""The event kernel's CPU instructions a row, by compiled function: where a batch's model work goes.

    python -m bench.kernel_functions                 # the bundled model, 256 rows a call
    python -m bench.kernel_functions --rows 1,64,256 --top 20

callgrind (``bench.instructions``' helper and rules: a process of its own under valgrind, counting only
between two client requests) counts ``--calls`` calls of ``EventKernel.step_forecast`` on ``--rows`` rows
(``bench.kernel.session_inputs``: flights-like events of sessions that have seen a few), then as many of
``EventKernel.forecast`` from the features alone. callgrind names numba's machine code by address only
(``???:0x...``): the counted process maps those addresses to the compiled functions' names, read from the
object code numba keeps in its cache files (listed with ``nm``) and looked up in the process's JIT engine
(numba internals: ``cres.library._codegen._engine``). A function LLVM inlined is counted in its caller.
Under valgrind numba and OpenBLAS see no AVX-512 (valgrind does not emulate it): these are counts of their
AVX2 code, as ``bench.instructions``' are.

Needs valgrind (with its headers), ``cc`` and ``nm`` (binutils).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.instructions import ROOT, build_helper

__all__ = ["bundled_kernel", "main", "per_function"]

_HELPER = r"""
#include <valgrind/callgrind.h>
void aaren_count_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void aaren_count_stop(const char *what) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT(what); }
"""
REGIONS = ("step_forecast", "forecast")
_CACHE_FILES = ("aaren_core/tasks/event/__pycache__/*.nbc",)


def _object_symbols(pattern: str) -> dict[str, int]:
    """The function symbols defined in the ELF objects inside numba's cache files matching ``pattern``, with
    their sizes in bytes (0 where the object gives none)."""
    names: dict[str, int] = {}
    for path in glob.glob(pattern):
        data = Path(path).read_bytes()
        at = data.find(b"\x7fELF")
        while at >= 0:
            with tempfile.NamedTemporaryFile(suffix=".o", delete=False) as f:
                f.write(data[at:])
            listed = subprocess.run(["nm", "-S", "--defined-only", f.name], capture_output=True, text=True).stdout
            os.unlink(f.name)
            for p in (line.split() for line in listed.splitlines()):
                if len(p) == 4 and p[2] in "Tt":
                    names[p[3]] = int(p[1], 16)
                elif len(p) == 3 and p[1] in "Tt":  # a symbol without a size (nm -S leaves the column out)
                    names[p[2]] = 0
            at = data.find(b"\x7fELF", at + 4)
    return names


def _short(symbol: str) -> str:
    """A numba symbol's function name (``_ZN...6kernel12_gap_rowB3v..`` -> ``_gap_row``; wrappers marked)."""
    m = re.match(r"(cfunc\.)?_ZN(7cpython)?(.*)", symbol)
    if not m:
        return symbol
    rest, parts = m.group(3), []
    while rest[:1].isdigit():
        digits = re.match(r"\d+", rest).group(0)  # type: ignore[union-attr]
        n = int(digits)
        parts.append(rest[len(digits) : len(digits) + n])
        rest = rest[len(digits) + n :]
    name = parts[-1] if parts else symbol
    return ("python wrapper of " if m.group(2) else "cfunc of " if m.group(1) else "") + name


def bundled_kernel(rows: int) -> tuple[Any, list[Any], int]:
    """The bundled model's ``EventKernel`` (torch on one thread), the arrays of ``rows`` sessions' next events
    (``bench.kernel.session_inputs``) and the ``top_k`` the server's batches ask: a counted or sampled process's
    workload."""
    import torch

    from aaren_core.checkpoint import load_checkpoint
    from aaren_core.tasks.event.fused import FusedEventModel
    from aaren_core.tasks.event.kernel import EventKernel
    from bench.kernel import CHECKPOINT, QUANTILES, session_inputs

    torch.set_num_threads(1)
    model = load_checkpoint(str(ROOT / CHECKPOINT)).model.eval()
    fused = FusedEventModel.from_model(model)
    kernel = EventKernel.from_fused(fused, QUANTILES)
    (dt, marks, values), state = session_inputs(model, fused, rows)
    arrays = [t.numpy() for t in (dt, marks, values, *state)]
    arrays[0] = arrays[0].astype("float64")  # as a batch's RunColumns pass gaps
    return kernel, arrays, fused.num_marks  # every mark ranked, as the server's batches do


def _inside(rows: int, calls: int, helper: str, symbols: str) -> None:
    """The counted process: both regions counted, then the address -> function map written to ``symbols``."""
    from aaren_core.tasks.event import kernel as kernel_module

    kernel, arrays, top_k = bundled_kernel(rows)
    features = kernel.step_forecast(*arrays, top_k).y
    work = {
        "step_forecast": lambda: kernel.step_forecast(*arrays, top_k),
        "forecast": lambda: kernel.forecast(features, top_k),
    }
    library = ctypes.CDLL(helper)
    for name in REGIONS:
        work[name]()  # compiled and warm before the count
        library.aaren_count_start()
        for _ in range(calls):
            work[name]()
        library.aaren_count_stop(name.encode())
    names = {name for p in _CACHE_FILES for name in _object_symbols(str(ROOT / p))}
    found: dict[str, str] = {}
    for dispatcher in (kernel_module._step_forecast_packed, kernel_module._forecast_packed):
        for compiled in dispatcher.overloads.values():
            engine = compiled.library._codegen._engine
            for symbol in names:
                address = engine.get_function_address(symbol)
                if address:
                    found[f"0x{address:016x}"] = _short(symbol)
    Path(symbols).write_text(json.dumps(found))


def per_function(dump: Path, symbols: dict[str, str], rows: int) -> dict[str, float]:
    """Instructions a row by function in one callgrind dump (numba's by name, others by callgrind's)."""
    listed = subprocess.run(["callgrind_annotate", "--threshold=100", str(dump)], capture_output=True, text=True)
    out: dict[str, float] = {}
    for line in listed.stdout.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S+)", line)
        if not m or m.group(2) == "PROGRAM":
            continue
        where = m.group(2)
        address = re.match(r"\?\?\?:(0x[0-9a-f]+)", where)
        name = symbols.get(address.group(1), where) if address else where.split(":")[-1]
        out[name] = out.get(name, 0.0) + int(m.group(1).replace(",", "")) / rows
    return out


def count(rows: int, calls: int) -> dict[str, dict[str, float]]:
    """``{region: {function: instructions a row}}`` (with ``total``) for ``rows`` rows a call."""
    with tempfile.TemporaryDirectory(prefix="aaren-kernel-functions-") as tmp:
        folder = Path(tmp)
        library = build_helper(folder, _HELPER)
        symbols = folder / "symbols.json"
        command = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no", "--collect-jumps=no",
            f"--callgrind-out-file={folder}/callgrind.out.%p", sys.executable, "-m", "bench.kernel_functions",
            "--inside", str(rows), "--calls", str(calls), "--helper", str(library), "--symbols", str(symbols),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            raise SystemExit(f"the counted run failed ({done.returncode}):\n{done.stderr[-4000:]}")
        found = json.loads(symbols.read_text())
        result = {}
        for dump in folder.glob("callgrind.out.*"):
            text = dump.read_text(errors="replace")
            region = re.search(r"^desc: Trigger: Client Request: (\S+)", text, flags=re.MULTILINE)
            if region and region.group(1) in REGIONS:
                total = int(re.findall(r"^totals:\s+(\d+)", text, flags=re.MULTILINE)[-1])
                result[region.group(1)] = {"total": total / (rows * calls), **per_function(dump, found, rows * calls)}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="256", help="comma list of rows a call")
    p.add_argument("--calls", type=int, default=4, help="counted calls a region")
    p.add_argument("--top", type=int, default=16, help="functions shown")
    p.add_argument("--inside", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--helper", default=None, help=argparse.SUPPRESS)
    p.add_argument("--symbols", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.inside is not None:
        _inside(a.inside, a.calls, a.helper, a.symbols)
        return 0
    for rows in (int(r) for r in a.rows.split(",")):
        result = count(rows, a.calls)
        full, forecast = result["step_forecast"], result["forecast"]
        print(f"\n{rows} rows a call: instructions a row (step + forecast {full['total']:,.0f}, forecast alone "
              f"{forecast['total']:,.0f})\n")  # fmt: skip
        print("| function | step + forecast | forecast alone |\n|---|---:|---:|")
        names = sorted((k for k in full if k != "total"), key=lambda k: -full[k])[: a.top]
        for name in names:
            print(f"| {name} | {full[name]:,.0f} | {forecast.get(name, 0.0):,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
