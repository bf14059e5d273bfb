"""Benchmark of the gRPC service: events/s and latency beside a no-op echo server (the transport ceiling).

What it measures, in one run so that the ratio service/echo compares like with like on these
shared machines:

- **Servers**, each a subprocess with its own Python interpreter: the real service
  (``aaren serve --address 127.0.0.1:0 --device cpu --frontends 0``: one process, its CPU read from
  ``/proc`` per thread; ``--frontends N`` to change it), ``--checkpoint DIR`` when given; a random
  tiny model when no checkpoint exists) and ``bench/echo_server.py``, a server on the same proto
  and grpc.aio options whose ``Stream`` answers every message at once with one dummy forecast per
  event, of the service's shape (same response bytes; no model, no store).
- **Load**: closed-loop grpc.aio clients in separate processes (``multiprocessing``, spawned once
  and reused; by default 1 process up to 16 streams, 2 beyond), one channel per process. Every
  stream sends a ``StreamRequest``, awaits its ``StreamResponse`` and only then sends the next; a
  message's latency runs from just before the write to the matching response. Every stream owns
  its sessions; seqs go up by one per event without gaps, so every event is applied (any result
  other than a forecast is counted as an error and reported).
- **Grid**: concurrent streams (``--streams``, default 1, 16, 64) x message kinds: ``--batch N``
  events per message, each of a different session (the stream's N sessions, each advancing by one
  seq per message), and ``--run N``: N consecutive events of one session per message (the
  history path: one parallel scan). Each cell runs ``--warmup`` seconds unmeasured then
  ``--duration`` seconds measured; only responses that arrive within the measured window count.
  The echo and the service take turns cell by cell (alternating which goes first).
- **Server phases** (service only): the server's Prometheus counters are scraped at the edges of
  the measured window, giving batches/s, sessions and events per batch, model and store time per
  batch and the server-side request time, beside what the clients saw.
- **CPU**: user+system time of the server process (per thread for the service, labelled with the
  Python thread names from one ``py-spy dump``) and of the load generators over the measured
  window, from ``/proc``: on 2 cores it tells whether a server is held to one core by its GIL.
  ``--torch-threads N`` sets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` for the service (a diagnostic).
- ``--py-spy SECONDS``: after the grid, one more (unmeasured) service cell at the largest stream
  count with one event per message, and one with the first batched kind, while two ``py-spy
  record`` (all running threads; ``--gil``) sample the server process; the raw stacks go to
  ``OUT/service-pyspy-KIND[-gil].txt`` and their summary (busy and GIL share per thread, top
  frames of the two busiest threads) to the report.

Latency "per event" is the message's latency divided by its events (the amortized cost); an
event's own latency is its message's round trip.

Run from the repository root::

    python bench/service.py                    # full grid, about 3 minutes
    python bench/service.py --quick            # short cells, under a minute
    python bench/service.py --duration 10 --streams 1,64 --batch 1,256 --run 0 --py-spy 5

It prints the tables, writes them as Markdown to ``OUT/service.md``, the raw numbers to
``OUT/service.json`` and draws ``OUT/service.png`` (default ``OUT`` = ``bench/out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import platform
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
TARGETS = ("echo", "service")

# The targets (issue 4, "Acceptance").
TARGET_RATIO = 0.8
TARGET_BATCHED_EVENTS_S = 50_000
TARGET_P50_ONE_STREAM_MS = 1.5
TORCHSERVE_64_STREAMS = (3_000, 3_500)


# --------------------------------------------------------------------------------------------------
# What to run


@dataclasses.dataclass(frozen=True)
class Kind:
    """A message shape: ``events`` per message, of as many sessions, or (``run``) all of one session."""

    events: int
    run: bool

    @property
    def label(self) -> str:
        if self.events == 1:
            return "1 event/msg"
        return f"{self.events}-event run of 1 session/msg" if self.run else f"{self.events} sessions x 1 event/msg"

    @property
    def key(self) -> str:
        return f"run{self.events}" if self.run else f"b{self.events}"


@dataclasses.dataclass(frozen=True)
class Job:
    """One worker process's share of one cell."""

    address: str
    kind: Kind
    streams: tuple[int, ...]
    prefix: str
    t0: float  # wall clock (time.time) when the streams start
    warmup: float
    duration: float
    num_marks: int
    value_width: int
    last_only: bool = False  # runs ask for a forecast of the last event only (history ingestion)
    columns: bool = False  # forecasts as packed columns (RESPONSE_LAYOUT_COLUMNS)


@dataclasses.dataclass
class WorkerResult:
    latencies: np.ndarray  # seconds, one per message answered inside the measured window
    messages: int
    events: int
    errors: int
    first_error: str


@dataclasses.dataclass
class Cell:
    target: str
    kind: Kind
    streams: int
    procs: int
    round: int
    duration: float
    messages: int
    events: int
    errors: int
    first_error: str
    p50_ms: float
    p99_ms: float
    mean_ms: float
    phases: dict[str, float] | None = None
    server_cpu: float = float("nan")  # cores used by the server process over the window
    client_cpu: float = float("nan")  # cores used by the load-generator processes
    thread_cpu: dict[str, float] | None = None  # server threads (grouped by label) -> cores

    @property
    def events_per_s(self) -> float:
        return self.events / self.duration

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.duration


