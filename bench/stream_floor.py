"""What one event costs a server at each layer of aaren.v1's stream, side by side in one run.

    python -m bench.stream_floor                       # 1, 16, 64 sessions, 3 reps (about 3 minutes)
    python -m bench.stream_floor --quick               # smoke run

Four servers of the same protocol, each driven by ``bench.stream_client`` (one connection, every
session its own stream, one event per message, waiting for each reply), their CPU from ``/proc``:

- ``bare``: gRPC and nothing else: ``async for`` over the requests, each answered with the same
  ready-made reply bytes (a forecast of the echo's shape), as the requests' raw bytes come.
- ``loop``: the same bytes through the project's ``StreamLoop`` (the reader task, the ordered replies,
  the writer, as both protocols serve a stream) with a codec that answers each request on the next turn
  of the loop: the stream's structure, without decoding, core or encoding.
- ``echo``: the project's ``bench.echo_server`` (a protobuf reply built per event, no model).
- ``aaren f0``: ``aaren serve --frontends 0``, the bundled model.

So ``loop`` - ``bare`` is what the stream's structure costs an event, and ``aaren f0`` - ``loop`` what
decoding, the engine core and encoding add on top. Prints a Markdown table and writes it with every
cell to ``OUT/stream_floor.md`` and ``.json``. Only differences within one run mean much on shared
cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from aaren import event_loop
from aaren.server.contract.core_api import OnDone
from aaren.server.contract.errors import ErrorInfo
from aaren.server.frontends.handlers import add_service
from aaren.server.frontends.streams import Accepted, StreamLoop
from aaren.server.observability.metrics import Metrics
from aaren.server.settings import ServerSettings
from aaren.v1 import aaren_pb2 as pb
from bench.echo_server import dummy_forecast
from bench.harness import ROOT, Server, cpu_seconds, describe, start_aaren, start_echo
from bench.layouts import span

__all__ = ["main"]

READY = r"stream_floor: listening on port (\d+)"


def reply_bytes(num_marks: int, value_width: int) -> bytes:
    """One ``StreamResponse`` with one forecast of the echo's shape, as wire bytes."""
    forecast = dummy_forecast(n_marks=min(num_marks, 5), n_values=value_width)
    forecast.session_id, forecast.seq = "s", 1
    response = pb.StreamResponse()
    response.results.add(session_id="s", seq=1).forecast.CopyFrom(forecast)
    return response.SerializeToString()


class _NoCore:
    """The ``CoreAPI`` part ``StreamLoop.serve`` asks of a core: it opens and closes every stream."""

    draining = False

    async def open_stream(self, tenant: str) -> ErrorInfo | None:
        return None

    async def close_stream(self, tenant: str) -> None:
        return None


class NextTurnCodec:
    """A ``StreamCodec`` that answers each request with ``reply`` on the loop's next turn (as a core's
    batch answers on a turn of its own)."""

    draining = False

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.core = _NoCore()

    async def ready(self, context: grpc.aio.ServicerContext) -> Any:
        return self.core

    def decode(self, request: bytes, tenant: str) -> Accepted[bytes]:
        loop = asyncio.get_running_loop()

        def submit(_: object, on_done: OnDone) -> None:
            loop.call_soon(on_done, None)

        return Accepted(request, lambda _: self.reply, submit)

    def refusal(self, request: bytes, info: ErrorInfo) -> bytes:
        return self.reply


async def serve(kind: str, reply: bytes) -> None:
    """Serve ``kind`` (``bare`` or ``loop``) on a free port until SIGTERM."""
    server = grpc.aio.server()
    if kind == "bare":

        async def stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            async for _ in requests:
                yield reply

        handler: Any = stream
    else:
        handler = StreamLoop(NextTurnCodec(reply), ServerSettings(), Metrics(), "Stream").serve
    add_service(server, pb.DESCRIPTOR.services_by_name["ForecastService"], lambda _: handler, passthrough=("Stream",))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"stream_floor: listening on port {port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0.5)


