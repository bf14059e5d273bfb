"""What the front end <-> engine core IPC costs: packing, framing and a unix-socket round trip.

The IPC (``aaren.server.ipc``: ``packing``, ``framing``) sends the requests a front end received in one loop turn as one
frame of concatenated columns, and the outcomes of one batch back as one frame. This measures,
per event, for the two shapes that matter (many one-event requests; one request of many events):

- ``pack+frame``: ``pack_requests`` then ``framing.dumps`` (MessagePack, front end), ``framing.loads``
  then ``unpack_requests`` (core), and the same for the outcomes on the way back;
- ``pack+pickle``: the same packed columns pickled instead, as the frames were before they carried
  plain values only (for comparison: the socket no longer unpickles anything);
- ``round trip``: the frames written to and read back from a real unix socket pair by asyncio
  streams (both ends in this process, so it is the syscalls and the event loop, not a second core);
- against ``per-object pickle``: pickling each ``CoreRequest`` / ``Outcomes`` on its own, the naive
  alternative the packing replaces.

Run from the repository root::

    python -m bench.ipc             # a few seconds
    python -m bench.ipc --repeat 2000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import socket
import tempfile
import time

import numpy as np

from aaren.server.contract.columns import FORECAST, Outcomes
from aaren.server.frontends.streams import EventChecker
from aaren.server.ipc.framing import dumps, loads, read_frame, write_frame
from aaren.server.ipc.packing import pack_outcomes, pack_requests, unpack_outcomes, unpack_requests

MARKS = 16
VALUES = ("v0", "v1")


def requests_of(shape: str) -> list:
    checker = EventChecker(MARKS, VALUES, 256)
    if shape == "64 x 1 event":
        return [
            (i, checker.request([f"s{i}"], [7], [100.0 + i], [i % MARKS], [[0.5, -1.0]], top_k=3, tenant=""))
            for i in range(64)
        ]
    n = 64
    ids, seqs, times = [f"s{k}" for k in range(n)], list(range(1, n + 1)), [float(k) for k in range(n)]
    return [(0, checker.request(ids, seqs, times, [k % MARKS for k in range(n)], [[0.5, -1.0]] * n, top_k=3))]


def outcomes_of(requests: list) -> list:
    out = []
    for rid, r in requests:
        n = r.n
        outputs = {
            "time_mean": np.random.rand(n),
            "time_quantiles": np.random.rand(n, 3).astype(np.float32),
            "top_marks": np.tile(np.arange(MARKS), (n, 1)),
            "top_probs": np.random.rand(n, MARKS).astype(np.float32),
            "value_mean": np.random.rand(n, 2).astype(np.float32),
            "value_std": np.random.rand(n, 2).astype(np.float32),
        }
        kind = np.full(n, FORECAST, np.int8)
        out.append((rid, Outcomes(kind, np.zeros(n, np.int64), {}, np.arange(n), outputs)))
    return out


def timed(fn, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat


async def round_trip(frames: list[tuple], repeat: int) -> float:
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "bench.sock")
    echoed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(repeat):
            frame = await read_frame(reader)
            write_frame(writer, frame)
        echoed.set()

    server = await asyncio.start_unix_server(serve, path=path)
    reader, writer = await asyncio.open_unix_connection(path)
    started = time.perf_counter()
    for _ in range(repeat):
        write_frame(writer, frames[0])
        await read_frame(reader)
    elapsed = time.perf_counter() - started
    await echoed.wait()
    writer.close()
    server.close()
    os.unlink(path)
    os.rmdir(folder)
    return elapsed / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=500)
    args = parser.parse_args()
    rows = []
    for shape in ("64 x 1 event", "1 x 64 events"):
        requests = requests_of(shape)
        outcomes = outcomes_of(requests)
        n_events = sum(r.n for _, r in requests)

        def there_and_back(requests: list = requests, outcomes: list = outcomes) -> None:
            unpack_requests(loads(dumps(["submit", pack_requests(requests)]))[1])
            unpack_outcomes(loads(dumps(["results", pack_outcomes(outcomes)]))[1])

        def pickled(requests: list = requests, outcomes: list = outcomes) -> None:
            unpack_requests(pickle.loads(pickle.dumps(pack_requests(requests), protocol=5)))
            unpack_outcomes(pickle.loads(pickle.dumps(pack_outcomes(outcomes), protocol=5)))

        def naive(requests: list = requests, outcomes: list = outcomes) -> None:
            pickle.loads(pickle.dumps(requests, protocol=5))
            pickle.loads(pickle.dumps(outcomes, protocol=5))

        packed = timed(there_and_back, args.repeat)
        packed_pickle = timed(pickled, args.repeat)
        per_object = timed(naive, args.repeat)
        frame = ["submit", pack_requests(requests)]
        trip = asyncio.run(round_trip([frame], args.repeat))
        back = ["results", pack_outcomes(outcomes)]
        size = len(dumps(frame)) + len(dumps(back))
        per_event = [t * 1e6 / n_events for t in (packed, packed_pickle, per_object)]
        rows.append((shape, *per_event, trip * 1e6, size / n_events))
    socket_note = "unix socket" if hasattr(socket, "AF_UNIX") else "?"
    print(f"IPC costs ({socket_note}, {args.repeat} repeats; µs per event unless said)\n")
    print(
        "| shape | pack+frame both ways | pack+pickle both ways | per-object pickle both ways "
        "| request frame round trip (µs per frame) | bytes per event both ways |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for shape, packed, packed_pickle, per_object, trip, size in rows:
        print(f"| {shape} | {packed:.2f} | {packed_pickle:.2f} | {per_object:.2f} | {trip:.0f} | {size:.0f} |")


if __name__ == "__main__":
    main()
