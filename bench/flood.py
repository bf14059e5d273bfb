"""Flood benchmark: a well-behaved tenant's latency while another tenant floods the same server.

One server (``aaren serve``, a subprocess, the bundled model unless ``--checkpoint``, in-memory
sessions, two tenants with tokens) and, in a process of its own, the hostile client of the tests
(``tests/server/flood_client.py``: pipelined writes on ``--flood-streams`` streams, each message 64
new sessions, plus extra streams over the tenant's stream limit). The good tenant sends one event
per message, awaiting each answer, paced at ``--good-rate`` events/s; a message's latency runs from
just before the write to its answer. Phases, in one run so that they compare like with like on
these shared machines: the good tenant alone, then under the flood; once with the tenant limits
(``--tenant-events-per-s``, 4 streams per tenant) and once without (every limit off), so the
ratio loaded/alone shows what the limits buy. tests/server/test_flood.py asserts what each tenant
is served and refused; the times are here.

    python -m bench.flood                      # from the repository root
    python -m bench.flood --events 500 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np

from aaren.server.security.auth import hash_token, new_token
from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc
from bench.service import ROOT, Subprocess

FLOOD_CLIENT = ROOT / "tests" / "server" / "flood_client.py"
_END = object()


class StalledError(Exception):
    """The server did not answer one event within the answer timeout."""


class GoodStream:
    """One Stream call of the good tenant: ``send`` one event and wait for its answer."""

    def __init__(self, address: str, token: str, answer_timeout_s: float) -> None:
        self.channel = grpc.insecure_channel(address)
        self.answer_timeout_s = answer_timeout_s
        self._requests: queue.Queue[object] = queue.Queue()
        stub = pb_grpc.ForecastServiceStub(self.channel)
        self._call = stub.Stream(iter(self._requests.get, _END), metadata=(("authorization", f"Bearer {token}"),))
        self._answers: queue.Queue[pb.StreamResponse | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.seq = 0

    def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError):  # cancelled by close
            for answer in self._call:
                self._answers.put(answer)
        self._answers.put(None)

    def send(self) -> tuple[float, bool]:
        """The latency of one event of session ``g`` and whether it was answered with a forecast."""
        self.seq += 1
        event = pb.Event(session_id="g", seq=self.seq, time=float(self.seq), mark=0, values=[0.0, 0.0])
        sent = time.perf_counter()
        self._requests.put(pb.StreamRequest(request_id=str(self.seq), events=[event]))
        try:
            answer = self._answers.get(timeout=self.answer_timeout_s)
        except queue.Empty:
            raise StalledError from None
        latency = time.perf_counter() - sent
        if answer is None:
            raise RuntimeError(f"the good tenant's stream ended: {self._call.code()} {self._call.details()}")
        served = not answer.HasField("request_error") and answer.results[0].WhichOneof("outcome") == "forecast"
        if not served:
            self.seq -= 1  # refused: the same seq goes again
        return latency, served

    def close(self) -> None:
        self._call.cancel()
        self._requests.put(_END)
        self.channel.close()


def paced(stream: GoodStream, n: int, rate: float) -> dict[str, float]:
    """``n`` events at about ``rate`` events/s: latency percentiles in ms, the refused count, and
    how many were answered before one waited longer than the stream's answer timeout."""
    latencies, refused = [], 0
    for _ in range(n):
        try:
            latency, served = stream.send()
        except StalledError:
            break
        latencies.append(latency)
        refused += not served
        time.sleep(max(0.0, 1.0 / rate - latency))
    ms = np.array(latencies or [np.nan]) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "refused": refused,
        "answered": len(latencies),
    }


def start_server(args: argparse.Namespace, token_file: Path, limits: bool, out: Path) -> tuple[Subprocess, str]:
    exe = Path(sys.executable).parent / "aaren"
    cmd = [str(exe), "serve", "--address", "127.0.0.1:0", "--metrics-port", "-1", "--device", "cpu"]
    cmd += ["--auth-tokens-file", str(token_file)]
    if args.checkpoint:
        cmd += ["--checkpoint", str(args.checkpoint)]
    if limits:
        cmd += ["--tenant-events-per-s", str(args.tenant_events_per_s)]
        cmd += ["--tenant-burst-events", str(args.tenant_events_per_s), "--max-streams-per-tenant", "4"]
    name = "limits" if limits else "no-limits"
    server = Subprocess(name, cmd, r"listening on port (\d+)", out / f"flood-{name}.log")
    return server, f"127.0.0.1:{server.match.group(1)}"


