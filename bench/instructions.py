"""CPU instructions per event of the engine core alone, counted by valgrind's callgrind: a figure that
does not move with the machine's load (wall-clock tables do; the two are reported side by side).

    python -m bench.instructions                          # kinds b1 and b64, 2 runs each
    python -m bench.instructions --kind b64 --rounds 40 --runs 2 --out bench/results/instructions.md

Each run is a process of its own under ``valgrind --tool=callgrind --instr-atstart=no``: it assembles
the engine core as ``bench.engine_core`` does (bundled model on the CPU, memory store, default
settings), builds every request before measuring, runs the warm-up rounds uninstrumented, then counts
the measured rounds only: a three-line C helper (compiled here with the system's C compiler against
valgrind's ``callgrind.h``, called through ctypes) zeroes callgrind's counters and starts the
instrumentation where ``bench.engine_core.measure`` starts its clock, and stops it and dumps the count
where it reads its clock again (``_CountedClock``: the same rule in every version of ``measure``, so
an older tree's own ``bench/engine_core.py`` is counted alike: run this file from that tree).
Instructions per event = the dump's total ``Ir`` / the events answered. The same tree and input
count the same within a fraction of a percent (each kind is run ``--runs`` times to show it); what
runs before and after (imports, model load, compiling) is not counted.

Needs ``valgrind`` and its headers (Debian: ``valgrind``) and ``cc``. Valgrind runs the process about
50 times slower than natively while it counts: keep ``--rounds`` small (the figure is per event).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["count", "main"]

ROOT = Path(__file__).resolve().parent.parent

_HELPER = r"""
#include <valgrind/callgrind.h>
void aaren_count_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void aaren_count_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("aaren-measured"); }
"""


def _build_helper(folder: Path) -> Path:
    """The helper's shared library in ``folder``."""
    source, library = folder / "count.c", folder / "libaarencount.so"
    source.write_text(_HELPER)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("bench.instructions needs a C compiler (cc) to build its callgrind helper")
    done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], capture_output=True)
    if done.returncode:
        raise SystemExit(f"building the callgrind helper failed (valgrind's headers?):\n{done.stderr.decode()}")
    return library


def _total_ir(dump: Path) -> int:
    """The instruction count of one callgrind dump: its ``totals:`` line (the dump's ``summary:`` line
    reads 0 for a dump that a client request triggers with instrumentation started late)."""
    totals = re.findall(r"^totals:\s+(\d+)", dump.read_text(), flags=re.MULTILINE)
    if not totals:
        raise ValueError(f"{dump} holds no totals line")
    return int(totals[-1])


def count(kind: str, rounds: int, warmup: int, python: str = sys.executable, cwd: Path = ROOT) -> dict[str, object]:
    """One counted run of ``kind`` (``bench.engine_core.KINDS``) in a process of its own: its events,
    the measured rounds' instructions and instructions per event."""
    if shutil.which("valgrind") is None:
        raise SystemExit("bench.instructions needs valgrind (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="aaren-instructions-") as tmp:
        folder = Path(tmp)
        library = _build_helper(folder)
        command = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no", "--collect-jumps=no",
            f"--callgrind-out-file={folder}/callgrind.out.%p",
            python, "-m", "bench.instructions", "--inside", kind, "--rounds", str(rounds), "--warmup", str(warmup),
            "--helper", str(library),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            raise SystemExit(f"the counted run failed ({done.returncode}):\n{done.stderr[-4000:]}")
        result = json.loads(lines[-1])
        dumps = [p for p in folder.glob("callgrind.out.*") if "aaren-measured" in p.read_text(errors="replace")[:4000]]
        if len(dumps) != 1:
            raise SystemExit(f"expected one dump of the measured rounds, found {len(dumps)}")
        instructions = _total_ir(dumps[0])
    events = int(result["events"])
    return {**result, "instructions": instructions, "instructions_per_event": round(instructions / max(events, 1))}


class _CountedClock:
    """Stands in for the ``time`` module inside ``bench.engine_core``: its ``measure`` reads
    ``time.perf_counter()`` exactly twice, as the measured rounds start and as they end, in every
    version of it (so older trees are counted by the same rule); the first read starts the count,
    the second stops it and dumps it."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._library = library
        self._reads = 0

    def perf_counter(self) -> float:
        self._reads += 1
        if self._reads == 2:
            self._library.aaren_count_stop()
        value = time.perf_counter()
        if self._reads == 1:
            self._library.aaren_count_start()
        return value

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def _inside(kind: str, rounds: int, warmup: int, helper: str) -> None:
    """The counted process: ``bench.engine_core.measure``, its measured rounds counted."""
    import bench.engine_core as engine_core

    engine_core.time = _CountedClock(ctypes.CDLL(helper))  # type: ignore[assignment]
    print(json.dumps(asyncio.run(engine_core.measure(kind, rounds, warmup))), flush=True)


def _table(rows: list[dict[str, object]], label: str) -> str:
    lines = [
        f"| kind ({label}) | events | instructions | instructions per event | wall µs per event (under valgrind) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['events']} | {int(r['instructions']):,} | {int(r['instructions_per_event']):,} "
            f"| {r['us_per_event']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", default="b1,b64", help="comma list of bench.engine_core kinds (b1, b64, b256, run64)")
    p.add_argument("--rounds", type=int, default=20, help="counted rounds per run (b1: 8x as many)")
    p.add_argument("--warmup", type=int, default=3, help="uncounted rounds first")
    p.add_argument("--runs", type=int, default=2, help="runs per kind (the count's spread)")
    p.add_argument("--label", default="this tree", help="what the table's rows are of (e.g. a commit)")
    p.add_argument("--out", type=Path, default=None, help="also append the Markdown table to this file")
    p.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    p.add_argument("--helper", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.inside:
        _inside(a.inside, a.rounds, a.warmup, a.helper)
        return 0
    rows = []
    for kind in a.kind.split(","):
        rounds = a.rounds * 8 if kind == "b1" else a.rounds
        for _ in range(a.runs):
            row = count(kind, rounds, a.warmup)
            print(json.dumps(row), flush=True)
            rows.append(row)
    table = _table(rows, a.label)
    print(table)
    if a.out is not None:
        with a.out.open("a") as out:
            out.write(table + "\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
