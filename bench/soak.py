"""Soak benchmark: many streams for minutes with good and bad traffic; the server's memory must not grow.

One server (``aaren serve``, a subprocess, the bundled model, in-memory sessions, two tenants with
tokens and a per-tenant event rate) is driven by load-generator processes: ``--streams`` streams in
all, of which most send good events (one or a few sessions' next events per message, paced) and
the rest misbehave in turns: invalid events (NaN, marks out of range, wrong widths), seq gaps and
duplicates, messages over the event limit, bursts over the tenant's rate, calls without or with a
wrong token, and streams cancelled with requests in flight. Every ``--sample`` seconds the report
records the server's RSS (``/proc/PID/status`` VmRSS) and the window's events/s and p99 of good
messages; at the end, every outcome by code and reason.

    python bench/soak.py                         # 200 streams, 10 minutes
    python bench/soak.py --minutes 1 --streams 40
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import multiprocessing as mp
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import service as svc  # bench/service.py: server subprocesses

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
STREAMS_PER_CHANNEL = 25
READ_TIMEOUT_S = 10.0
BAD_KINDS = ("invalid", "gap_and_duplicate", "too_many", "burst", "no_token", "bad_token", "cancel")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


async def good_stream(stub, metadata, name: str, until: float, out: dict) -> None:
    """Paced good traffic: 1-4 sessions' next events per message, about 20 messages/s."""
    rng = random.Random(name)
    sessions = [f"{name}-s{k}" for k in range(4)]
    seqs = dict.fromkeys(sessions, 0)
    call = stub.Stream(metadata=metadata)
    try:
        i = 0
        while time.monotonic() < until:
            i += 1
            chosen = rng.sample(sessions, rng.randint(1, 4))
            events = []
            for sid in chosen:
                seqs[sid] += 1
                events.append(
                    pb.Event(
                        session_id=sid, seq=seqs[sid], time=float(seqs[sid]), mark=rng.randrange(3), values=[0.1, 0.2]
                    )
                )
            sent = time.perf_counter()
            await call.write(pb.StreamRequest(request_id=str(i), events=events))
            response = await call.read()
            done = time.perf_counter()
            out["latency"].append((time.monotonic(), done - sent))
            for r in response.results:
                kind = r.WhichOneof("outcome")
                out["outcomes"][f"good:{kind}" if kind != "error" else f"good:error:{r.error.reason}"] += 1
            if response.HasField("request_error"):
                out["outcomes"][f"good:request_error:{response.request_error.reason}"] += 1
                for sid in chosen:
                    seqs[sid] -= 1
            await asyncio.sleep(max(0.0, 0.05 - (done - sent)))
        await call.done_writing()
    except grpc.aio.AioRpcError as exc:
        out["outcomes"][f"good:stream:{exc.code().name}"] += 1
    except asyncio.InvalidStateError:
        out["outcomes"][f"good:stream:client_write_after_end:{(await call.code()).name}"] += 1
    finally:
        call.cancel()


