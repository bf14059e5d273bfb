"""Where one session's event spends its wall time inside ``aaren serve``: the segments of a round trip.

    python -m bench.timeline                          # 3,000 events of one session, the bundled model
    python -m bench.timeline --events 200 --checkpoint PATH --out DIR

A server runs in a child process (``--frontends 0``, the in-memory store, plaintext) with a time stamp
taken at fixed points of an event's path: the project's functions are wrapped at start, nothing else in
the server changes. One client session (``bench.stream_client``) streams the events, one a message, each
after the last reply; a first run warms the server and is not counted. The points, in order:

- ``wake``: the request is handed to the stream (``decode`` entered), the first work after the wait;
- ``read``: after a fixed Python loop (the *probe*, ``PROBE_ITEMS`` additions) run right there;
- ``decoded``: the request read into its columns; ``probed``: after the probe run again;
- ``flush``: the loop turn's group submitted to the core (``Gather.flush``);
- ``batch``: its batch started; ``settled``: the batch's outcomes handed out; ``batched``: the batch over;
- ``answer`` and ``answered``: the group's replies made (``Gather._answer``);
- ``finish``: the reply handed to gRPC (``StreamLoop._finish``); then the next request's ``wake`` (the send,
  the client's turn and the next read). Apart: the send alone, from the reply's ``yield`` until gRPC
  resumes the writer (the next request may come before it).

Printed as a Markdown table (written to ``OUT/timeline.md`` and ``.json`` with ``--out``): each
segment's mean in microseconds over the counted events, and the probe's time in a warm loop of the same
process. ``wake -> read`` against ``decoded -> probed`` is the same loop as the first work after the
server waited and again once it runs: how much slower the first work after a wait is on this machine.
These are wall times of one machine at one moment: compare segments of one run, never runs.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["CHAIN", "PROBE_ITEMS", "main"]

#: the points of one round trip, in the order an event passes them (the last one leads to the next ``wake``)
CHAIN = ("wake", "read", "decoded", "probed", "flush", "batch", "settled", "batched", "answer", "answered", "finish")
#: additions in the probe loop
PROBE_ITEMS = 300
READY = "aaren: listening on port"
ROOT = Path(__file__).resolve().parent.parent


def _probe() -> int:
    total = 0
    for i in range(PROBE_ITEMS):
        total += i
    return total


class Timeline:
    """Stamps of the current round trip; the sums and counts of each segment ``(from, to)`` so far."""

    def __init__(self) -> None:
        self.stamps: list[tuple[str, float]] = []
        self.sums: dict[tuple[str, str], float] = collections.defaultdict(float)
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        #: the sends: from the reply's ``yield`` until gRPC resumes the writer (outside the chain: the next
        #: request may come first)
        self.sends = 0.0
        self.n_sends = 0

    def stamp(self, label: str) -> None:
        self.stamps.append((label, time.perf_counter()))

    def wake(self) -> None:
        """A request came: the last round trip's segments are counted and a new one starts."""
        now = time.perf_counter()
        chain = [*self.stamps, ("wake", now)]
        if self.stamps:
            for (a, ta), (b, tb) in itertools.pairwise(chain):
                self.sums[(a, b)] += tb - ta
                self.counts[(a, b)] += 1
        self.stamps = [("wake", now)]

    def reset(self) -> None:
        self.sums.clear()
        self.counts.clear()
        self.sends, self.n_sends = 0.0, 0
        self.stamps = []  # the next request starts a round trip: none ends across the pause between clients

    def result(self) -> dict[str, Any]:
        warm = min(_timed(_probe) for _ in range(200))
        segments = [
            {"from": a, "to": b, "n": self.counts[(a, b)], "mean_us": 1e6 * self.sums[(a, b)] / self.counts[(a, b)]}
            for (a, b) in self.sums
        ]
        send = {"n": self.n_sends, "mean_us": 1e6 * self.sends / self.n_sends if self.n_sends else None}
        return {"segments": segments, "send": send, "warm_probe_us": 1e6 * warm}


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _wrap(timeline: Timeline, owner: type, name: str, before: str, after: str | None = None) -> None:
    """Stamp ``before`` as ``owner.name`` is entered and ``after`` as it returns."""
    fn = getattr(owner, name)
    if inspect.iscoroutinefunction(fn):

        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            timeline.stamp(before)
            out = await fn(*args, **kwargs)
            if after:
                timeline.stamp(after)
            return out

        setattr(owner, name, wrapped_async)
        return

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        timeline.stamp(before)
        out = fn(*args, **kwargs)
        if after:
            timeline.stamp(after)
        return out

    setattr(owner, name, wrapped)


