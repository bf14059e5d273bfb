"""aaren's process layouts beside TorchServe 0.12 stateful and the echo, side by side in one run.

    python -m bench.layouts                      # full run (about 10-20 minutes on 2 shared cores)
    python -m bench.layouts --quick              # smoke run: one rep, short cells
    python -m bench.layouts --quick --no-torchserve --layouts 0 --levels 1,4 --events 30

Servers, all started first and checked once with a tiny load (TorchServe with the kit's
``--verify``): ``aaren serve --frontends N`` for each ``--layouts`` N (default 0, 1, 2; bundled
model, eager, in-memory store, CPU), TorchServe 0.12 stateful from the project's kit in
``bench/peers/torchserve`` (``setup.sh`` when its work folder has no stubs yet, ``start.sh``,
``stop.sh``; its ``client.py`` drives it), and the project's no-op echo (``bench.echo_server``).

The kit's "Measuring side by side" protocol (its README): warm-up (TorchServe 64 sessions x 200 events, the
others 64 x 100), then per rep and per level (1, 16, 64 sessions) every server once, a fresh client
process per cell, 400 events per session, the order rotated by one per rep, 3 reps, at least 4 s
before each TorchServe cell. Every session is its own stream, one event per message, waiting for
each reply; aaren and the echo are driven by ``bench.stream_client``, which keeps the kit client's
accounting (latency write -> read leaving out the first 10 events per session; ``wall`` = all
events / wall time; ``all-active`` = events completed while every session was still running).
A client talks to a one-process server (``--frontends 0``, the echo) over one connection, as the
kit's client talks to TorchServe; against front-end processes it spreads its streams over up to 8
connections, so that every front end of ``--frontends N`` gets load (SO_REUSEPORT balances
connections, not streams). Eight connections to one process cost both ends CPU an event for nothing:
at 64 sessions they served the echo 0.85-0.93 and ``--frontends 0`` 0.88-0.97 of one connection's
events/s (``bench/results/round_connections.md``).

Server CPU per event, by process, from ``/proc/PID/stat`` (user + sys) before and after each cell:
aaren's core (the ``aaren serve`` pid) and each front end (its children), TorchServe's
``java.pid`` and ``worker.pid``, the echo's one process; of a Python server's, the part its main thread took
(``/proc/PID/task/PID/stat``: the event loop's thread; gRPC's own threads cost the echo and aaren alike, so a
difference between them shows there, ``bench/results/round_reader_room.md``). Beside it, the CPU of the cell's
load client (its process's, from ``getrusage(RUSAGE_CHILDREN)``): each server's own client (ours for aaren and the
echo, the kit's for TorchServe) shares the same two cores, so a heavier client leaves its server less. And the
cores each server kept busy (its CPU seconds over the cell's wall seconds): at 64 sessions aaren and the echo keep
about one core busy each and their clients the other, so their events/s follow the machine's speed, which moves by
half within an hour here; TorchServe keeps about two thirds of one, waiting on its own batching, and moves less. The
aims' table shows the echo's events/s over TorchServe's beside aaren's: what the transport alone reaches in the
same reps.

Then batched messages (columns layout): 64 sessions x 1 event per message, and a 64-event history
of one session per message, ``--batched-streams`` streams, for each aaren layout and the echo,
rotated per rep; and the engine core alone (``bench.engine_core``: ``EngineCore.submit`` fed with
ready-made requests, no gRPC), its events/s ceiling.

Prints the tables and which of issue 21's aims this run meets; writes them to ``OUT/layouts.md``
and every cell's numbers to ``OUT/layouts.json`` (default ``OUT`` = ``bench/out``). Only ratios
within one run mean much on these shared machines.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.harness import ROOT, Server, cpu_seconds, describe, main_thread_cpu_seconds, start_aaren, start_echo

__all__ = ["main"]

TS = "TorchServe"
ECHO = "echo"
#: issue 21's aims: events/s ÷ TorchServe by sessions, server CPU per event ÷ the echo's at 64 sessions,
#: one session's p50 ÷ the echo's, batched messages (64 sessions x 1 event) ÷ the echo, the engine core alone
AIM_TS_RATIO = {64: 1.5, 16: 2.0, 1: 4.0}
AIM_CPU_ECHO = 1.5
AIM_P50_ECHO = 3.0
AIM_BATCHED_ECHO = 0.3
AIM_CORE_B256 = 200_000
#: Connections each aaren client spreads its streams over where the server has front-end processes (at most
#: one per stream); one where it is one process (``Target.connections``).
CHANNELS = 8
BATCHED_KINDS = (("batch", "64 sessions x 1 event/msg"), ("run", "64-event history of 1 session/msg"))
CORE_KINDS = (
    ("b1", "1 session x 1 event"),
    ("b64", "64 sessions x 1 event"),
    ("b256", "256 sessions x 1 event"),
    ("run64", "64-event run"),
)


def layout_name(frontends: int) -> str:
    return f"aaren f{frontends}"


#: The TorchServe peer's kit (bench/peers/torchserve/README.md).
KIT = ROOT / "bench" / "peers" / "torchserve"


# --------------------------------------------------------------------------------------------------
# Targets


@dataclasses.dataclass
class Target:
    name: str
    kind: str  # "aaren", "torchserve" or "echo"
    address: str
    processes: Callable[[], dict[str, int]]
    stop: Callable[[], None]

    @property
    def connections(self) -> int:
        """The connections a client spreads its streams over: one to one process (and TorchServe's kit client
        always uses one), else ``CHANNELS``."""
        return 1 if self.kind == "torchserve" or len(self.processes()) == 1 else CHANNELS


def aaren_target(server: Server) -> Target:
    return Target(server.name, "aaren", server.address, server.processes, server.stop)


def free_port_base(start: int = 17070, count: int = 5) -> int:
    """A base port with ``count`` free ports after it (TorchServe's gRPC, management, HTTP, metrics)."""
    for base in range(start, start + 2000, 10):
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free ports for TorchServe")


class TorchServe:
    """The kit's TorchServe: set up (when needed), started, stopped by its own scripts."""

    def __init__(self, kit: Path, work: Path, log: Path) -> None:
        self.kit, self.work, self.log = kit, work, log
        self.python = work / "venv" / "bin" / "python"

    def run(self, script: str, *args: str, timeout: float = 900) -> None:
        with self.log.open("ab") as log:
            subprocess.run(
                ["bash", str(self.kit / script), str(self.work), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=timeout,
            )

    def start(self) -> Target:
        if not (self.work / "gen" / "inference_pb2.py").is_file() or not self.python.exists():
            print(f"setting up TorchServe in {self.work} (kit {self.kit}) ...", flush=True)
            self.run("setup.sh")
        self.run("start.sh", str(free_port_base()), timeout=300)
        address = (self.work / "grpc_address").read_text().strip()
        return Target(TS, "torchserve", address, self.processes, self.stop)

    def processes(self) -> dict[str, int]:
        pids = {}
        for name in ("java", "worker"):
            path = self.work / f"{name}.pid"
            if path.is_file():
                pids[name] = int(path.read_text().split()[0])
        return pids

    def stop(self) -> None:
        self.run("stop.sh", timeout=120)

    def client(self, sessions: int, events: int, label: str, verify: int = 0) -> list[str]:
        cmd = [
            str(self.python),
            str(self.kit / "client.py"),
            "--work",
            str(self.work),
            "--sessions",
            str(sessions),
            "--events",
            str(events),
            "--label",
            label,
        ]
        return [*cmd, "--verify", str(verify)] if verify else cmd


# --------------------------------------------------------------------------------------------------
# Cells


class Bench:
    def __init__(self, a: argparse.Namespace, model: object, ts: TorchServe | None) -> None:
        self.a = a
        self.model = model
        self.ts = ts
        self.cells: list[dict[str, object]] = []
        self.serial = 0

    def stream_client(self, target: Target, *args: str) -> list[str]:
        m = self.model
        return [
            sys.executable,
            "-m",
            "bench.stream_client",
            "--target",
            target.address,
            "--channels",
            str(target.connections),
            "--num-marks",
            str(m.num_marks),
            "--value-width",
            str(m.value_width),
            *args,
        ]

    def cell(self, target: Target, cmd: Sequence[str], **info: object) -> dict[str, object]:
        """Run one client process against ``target``; the result with the server's CPU by process."""
        if target.kind == "torchserve":
            time.sleep(self.a.ts_pause)
        pids = target.processes()
        before = {k: cpu_seconds(p) for k, p in pids.items()}
        main_before = {k: main_thread_cpu_seconds(p) for k, p in pids.items()}
        client_before = client_cpu_seconds()
        proc = subprocess.run(list(cmd), cwd=ROOT, capture_output=True, text=True, timeout=900)
        main_after = {k: main_thread_cpu_seconds(p) for k, p in pids.items()}
        after = {k: cpu_seconds(p) for k, p in pids.items()}
        client_s = client_cpu_seconds() - client_before
        lines = [x for x in proc.stdout.strip().splitlines() if x.startswith("{")]
        res: dict[str, object] = json.loads(lines[-1]) if lines else {"errors": 1, "first_error": proc.stderr[-500:]}
        res.update(
            info,
            server=target.name,
            rc=proc.returncode,
            cpu_s={k: round(after[k] - before[k], 4) for k in pids},
            main_thread_cpu_s={k: round(main_after[k] - main_before[k], 4) for k in pids},
            client_cpu_s=round(client_s, 4),
        )
        self.cells.append(res)
        n = cell_events(res)
        cpu = sum(after[k] - before[k] for k in pids)
        rate = res.get("all_active_ev_per_s") or res.get("ev_per_s")
        print(
            f"  {info.get('phase')} {info.get('level', '')} {target.name:<11} rep {info.get('rep', '-')}: "
            f"{res.get('ev_per_s')} ev/s (all-active {rate}), p50 {res.get('p50_ms', res.get('msg_p50_ms'))} ms, "
            f"cpu {cpu / n * 1e3 if n else float('nan'):.4f} ms/event, errors {res.get('errors')}",
            flush=True,
        )
        return res

    def single(self, target: Target, sessions: int, events: int, **info: object) -> dict[str, object]:
        self.serial += 1
        label = f"{target.name}-{sessions}"
        if target.kind == "torchserve":
            assert self.ts is not None
            cmd = self.ts.client(sessions, events, label, verify=int(info.pop("verify", 0)))
        else:
            info.pop("verify", None)
            cmd = self.stream_client(
                target,
                "--sessions",
                str(sessions),
                "--events",
                str(events),
                "--label",
                label,
                "--tag",
                f"c{self.serial}-{os.getpid()}",
            )
        return self.cell(target, cmd, sessions=sessions, **info)

    def batched(self, target: Target, mode: str, **info: object) -> dict[str, object]:
        self.serial += 1
        a = self.a
        cmd = self.stream_client(
            target,
            "--mode",
            mode,
            "--streams",
            str(a.batched_streams),
            "--batch",
            "64",
            "--messages",
            str(a.batched_messages),
            "--layout",
            "columns",
            "--tag",
            f"c{self.serial}-{os.getpid()}",
        )
        return self.cell(target, cmd, mode=mode, **info)


def rotate(items: Sequence[Target], k: int) -> list[Target]:
    k %= len(items)
    return [*items[k:], *items[:k]]


# --------------------------------------------------------------------------------------------------
# Tables


def span(values: Sequence[float | None], fmt: str = "{:,.0f}") -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def client_cpu_seconds() -> float:
    """User + system CPU seconds of this process's waited-for children so far: the load clients (each cell's
    client runs as a child and is waited for), so that a cell's difference is its client's."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cell_events(cell: dict[str, object]) -> float:
    """The events a cell's client reports: the kit reports events, ours forecasts too."""
    return float(cell.get("forecasts", cell.get("events", 0)) or 0)  # type: ignore[arg-type]


def client_cpu_ms(cell: dict[str, object]) -> float | None:
    """A cell's client CPU ms per event (None for a cell from before clients were counted)."""
    n, client = cell_events(cell), cell.get("client_cpu_s")
    return None if not n or client is None else float(client) / n * 1e3  # type: ignore[arg-type]


def cpu_ms(cell: dict[str, object], process: str | None = None) -> float | None:
    n = cell_events(cell)
    cpu = cell["cpu_s"]
    assert isinstance(cpu, dict)
    if not n or not cpu:
        return None
    total = cpu[process] if process is not None else sum(cpu.values())
    return total / n * 1e3


def server_cores(cell: dict[str, object]) -> float | None:
    """The server's CPU seconds (all its processes) over the cell's wall seconds: the cores it kept busy."""
    wall = cell.get("wall_s")
    if not wall or not cell.get("cpu_s"):
        return None
    return sum(cell["cpu_s"].values()) / float(wall)  # type: ignore[union-attr,arg-type]


def main_thread_ms(cell: dict[str, object]) -> float | None:
    """A cell's main-thread CPU ms per event over the server's processes (each Python server process's event loop
    runs on its main thread); None for TorchServe (the JVM's main thread serves nothing) or an older cell."""
    n, main = cell_events(cell), cell.get("main_thread_cpu_s")
    if not n or not isinstance(main, dict) or cell.get("server") == TS:
        return None
    return sum(main.values()) / n * 1e3


def report(
    b: Bench,
    names: Sequence[str],
    layouts: Sequence[str],
    levels: Sequence[int],
    reps: int,
    core: list[dict[str, object]],
) -> tuple[list[str], list[tuple[str, str, str]]]:
    a = b.a
    cells = b.cells

    def pick(phase: str, server: str, **match: object) -> list[dict[str, object]]:
        return [
            c
            for c in cells
            if c.get("phase") == phase and c["server"] == server and all(c.get(k) == v for k, v in match.items())
        ]

    def per_rep(phase: str, server: str, **match: object) -> dict[int, dict[str, object]]:
        return {int(c["rep"]): c for c in pick(phase, server, **match)}

    out: list[str] = []
    out += [
        f"### One event per message, each session its own stream ({a.events} events per session, "
        f"{reps} reps, min-max over reps)",
        "",
    ]
    rows = []
    for level in levels:
        for name in names:
            cs = pick("single", name, sessions=level)
            rows.append(
                [
                    level,
                    name,
                    span([c.get("ev_per_s") for c in cs]),
                    span([c.get("all_active_ev_per_s") for c in cs]),
                    span([c.get("p50_ms") for c in cs], "{:.2f}"),
                    span([c.get("p99_ms") for c in cs], "{:.2f}"),
                    sum(int(c.get("errors") or 0) for c in cs),
                ]
            )
    out += table(("sessions", "server", "events/s wall", "events/s all-active", "p50 ms", "p99 ms", "errors"), rows)

    ratios: dict[tuple[str, int, str], list[float]] = {}
    out += ["### Ratios within each rep (min-max over reps; events/s: > 1 favours aaren; p50: < 1 favours aaren)", ""]
    rows = []
    for level in levels:
        for name in layouts:
            mine = per_rep("single", name, sessions=level)
            row: list[object] = [level, name]
            for peer, key in (
                (TS, "all_active_ev_per_s"),
                (TS, "ev_per_s"),
                (ECHO, "all_active_ev_per_s"),
                (ECHO, "ev_per_s"),
                (TS, "p50_ms"),
                (ECHO, "p50_ms"),
            ):
                theirs = per_rep("single", peer, sessions=level)
                vals = [
                    float(mine[r][key]) / float(theirs[r][key])
                    for r in mine
                    if r in theirs and mine[r].get(key) and theirs[r].get(key)
                ]
                ratios[(name, level, f"{peer}:{key}")] = vals
                row.append(span(vals, "{:.2f}"))
            rows.append(row)
    out += table(
        (
            "sessions",
            "aaren",
            "÷ TS all-active",
            "÷ TS wall",
            "÷ echo all-active",
            "÷ echo wall",
            "p50 ÷ TS",
            "p50 ÷ echo",
        ),
        rows,
    )

    out += [
        "### Server CPU per event (ms, user+sys from /proc over each cell; min-max over reps)",
        "",
        "Event-loop threads: each Python server process's main thread, where its loop, its Python and gRPC's Cython "
        "run; the rest of its CPU is gRPC's I/O and poller threads (and the kernel's workers). Server cores busy: "
        "its CPU seconds over the cell's wall seconds (first write to last reply): a server that keeps its share of "
        "the two cores busy serves as fast as the machine lets it, and follows the machine's speed; one that "
        "leaves them idle waits on itself (TorchServe's batching and its worker's round trip).",
        "",
    ]
    rows = []
    cpu_at: dict[tuple[str, int], list[float]] = {}
    for level in levels:
        for name in names:
            cs = pick("single", name, sessions=level)
            if not cs:
                continue
            procs = sorted({p for c in cs for p in c["cpu_s"]}, key=lambda p: (p != "core", p))
            by = "; ".join(f"{p} {span([cpu_ms(c, p) for c in cs if p in c['cpu_s']], '{:.3f}')}" for p in procs)
            totals = [v for v in (cpu_ms(c) for c in cs) if v is not None]
            cpu_at[(name, level)] = totals
            clients = [v for v in (client_cpu_ms(c) for c in cs) if v is not None]
            loops = [v for v in (main_thread_ms(c) for c in cs) if v is not None]
            busy = [v for v in (server_cores(c) for c in cs) if v is not None]
            rows.append([level, name, span(totals, "{:.3f}"), by, span(loops, "{:.3f}") if loops else "-",
                         span(busy, "{:.2f}"), span(clients, "{:.3f}")])  # fmt: skip
    out += table(
        (
            "sessions",
            "server",
            "total",
            "by process",
            "of it, event-loop threads",
            "server cores busy",
            "its client (same machine)",
        ),
        rows,
    )

    out += [
        f"### Batched messages, columns layout ({a.batched_streams} streams, {a.batched_messages} messages "
        f"each, one connection to one process, up to {CHANNELS} to front ends; min-max over reps)",
        "",
    ]
    rows = []
    batched_best: dict[str, float] = {}
    batched_vs_echo: dict[str, list[float]] = {}
    for mode, label in BATCHED_KINDS:
        for name in [*layouts, ECHO] if ECHO in names else layouts:
            mine = per_rep("batched", name, mode=mode)
            echo = per_rep("batched", ECHO, mode=mode)
            rates = [float(c["ev_per_s"]) for c in mine.values()]
            if name != ECHO and rates:
                batched_best[name] = max(batched_best.get(name, 0.0), min(rates))
            vs = [float(mine[r]["ev_per_s"]) / float(echo[r]["ev_per_s"]) for r in mine if r in echo]
            if mode == "batch" and name != ECHO:
                batched_vs_echo[name] = vs
            rows.append(
                [
                    label,
                    name,
                    span(rates),
                    span([c.get("msg_p50_ms") for c in mine.values()], "{:.2f}"),
                    span(vs, "{:.2f}") if name != ECHO else "",
                    span([cpu_ms(c) for c in mine.values()], "{:.4f}"),
                    sum(int(c.get("errors") or 0) for c in mine.values()),
                ]
            )
    out += table(("message", "server", "events/s", "msg p50 ms", "÷ echo", "server CPU ms/event", "errors"), rows)

    out += ["### The engine core alone (EngineCore.submit with ready-made CoreRequests, in-process, no gRPC)", ""]
    rows = []
    for kind, label in CORE_KINDS:
        cs = [c for c in core if c["kind"] == kind]
        if cs:
            rows.append(
                [
                    label,
                    cs[0]["inflight"],
                    span([c["ev_per_s"] for c in cs]),
                    span([c["us_per_event"] for c in cs], "{:.1f}"),
                    sum(int(c["errors"]) for c in cs),
                ]
            )
    out += table(("requests", "in flight", "events/s", "µs/event", "errors"), rows)

    aims: list[tuple[str, str, str]] = []

    def verdict(name: str, vals: list[float], ok: Callable[[float], bool], fmt: str = "{:.2f}") -> str:
        if not vals:
            return f"{name}: not measured"
        return f"{name} {span(vals, fmt)}{'' if all(ok(v) for v in vals) else ' (no)'}"

    def met(parts: list[list[float]], ok: Callable[[float], bool]) -> str:
        measured = [p for p in parts if p]
        if not measured:
            return "not measured"
        good = [all(ok(v) for v in p) for p in measured]
        return "**yes**" if all(good) else ("partly (some layouts)" if any(good) else "**no**")

    def rep_ratio(
        name: str, level: int, key: Callable[[dict[str, Any]], float | None], over: str = ECHO
    ) -> list[float]:
        """``key`` of ``name``'s cell over ``over``'s (the echo's), per rep."""
        mine, theirs = per_rep("single", name, sessions=level), per_rep("single", over, sessions=level)
        pairs = [(key(mine[r]), key(theirs[r])) for r in mine if r in theirs]
        return [float(m) / float(t) for m, t in pairs if m and t]

    for level, aim in AIM_TS_RATIO.items():
        if level not in levels:
            continue
        if TS not in names:
            aims.append((f"aaren ≥ {aim}x TorchServe at {level} sessions", "TorchServe not run", "not measured"))
            continue
        vals = [ratios.get((n, level, f"{TS}:all_active_ev_per_s"), []) for n in layouts]
        measured = "; ".join(verdict(n, v, lambda x, a=aim: x >= a) for n, v in zip(layouts, vals, strict=True))
        if ECHO in names:  # the no-op echo, measured the same way: the ratio the transport alone reaches
            echo_ts = rep_ratio(ECHO, level, lambda c: c.get("all_active_ev_per_s"), over=TS)
            measured += f" [the echo: {span(echo_ts, '{:.2f}') if echo_ts else 'not measured'}]"
        aims.append(
            (
                f"aaren ≥ {aim}x TorchServe all-active events/s at {level} sessions",
                measured,
                met(vals, lambda x, a=aim: x >= a),
            )
        )
    top = max(levels)
    if ECHO in names:
        vals = [rep_ratio(n, top, cpu_ms) for n in layouts]
        aims.append(
            (
                f"server CPU per event ≤ {AIM_CPU_ECHO}x the echo's at {top} sessions (all its processes)",
                "; ".join(verdict(n, v, lambda x: x <= AIM_CPU_ECHO) for n, v in zip(layouts, vals, strict=True)),
                met(vals, lambda x: x <= AIM_CPU_ECHO),
            )
        )
        if 1 in levels:
            vals = [ratios.get((n, 1, f"{ECHO}:p50_ms"), []) for n in layouts]
            aims.append(
                (
                    f"one session p50 ≤ {AIM_P50_ECHO}x the echo's",
                    "; ".join(verdict(n, v, lambda x: x <= AIM_P50_ECHO) for n, v in zip(layouts, vals, strict=True)),
                    met(vals, lambda x: x <= AIM_P50_ECHO),
                )
            )
        vals = [batched_vs_echo.get(n, []) for n in layouts]
        aims.append(
            (
                f"batched messages (64 sessions x 1 event, columns) ≥ {AIM_BATCHED_ECHO} of the echo's events/s",
                "; ".join(verdict(n, v, lambda x: x >= AIM_BATCHED_ECHO) for n, v in zip(layouts, vals, strict=True)),
                met(vals, lambda x: x >= AIM_BATCHED_ECHO),
            )
        )
    vals = [[float(c["ev_per_s"]) for c in core if c["kind"] == "b256"]]
    aims.append(
        (
            f"engine core alone, 256 sessions x 1 event ≥ {AIM_CORE_B256:,} events/s",
            verdict("core", vals[0], lambda x: x >= AIM_CORE_B256, "{:,.0f}"),
            met(vals, lambda x: x >= AIM_CORE_B256),
        )
    )
    out += ["### Issue 21's aims in this run", ""]
    out += table(("aim", "measured (per layout; min-max over reps)", "met"), aims)
    return out, aims


# --------------------------------------------------------------------------------------------------
# Main


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 rep, short cells, short warm-up")
    p.add_argument("--no-torchserve", action="store_true", help="leave TorchServe out (e.g. where it is not installed)")
    p.add_argument("--no-echo", action="store_true", help="leave the echo out")
    p.add_argument("--layouts", default="0,1,2", help="comma list of aaren --frontends values")
    p.add_argument("--levels", default="1,16,64", help="comma list of concurrent sessions")
    p.add_argument("--reps", type=int, default=None, help="default 3 (quick: 1)")
    p.add_argument("--events", type=int, default=None, help="events per session per cell (default 400; quick: 60)")
    p.add_argument("--batched-streams", type=int, default=4, help="streams of a batched-message cell")
    p.add_argument("--batched-messages", type=int, default=None, help="messages per stream (default 100; quick 10)")
    p.add_argument("--core-rounds", type=int, default=None, help="engine core alone: rounds (default 300; quick 10)")
    p.add_argument("--ts-kit", type=Path, default=KIT, help="the TorchServe kit folder (default: the project's own)")
    p.add_argument(
        "--ts-work",
        type=Path,
        default=Path(os.environ.get("TS_WORK", "/tmp/ts-peer-bench")),
        help="TorchServe's work folder (or $TS_WORK); setup.sh runs there when it has no stubs",
    )
    p.add_argument("--ts-pause", type=float, default=4.0, help="seconds before each TorchServe cell")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="output folder")
    a = p.parse_args(argv)
    q = a.quick
    a.reps = a.reps or (1 if q else 3)
    a.events = a.events or (60 if q else 400)
    a.batched_messages = a.batched_messages or (10 if q else 100)
    a.core_rounds = a.core_rounds or (10 if q else 300)
    a.warm_ts, a.warm_other = ((16, 50), (16, 30)) if q else ((64, 200), (64, 100))
    return a


def stop_on_signal(signum: int, frame: object) -> None:
    """SIGTERM / SIGINT end the run through ``finally``, so every server started here is stopped."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop_on_signal)
    a.out.mkdir(parents=True, exist_ok=True)
    layouts = [int(x) for x in a.layouts.split(",") if x.strip()]
    levels = [int(x) for x in a.levels.split(",") if x.strip()]
    layout_names = [layout_name(f) for f in layouts]
    started = time.time()
    targets: list[Target] = []
    ts: TorchServe | None = None
    notes: list[str] = []
    core: list[dict[str, object]] = []
    try:
        print("starting servers ...", flush=True)
        servers = [start_aaren(f, a.out / f"layouts-aaren-f{f}.log", name=layout_name(f)) for f in layouts]
        targets += [aaren_target(s) for s in servers]
        model = describe(servers[0].address)
        if not a.no_echo:
            echo = start_echo(model, a.out / "layouts-echo.log")
            targets.append(Target(ECHO, "echo", echo.address, echo.processes, echo.stop))
        if not a.no_torchserve:
            ts = TorchServe(a.ts_kit, a.ts_work, a.out / "layouts-torchserve.log")
            targets.insert(0, ts.start())
        b = Bench(a, model, ts)
        names = [t.name for t in targets]
        for t in targets:
            print(f"  {t.name}: {t.address} {t.processes()}", flush=True)

        print("checking each server once ...", flush=True)
        for t in targets:
            res = b.single(t, 2, 100 if t.kind == "torchserve" else 20, phase="check", verify=2)
            if "verify_maxabsdiff" in res:
                notes.append(
                    f"TorchServe state check before the timed part: max abs difference "
                    f"{res['verify_maxabsdiff']:.2e} over {res.get('verify_events')} events"
                )
        print("warming up ...", flush=True)
        for t in targets:
            sessions, events = a.warm_ts if t.kind == "torchserve" else a.warm_other
            b.single(t, sessions, events, phase="warmup")

        print("one event per message ...", flush=True)
        for rep in range(a.reps):
            for level in levels:
                for t in rotate(targets, rep):
                    b.single(t, level, a.events, phase="single", level=level, rep=rep)
        print("batched messages ...", flush=True)
        batched_targets = [t for t in targets if t.kind != "torchserve"]
        for rep in range(a.reps):
            for mode, _ in BATCHED_KINDS:
                for t in rotate(batched_targets, rep):
                    b.batched(t, mode, phase="batched", rep=rep)
        if ts is not None:
            res = b.single(targets[0], 2, 100, phase="check-after", verify=2)
            notes.append(
                f"TorchServe state check after the timed part: max abs difference "
                f"{float(res.get('verify_maxabsdiff', float('nan'))):.2e}"
            )
    finally:
        for t in targets:
            try:
                t.stop()
            except Exception as exc:  # stop the others whatever happens to one
                print(f"stopping {t.name}: {exc}", file=sys.stderr)

    print("engine core alone ...", flush=True)
    for rep in range(a.reps):
        proc = subprocess.run(
            [sys.executable, "-m", "bench.engine_core", "--rounds", str(a.core_rounds)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                core.append({**json.loads(line), "rep": rep})
        if proc.returncode:
            notes.append(f"engine core alone exited {proc.returncode}: {proc.stderr[-300:]}")

    lines, aims = report(b, names, layout_names, levels, a.reps, core)
    head = [
        "# bench/layouts.py",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {time.time() - started:.0f} s; "
        f"{os.cpu_count()} CPUs (shared; the clients run on them too), Python {platform.python_version()}; "
        f"model {model.name} ({model.version}), device {model.device}; aaren layouts: "
        + ", ".join(f"`--frontends {f}`" for f in layouts),
        "",
        "`" + " ".join(["python -m bench.layouts", *(sys.argv[1:] if argv is None else argv)]) + "`",
        "",
        *(f"- {n}" for n in notes),
        "",
    ]
    text = "\n".join([*head, *lines])
    print(text, flush=True)
    (a.out / "layouts.md").write_text(text)
    (a.out / "layouts.json").write_text(json.dumps({"cells": b.cells, "core": core, "aims": aims}, indent=1))
    print(f"wrote {a.out / 'layouts.md'} and {a.out / 'layouts.json'}")
    bad = [c for c in b.cells if c["server"] != TS and (c.get("errors") or c.get("rc"))]
    return 1 if bad or any(int(c["errors"]) for c in core) else 0


if __name__ == "__main__":
    sys.exit(main())
