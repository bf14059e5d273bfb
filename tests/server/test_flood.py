"""A tenant that floods events and opens too many streams is refused (RESOURCE_EXHAUSTED) while a
well-behaved tenant on the same server keeps its p99 latency within 2x of its unloaded value.

The server and the flooder run in processes of their own (no GIL shared with the measuring client).
The flooder pipelines its writes (it never waits for an answer), so only the server's limits and
flow control hold it back. Generous on purpose: exact figures belong to bench/soak.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
from server_helpers import OpenStream, ServerProcess, assert_forecast, ev, stub_for

from aaren.server.auth import hash_token, new_token

FLOOD_CLIENT = Path(__file__).with_name("flood_client.py")


def p99_of_paced_requests(stream: OpenStream, session: str, start_seq: int, n: int) -> tuple[float, int]:
    latencies = []
    for i in range(n):
        seq = start_seq + i
        sent = time.perf_counter()
        result = stream.send([ev(session, seq, float(seq))]).results[0]
        latencies.append(time.perf_counter() - sent)
        assert_forecast(result, session, seq)
        time.sleep(0.01)  # about 100 events/s: well inside the tenant's rate
    return float(np.percentile(latencies, 99)), start_seq + n


def test_flooding_tenant_is_refused_and_others_keep_their_latency(tmp_path, tiny_checkpoint):
    tokens = {"flooder": new_token(), "good": new_token()}
    token_file = tmp_path / "tokens.txt"
    token_file.write_text("".join(f"{t} {hash_token(v)}\n" for t, v in tokens.items()))
    server = ServerProcess(
        tmp_path / "server.log",
        checkpoint=tiny_checkpoint,
        auth_tokens_file=token_file,
        tenant_events_per_s=500,
        tenant_burst_events=500,
        max_streams_per_tenant=4,
    )
    try:
        with grpc.insecure_channel(server.address) as channel:
            good = OpenStream(stub_for(channel), metadata=[("authorization", f"Bearer {tokens['good']}")])
            p99_of_paced_requests(good, "g", 1, 30)  # warm up
            unloaded, seq = p99_of_paced_requests(good, "g", 31, 150)

            flooder = subprocess.Popen(
                [sys.executable, str(FLOOD_CLIENT), server.address, tokens["flooder"], "4", "4", "6"],
                stdout=subprocess.PIPE,
                text=True,
            )
            time.sleep(0.5)
            loaded, _ = p99_of_paced_requests(good, "g", seq, 150)
            out, _ = flooder.communicate(timeout=60)
            good.close()
        seen = json.loads(out)
    finally:
        server.stop()

    print(f"unloaded p99 {unloaded * 1e3:.2f} ms, loaded {loaded * 1e3:.2f} ms, flooder {seen}")
    assert seen.get("tenant_rate_limited", 0) > 0, seen
    assert seen.get("accepted", 0) > 0, seen
    assert seen.get("extra_stream:RESOURCE_EXHAUSTED:tenant_stream_limit", 0) == 6, seen
    # The floor absorbs scheduling noise of three busy processes on two cores (seen: 9 -> 20 ms in a
    # CI run of an earlier, gentler flooder). Without the limits this flood puts the p99 at 50-60 ms
    # against 3 ms unloaded (measured), so the bound still tells a fair server from an unfair one.
    bound = 2 * max(unloaded, 0.015)
    assert loaded <= bound, f"p99 {loaded * 1e3:.2f} ms under the flood vs {unloaded * 1e3:.2f} ms unloaded"
