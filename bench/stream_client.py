"""Load client for aaren (and the echo) with the TorchServe kit client's accounting.

Two modes; one JSON line on stdout either way (a fresh process per benchmark cell):

``--mode single`` (the kit's ``client.py`` on ``aaren.v1``): N concurrent sessions, each on its own
bidi ``Stream``, E events in order, one event per message, waiting for each reply before the next
write. Latency is write -> read per event, leaving out the first 10 events of each session.
``ev_per_s``: all events / wall time (first write of any session to the last reply);
``all_active_ev_per_s``: events completed while every session was still running; ``p50_ms``,
``p99_ms``, ``mean_ms``, ``errors`` (any reply that is not a forecast), ``first_error``,
``first_reply_ms_max``, ``session_end_s_min/max``, ``wall_s``, ``events``, ``forecasts``.

``--mode batch`` / ``--mode run``: S concurrent streams, each sending M messages and waiting for
each reply: ``batch`` = B sessions x 1 event per message (the stream's own B sessions, one seq
further per message), ``run`` = a B-event history of one session per message (the stream's
session, B seqs further per message). ``--layout columns`` asks for RESPONSE_LAYOUT_COLUMNS.
``ev_per_s``: forecasts / wall time; ``msg_p50_ms``, ``msg_p99_ms``: message round trips.

The streams are spread over ``--channels`` connections (each its own TCP connection), so a server
with several front-end processes on one port (SO_REUSEPORT) gets its load spread over them.

    python -m bench.stream_client --target 127.0.0.1:50051 --sessions 16 --events 400 --label aaren-16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import grpc
import numpy as np

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc
from bench.accounting import Tally, percentile_ms, single_summary
from bench.accounting import one_session as session_loop

__all__ = ["main", "session_events"]

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.use_local_subchannel_pool", 1),  # one TCP connection per channel, never shared
]


def session_events(
    index: int, n: int, num_marks: int, width: int, seed: int = 1000
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Session ``index``'s ``n`` events: increasing times ``[n]``, marks ``[n]``, values ``[n, width]``."""
    rng = np.random.default_rng(seed + index)
    times = np.cumsum(rng.exponential(1.0, n)) + 1.0
    marks = rng.integers(0, num_marks, n)
    values = rng.standard_normal((n, width)).astype(np.float32)
    return times, marks, values


def make_events(sid: str, first_seq: int, times: np.ndarray, marks: np.ndarray, values: np.ndarray) -> list[pb.Event]:
    return [
        pb.Event(session_id=sid, seq=first_seq + j, time=float(t), mark=int(m), values=v.tolist())
        for j, (t, m, v) in enumerate(zip(times.tolist(), marks.tolist(), values, strict=True))
    ]


def forecasts_in(response: pb.StreamResponse, layout: int) -> tuple[int, str | None]:
    """How many forecasts a response holds, and the first thing in it that is not one."""
    if response.HasField("request_error"):
        return 0, f"{response.request_error.reason}: {response.request_error.message}"
    n = len(response.forecast_columns.event_index) if layout == pb.RESPONSE_LAYOUT_COLUMNS else 0
    first: str | None = None
    for result in response.results:
        if result.HasField("forecast"):
            n += 1
        elif first is None:
            first = f"{result.error.reason}: {result.error.message}" if result.HasField("error") else "ack, no forecast"
    return n, first


async def one_session(
    stub: pb_grpc.ForecastServiceStub, sid: str, index: int, a: argparse.Namespace, tally: Tally
) -> None:
    times, marks, values = session_events(index, a.events, a.num_marks, a.value_width)
    reqs = [pb.StreamRequest(events=[e], layout=a.layout_value) for e in make_events(sid, 1, times, marks, values)]

    def problem(reply: pb.StreamResponse) -> str | None:
        n, first = forecasts_in(reply, a.layout_value)
        return None if n == 1 else first or "no forecast"

    await session_loop(stub.Stream(), reqs, problem, tally)