def cell_summary(cell: Cell) -> str:
    """One line of progress: events/s, p50 and p99, and the first error if any."""
    return f"{cell.events_per_s:10,.0f} ev/s  p50 {_fmt(cell.p50_ms)} ms  p99 {_fmt(cell.p99_ms)} ms" + (
        f"  ERRORS {cell.errors}: {cell.first_error}" if cell.errors else ""
    )


# --------------------------------------------------------------------------------------------------
# Load generator (runs in worker processes)


async def _one_stream(
    stub: pb_grpc.ForecastServiceStub, job: Job, stream: int, start: float, t_from: float, t_to: float
) -> tuple[list[float], int, int, int, str]:
    kind = job.kind
    n = kind.events
    sids = [f"{job.prefix}-s{stream}"] * n if kind.run else [f"{job.prefix}-s{stream}-k{k}" for k in range(n)]
    request = pb.StreamRequest()
    if kind.run and job.last_only:
        request.forecast_mode = pb.FORECAST_MODE_LAST_PER_SESSION
    if job.columns:
        request.layout = pb.RESPONSE_LAYOUT_COLUMNS
    for k, sid in enumerate(sids):
        request.events.add(
            session_id=sid,
            seq=0,
            time=0.0,
            mark=(stream + k) % job.num_marks,
            values=[0.25 * (k % 7) - 0.5 + j for j in range(job.value_width)],
        )
    events = list(request.events)  # views into the request: updated in place for every message
    latencies: list[float] = []
    messages = n_events = errors = 0
    first_error = ""
    seq, t, i = 0, 1_000.0, 0
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    call = stub.Stream()
    try:
        while time.perf_counter() < t_to:
            i += 1
            if kind.run:
                for e in events:
                    seq += 1
                    t += 0.5 + (seq % 5) * 0.25
                    e.seq, e.time = seq, t
            else:
                seq += 1
                t += 0.5 + (seq % 5) * 0.25
                for e in events:
                    e.seq, e.time = seq, t
            rid = str(i)
            request.request_id = rid
            sent = time.perf_counter()
            await call.write(request)
            response = await call.read()
            done = time.perf_counter()
            if response is grpc.aio.EOF:
                errors += n
                first_error = first_error or "stream ended early"
                break
            bad = 0
            last_only = request.forecast_mode == pb.FORECAST_MODE_LAST_PER_SESSION
            if job.columns:
                forecasts = len(response.forecast_columns.event_index)
                if (
                    response.request_id != rid
                    or response.HasField("request_error")
                    or forecasts + len(response.results) != n
                    or forecasts != (1 if last_only else n)
                ):
                    bad = n
                    first_error = first_error or f"bad response: {str(response)[:300]!r}"
            elif response.request_id != rid or response.HasField("request_error") or len(response.results) != n:
                bad = n
                first_error = first_error or f"bad response: {str(response)[:300]!r}"
            else:
                for k, r in enumerate(response.results):
                    # In last-only mode every event but the message's last is answered with an ack.
                    want = "forecast" if not last_only or k == n - 1 else "ack"
                    if r.WhichOneof("outcome") != want:
                        bad += 1
                        first_error = first_error or f"result without {want}: {str(r)[:300]!r}"
            errors += bad
            if t_from <= done <= t_to:
                latencies.append(done - sent)
                messages += 1
                n_events += n
        await call.done_writing()
        while await asyncio.wait_for(call.read(), 10) is not grpc.aio.EOF:
            pass
    except (grpc.aio.AioRpcError, TimeoutError) as exc:
        errors += 1
        first_error = first_error or f"stream failed: {exc!r}"[:300]
    finally:
        call.cancel()
    return latencies, messages, n_events, errors, first_error


