"""Load client of the TorchServe peer, with the accounting of aaren's own (``bench.accounting``).

N concurrent sessions, each one bidi ``StreamPredictions2`` stream with its own ``sequence_id``, sending E
events in order, one per request (``D`` float32 from seed 1000 + the session's index), waiting for each
reply (``OUT`` float32) before the next write. Prints one JSON line (the fields of ``bench.accounting``,
and with ``--verify K`` ``verify_maxabsdiff``: the largest difference between the first K sessions'
replies and a local run of the same model over each whole sequence, about 4e-7 when the server keeps
each sequence's state right). Exit 0; 1 when a reply was an error or a stream ended early; 2 when
``--verify`` differs by more than 1e-4.

Run it with the work folder's Python:  WORKDIR/venv/bin/python client.py --work WORKDIR --sessions 16
The stubs come from WORKDIR/gen (setup.sh); the address from WORKDIR/grpc_address (start.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True  # write nothing into the checkout from the kit's venv
KIT = Path(__file__).resolve().parent
REPO = KIT.parents[2]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--work", type=Path, default=os.environ.get("TS_WORK"), help="the folder setup.sh made ($TS_WORK)")
    p.add_argument("--target", help="host:port (default: WORKDIR/grpc_address)")
    p.add_argument("--model", default="aaren")
    p.add_argument("--sessions", type=int, default=1)
    p.add_argument("--events", type=int, default=500, help="events per session")
    p.add_argument("--tag", help="sequence id prefix, new for each run against one server (default: unique)")
    p.add_argument("--label", default="")
    p.add_argument("--verify", type=int, default=0, metavar="K", help="check the first K sessions' replies")
    a = p.parse_args(argv)
    if a.work is None or not (Path(a.work) / "gen" / "inference_pb2.py").is_file():
        p.error(f"--work {a.work}: no stubs there; run setup.sh WORKDIR first")
    a.work = Path(a.work).resolve()
    if a.target is None:
        address = a.work / "grpc_address"
        if not address.is_file():
            p.error(f"no --target and no {address}: start TorchServe first (start.sh {a.work})")
        a.target = address.read_text().strip()
    a.tag = a.tag or f"run{time.time_ns() % 10**12}-{os.getpid()}"  # a reused id would go on from old state
    return a


async def session(stub: Any, a: argparse.Namespace, index: int, xs: Any, tally: Any, outs: list[bytes]) -> None:
    """Session ``index``: its events ``xs [E, D]`` one per request; replies into ``outs``, numbers into ``tally``."""
    import inference_pb2 as pb

    from bench.accounting import one_session

    sid = f"{a.tag}-s{index}"
    requests = [pb.PredictionsRequest(model_name=a.model, sequence_id=sid, input={"data": x.tobytes()}) for x in xs]

    def problem(reply: Any) -> str | None:
        if reply.HasField("status") and reply.status.code != 0:
            return reply.status.message
        outs.append(reply.prediction)
        return None

    await one_session(stub.StreamPredictions2(), requests, problem, tally)


def verify(xs: list[Any], outs: list[list[bytes]], k: int) -> tuple[float, int]:
    """The largest |served - local| over the first ``k`` sessions, and how many replies were compared."""
    import numpy as np
    import torch
    from peer_model import PeerModel

    torch.set_num_threads(1)
    model, worst, n = PeerModel(seed=0), 0.0, 0
    for x, replies in zip(xs[:k], outs[:k], strict=True):
        state = PeerModel.initial_state(1)
        for t, raw in enumerate(replies):
            y, state = model.step(torch.from_numpy(x[t : t + 1]), state)
            worst = max(worst, float(np.abs(np.frombuffer(raw, np.float32) - y[0].numpy()).max()))
            n += 1
    return worst, n


async def run(a: argparse.Namespace) -> int:
    import grpc
    import inference_pb2_grpc as pb_grpc
    import numpy as np
    from peer_model import D

    from bench.accounting import Tally, single_summary

    xs = [np.random.default_rng(1000 + i).standard_normal((a.events, D)).astype(np.float32) for i in range(a.sessions)]
    tally, outs = Tally(), [[] for _ in range(a.sessions)]
    async with grpc.aio.insecure_channel(a.target) as channel:
        stub = pb_grpc.InferenceAPIsServiceStub(channel)
        t0 = time.perf_counter()
        await asyncio.gather(*(session(stub, a, i, xs[i], tally, outs[i]) for i in range(a.sessions)))
        wall = time.perf_counter() - t0
    result: dict[str, object] = dict(label=a.label, target=a.target, sessions=a.sessions, events_per_session=a.events)
    result.update(single_summary(tally, t0, wall))
    if a.verify:
        result["verify_maxabsdiff"], result["verify_events"] = verify(xs, outs, min(a.verify, a.sessions))
    print(json.dumps(result), flush=True)
    if tally.errors:
        return 1
    return 2 if a.verify and float(result["verify_maxabsdiff"]) > 1e-4 else 0  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    sys.path[:0] = [str(a.work / "gen"), str(KIT), str(REPO)]  # the stubs, the peer's model, bench.accounting
    return asyncio.run(run(a))


if __name__ == "__main__":
    sys.exit(main())