def cell(server: Server, model: pb.DescribeModelResponse, sessions: int, events: int) -> dict[str, Any]:
    """One client process against ``server``: its JSON line, with the server's CPU ms an event."""
    pids = server.processes()
    before = sum(cpu_seconds(p) for p in pids.values())
    cmd = [sys.executable, "-m", "bench.stream_client", "--target", server.address, "--channels", "1",
           "--num-marks", str(model.num_marks), "--value-width", str(model.value_width),
           "--sessions", str(sessions), "--events", str(events)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    cpu = sum(cpu_seconds(p) for p in pids.values()) - before
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    res: dict[str, Any] = json.loads(lines[-1]) if lines else {"errors": 1, "events": 0, "stderr": proc.stderr[-500:]}
    res.update(server=server.name, cpu_ms=cpu / res["events"] * 1e3 if res["events"] else None, rc=proc.returncode)
    return res


#: What each server's CPU an event is compared with: the layer it adds to.
BELOW = {"loop": "bare", "echo": "bare", "aaren f0": "loop"}


def report(cells: list[dict[str, Any]], names: list[str], levels: list[int]) -> list[str]:
    """The table: each server's events/s and CPU an event, and what it adds to the layer below it
    (``BELOW``), rep by rep."""
    lines = [
        "| sessions | server | events/s all-active | server CPU ms an event | over | its CPU - that one's, ms |",
        "|---:|---|---:|---:|---|---:|",
    ]
    for level in levels:
        at = [c for c in cells if c["sessions"] == level]
        for name in names:
            mine = [c for c in at if c["server"] == name]
            below = BELOW.get(name)
            diffs = [
                c["cpu_ms"] - b["cpu_ms"]
                for c in mine
                for b in at
                if b["server"] == below and b["rep"] == c["rep"] and None not in (c["cpu_ms"], b["cpu_ms"])
            ]
            lines.append(
                f"| {level} | {name} | {span([c['all_active_ev_per_s'] for c in mine])} "
                f"| {span([c['cpu_ms'] for c in mine], '{:.4f}')} | {below or '-'} | {span(diffs, '{:+.4f}')} |"
            )
    return lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--serve", choices=("bare", "loop"), help=argparse.SUPPRESS)  # a server process of this run
    p.add_argument("--reply-marks", type=int, default=5, help=argparse.SUPPRESS)
    p.add_argument("--reply-values", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="smoke run: 1 rep, 1 and 4 sessions, 30 events")
    p.add_argument("--levels", default=None, help="comma list of sessions (default 1,16,64)")
    p.add_argument("--reps", type=int, default=None, help="default 3 (quick: 1)")
    p.add_argument("--events", type=int, default=None, help="events per session (default 400; quick 30)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="output folder")
    a = p.parse_args(argv)
    a.levels = [int(x) for x in (a.levels or ("1,4" if a.quick else "1,16,64")).split(",")]
    a.reps = a.reps or (1 if a.quick else 3)
    a.events = a.events or (30 if a.quick else 400)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.serve:
        event_loop.run(serve(a.serve, reply_bytes(a.reply_marks, a.reply_values)))  # aaren serve's default loop
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    servers: list[Server] = []
    cells: list[dict[str, Any]] = []
    try:
        servers.append(start_aaren(0, a.out / "stream_floor-aaren.log", name="aaren f0"))
        model = describe(servers[0].address)
        for kind in ("bare", "loop"):
            cmd = [sys.executable, "-m", "bench.stream_floor", "--serve", kind,
                   "--reply-marks", str(model.num_marks), "--reply-values", str(model.value_width)]  # fmt: skip
            servers.insert(-1, Server(kind, cmd, READY, a.out / f"stream_floor-{kind}.log"))
        servers.insert(-1, start_echo(model, a.out / "stream_floor-echo.log"))  # the layers in order, aaren last
        for server in servers:  # warm-up, uncounted
            cell(server, model, min(16, max(a.levels)), 30)
        for rep in range(a.reps):
            for level in a.levels:
                for server in servers[rep % len(servers) :] + servers[: rep % len(servers)]:
                    res = cell(server, model, level, a.events)
                    cells.append({**res, "rep": rep})
                    print(f"  {level:3d} {server.name:<9} rep {rep}: {res.get('all_active_ev_per_s')} ev/s, "
                          f"cpu {res['cpu_ms']} ms/event, errors {res['errors']}", flush=True)  # fmt: skip
    finally:
        for server in servers:
            server.stop()
    text = "\n".join(["# bench/stream_floor.py", "", *report(cells, [s.name for s in servers], a.levels), ""])
    print(text)
    (a.out / "stream_floor.md").write_text(text)
    (a.out / "stream_floor.json").write_text(json.dumps(cells, indent=1))
    return 1 if any(c["errors"] or c["rc"] for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