async def _run_job(job: Job) -> WorkerResult:
    async with grpc.aio.insecure_channel(job.address, options=CHANNEL_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        stub = pb_grpc.ForecastServiceStub(channel)
        offset = time.perf_counter() - time.time()
        start = job.t0 + offset
        t_from = start + job.warmup
        t_to = t_from + job.duration
        parts = await asyncio.gather(*(_one_stream(stub, job, s, start, t_from, t_to) for s in job.streams))
    return WorkerResult(
        latencies=np.concatenate([np.asarray(p[0], dtype=np.float64) for p in parts]),
        messages=sum(p[1] for p in parts),
        events=sum(p[2] for p in parts),
        errors=sum(p[3] for p in parts),
        first_error=next((p[4] for p in parts if p[4]), ""),
    )


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            conn.send(asyncio.run(_run_job(job)))
        except Exception as exc:
            conn.send(f"{type(exc).__name__}: {exc}")


class Workers:
    """Persistent load-generator processes (spawned: grpc does not survive fork)."""

    def __init__(self, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[multiprocessing.connection.Connection] = []
        self.procs: list[Any] = []
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(self, jobs: Sequence[Job], during: Any = None) -> list[WorkerResult]:
        for conn, job in zip(self.conns, jobs, strict=False):
            conn.send(job)
        if during is not None:
            during()
        results = []
        for conn in self.conns[: len(jobs)]:
            result = conn.recv()
            if isinstance(result, str):
                raise RuntimeError(f"load generator failed: {result}")
            results.append(result)
        return results

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()


# --------------------------------------------------------------------------------------------------
# Servers


class Subprocess:
    """A server subprocess whose first stdout line matching ``pattern`` gives its port(s)."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        pattern: str,
        log_path: Path,
        timeout: float = 180,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=self._log, text=True, start_new_session=True, env=env
        )
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError(f"{name} did not start; see {log_path}:\n{log_path.read_text()[-2000:]}")
            match = re.search(pattern, line)
            if match:
                self.match = match
                return

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start_service(args: argparse.Namespace, out: Path) -> tuple[Subprocess, int, int | None]:
    exe = Path(sys.executable).parent / "aaren"
    cmd = [str(exe)] if exe.exists() else [shutil.which("aaren") or "aaren"]
    cmd += ["serve", "--address", "127.0.0.1:0", "--device", "cpu", "--frontends", str(args.frontends)]
    cmd += ["--metrics-port", "0" if args.server_metrics else "-1"]
    if args.checkpoint:
        cmd += ["--checkpoint", str(args.checkpoint)]
    env = None
    if args.torch_threads:
        n = str(args.torch_threads)
        env = {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}
    server = Subprocess(
        "service", cmd, r"listening on port (\d+), metrics on port (\d+)", out / "service-server.log", env=env
    )
    metrics_port = int(server.match.group(2)) if args.server_metrics else None
    return server, int(server.match.group(1)), metrics_port


def start_echo(model: pb.DescribeModelResponse, out: Path) -> tuple[Subprocess, int]:
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "echo_server.py"),
        "--address",
        "127.0.0.1:0",
        "--quantiles",
        str(len(model.quantile_levels)),
        "--marks",
        str(min(model.limits.default_top_k or 3, model.num_marks)),
        "--values",
        str(model.value_width),
        "--model-name",
        model.name,
        "--model-version",
        model.version,
    ]
    server = Subprocess("echo", cmd, r"echo: listening on port (\d+)", out / "service-echo.log")
    return server, int(server.match.group(1))


def describe(address: str) -> pb.DescribeModelResponse:
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
        return pb_grpc.ForecastServiceStub(channel).DescribeModel(pb.DescribeModelRequest(), timeout=30)


def probe_bytes(address: str, model: pb.DescribeModelResponse, n: int, tag: str) -> tuple[int, int]:
    """Request and response bytes of one message of ``n`` events of ``n`` new sessions."""
    request = pb.StreamRequest(request_id="probe")
    for k in range(n):
        request.events.add(session_id=f"probe-{tag}-{n}-{k}", seq=1, time=1.0, mark=0, values=[0.5] * model.value_width)
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.ForecastServiceStub(channel)
        (response,) = list(stub.Stream(iter([request]), timeout=60))
    outcomes = {r.WhichOneof("outcome") for r in response.results}
    if outcomes != {"forecast"}:
        raise RuntimeError(f"probe of {address} got {outcomes}: {str(response)[:500]}")
    return request.ByteSize(), response.ByteSize()


# --------------------------------------------------------------------------------------------------
# Server-side phases from the service's Prometheus metrics

PHASE_SAMPLES = {
    "batches": ("aaren_batch_size_count", {}),
    "batch_sessions": ("aaren_batch_size_sum", {}),
    "batch_events": ("aaren_batch_events_sum", {}),
    "model_s": ("aaren_event_latency_seconds_sum", {"phase": "model"}),
    "store_s": ("aaren_event_latency_seconds_sum", {"phase": "store"}),
    "queue_s": ("aaren_event_latency_seconds_sum", {"phase": "queue"}),
    "queue_n": ("aaren_event_latency_seconds_count", {"phase": "queue"}),
    "request_s": ("aaren_request_latency_seconds_sum", {"method": "Stream"}),
    "request_n": ("aaren_request_latency_seconds_count", {"method": "Stream"}),
}


def scrape(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values: dict[str, float] = dict.fromkeys(PHASE_SAMPLES, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for key, (name, labels) in PHASE_SAMPLES.items():
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    values[key] = sample.value
    return values


def phases_of(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    d = {k: after[k] - before[k] for k in before}
    batches = max(d["batches"], 1.0)
    return {
        "batches_per_s": d["batches"] / seconds,
        "sessions_per_batch": d["batch_sessions"] / batches,
        "events_per_batch": d["batch_events"] / batches,
        "model_ms_per_batch": 1e3 * d["model_s"] / batches,
        "store_ms_per_batch": 1e3 * d["store_s"] / batches,
        "model_busy": d["model_s"] / seconds,
        "store_busy": d["store_s"] / seconds,
        "queue_ms": 1e3 * d["queue_s"] / max(d["queue_n"], 1.0),
        "request_ms": 1e3 * d["request_s"] / max(d["request_n"], 1.0),
    }


# --------------------------------------------------------------------------------------------------
# Running the grid


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """``tid -> (comm, user+system clock ticks)`` of every thread of ``pid`` (Linux /proc)."""
    ticks: dict[int, tuple[str, int]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return ticks
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks[int(task.name)] = (comm, int(fields[11]) + int(fields[12]))
    return ticks


def python_thread_names(pid: int) -> dict[int, str]:
    """OS thread id -> Python thread name, from one ``py-spy dump`` (empty without py-spy)."""
    exe = Path(sys.executable).parent / "py-spy"
    spy = str(exe) if exe.exists() else shutil.which("py-spy")
    if spy is None:
        return {}
    done = subprocess.run([spy, "dump", "-p", str(pid)], capture_output=True, text=True, timeout=30)
    return {int(m.group(1)): m.group(2) for m in re.finditer(r'Thread (\d+) \([^)]*\): "([^"]*)"', done.stdout)}


def thread_label(pid: int, tid: int, comm: str, names: dict[int, str]) -> str:
    if tid == pid:
        return "MainThread (asyncio loop: grpc.aio, servicer, batcher)"
    if tid in names:
        name = names[tid]
        if name.startswith("aaren-model"):
            return f"{name} (model worker: EventTask.apply)"
        if "_poll_wrapper" in name:
            return f"{name} (grpc.aio poller)"
        return name
    if comm in ("event_engine", "grpc_global_tim", "lifeguard"):
        return f"grpc C-core threads ({comm})"
    return f"native threads named {comm!r} (not Python: torch intra-op pool)" if names else f"threads named {comm!r}"


def cpu_delta(
    before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], seconds: float
) -> dict[int, tuple[str, float]]:
    return {
        tid: (comm, (t - before.get(tid, (comm, 0))[1]) / CLK_TCK / seconds)
        for tid, (comm, t) in after.items()
        if t - before.get(tid, (comm, 0))[1] > 0
    }


def procs_for(streams: int, args: argparse.Namespace) -> int:
    if args.procs:
        return max(1, min(args.procs, streams))
    return 1 if streams <= 16 else 2


def run_cell(
    workers: Workers,
    target: str,
    address: str,
    kind: Kind,
    streams: int,
    rnd: int,
    args: argparse.Namespace,
    model: pb.DescribeModelResponse,
    server_pid: int,
    metrics_port: int | None = None,
    duration: float | None = None,
    during_window: Any = None,
    thread_names: dict[int, str] | None = None,
) -> Cell:
    duration = args.duration if duration is None else duration
    procs = procs_for(streams, args)
    t0 = time.time() + 0.5
    prefix = f"r{rnd}-{target}-{kind.key}-n{streams}-{int(t0 * 1000) % 10**9}"
    jobs = [
        Job(
            address=address,
            kind=kind,
            streams=tuple(range(p, streams, procs)),
            prefix=f"{prefix}-p{p}",
            t0=t0,
            warmup=args.warmup,
            duration=duration,
            num_marks=model.num_marks,
            value_width=model.value_width,
            last_only=args.last_only,
            columns=args.columns,
        )
        for p in range(procs)
    ]
    scraped: list[dict[str, float]] = []
    ticks: list[tuple[dict[int, tuple[str, int]], list[dict[int, tuple[str, int]]]]] = []
    client_pids = [proc.pid for proc in workers.procs[:procs]]

    def snapshot() -> None:
        ticks.append((thread_ticks(server_pid), [thread_ticks(pid) for pid in client_pids]))
        if metrics_port is not None:
            scraped.append(scrape(metrics_port))

    def during() -> None:
        t_from = t0 + args.warmup
        time.sleep(max(0.0, t_from - time.time()))
        snapshot()
        if during_window is not None:
            during_window(t_from, duration)
        time.sleep(max(0.0, t_from + duration - time.time()))
        snapshot()

    results = workers.run(jobs, during)
    server_threads = cpu_delta(ticks[0][0], ticks[1][0], duration)
    client_cpu = sum(
        c for b, a in zip(ticks[0][1], ticks[1][1], strict=True) for _, c in cpu_delta(b, a, duration).values()
    )
    grouped: dict[str, float] = defaultdict(float)
    for tid, (comm, c) in server_threads.items():
        grouped[thread_label(server_pid, tid, comm, thread_names or {})] += c
    latencies = np.concatenate([r.latencies for r in results])
    has = latencies.size > 0
    return Cell(
        target=target,
        kind=kind,
        streams=streams,
        procs=procs,
        round=rnd,
        duration=duration,
        messages=sum(r.messages for r in results),
        events=sum(r.events for r in results),
        errors=sum(r.errors for r in results),
        first_error=next((r.first_error for r in results if r.first_error), ""),
        p50_ms=float(np.percentile(latencies, 50)) * 1e3 if has else float("nan"),
        p99_ms=float(np.percentile(latencies, 99)) * 1e3 if has else float("nan"),
        mean_ms=float(latencies.mean()) * 1e3 if has else float("nan"),
        phases=phases_of(scraped[0], scraped[1], duration) if len(scraped) == 2 else None,
        server_cpu=sum(c for _, c in server_threads.values()),
        client_cpu=client_cpu,
        thread_cpu=dict(grouped),
    )


def median_cell(cells: list[Cell]) -> Cell:
    """The cell of median events/s among rounds (its own latencies, so numbers stay consistent)."""
    ordered = sorted(cells, key=lambda c: c.events_per_s)
    return ordered[(len(ordered) - 1) // 2]


# --------------------------------------------------------------------------------------------------
# py-spy


def _read_raw(path: Path) -> Iterator[tuple[str, list[str], int]]:
    """(thread name, frames root first, samples) per line of ``py-spy record --threads -f raw`` output."""
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        head, *frames = stack.split(";")
        thread = head.split(": ", 1)[1] if head.startswith("thread (") and ": " in head else head
        frames = [re.sub(r":\d+\)$", ")", f) for f in frames]
        if frames:
            yield thread, frames, int(count_s)


def summarize_pyspy(path: Path, gil_path: Path | None, seconds: float, rate: int, top: int = 15) -> str:
    """Busy and GIL-holding share per thread, then each busy thread's top frames (self and inclusive)."""
    expected = seconds * rate
    busy: Counter[str] = Counter()
    self_t: dict[str, Counter[str]] = defaultdict(Counter)
    incl: dict[str, Counter[str]] = defaultdict(Counter)
    for thread, frames, count in _read_raw(path):
        busy[thread] += count
        self_t[thread][frames[-1]] += count
        for f in set(frames):
            incl[thread][f] += count
    gil: Counter[str] = Counter()
    if gil_path is not None and gil_path.exists():
        for thread, _, count in _read_raw(gil_path):
            gil[thread] += count
    lines = [
        f"{sum(busy.values()):,} samples of running threads at {rate}/s over {seconds:g} s. busy = share of wall "
        "time the thread was running (Python, or C/C++ called from Python, e.g. torch or grpc's Cython); "
        "GIL = share of wall time it held the GIL (a second py-spy with --gil, at the same time).",
        "",
        "| thread | busy | GIL |",
        "|---|---:|---:|",
    ]
    for thread in sorted(set(busy) | set(gil), key=lambda t: -busy[t]):
        g = f"{gil[thread] / expected:.0%}" if gil else "-"
        lines.append(f"| {thread} | {busy[thread] / expected:.0%} | {g} |")
    if gil:
        lines.append(f"| **all threads** | {sum(busy.values()) / expected:.0%} | {sum(gil.values()) / expected:.0%} |")
    skip = ("<module>", "run (", "_bootstrap", "Runner.run", "run_until_complete", "run_forever", "Thread.run")
    skip += ("_WorkItem.run", "_worker (", "decorate_context", "_wrapped_call_impl", "typer", "click", "cli.py")
    for thread, _ in busy.most_common(2):
        lines += [
            "",
            f"{thread}: top frames, % of wall time (self = the innermost Python frame; time in C called from it "
            "counts there)",
            "",
            "| inclusive | % | self | % |",
            "|---|---:|---|---:|",
        ]
        inclusive = [(f, n) for f, n in incl[thread].most_common() if not any(x in f for x in skip)][:top]
        selfs = self_t[thread].most_common(top)
        for i in range(max(len(inclusive), len(selfs))):
            a = f"`{inclusive[i][0]}` | {inclusive[i][1] / expected:.1%}" if i < len(inclusive) else " | "
            b = f"`{selfs[i][0]}` | {selfs[i][1] / expected:.1%}" if i < len(selfs) else " | "
            lines.append(f"| {a} | {b} |")
    return "\n".join(lines)


def profile_server(
    workers: Workers,
    service: Subprocess,
    address: str,
    kind: Kind,
    streams: int,
    args: argparse.Namespace,
    model: pb.DescribeModelResponse,
    out: Path,
    thread_names: dict[int, str],
) -> tuple[Cell, str] | None:
    exe = Path(sys.executable).parent / "py-spy"
    spy = str(exe) if exe.exists() else shutil.which("py-spy")
    if spy is None:
        print("py-spy not found (pip install py-spy); skipping the profile", file=sys.stderr)
        return None
    raw, gil_raw = out / f"service-pyspy-{kind.key}.txt", out / f"service-pyspy-{kind.key}-gil.txt"
    rate = 200
    seconds = args.py_spy

    def record(t_from: float, duration: float) -> None:
        time.sleep(max(0.0, t_from - time.time()))
        base = [spy, "record", "-p", str(service.pid), "-d", str(seconds), "-r", str(rate), "--nonblocking"]
        base += ["--threads", "--nolineno", "-f", "raw"]
        native = ["--native"] if args.py_spy_native else []
        procs = [
            subprocess.Popen([*base, *native, "-o", str(raw)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
            subprocess.Popen([*base, "--gil", "-o", str(gil_raw)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
        ]
        for proc in procs:
            output, _ = proc.communicate()
            if proc.returncode != 0:
                print(f"py-spy failed: {output.decode(errors='replace')[-1000:]}", file=sys.stderr)

    raw.unlink(missing_ok=True)
    gil_raw.unlink(missing_ok=True)
    cell = run_cell(
        workers,
        "service",
        address,
        kind,
        streams,
        -1,
        args,
        model,
        server_pid=service.pid,
        duration=seconds + 1.0,
        during_window=record,
        thread_names=thread_names,
    )
    if not raw.exists():
        return None
    return cell, summarize_pyspy(raw, gil_raw, seconds, rate)


# --------------------------------------------------------------------------------------------------
# Report


def _fmt(x: float, digits: int = 3) -> str:
    if x != x:  # NaN
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def results_table(cells: dict[tuple[str, str, int], Cell], kinds: Sequence[Kind], streams: Sequence[int]) -> str:
    head = (
        "| message | streams | service ev/s | echo ev/s | service/echo | service p50 / p99 ms | "
        "echo p50 / p99 ms | service p50 / p99 µs/event | echo p50 µs/event | errors |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in kinds:
        for n in streams:
            s, e = cells.get(("service", kind.key, n)), cells.get(("echo", kind.key, n))
            if s is None or e is None:
                continue
            per = 1e3 / kind.events
            lines.append(
                f"| {kind.label} | {n} | {s.events_per_s:,.0f} | {e.events_per_s:,.0f} | "
                f"{s.events_per_s / max(e.events_per_s, 1e-9):.2f} | {_fmt(s.p50_ms)} / {_fmt(s.p99_ms)} | "
                f"{_fmt(e.p50_ms)} / {_fmt(e.p99_ms)} | {_fmt(s.p50_ms * per)} / {_fmt(s.p99_ms * per)} | "
                f"{_fmt(e.p50_ms * per)} | {s.errors + e.errors} |"
            )
    return "\n".join(lines)


def phases_table(cells: dict[tuple[str, str, int], Cell], kinds: Sequence[Kind], streams: Sequence[int]) -> str:
    head = (
        "| message | streams | batches/s | sessions/batch | events/batch | model ms/batch | store ms/batch | "
        "model busy | queue wait ms | server request ms (mean) | client latency ms (mean) |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in kinds:
        for n in streams:
            s = cells.get(("service", kind.key, n))
            if s is None or s.phases is None:
                continue
            p = s.phases
            lines.append(
                f"| {kind.label} | {n} | {p['batches_per_s']:,.0f} | {_fmt(p['sessions_per_batch'])} | "
                f"{_fmt(p['events_per_batch'])} | {_fmt(p['model_ms_per_batch'])} | {_fmt(p['store_ms_per_batch'])} | "
                f"{p['model_busy']:.0%} | {_fmt(p['queue_ms'])} | {_fmt(p['request_ms'])} | {_fmt(s.mean_ms)} |"
            )
    return "\n".join(lines)


def cpu_table(cells: dict[tuple[str, str, int], Cell], kinds: Sequence[Kind], streams: Sequence[int]) -> str:
    lines = [
        "| message | streams | service: server CPU | service: clients CPU | echo: server CPU | echo: clients CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        for n in streams:
            s, e = cells.get(("service", kind.key, n)), cells.get(("echo", kind.key, n))
            if s is None or e is None:
                continue
            lines.append(
                f"| {kind.label} | {n} | {s.server_cpu:.2f} | {s.client_cpu:.2f} | {e.server_cpu:.2f} | "
                f"{e.client_cpu:.2f} |"
            )
    return "\n".join(lines)


def threads_table(cells: Sequence[Cell]) -> str:
    """Cores used per server thread (grouped by label), one column per cell."""
    labels: Counter[str] = Counter()
    for c in cells:
        for label, cores in (c.thread_cpu or {}).items():
            labels[label] += cores
    head = "| server thread | " + " | ".join(f"{c.kind.label}, {c.streams} streams" for c in cells) + " |"
    lines = [head, "|---|" + "---:|" * len(cells)]
    for label, _ in labels.most_common():
        lines.append(f"| {label} | " + " | ".join(f"{(c.thread_cpu or {}).get(label, 0.0):.2f}" for c in cells) + " |")
    lines.append("| **whole process** | " + " | ".join(f"**{c.server_cpu:.2f}**" for c in cells) + " |")
    return "\n".join(lines)


def targets_table(cells: dict[tuple[str, str, int], Cell], kinds: Sequence[Kind], streams: Sequence[int]) -> str:
    def mark(ok: bool | None) -> str:
        return "-" if ok is None else ("yes" if ok else "**no**")

    rows = []
    one = next((k for k in kinds if k.events == 1), None)
    if one is not None:
        ratios = []
        for n in streams:
            s, e = cells.get(("service", one.key, n)), cells.get(("echo", one.key, n))
            if s and e:
                ratios.append((n, s.events_per_s / max(e.events_per_s, 1e-9)))
        ok = all(r >= TARGET_RATIO for _, r in ratios) if ratios else None
        measured = ", ".join(f"{r:.2f} at {n}" for n, r in ratios)
        rows.append(f"| service/echo events/s >= {TARGET_RATIO} with 1 event/msg | {measured} | {mark(ok)} |")
    batched = [c for (t, _, _), c in cells.items() if t == "service" and c.kind.events > 1]
    if batched:
        best = max(batched, key=lambda c: c.events_per_s)
        rows.append(
            f"| >= {TARGET_BATCHED_EVENTS_S:,} events/s with batched messages | {best.events_per_s:,.0f} "
            f"({best.kind.label}, {best.streams} streams) | {mark(best.events_per_s >= TARGET_BATCHED_EVENTS_S)} |"
        )
    if one is not None and ("service", one.key, 1) in cells:
        c = cells[("service", one.key, 1)]
        rows.append(
            f"| p50 < {TARGET_P50_ONE_STREAM_MS} ms at 1 stream, 1 event/msg | {_fmt(c.p50_ms)} ms "
            f"(p99 {_fmt(c.p99_ms)} ms) | {mark(c.p50_ms < TARGET_P50_ONE_STREAM_MS)} |"
        )
    if one is not None and ("service", one.key, 64) in cells:
        c = cells[("service", one.key, 64)]
        lo, hi = TORCHSERVE_64_STREAMS
        rows.append(
            f"| >= 2x TorchServe ({lo:,}-{hi:,} events/s) at 64 streams, 1 event/msg, i.e. >= {2 * hi:,} | "
            f"{c.events_per_s:,.0f} ({c.events_per_s / hi:.1f}-{c.events_per_s / lo:.1f}x), p50 {_fmt(c.p50_ms)} ms, "
            f"p99 {_fmt(c.p99_ms)} ms | {mark(c.events_per_s >= 2 * hi)} |"
        )
    return "\n".join(["| target (issue 4) | measured | met |", "|---|---|---|", *rows])


def plot(cells: dict[tuple[str, str, int], Cell], kinds: Sequence[Kind], streams: Sequence[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_ratio) = plt.subplots(1, 2, figsize=(13, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, kind in enumerate(kinds):
        color = colors[i % len(colors)]
        for target, style in (("service", "-o"), ("echo", "--s")):
            xs = [n for n in streams if (target, kind.key, n) in cells]
            ys = [cells[(target, kind.key, n)].events_per_s for n in xs]
            if xs:
                ax.plot(xs, ys, style, color=color, label=f"{target}, {kind.label}")
        xs = [n for n in streams if ("service", kind.key, n) in cells and ("echo", kind.key, n) in cells]
        ratio = [cells[("service", kind.key, n)].events_per_s / cells[("echo", kind.key, n)].events_per_s for n in xs]
        if xs:
            ax_ratio.plot(xs, ratio, "-o", color=color, label=kind.label)
    lo, hi = TORCHSERVE_64_STREAMS
    ax.axhspan(lo, hi, color="grey", alpha=0.25, label="TorchServe, 64 sessions (issue 4)")
    ax.axhline(TARGET_BATCHED_EVENTS_S, color="grey", ls=":", label=f"target {TARGET_BATCHED_EVENTS_S:,}/s batched")
    ax.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="events/s", title="Throughput")
    ax.set_xticks(list(streams), [str(n) for n in streams])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax_ratio.axhline(TARGET_RATIO, color="grey", ls=":", label=f"target {TARGET_RATIO} (1 event/msg)")
    ax_ratio.set(xscale="log", xlabel="concurrent streams", ylabel="service / echo events/s", title="Service / echo")
    ax_ratio.set_xticks(list(streams), [str(n) for n in streams])
    ax_ratio.set_ylim(0, max(1.05, ax_ratio.get_ylim()[1]))
    ax_ratio.grid(True, alpha=0.3)
    ax_ratio.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def git_state() -> str:
    """The commit, and which files under server/, aaren_core/ and proto/ differ from it (read-only git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "server", "aaren_core", "proto"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "git: unknown"
    changed = [line[3:] for line in dirty.stdout.splitlines() if line.strip()]
    state = f"git {head.stdout.strip() or '?'}"
    return state + (f" + uncommitted changes in {', '.join(changed)}" if changed else " (server code as committed)")


def parse_ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each cell")
    p.add_argument("--streams", type=parse_ints, default=(1, 16, 64), help="concurrent streams, e.g. 1,16,64")
    p.add_argument("--batch", type=parse_ints, default=(1, 64), help="events per message, each of another session")
    p.add_argument("--run", type=parse_ints, default=(64,), help="events per message of one session (0: none)")
    p.add_argument(
        "--last-only",
        action="store_true",
        help="runs use FORECAST_MODE_LAST_PER_SESSION (a forecast for the last event, acks for the rest), "
        "as a client ingesting histories would; the echo answers alike",
    )
    p.add_argument(
        "--columns",
        action="store_true",
        help="ask for RESPONSE_LAYOUT_COLUMNS (forecasts as packed columns); the echo answers alike",
    )
    p.add_argument("--rounds", type=int, default=1, help="repeat the grid; report the median round per cell")
    p.add_argument("--procs", type=int, default=0, help="load-generator processes (0: 1 up to 16 streams, else 2)")
    p.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory for the service")
    p.add_argument("--py-spy", type=int, default=0, help="seconds to profile the server with py-spy (0: off)")
    p.add_argument(
        "--torch-threads", type=int, default=0, help="OMP/MKL_NUM_THREADS for the service (0: inherit, torch's default)"
    )
    p.add_argument(
        "--frontends",
        type=int,
        default=0,
        help="the service's front-end processes (0: one process, the layout whose CPU and threads this "
        "benchmark reads from /proc; bench/layouts.py compares the layouts)",
    )
    p.add_argument("--py-spy-native", action="store_true", help="py-spy --native: C/C++ frames too (slower)")
    p.add_argument(
        "--server-metrics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="scrape the service's Prometheus metrics for the phase table (serves them on a free port)",
    )
    p.add_argument("--quick", action="store_true", help="short cells (1.5 s + 0.5 s warmup)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="output folder")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.warmup = min(args.duration, 1.5), min(args.warmup, 0.5)
    return args


def grid(args: argparse.Namespace) -> tuple[list[Kind], list[int]]:
    kinds = [Kind(b, run=False) for b in args.batch if b > 0]
    kinds += [Kind(r, run=True) for r in args.run if r > 1]
    return kinds, list(args.streams)


def cells_in_order(kinds: Sequence[Kind], streams: Sequence[int], rounds: int) -> Iterator[tuple[int, Kind, int, bool]]:
    i = 0
    for rnd in range(rounds):
        for kind in kinds:
            for n in streams:
                yield rnd, kind, n, i % 2 == 1  # echo first on even cells, service first on odd ones
                i += 1


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    kinds, streams = grid(args)
    started = time.time()
    load_before = os.getloadavg()
    code_state = git_state()

    service, service_port, metrics_port = start_service(args, out)
    echo = None
    workers = None
    try:
        service_addr = f"127.0.0.1:{service_port}"
        model = describe(service_addr)
        echo, echo_port = start_echo(model, out)
        addresses = {"service": service_addr, "echo": f"127.0.0.1:{echo_port}"}
        sizes = {t: {n: probe_bytes(a, model, n, t) for n in (1, 64)} for t, a in addresses.items()}
        print(
            f"service {model.name} ({model.version}, {model.backbone}, d_model {model.d_model}, "
            f"{model.n_layers} layers, {model.num_marks} marks, {model.value_width} values) on port {service_port}"
            f" (pid {service.pid}); echo on port {echo_port} (pid {echo.pid})"
        )
        print(
            "response bytes for 1 / 64 events: "
            + ", ".join(f"{t} {s[1][1]} / {s[64][1]}" for t, s in sizes.items())
            + f"; request bytes {sizes['service'][1][0]} / {sizes['service'][64][0]}"
        )
        pids = {"service": service.pid, "echo": echo.pid}
        names = {t: python_thread_names(pid) for t, pid in pids.items()}
        n_workers = max(procs_for(n, args) for n in streams)
        workers = Workers(n_workers)

        all_cells: list[Cell] = []
        plan = list(cells_in_order(kinds, streams, args.rounds))
        for i, (rnd, kind, n, service_first) in enumerate(plan):
            order = ("service", "echo") if service_first else ("echo", "service")
            for target in order:
                cell = run_cell(
                    workers,
                    target,
                    addresses[target],
                    kind,
                    n,
                    rnd,
                    args,
                    model,
                    server_pid=pids[target],
                    metrics_port=metrics_port if target == "service" else None,
                    thread_names=names[target],
                )
                all_cells.append(cell)
                print(
                    f"[{i + 1}/{len(plan)}] {target:7s} {kind.label:32s} {n:3d} streams ({cell.procs} procs): "
                    + cell_summary(cell),
                    flush=True,
                )
                time.sleep(0.3)

        grouped: dict[tuple[str, str, int], list[Cell]] = defaultdict(list)
        for c in all_cells:
            grouped[(c.target, c.kind.key, c.streams)].append(c)
        cells = {k: median_cell(v) for k, v in grouped.items()}

        profiles = []
        if args.py_spy > 0:
            one = next((k for k in kinds if k.events == 1), Kind(1, run=False))
            batched = [k for k in kinds if k.events > 1 and not k.run][:1]
            for kind in [one, *batched]:
                print(f"profiling the server with py-spy for {args.py_spy:g} s at {max(streams)} streams, {kind.label}")
                profile = profile_server(
                    workers, service, service_addr, kind, max(streams), args, model, out, names["service"]
                )
                if profile is not None:
                    profiles.append(profile)
    finally:
        if workers is not None:
            workers.close()
        if echo is not None:
            echo.stop()
        service.stop()

    elapsed = time.time() - started
    load_after = os.getloadavg()
    header = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, grpcio {grpc.__version__}, "
        f"torch {_version('torch')}; model {model.name} ({model.backbone}, d_model {model.d_model}, "
        f"{model.n_layers} layers, {model.num_marks} marks, {model.value_width} values) on {model.device}; "
        f"{args.duration:g} s measured + {args.warmup:g} s warmup per cell, {args.rounds} round(s); "
        f"load generator: closed loop, 1 grpc.aio channel per process, "
        f"{', '.join(f'{procs_for(n, args)} proc(s) at {n}' for n in streams)} streams; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
        f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}, {elapsed:.0f} s; {code_state}"
    )
    bytes_line = (
        "Response bytes for 1 / 64 events: "
        + ", ".join(f"{t} {s[1][1]} / {s[64][1]}" for t, s in sizes.items())
        + f"; request bytes {sizes['service'][1][0]} / {sizes['service'][64][0]}."
    )
    parts = [
        "# bench/service.py",
        "",
        header,
        "",
        "`" + " ".join(["python", "bench/service.py", *(sys.argv[1:] if argv is None else argv)]) + "`",
        "",
        "### Throughput and latency (service vs echo, same clients, same run)",
        "",
        "Latency is per message, from write to matching response; µs/event = that / events per message.",
        bytes_line,
        "",
        results_table(cells, kinds, streams),
        "",
        "### Targets",
        "",
        targets_table(cells, kinds, streams),
    ]
    if any(c.phases for c in cells.values()):
        parts += [
            "",
            "### Server-side phases (service, from its Prometheus metrics over the measured window)",
            "",
            "model busy = model time / wall time (one worker thread); queue wait = arrival to batch start per "
            "run; server request = request received to response built.",
            "",
            phases_table(cells, kinds, streams),
        ]
    parts += [
        "",
        f"### CPU used over the measured window (cores; this machine has {os.cpu_count()}, shared with other users)",
        "",
        cpu_table(cells, kinds, streams),
    ]
    top = [cells[("service", k.key, max(streams))] for k in kinds if ("service", k.key, max(streams)) in cells]
    if top:
        parts += [
            "",
            f"### Service threads at {max(streams)} streams (cores, from /proc; names from py-spy dump)",
            "",
            threads_table(top),
        ]
    for pcell, summary in profiles:
        parts += [
            "",
            f"### Where the server's time goes: py-spy, {pcell.streams} streams, {pcell.kind.label}",
            "",
            f"An extra, unmeasured run: {pcell.events_per_s:,.0f} events/s while sampled (py-spy --nonblocking). "
            f"Raw stacks: `service-pyspy-{pcell.kind.key}.txt`, `service-pyspy-{pcell.kind.key}-gil.txt`.",
            "",
            summary,
            "",
            threads_table([pcell]),
        ]
    errors = [c for c in all_cells if c.errors]
    if errors:
        parts += ["", "### Errors", ""]
        parts += [f"- {c.target} {c.kind.label} {c.streams} streams: {c.errors}: {c.first_error}" for c in errors]
    report = "\n".join(parts) + "\n"
    print()
    print(report)
    (out / "service.md").write_text(report)
    (out / "service.json").write_text(
        json.dumps(
            [
                {
                    **{k: v for k, v in dataclasses.asdict(c).items() if k != "kind"},
                    "kind": c.kind.key,
                    "events_per_s": c.events_per_s,
                }
                for c in all_cells
            ],
            indent=1,
        )
    )
    plot(cells, kinds, streams, out / "service.png")
    print(f"wrote {out / 'service.md'}, {out / 'service.json'} and {out / 'service.png'}")


if __name__ == "__main__":
    main()
