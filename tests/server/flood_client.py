"""A hostile client for tests/server/test_flood.py, run as its own process: it floods events on
several streams and opens more streams than its tenant may, then prints what it got as JSON.

    python flood_client.py ADDRESS TOKEN SECONDS STREAMS EXTRA_STREAMS
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter

import grpc

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc


async def flood(
    stub: aaren_pb2_grpc.ForecastServiceStub, metadata: tuple, stream: int, until: float, seen: Counter
) -> None:
    call = stub.Stream(metadata=metadata)
    seq = 0
    try:
        while time.monotonic() < until:
            seq += 1
            events = [
                pb.Event(session_id=f"f{stream}-{k}", seq=seq, time=float(seq), mark=0, values=[0.0, 0.0])
                for k in range(64)
            ]
            await call.write(pb.StreamRequest(request_id=str(seq), events=events))
            response = await call.read()
            if response.HasField("request_error"):
                seen[response.request_error.reason] += 1
                seq -= 1  # nothing of it was accepted
            else:
                seen["accepted"] += 1
        await call.done_writing()
    except grpc.aio.AioRpcError as exc:
        seen[f"stream:{exc.code().name}"] += 1
    finally:
        call.cancel()


async def extra_stream(stub: aaren_pb2_grpc.ForecastServiceStub, metadata: tuple, seen: Counter) -> None:
    call = stub.Stream(metadata=metadata)
    try:
        await call.write(
            pb.StreamRequest(request_id="x", events=[pb.Event(session_id="x", seq=1, time=1.0, values=[0.0, 0.0])])
        )
        await call.read()
        seen["extra_stream_opened"] += 1
    except grpc.aio.AioRpcError as exc:
        reason = dict(exc.trailing_metadata() or ()).get("aaren-error-reason", "")
        seen[f"extra_stream:{exc.code().name}:{reason}"] += 1
    finally:
        call.cancel()


async def main(address: str, token: str, seconds: float, streams: int, extra: int) -> None:
    metadata = (("authorization", f"Bearer {token}"),)
    seen: Counter = Counter()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = aaren_pb2_grpc.ForecastServiceStub(channel)
        until = time.monotonic() + seconds
        floods = [asyncio.create_task(flood(stub, metadata, i, until, seen)) for i in range(streams)]
        await asyncio.sleep(0.3)
        await asyncio.gather(*(extra_stream(stub, metadata, seen) for _ in range(extra)))
        await asyncio.gather(*floods)
    print(json.dumps(dict(seen)), flush=True)


if __name__ == "__main__":
    address, token, seconds, streams, extra = sys.argv[1:6]
    asyncio.run(main(address, token, float(seconds), int(streams), int(extra)))