def serve(address: str, dump: Path, checkpoint: str | None) -> None:
    """The server with its stamps; SIGUSR2 forgets what was counted, SIGUSR1 writes ``dump`` and exits."""
    from aaren.server.app import run
    from aaren.server.core.batcher import Batcher
    from aaren.server.frontends.aaren_v1.gather import Gather
    from aaren.server.frontends.aaren_v1.servicer import ForecastServicer
    from aaren.server.frontends.streams import StreamLoop
    from aaren.server.settings import ServerSettings

    timeline = Timeline()
    decode = ForecastServicer.decode

    def stamped_decode(self: ForecastServicer, *args: Any, **kwargs: Any) -> Any:
        timeline.wake()
        _probe()
        timeline.stamp("read")
        out = decode(self, *args, **kwargs)
        timeline.stamp("decoded")
        _probe()
        timeline.stamp("probed")
        return out

    ForecastServicer.decode = stamped_decode  # type: ignore[method-assign]
    _wrap(timeline, Gather, "flush", "flush")
    _wrap(timeline, Batcher, "_run_batch", "batch", "batched")
    _wrap(timeline, Batcher, "_settle", "settled")
    _wrap(timeline, Gather, "_answer", "answer", "answered")
    _wrap(timeline, StreamLoop, "_finish", "finish")
    serve_stream = StreamLoop.serve

    async def stamped_serve(self: StreamLoop, requests: Any, context: Any) -> Any:
        async for reply in serve_stream(self, requests, context):
            started = time.perf_counter()
            yield reply
            timeline.sends += time.perf_counter() - started
            timeline.n_sends += 1

    StreamLoop.serve = stamped_serve  # type: ignore[method-assign,assignment]

    def write(*_: object) -> None:
        dump.write_text(json.dumps(timeline.result()))
        os._exit(0)

    signal.signal(signal.SIGUSR1, write)
    signal.signal(signal.SIGUSR2, lambda *_: timeline.reset())
    args = ["--frontends", "0", "--address", address, "--metrics-port", "-1", "--log-level", "WARNING"]
    if checkpoint:
        args += ["--checkpoint", checkpoint]
    run(ServerSettings(_cli_parse_args=args))  # type: ignore[call-arg]


def _client(address: str, events: int, tag: str, num_marks: int, width: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.stream_client", "--target", address, "--sessions", "1", "--events",
           str(events), "--num-marks", str(num_marks), "--value-width", str(width), "--tag", tag]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"the client failed: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def report(result: dict[str, Any], client: dict[str, Any]) -> str:
    """The segments in ``CHAIN``'s order, as a Markdown table."""
    order = {label: i for i, label in enumerate(CHAIN)}
    rows = sorted(result["segments"], key=lambda s: order.get(s["from"], len(CHAIN)))
    total = sum(s["mean_us"] for s in rows)
    lines = [
        f"One session, {client['events']} events, one a message (`python -m bench.timeline`): the client's round "
        f"trip mean {1000 * client['mean_ms']:.0f} µs, p50 {1000 * client['p50_ms']:.0f} µs.",
        "",
        "| segment | events | mean µs | share |",
        "|---|---:|---:|---:|",
        *[
            f"| {s['from']} -> {s['to']} | {s['n']} | {s['mean_us']:.1f} | {100 * s['mean_us'] / total:.1f} % |"
            for s in rows
        ],
        f"| the round trip | | {total:.1f} | 100 % |",
        "",
        f"Of `finish -> wake`, the send (from the reply's `yield` until gRPC resumes the writer): "
        f"{result['send']['mean_us']:.1f} µs over {result['send']['n']} replies.",
        "",
        f"The probe ({PROBE_ITEMS} additions): {result['warm_probe_us']:.1f} µs in a warm loop of the server's "
        "process.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--events", type=int, default=3000, help="counted events (one session)")
    p.add_argument("--warmup", type=int, default=300, help="events before the count")
    p.add_argument("--checkpoint", default=None, help="serve this checkpoint (default: the bundled model)")
    p.add_argument("--out", type=Path, default=None, help="write timeline.md and timeline.json here")
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dump", type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        serve(a.serve, a.dump, a.checkpoint)
        return 0
    from bench.harness import Server, describe

    with tempfile.TemporaryDirectory(prefix="aaren-timeline-") as tmp:
        dump = Path(tmp) / "timeline.json"
        cmd = [sys.executable, "-m", "bench.timeline", "--serve", "127.0.0.1:0", "--dump", str(dump)]
        if a.checkpoint:
            cmd += ["--checkpoint", a.checkpoint]
        server = Server("aaren f0", cmd, READY + r" (\d+)", Path(tmp) / "server.log", env={"AAREN_PLAINTEXT": "true"})
        try:
            model = describe(server.address)
            _client(server.address, a.warmup, "timeline-warmup", model.num_marks, model.value_width)
            server.proc.send_signal(signal.SIGUSR2)
            time.sleep(0.2)
            client = _client(server.address, a.events, "timeline", model.num_marks, model.value_width)
            server.proc.send_signal(signal.SIGUSR1)
            server.proc.wait(60)
            result = json.loads(dump.read_text())
        finally:
            server.stop()
    text = report(result, client)
    print(text)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "timeline.md").write_text(text + "\n")
        (a.out / "timeline.json").write_text(json.dumps({"client": client, **result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