def one_round(args: argparse.Namespace, tokens: dict[str, str], token_file: Path, limits: bool, out: Path) -> dict:
    server, address = start_server(args, token_file, limits, out)
    try:
        good = GoodStream(address, tokens["good"], args.answer_timeout_s)
        paced(good, args.warmup, args.good_rate)
        alone = paced(good, args.events, args.good_rate)
        flooder = subprocess.Popen(
            [sys.executable, str(FLOOD_CLIENT), address, tokens["flooder"], "600", str(args.flood_streams), "2"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(args.flood_lead_s)  # the flood is under way before the good tenant measures
        flooded = paced(good, args.events, args.good_rate)
        flood_out, _ = flooder.communicate("", timeout=120)
        good.close()
    finally:
        server.stop()
    return {"alone": alone, "flooded": flooded, "flooder": json.loads(flood_out)}


COLUMNS = ("server", "phase", "p50 ms", "p99 ms", "max ms", "good answered", "good refused", "p99 x alone")


def table(rounds: dict[str, list[dict]]) -> str:
    """Medians over rounds, per server setting and phase; then what the flooder got."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    floods = []
    for name, runs in rounds.items():
        ratio = float(np.median([r["flooded"]["p99_ms"] / r["alone"]["p99_ms"] for r in runs]))
        for phase in ("alone", "flooded"):
            med = {k: float(np.median([r[phase][k] for r in runs])) for k in runs[0][phase]}
            cells = [name, phase, f"{med['p50_ms']:.2f}", f"{med['p99_ms']:.2f}", f"{med['max_ms']:.2f}"]
            cells += [f"{med['answered']:.0f}", f"{med['refused']:.0f}", f"{ratio:.2f}" if phase == "flooded" else ""]
            lines.append("| " + " | ".join(cells) + " |")
        floods.append(f"{name}: flooder got {runs[-1]['flooder']} (last round)")
    return "\n".join([*lines, "", *floods])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="model directory (default: the bundled one)")
    parser.add_argument("--events", type=int, default=300, help="good events measured per phase")
    parser.add_argument("--warmup", type=int, default=50, help="good events before measuring")
    parser.add_argument("--good-rate", type=float, default=100.0, help="the good tenant's events/s")
    parser.add_argument("--tenant-events-per-s", type=int, default=500, help="each tenant's rate (and burst)")
    parser.add_argument("--flood-streams", type=int, default=4, help="the flooder's streams")
    parser.add_argument("--flood-lead-s", type=float, default=0.5, help="flood time before the good tenant measures")
    parser.add_argument(
        "--answer-timeout-s", type=float, default=10.0, help="a phase ends when one event waits longer than this"
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds per setting, alternating which goes first")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    tokens = {"flooder": new_token(), "good": new_token()}
    rounds: dict[str, list[dict]] = {"tenant limits": [], "no limits": []}
    with tempfile.TemporaryDirectory(prefix="aaren-flood-") as tmp:
        out = Path(tmp)
        token_file = out / "tokens.txt"
        token_file.write_text("".join(f"{t} {hash_token(v)}\n" for t, v in tokens.items()))
        for i in range(args.rounds):
            order = [True, False] if i % 2 == 0 else [False, True]
            for limits in order:
                result = one_round(args, tokens, token_file, limits, out)
                rounds["tenant limits" if limits else "no limits"].append(result)
    print(f"# flood benchmark, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}")
    print(
        f"good tenant: 1 event per message at {args.good_rate:g}/s, {args.events} measured per phase; flooder: "
        f"{args.flood_streams} pipelined streams of 64-event messages; {args.rounds} round(s), medians\n"
    )
    print(table(rounds))


if __name__ == "__main__":
    main()
