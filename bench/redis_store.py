"""Benchmark of the Redis session store beside the memory store: events/s, p50/p99, Redis bytes per session.

Two servers (``aaren serve``, subprocesses, the same model), one with ``memory://`` and one with
``redis://`` on a redis-server this script starts on a free port with a temp dir (append-only file
on, ``--appendfsync`` as given), are driven by the load generator of ``bench/service.py``
(closed-loop grpc.aio streams in separate processes) cell by cell, taking turns which goes first.

After the cells, Redis holds every session the redis server saw; the report gives Redis's
``used_memory`` growth per session and ``MEMORY USAGE`` of sampled session hashes and their
tombstones, beside the model's state bytes per session (what the tensors themselves take).

Run from the repository root::

    python bench/redis_store.py                       # 64 streams, 1 and 64 events/msg, 5 s cells
    python bench/redis_store.py --quick --streams 1,64
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import service as svc  # bench/service.py: load generator, server subprocesses, cells

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each cell")
    p.add_argument("--streams", type=svc.parse_ints, default=(64,), help="concurrent streams, e.g. 1,64")
    p.add_argument("--batch", type=svc.parse_ints, default=(1, 64), help="events per message, each of another session")
    p.add_argument("--rounds", type=int, default=1, help="repeat the grid; report the median round per cell")
    p.add_argument("--appendfsync", choices=("always", "everysec", "no"), default="everysec")
    p.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory (default: bundled model)")
    p.add_argument("--quick", action="store_true", help="short cells (1.5 s + 0.5 s warmup)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="output folder")
    args = p.parse_args()
    if args.quick:
        args.duration, args.warmup = min(args.duration, 1.5), min(args.warmup, 0.5)
    return args


def start_redis(directory: Path, appendfsync: str) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found (Debian package redis-server)")
    port = free_port()
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", ""]
    cmd += ["--appendonly", "yes", "--appendfsync", appendfsync, "--logfile", str(directory / "redis.log")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"redis-server did not start; see {directory / 'redis.log'}")


def redis_version() -> str:
    text = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    return " ".join(text.split()[:3])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(name: str, store_url: str, args: argparse.Namespace, out: Path) -> tuple[svc.Subprocess, int, int]:
    exe = Path(sys.executable).parent / "aaren"
    cmd = [str(exe) if exe.exists() else "aaren", "serve", "--address", "127.0.0.1:0", "--device", "cpu"]
    cmd += ["--metrics-port", "0", "--store-url", store_url]
    if args.checkpoint:
        cmd += ["--checkpoint", str(args.checkpoint)]
    server = svc.Subprocess(
        name, cmd, r"listening on port (\d+), metrics on port (\d+)", out / f"redis-bench-{name}.log"
    )
    return server, int(server.match.group(1)), int(server.match.group(2))


def memory_table(client: redis.Redis, baseline: int, state_bytes: int, prefix: str) -> str:
    sessions, tombstones = [], []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        (tombstones if key.endswith(b":t") else sessions).append(key)
    used = int(client.info("memory")["used_memory"]) - baseline
    sample = sessions[:200]
    record_len = [client.strlen(k) for k in sample]
    hash_usage = [client.memory_usage(k, samples=0) or 0 for k in sample]
    tomb_usage = [client.memory_usage(k + b":t", samples=0) or 0 for k in sample]
    n = max(len(sessions), 1)
    mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
    rows = [
        "| what | bytes per session | vs state bytes |",
        "|---|---:|---:|",
        f"| model state (tensors) | {state_bytes:,} | 1.00x |",
        "| record length (STRLEN): header (seq, times, model version) + state row (model state + last features) "
        f"| {mean(record_len):,.0f} | {mean(record_len) / state_bytes:.2f}x |",
        f"| MEMORY USAGE of the record key (mean of {len(sample)}) | {mean(hash_usage):,.0f} "
        f"| {mean(hash_usage) / state_bytes:.2f}x |",
        f"| MEMORY USAGE of its tombstone key | {mean(tomb_usage):,.0f} | {mean(tomb_usage) / state_bytes:.2f}x |",
        f"| INFO used_memory growth / sessions ({len(sessions):,} sessions) | {used / n:,.0f} "
        f"| {used / n / state_bytes:.2f}x |",
    ]
    return "\n".join(rows)


def main() -> None:
    args = parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    # The fields run_cell reads, from bench/service.py's own defaults.
    cell_args = svc.parse_args(["--duration", str(args.duration), "--warmup", str(args.warmup)])
    kinds = [svc.Kind(b, run=False) for b in args.batch]
    started = time.time()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="aaren-redis-bench-") as tmp:
        redis_proc, redis_port = start_redis(Path(tmp), args.appendfsync)
        client = redis.Redis(port=redis_port)
        baseline = int(client.info("memory")["used_memory"])
        servers: dict[str, tuple[svc.Subprocess, int, int]] = {}
        workers = None
        try:
            servers["memory"] = start_server("memory", "memory://", args, out)
            servers["redis"] = start_server("redis", f"redis://127.0.0.1:{redis_port}/0", args, out)
            model = svc.describe(f"127.0.0.1:{servers['memory'][1]}")
            workers = svc.Workers(max(svc.procs_for(n, cell_args) for n in args.streams))
            cells: dict[tuple[str, int, int], list[svc.Cell]] = {}
            i = 0
            for rnd in range(args.rounds):
                for kind in kinds:
                    for n in args.streams:
                        order = ("memory", "redis") if i % 2 == 0 else ("redis", "memory")
                        i += 1
                        for target in order:
                            server, port, metrics_port = servers[target]
                            cell = svc.run_cell(
                                workers,
                                target,
                                f"127.0.0.1:{port}",
                                kind,
                                n,
                                rnd,
                                cell_args,
                                model,
                                server_pid=server.pid,
                                metrics_port=metrics_port,
                            )
                            cells.setdefault((target, kind.events, n), []).append(cell)
                            print(f"{target:6s} {kind.label:26s} {n:3d} streams: {svc.cell_summary(cell)}", flush=True)
                            time.sleep(0.3)
            memory = memory_table(client, baseline, model.state_bytes_per_session, "aaren:")
        finally:
            if workers is not None:
                workers.close()
            for server, _, _ in servers.values():
                server.stop()
            redis_proc.terminate()
            redis_proc.wait(10)

    median = {k: svc.median_cell(v) for k, v in cells.items()}
    lines = [
        "| message | streams | memory ev/s | redis ev/s | redis/memory | memory p50 / p99 ms | redis p50 / p99 ms "
        "| redis store ms/batch | redis batches/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        for n in args.streams:
            m, r = median[("memory", kind.events, n)], median[("redis", kind.events, n)]
            ph = r.phases or {}
            batches = ph.get("batches_per_s", float("nan"))
            store_ms = ph.get("store_ms_per_batch", float("nan"))
            lines.append(
                f"| {kind.label} | {n} | {m.events_per_s:,.0f} | {r.events_per_s:,.0f} | "
                f"{r.events_per_s / m.events_per_s:.2f} | {m.p50_ms:.2f} / {m.p99_ms:.2f} | "
                f"{r.p50_ms:.2f} / {r.p99_ms:.2f} | {store_ms:.2f} | {batches:,.0f} |"
            )
    header = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; model {model.name} "
        f"({model.backbone}, d_model {model.d_model}, {model.n_layers} layers); {redis_version()}, redis-py "
        f"{redis.__version__}, appendonly yes, appendfsync {args.appendfsync}; "
        f"{args.duration:g} s measured + {args.warmup:g} s warmup "
        f"per cell, {args.rounds} round(s); load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; "
        f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}, {time.time() - started:.0f} s; {svc.git_state()}"
    )
    report = "\n".join(
        [
            "# bench/redis_store.py",
            "",
            header,
            "",
            "`" + " ".join(["python", "bench/redis_store.py", *sys.argv[1:]]) + "`",
            "",
            "### Events/s and latency per message, memory store vs Redis store (same clients, same run)",
            "",
            *lines,
            "",
            "### Redis memory per session",
            "",
            memory,
        ]
    )
    print()
    print(report)
    (out / "redis_store.md").write_text(report + "\n")
    print(f"wrote {out / 'redis_store.md'}")


if __name__ == "__main__":
    main()