async def bad_stream(stub, metadata, name: str, until: float, out: dict) -> None:
    """Misbehaviour in turns, one kind per round (a new call each round)."""
    rng = random.Random(name)
    n = 0
    while time.monotonic() < until:
        n += 1
        kind = BAD_KINDS[n % len(BAD_KINDS)]
        md = metadata
        if kind == "no_token":
            md = ()
        elif kind == "bad_token":
            md = (("authorization", "Bearer aaren_not-a-token"),)
        call = stub.Stream(metadata=md)
        sid = f"{name}-{n}"
        try:
            if kind == "invalid":
                events = [
                    pb.Event(session_id=sid, seq=1, time=math.nan, values=[0.1, 0.2]),
                    pb.Event(session_id=sid, seq=1, time=1.0, mark=999, values=[0.1, 0.2]),
                    pb.Event(session_id=sid, seq=1, time=1.0, values=[0.1]),
                    pb.Event(session_id="", seq=1, time=1.0, values=[0.1, 0.2]),
                ]
            elif kind == "gap_and_duplicate":
                events = [pb.Event(session_id=sid, seq=s, time=float(s), values=[0.1, 0.2]) for s in (1, 3, 1, 2, 2)]
            elif kind == "too_many":
                events = [pb.Event(session_id=sid, seq=1, time=1.0, values=[0.1, 0.2])] * 10_001
            elif kind == "burst":
                events = [pb.Event(session_id=f"{sid}-{k}", seq=1, time=1.0, values=[0.1, 0.2]) for k in range(2000)]
            else:
                events = [pb.Event(session_id=sid, seq=1, time=1.0, values=[0.1, 0.2])]
            try:
                await call.write(pb.StreamRequest(request_id="1", events=events))
            except grpc.aio.AioRpcError as exc:
                # The server ended the call first (a refused token): the aio client then reports
                # INTERNAL instead of the server's status (grpc/grpc#36066); count it as such.
                out["outcomes"][
                    f"bad:{kind}:client_write_after_server_end:{exc.code().name}:{(exc.details() or '')[:140]}"
                ] += 1
                continue
            if kind == "cancel":
                await call.write(pb.StreamRequest(request_id="2", events=events))
                call.cancel()
                out["outcomes"]["bad:cancelled"] += 1
            else:
                try:
                    response = await asyncio.wait_for(call.read(), READ_TIMEOUT_S)
                except TimeoutError:
                    # Seen with grpc.aio clients whose call the server refused while they wrote
                    # (grpc/grpc#36066): the read never returns. A client problem; counted apart.
                    out["outcomes"][f"bad:{kind}:client_read_hung"] += 1
                    continue
                if response is grpc.aio.EOF:
                    out["outcomes"][f"bad:{kind}:eof"] += 1
                elif response.HasField("request_error"):
                    out["outcomes"][
                        f"bad:{kind}:{pb.ErrorCode.Name(response.request_error.code)}:{response.request_error.reason}"
                    ] += 1
                else:
                    for r in response.results:
                        label = (
                            r.WhichOneof("outcome")
                            if r.WhichOneof("outcome") != "error"
                            else pb.ErrorCode.Name(r.error.code) + ":" + r.error.reason
                        )
                        out["outcomes"][f"bad:{kind}:{label}"] += 1
                await call.done_writing()
        except grpc.aio.AioRpcError as exc:
            reason = dict(exc.trailing_metadata() or ()).get("aaren-error-reason", "")
            out["outcomes"][f"bad:{kind}:{exc.code().name}:{reason}:{(exc.details() or '')[:140]}"] += 1
        except asyncio.InvalidStateError:
            # A write to a call the server had already ended; its status says why.
            out["outcomes"][f"bad:{kind}:client_write_after_end:{(await call.code()).name}"] += 1
        finally:
            call.cancel()
        await asyncio.sleep(rng.uniform(0.05, 0.2))


async def run_worker(address: str, tokens: dict, good: int, bad: int, seconds: float, tag: str) -> dict:
    """Good streams as tenant-a, misbehaving ones as tenant-b (whose rate limit they hit)."""
    out: dict = {"latency": [], "outcomes": Counter()}
    good_md = (("authorization", f"Bearer {tokens['tenant-a']}"),)
    bad_md = (("authorization", f"Bearer {tokens['tenant-b']}"),)
    # One connection per STREAMS_PER_CHANNEL streams: the server allows max_streams_per_connection
    # (100) concurrent streams on one connection and makes further calls wait.
    # (a local subchannel pool each: channels with equal arguments otherwise share one connection).
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [
        grpc.aio.insecure_channel(address, options=options)
        for _ in range(math.ceil((good + bad) / STREAMS_PER_CHANNEL))
    ]
    stubs = [pb_grpc.ForecastServiceStub(c) for c in channels]
    try:
        until = time.monotonic() + seconds
        tasks = [good_stream(stubs[i % len(stubs)], good_md, f"{tag}g{i}", until, out) for i in range(good)]
        tasks += [bad_stream(stubs[i % len(stubs)], bad_md, f"{tag}b{i}", until, out) for i in range(bad)]
        await asyncio.gather(*tasks)
    finally:
        for channel in channels:
            await channel.close()
    return out


