"""CPU instructions per event of the engine core alone (kinds ``b1``, ``b64``, ``b256``, ``run64``, ``q64``) or
of the whole in-process server (kinds ``s1``, ``s64``), counted by valgrind's callgrind: a figure that
does not move with the machine's load (wall-clock tables do; the two are reported side by side).

    python -m bench.instructions                          # kinds b1 and b64, 2 runs each
    python -m bench.instructions --kind b64 --rounds 40 --runs 2 --out bench/results/instructions.md
    python -m bench.instructions --kind s1,s64 --rounds 10  # the whole server, 1 and 64 streams

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

The server kinds ``sN`` count the whole in-process server (``aaren serve --frontends 0``: gRPC, the
aaren.v1 front end, the engine core, the memory store, every thread of the process, on the event loop
``aaren serve`` runs on: uvloop where it is installed, ``AAREN_EVENT_LOOP`` chooses; the JSON line's
``event_loop``; counts made before 2026-12-07 ran on asyncio's own loop) while a client in
another process (this one, not under valgrind) drives ``N`` streams, one session each, one event per
message, each stream waiting for its reply before its next write (``bench.stream_client``'s single
mode). The streams are opened and warmed up (``--warmup`` events each) uncounted; then the client
asks the server (a line on its stdin) to zero the counters and start counting, sends ``--rounds``
events per stream (``s1``: 8x as many) on the same open streams, and asks it to stop and dump once
the last reply is in: instructions per event = that dump's ``Ir`` / the events answered in the
window. Stream opening and closing, start-up and shutdown are not counted. The echo kinds ``eN``
count the project's no-op ``bench.echo_server`` (the same aaren.v1 protocol and forecast shape, no
model) the same way: the gRPC floor the server kinds sit on. Under valgrind the server
runs about 50 times slower than the client, so at ``s64`` every stream's next event is waiting
whenever the batcher takes a batch: batches of up to 64 single events, as under a saturating load.

The JSON line names the library that computed the kernel's layer products (``kernel_blas``). Under valgrind
both BLAS libraries see another CPU than natively and may fail ``blas.rows_exact``, which would leave ``auto``
with the kernel's loops: the counted process is told the library the server takes natively here
(``native_blas``), or the one ``AAREN_KERNEL_BLAS`` names.

Needs ``valgrind`` and its headers (Debian: ``valgrind``) and ``cc``. Valgrind runs the process about
50 times slower than natively while it counts: keep ``--rounds`` small (the figure is per event).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["build_helper", "count", "count_server", "main"]

ROOT = Path(__file__).resolve().parent.parent

_HELPER = r"""
#include <valgrind/callgrind.h>
void aaren_count_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void aaren_count_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("aaren-measured"); }
"""


def build_helper(folder: Path, code: str = _HELPER) -> Path:
    """The helper's shared library (C source ``code``, by default the start/stop pair above) in ``folder``."""
    source, library = folder / "count.c", folder / "libaarencount.so"
    source.write_text(code)
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


def _callgrind(folder: Path, python: str, *args: str) -> list[str]:
    """The command that runs ``python -m bench.instructions ARGS`` under callgrind, instrumentation off until
    the helper starts it, its dumps written into ``folder``."""
    return [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no", "--collect-jumps=no",
        f"--callgrind-out-file={folder}/callgrind.out.%p", python, "-m", "bench.instructions", *args,
    ]  # fmt: skip


#: where ``--keep`` copies each measured dump (for ``callgrind_annotate``); None: dumps are dropped
KEEP: Path | None = None


def _measured_ir(folder: Path, what: str) -> int:
    """The instructions of the one dump in ``folder`` that the helper wrote for the measured ``what`` (copied
    into ``KEEP`` where set)."""
    dumps = [p for p in folder.glob("callgrind.out.*") if "aaren-measured" in p.read_text(errors="replace")[:4000]]
    if len(dumps) != 1:
        raise SystemExit(f"expected one dump of the measured {what}, found {len(dumps)}")
    if KEEP is not None:
        KEEP.mkdir(parents=True, exist_ok=True)
        shutil.copy(dumps[0], KEEP / f"{dumps[0].name}.{time.time_ns()}")
    return _total_ir(dumps[0])