async def one_stream(stub: pb_grpc.ForecastServiceStub, s: int, a: argparse.Namespace, tally: Tally) -> None:
    """``batch``: B sessions x 1 event per message; ``run``: one B-event history per message."""
    b, m = a.batch, a.messages
    if a.mode == "batch":
        sids = [f"{a.tag}-b{s}-{j}" for j in range(b)]
        cols = [session_events(s * b + j, m, a.num_marks, a.value_width) for j in range(b)]
        reqs = []
        for k in range(m):
            events = [
                pb.Event(session_id=sid, seq=k + 1, time=float(t[k]), mark=int(mk[k]), values=v[k].tolist())
                for sid, (t, mk, v) in zip(sids, cols, strict=True)
            ]
            reqs.append(pb.StreamRequest(events=events, layout=a.layout_value))
    else:
        times, marks, values = session_events(s, b * m, a.num_marks, a.value_width)
        sid = f"{a.tag}-r{s}"
        reqs = [
            pb.StreamRequest(
                events=make_events(
                    sid, k * b + 1, times[k * b : (k + 1) * b], marks[k * b : (k + 1) * b], values[k * b : (k + 1) * b]
                ),
                layout=a.layout_value,
            )
            for k in range(m)
        ]
    await a.start.wait()
    ts0 = time.perf_counter()
    call = stub.Stream()
    for r in reqs:
        t0 = time.perf_counter()
        await call.write(r)
        resp = await call.read()
        dt = time.perf_counter() - t0
        if resp is grpc.aio.EOF:
            tally.errors.append("EOF")
            break
        n, problem = forecasts_in(resp, a.layout_value)
        tally.forecasts += n
        if n != len(r.events):
            tally.errors.append(problem or f"{n} forecasts for {len(r.events)} events")
        tally.lat.append(dt)
        tally.done.append(time.perf_counter())
    tally.spans.append((ts0, time.perf_counter()))
    await call.done_writing()
    try:
        await asyncio.wait_for(call.code(), 10)
    except TimeoutError:
        call.cancel()


async def run(a: argparse.Namespace) -> dict[str, object]:
    tally = Tally()
    streams = a.sessions if a.mode == "single" else a.streams
    channels = [
        grpc.aio.insecure_channel(a.target, options=CHANNEL_OPTIONS) for _ in range(max(1, min(a.channels, streams)))
    ]
    try:
        for ch in channels:
            await asyncio.wait_for(ch.channel_ready(), 30)
        stubs = [pb_grpc.ForecastServiceStub(ch) for ch in channels]
        a.start = asyncio.Event()
        if a.mode == "single":
            t0 = time.perf_counter()
            await asyncio.gather(
                *[one_session(stubs[i % len(stubs)], f"{a.tag}-s{i}", i, a, tally) for i in range(a.sessions)]
            )
        else:
            tasks = [asyncio.create_task(one_stream(stubs[s % len(stubs)], s, a, tally)) for s in range(a.streams)]
            await asyncio.sleep(0)  # every stream builds its messages, then waits for the start
            t0 = time.perf_counter()
            a.start.set()
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    finally:
        for ch in channels:
            await ch.close()
    res: dict[str, object] = dict(label=a.label, target=a.target, mode=a.mode, channels=len(channels))
    if a.mode == "single":
        res.update(single_summary(tally, t0, wall), sessions=a.sessions, events_per_session=a.events)
        res["forecasts"] = tally.forecasts
    else:
        res.update(
            wall_s=round(wall, 3),
            forecasts=tally.forecasts,
            errors=len(tally.errors),
            first_error=tally.errors[0] if tally.errors else None,
            ev_per_s=round(tally.forecasts / wall, 1),
            streams=a.streams,
            batch=a.batch,
            messages=a.messages,
            events=a.streams * a.batch * a.messages,
            msg_p50_ms=percentile_ms(tally.lat, 50),
            msg_p99_ms=percentile_ms(tally.lat, 99),
        )
    return res


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="host:port")
    ap.add_argument("--mode", choices=("single", "batch", "run"), default="single")
    ap.add_argument("--sessions", type=int, default=1, help="single: concurrent sessions, one stream each")
    ap.add_argument("--events", type=int, default=400, help="single: events per session")
    ap.add_argument("--streams", type=int, default=4, help="batch/run: concurrent streams")
    ap.add_argument("--batch", type=int, default=64, help="batch/run: events per message")
    ap.add_argument("--messages", type=int, default=50, help="batch/run: messages per stream")
    ap.add_argument("--layout", choices=("rows", "columns"), default="rows")
    ap.add_argument(
        "--channels", type=int, default=1, help="connections the streams are spread over (at most one each)"
    )
    ap.add_argument("--num-marks", type=int, default=16, help="the model's marks (events use 0..N-1)")
    ap.add_argument("--value-width", type=int, default=0, help="values per event (the model's width)")
    ap.add_argument("--tag", default=None, help="session id prefix (default: unique per run)")
    ap.add_argument("--label", default="")
    a = ap.parse_args(argv)
    if a.tag is None:
        a.tag = f"run{int(time.time() * 1000) % 10**10}-{os.getpid()}"
    a.layout_value = pb.RESPONSE_LAYOUT_COLUMNS if a.layout == "columns" else pb.RESPONSE_LAYOUT_ROWS
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    res = asyncio.run(run(a))
    print(json.dumps(res), flush=True)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