def worker(args: tuple) -> dict:
    return asyncio.run(run_worker(*args))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--bad-fraction", type=float, default=0.2, help="share of streams that misbehave")
    p.add_argument("--sample", type=float, default=30.0, help="seconds between RSS samples")
    p.add_argument("--procs", type=int, default=2, help="load-generator processes")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    seconds = args.minutes * 60
    tokens = {"tenant-a": "aaren_soak-a-" + os.urandom(8).hex(), "tenant-b": "aaren_soak-b-" + os.urandom(8).hex()}
    from aaren.server.security.auth import hash_token

    started = time.time()
    with tempfile.TemporaryDirectory(prefix="aaren-soak-") as tmp:
        token_file = Path(tmp) / "tokens.txt"
        token_file.write_text("".join(f"{t} {hash_token(v)}\n" for t, v in tokens.items()))
        exe = Path(sys.executable).parent / "aaren"
        cmd = [str(exe), "serve", "--address", "127.0.0.1:0", "--device", "cpu", "--metrics-port", "0"]
        cmd += [
            "--auth-tokens-file",
            str(token_file),
            "--tenant-events-per-s",
            "20000",
            "--tenant-burst-events",
            "5000",
        ]
        # A bounded session population (the misbehaving streams start new sessions all the time),
        # so that memory must level off: what grows past that is a leak.
        cmd += ["--idle-ttl-s", "60", "--session-capacity", "20000", "--max-sessions-per-tenant", "8000"]
        server = svc.Subprocess(
            "soak", cmd, r"listening on port (\d+), metrics on port (\d+)", args.out / "soak-server.log"
        )
        address = f"127.0.0.1:{server.match.group(1)}"
        bad = round(args.streams * args.bad_fraction)
        good = args.streams - bad
        jobs = []
        for i in range(args.procs):
            jobs.append(
                (
                    address,
                    tokens,
                    good // args.procs + (i < good % args.procs),
                    bad // args.procs + (i < bad % args.procs),
                    seconds,
                    f"w{i}",
                )
            )
        samples = [(0.0, rss_mb(server.pid))]
        try:
            with mp.get_context("spawn").Pool(args.procs) as pool:
                pending = pool.map_async(worker, jobs)
                t0 = time.monotonic()
                while not pending.ready():
                    pending.wait(timeout=args.sample)
                    samples.append((time.monotonic() - t0, rss_mb(server.pid)))
                results = pending.get()
        finally:
            server.stop()

    outcomes: Counter = Counter()
    latencies = []
    for r in results:
        outcomes.update(r["outcomes"])
        latencies.extend(r["latency"])
    t_start = min(t for t, _ in latencies) if latencies else 0.0
    rows = ["| minute | server RSS MB | good messages/s | good p50 ms | good p99 ms |", "|---:|---:|---:|---:|---:|"]
    window = 60.0
    for k in range(math.ceil(seconds / window)):
        lat = [d for t, d in latencies if k * window <= t - t_start < (k + 1) * window]
        rss = [m for t, m in samples if k * window <= t < (k + 1) * window] or [math.nan]
        if lat:
            p50, p99 = np.percentile(lat, [50, 99]) * 1e3
            rows.append(f"| {k + 1} | {max(rss):.0f} | {len(lat) / window:.0f} | {p50:.1f} | {p99:.1f} |")
    all_lat = [d for _, d in latencies]
    summary = "No good messages answered."
    if all_lat:
        p50, p99 = np.percentile(all_lat, [50, 99]) * 1e3
        summary = f"Good messages: {len(all_lat):,}, p50 {p50:.1f} ms, p99 {p99:.1f} ms."
    rss_line = ", ".join(f"{t:.0f}s {m:.0f}" for t, m in samples)
    report = "\n".join(
        [
            "# bench/soak.py",
            "",
            f"{platform.machine()}, {os.cpu_count()} CPUs; {args.streams} streams ({good} good, {bad} "
            f"misbehaving) for {args.minutes:g} min in {args.procs} processes; bundled model, memory store "
            "(capacity 20,000, idle TTL 60 s, 8,000 sessions per tenant), 2 tenants with tokens (good streams "
            "tenant-a, misbehaving tenant-b), 20,000 events/s per tenant (bursts of 5,000); "
            f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {time.time() - started:.0f} s; "
            f"{svc.git_state()}",
            "",
            "`" + " ".join(["python", "bench/soak.py", *sys.argv[1:]]) + "`",
            "",
            summary,
            "",
            *rows,
            "",
            f"Server RSS (MB) by time: {rss_line}.",
            "",
            "### Outcomes (stream:kind:code:reason)",
            "",
            "| outcome | count |",
            "|---|---:|",
            *(f"| {k} | {v:,} |" for k, v in sorted(outcomes.items())),
        ]
    )
    print(report)
    (args.out / "soak.md").write_text(report + "\n")
    (args.out / "soak.json").write_text(json.dumps({"rss": samples, "outcomes": outcomes}, indent=1))


if __name__ == "__main__":
    main()