@functools.cache
def native_blas() -> str | None:
    """``AAREN_KERNEL_BLAS`` for a counted process: as set, or where it is ``auto`` (or unset) the library the
    server takes natively for the bundled model (``EventTask.kernel_blas``; ``0`` for the kernel's loops). Under
    valgrind the libraries see another CPU and may fail ``blas.rows_exact``, so ``auto`` there would count the
    kernel's loops, not what serves. None (the setting left as it is) where the tree's task does not say: an older
    tree, or no kernel serving."""
    choice = os.environ.get("AAREN_KERNEL_BLAS", "auto").strip().lower()
    if choice not in ("auto", "", "1", "on"):
        return choice
    from aaren.server.settings import ServerSettings, bundled_checkpoint
    from aaren.server.tasks.event.task import load_event_task, resolve_device

    engine = load_event_task(str(bundled_checkpoint()), resolve_device("cpu"), ServerSettings().quantiles)
    name = getattr(engine, "kernel_blas", None)
    return None if name is None else "0" if name == "loops" else name


def _with_blas(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``AAREN_KERNEL_BLAS`` set to ``native_blas()`` where that says one."""
    blas = native_blas()
    return env if blas is None else {**env, "AAREN_KERNEL_BLAS": blas}


def count(kind: str, rounds: int, warmup: int, python: str = sys.executable, cwd: Path = ROOT) -> dict[str, object]:
    """One counted run of ``kind`` (``bench.engine_core.KINDS``) in a process of its own: its events,
    the measured rounds' instructions and instructions per event."""
    if shutil.which("valgrind") is None:
        raise SystemExit("bench.instructions needs valgrind (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="aaren-instructions-") as tmp:
        folder = Path(tmp)
        library = build_helper(folder)
        command = _callgrind(
            folder, python, "--inside", kind, "--rounds", str(rounds), "--warmup", str(warmup), "--helper", str(library)
        )
        env = _with_blas({**os.environ, "PYTHONHASHSEED": "0"})
        done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            raise SystemExit(f"the counted run failed ({done.returncode}):\n{done.stderr[-4000:]}")
        result = json.loads(lines[-1])
        instructions = _measured_ir(folder, "rounds")
    events = int(result["events"])
    return {**result, "instructions": instructions, "instructions_per_event": round(instructions / max(events, 1))}


def _server_streams(kind: str) -> int | None:
    """The stream count of a server kind (``s1`` -> 1, ``s64`` -> 64; the echo's ``e1``, ``e64``), None
    for an engine-core kind."""
    match = re.fullmatch(r"[se](\d+)", kind)
    return int(match.group(1)) if match else None


def count_server(
    kind: str, rounds: int, warmup: int, python: str = sys.executable, cwd: Path = ROOT
) -> dict[str, object]:
    """One counted run of server kind ``kind`` (``sN``: N streams): the in-process server under
    callgrind, driven from this process; its events, instructions and instructions per event."""
    streams = _server_streams(kind)
    assert streams is not None, kind
    if shutil.which("valgrind") is None:
        raise SystemExit("bench.instructions needs valgrind (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="aaren-instructions-") as tmp:
        folder = Path(tmp)
        library = build_helper(folder)
        command = _callgrind(folder, python, "--serve-inside", kind[0], "--helper", str(library))
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        if kind.startswith("s"):  # the server's kernel (the echo has none)
            env = _with_blas(env)
        with (folder / "server.err").open("w") as err:
            server = subprocess.Popen(
                command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
            )
            try:
                result = asyncio.run(_drive(server, kind, streams, rounds, warmup))
            finally:
                if server.poll() is None:
                    assert server.stdin is not None
                    with contextlib.suppress(OSError):
                        server.stdin.write("quit\n")
                        server.stdin.flush()
                    try:
                        server.wait(120)
                    except subprocess.TimeoutExpired:
                        server.kill()
                        server.wait(30)
        if server.returncode:
            tail = (folder / "server.err").read_text(errors="replace")[-4000:]
            raise SystemExit(f"the counted server failed ({server.returncode}):\n{tail}")
        instructions = _measured_ir(folder, "window")
    events = int(result["events"])
    from aaren import event_loop
    from aaren.server.settings import ServerSettings

    loop = event_loop.resolve(ServerSettings().event_loop)  # the counted server's, from the same environment
    return {
        **result,
        "event_loop": loop,
        "instructions": instructions,
        "instructions_per_event": round(instructions / max(events, 1)),
    }


def _line(server: subprocess.Popen[str], prefix: str) -> str:
    """The server's next stdout line that starts with ``prefix`` (blocking; run in a thread)."""
    assert server.stdout is not None
    for line in server.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise RuntimeError(f"the counted server ended before saying {prefix!r}")


async def _say(server: subprocess.Popen[str], command: str, answer: str) -> str:
    assert server.stdin is not None
    server.stdin.write(command + "\n")
    server.stdin.flush()
    return await asyncio.to_thread(_line, server, answer)


async def _drive(server: subprocess.Popen[str], kind: str, streams: int, rounds: int, warmup: int) -> dict[str, object]:
    """The client: ``streams`` open streams warmed up, then ``rounds`` events each inside the window."""
    import grpc

    from aaren.v1 import aaren_pb2 as pb
    from aaren.v1 import aaren_pb2_grpc as pb_grpc
    from bench.stream_client import CHANNEL_OPTIONS, make_events, session_events

    port = int((await asyncio.to_thread(_line, server, "server: listening on port")).split()[4].rstrip(","))
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) for _ in range(8)]
    try:
        stubs = [pb_grpc.ForecastServiceStub(ch) for ch in channels]
        # The echo has no DescribeModel: its events have the bundled model's shape (16 marks, 2 values).
        model = (
            await stubs[0].DescribeModel(pb.DescribeModelRequest(), timeout=600)
            if kind.startswith("s")
            else pb.DescribeModelResponse(mark_names=[""] * 16, value_names=["", ""])
        )
        n = warmup + rounds
        warmed, window = asyncio.Event(), asyncio.Event()
        ready: list[int] = []
        answered: list[int] = []
        problems: list[str] = []

        async def one(index: int) -> None:
            times, marks, values = session_events(index, n, len(model.mark_names) or 16, len(model.value_names))
            events = make_events(f"count-{index}", 1, times, marks, values)
            call = stubs[index % len(stubs)].Stream()
            for k, event in enumerate(events):
                if k == warmup:
                    ready.append(index)
                    if len(ready) == streams:
                        warmed.set()
                    await window.wait()
                await call.write(pb.StreamRequest(events=[event]))
                reply = await call.read()
                if reply is grpc.aio.EOF or len(reply.results) != 1 or not reply.results[0].HasField("forecast"):
                    problems.append(str(reply)[:300])
                elif k >= warmup:
                    answered.append(index)
            await call.done_writing()
            await call.code()

        tasks = [asyncio.create_task(one(i)) for i in range(streams)]
        await warmed.wait()
        await _say(server, "start", "counting")
        started = time.perf_counter()
        window.set()
        # The window ends when the last stream's last reply is read (before the calls are closed).
        while len(answered) + len(problems) < streams * rounds and not all(t.done() for t in tasks):
            await asyncio.sleep(0.005)
        wall = time.perf_counter() - started
        await _say(server, "stop", "stopped")
        await asyncio.gather(*tasks)
    finally:
        for ch in channels:
            await ch.close()
    if problems:
        raise SystemExit(f"{len(problems)} replies were not one forecast, e.g. {problems[0]}")
    events = len(answered)
    return dict(
        kind=kind, streams=streams, rounds=rounds, events=events, forecasts=events, errors=len(problems),
        wall_s=round(wall, 4), us_per_event=round(wall / max(events, 1) * 1e6, 2),
    )  # fmt: skip


def _serve_inside(which: str, helper: str) -> None:
    """The counted server process: ``aaren serve --frontends 0`` in this process (bundled model, CPU,
    memory store, metrics off; ``which`` "s") or the no-op ``bench.echo_server`` with that model's
    forecast shape ("e"); stdin's ``start`` / ``stop`` start and stop the count, ``quit`` ends it."""
    import gc
    import threading

    import grpc

    from aaren import event_loop
    from aaren.server.app import AarenServer
    from aaren.server.settings import ServerSettings

    library = ctypes.CDLL(helper)
    settings = ServerSettings(
        address="127.0.0.1:0", metrics_port=-1, device="cpu", frontends=0, store_check_interval_s=3600
    )

    async def serve() -> None:
        if which == "e":
            from aaren.v1 import aaren_pb2_grpc as pb_grpc
            from bench.echo_server import EchoServicer, dummy_forecast, server_options

            echo = grpc.aio.server(options=server_options())
            template = dummy_forecast(n_quantiles=len(settings.quantiles), n_marks=3, n_values=2)
            pb_grpc.add_ForecastServiceServicer_to_server(EchoServicer(template), echo)
            port = echo.add_insecure_port("127.0.0.1:0")
            await echo.start()
            stop = echo.stop
        else:
            server = AarenServer(settings)
            await server.start()
            port, stop = server.grpc_port, server.stop
        print(f"server: listening on port {port}", flush=True)
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def control() -> None:
            for line in sys.stdin:
                if line.strip() == "start":
                    gc.collect()
                    library.aaren_count_start()
                    print("counting", flush=True)
                elif line.strip() == "stop":
                    library.aaren_count_stop()
                    print("stopped", flush=True)
                elif line.strip() == "quit":
                    break
            loop.call_soon_threadsafe(done.set)

        threading.Thread(target=control, daemon=True).start()
        await done.wait()
        await stop(1.0)

    event_loop.run(serve(), settings.event_loop)  # the loop aaren serve runs on (uvloop where it is installed)


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


#: Engine-core kinds of this tool's own, added to ``bench.engine_core.KINDS`` in the counted process:
#: ``q64`` is 64 requests of one event each (64 sessions) in flight, what a server's 64 streams of one
#: event per message hand the core (``b64`` is one request of 64 events: its per-request work is
#: shared by 64 events, ``q64``'s is not).
EXTRA_KINDS = {"q64": (1, 1, 64)}


def _inside(kind: str, rounds: int, warmup: int, helper: str) -> None:
    """The counted process: ``bench.engine_core.measure``, its measured rounds counted."""
    import bench.engine_core as engine_core

    engine_core.KINDS.update({k: v for k, v in EXTRA_KINDS.items() if k not in engine_core.KINDS})
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
    p.add_argument(
        "--kind",
        default="b1,b64",
        help="comma list: bench.engine_core kinds (b1, b64, b256, run64; q64), server kinds sN, echo kinds eN",
    )
    p.add_argument("--rounds", type=int, default=20, help="counted rounds (sN: events per stream) per run (b1, s1: 8x)")
    p.add_argument("--warmup", type=int, default=3, help="uncounted rounds (sN: events per stream) first")
    p.add_argument("--runs", type=int, default=2, help="runs per kind (the count's spread)")
    p.add_argument("--label", default="this tree", help="what the table's rows are of (e.g. a commit)")
    p.add_argument("--out", type=Path, default=None, help="also append the Markdown table to this file")
    p.add_argument("--keep", type=Path, default=None, help="copy each measured dump here (for callgrind_annotate)")
    p.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    p.add_argument("--helper", default=None, help=argparse.SUPPRESS)
    p.add_argument("--serve-inside", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve_inside:
        _serve_inside(a.serve_inside, a.helper)
        return 0
    if a.inside:
        _inside(a.inside, a.rounds, a.warmup, a.helper)
        return 0
    global KEEP
    KEEP = a.keep
    rows = []
    for kind in a.kind.split(","):
        rounds = a.rounds * 8 if kind in ("b1", "s1", "e1") else a.rounds
        for _ in range(a.runs):
            server = _server_streams(kind) is not None
            row = count_server(kind, rounds, a.warmup) if server else count(kind, rounds, a.warmup)
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
