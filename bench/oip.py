"""The OIP front end beside aaren.v1, in one run: events/s and latency of the same sessions driven
through tritonclient's streaming API and through aaren.v1's Stream.

One server subprocess (``aaren serve``, the bundled model, its default process layout). Per cell, a
load process (spawned, its own interpreter) opens one stream per session and runs them closed-loop
for ``--duration`` seconds after ``--warmup``: a request, its answer, the next. Every request holds
one event of its session (the OIP carries one event per request); the aaren.v1 side sends the same
events (seq up by one) in one-event StreamRequests. The OIP side uses tritonclient.grpc.aio
``stream_infer`` with ``InferInput.set_data_from_numpy`` as a Triton user writes it, so its numbers
include the client's own request building (on these 2 cores the load process shares the CPU with
the server). Cells alternate which protocol goes first.

    python -m bench.oip                        # 1, 16, 64 sessions; 6 s a cell
    python -m bench.oip --sessions 1,64 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.service import Subprocess

MODEL_WAIT_S = 60


def _server(out: Path, frontends: str | None) -> tuple[Subprocess, int]:
    exe = Path(sys.executable).parent / "aaren"
    cmd = [str(exe), "serve", "--address", "127.0.0.1:0", "--device", "cpu", "--metrics-port", "-1"]
    if frontends is not None:
        cmd += ["--frontends", frontends]
    server = Subprocess("service", cmd, r"listening on port (\d+)", out / "oip-server.log")
    return server, int(server.match.group(1))


async def _v1_session(address: str, sid: str, t_from: float, t_to: float) -> tuple[list[float], int]:
    import grpc

    from aaren.v1 import aaren_pb2 as pb
    from aaren.v1 import aaren_pb2_grpc as pb_grpc

    latencies: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.ForecastServiceStub(channel).Stream()
        request = pb.StreamRequest()
        event = request.events.add(session_id=sid, values=[0.1, -0.2])
        seq, t = 0, 1000.0
        while time.perf_counter() < t_to:
            seq += 1
            t += 0.5 + (seq % 5) * 0.25
            event.seq, event.time, event.mark = seq, t, seq % 3
            request.request_id = str(seq)
            sent = time.perf_counter()
            await call.write(request)
            response = await call.read()
            done = time.perf_counter()
            if response.results[0].WhichOneof("outcome") != "forecast":
                errors += 1
            if t_from <= done <= t_to:
                latencies.append(done - sent)
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:
            pass
    return latencies, errors


async def _oip_session(address: str, sid: str, model: str, width: int, t_from: float, t_to: float):
    import tritonclient.grpc as triton
    from tritonclient.grpc import aio as triton_aio

    latencies: list[float] = []
    errors = 0
    client = triton_aio.InferenceServerClient(address)
    requests: asyncio.Queue[dict | None] = asyncio.Queue()

    async def feed():
        while (item := await requests.get()) is not None:
            yield item

    answers = client.stream_infer(feed())
    seq, t = 0, 1000.0
    try:
        while time.perf_counter() < t_to:
            seq += 1
            t += 0.5 + (seq % 5) * 0.25
            time_in = triton.InferInput("TIME", [1], "FP64")
            time_in.set_data_from_numpy(np.array([t]))
            mark_in = triton.InferInput("MARK", [1], "INT64")
            mark_in.set_data_from_numpy(np.array([seq % 3], np.int64))
            values_in = triton.InferInput("VALUES", [width], "FP32")
            values_in.set_data_from_numpy(np.array([0.1, -0.2], np.float32))
            sent = time.perf_counter()
            requests.put_nowait(
                {"model_name": model, "inputs": [time_in, mark_in, values_in], "sequence_id": sid,
                 "sequence_start": seq == 1, "request_id": str(seq)}
            )  # fmt: skip
            result, error = await anext(answers)
            done = time.perf_counter()
            if error is not None or result.as_numpy("SEQ")[0] != seq:
                errors += 1
            if t_from <= done <= t_to:
                latencies.append(done - sent)
    finally:
        requests.put_nowait(None)
        await client.close()
    return latencies, errors


def _load(args: tuple) -> tuple[np.ndarray, int]:
    protocol, address, prefix, sessions, warmup, duration, model, width = args

    async def run():
        start = time.perf_counter()
        t_from, t_to = start + warmup, start + warmup + duration
        if protocol == "aaren.v1":
            parts = [_v1_session(address, f"{prefix}-{k}", t_from, t_to) for k in range(sessions)]
        else:
            parts = [_oip_session(address, f"{prefix}-{k}", model, width, t_from, t_to) for k in range(sessions)]
        done = await asyncio.gather(*parts)
        return np.concatenate([np.asarray(p[0]) for p in done]), sum(p[1] for p in done)

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", default="1,16,64")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--frontends", default=None, help="the server's --frontends (default: its own)")
    args = parser.parse_args(argv)
    import grpc
    import tritonclient.grpc as triton

    out = Path(tempfile.mkdtemp(prefix="aaren-bench-oip-"))
    server, port = _server(out, args.frontends)
    address = f"127.0.0.1:{port}"
    try:
        client = triton.InferenceServerClient(address)
        deadline = time.monotonic() + MODEL_WAIT_S
        while not client.is_server_ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not become ready")
            time.sleep(0.2)
        meta = client.get_model_metadata(_first_model(address, grpc))
        width = next(int(t.shape[0]) for t in meta.inputs if t.name == "VALUES")
        model = meta.name
        client.close()
        ctx = mp.get_context("spawn")
        rows = []
        with ctx.Pool(1) as pool:
            for n, sessions in enumerate(int(s) for s in args.sessions.split(",")):
                order = ("aaren.v1", "oip") if n % 2 == 0 else ("oip", "aaren.v1")
                cell = {}
                for protocol in order:
                    latencies, errors = pool.apply(
                        _load,
                        ((protocol, address, f"{protocol}-{sessions}", sessions, args.warmup, args.duration, model,
                          width),),
                    )  # fmt: skip
                    cell[protocol] = (len(latencies) / args.duration, *np.percentile(latencies, [50, 99]) * 1e3, errors)
                rows.append((sessions, cell))
    finally:
        server.stop()
    layout = f" --frontends {args.frontends}" if args.frontends is not None else ""
    print(f"\n`python -m bench.oip --sessions {args.sessions} --duration {args.duration}{layout}` (one event per "
          "request, each session on its own stream, closed loop)\n")  # fmt: skip
    print("| sessions | aaren.v1 events/s | p50 ms | p99 ms | OIP events/s | p50 ms | p99 ms | OIP / v1 | errors |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sessions, cell in rows:
        v, o = cell["aaren.v1"], cell["oip"]
        print(f"| {sessions} | {v[0]:,.0f} | {v[1]:.2f} | {v[2]:.2f} | {o[0]:,.0f} | {o[1]:.2f} | {o[2]:.2f} | "
              f"{o[0] / v[0]:.2f}x | {v[3]} / {o[3]} |")  # fmt: skip


def _first_model(address: str, grpc) -> str:
    from aaren.v1 import aaren_pb2 as pb
    from aaren.v1 import aaren_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        return pb_grpc.ForecastServiceStub(channel).DescribeModel(pb.DescribeModelRequest(), timeout=30).name


if __name__ == "__main__":
    main()
