"""A tenant that floods events and opens too many streams is refused (RESOURCE_EXHAUSTED, with a
reason and a retry hint) while a well-behaved tenant on the same server has every event served.

The server and the flooder run in processes of their own. The flooder pipelines its writes (it
never waits for an answer), so only the server's limits and flow control hold it back. What is
asserted is what each tenant was served and refused, never how fast: that cannot flake with the
machine's load. The latencies under the flood are a benchmark, ``python -m bench.flood``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
from server_helpers import OpenStream, ServerProcess, assert_forecast, ev, metric, scrape, stub_for, wait_until

from aaren.server.security.auth import hash_token, new_token

FLOOD_CLIENT = Path(__file__).with_name("flood_client.py")
RATE, BURST = 500, 500
#: The well-behaved tenant's events, one per message, each awaited before the next: fewer than its
#: burst, so its own quota can never refuse one, however the machine schedules the processes.
GOOD_EVENTS = 200
#: Streams the flooder opens beyond its tenant's 4 (each refused as it opens).
EXTRA_STREAMS = 6


def test_flooding_tenant_is_refused_and_the_other_is_served_in_full(tmp_path, tiny_checkpoint):
    tokens = {"flooder": new_token(), "good": new_token()}
    token_file = tmp_path / "tokens.txt"
    token_file.write_text("".join(f"{t} {hash_token(v)}\n" for t, v in tokens.items()))
    server = ServerProcess(
        tmp_path / "server.log",
        checkpoint=tiny_checkpoint,
        auth_tokens_file=token_file,
        tenant_events_per_s=RATE,
        tenant_burst_events=BURST,
        max_streams_per_tenant=4,
    )
    flooder = None
    try:
        # Runs until its stdin closes (120 s only bounds a test that broke off).
        flooder = subprocess.Popen(
            [sys.executable, str(FLOOD_CLIENT), server.address, tokens["flooder"], "120", "4", str(EXTRA_STREAMS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

        def refused(limit: str) -> float:
            return metric(scrape(server.metrics_url), "aaren_limit_refusals_total", limit=limit)

        # The good tenant starts once the flood is over its rate and its extra streams were refused
        # (a good tenant served fast must not end the flood before the flooder tried them), and the
        # flood goes on until it is done.
        wait_until(
            lambda: refused("tenant_rate_limited") > 0 and refused("tenant_stream_limit") >= EXTRA_STREAMS,
            "the flooder to be rate limited and its extra streams refused",
            timeout=60,
        )
        with grpc.insecure_channel(server.address) as channel:
            # the whole call is bounded: GOOD_EVENTS round trips under the flood, on a loaded machine
            good = OpenStream(stub_for(channel), timeout=120, metadata=[("authorization", f"Bearer {tokens['good']}")])
            for seq in range(1, GOOD_EVENTS + 1):
                response = good.send([ev("g", seq, float(seq))])
                assert not response.HasField("request_error"), f"the good tenant was refused: {response}"
                assert_forecast(response.results[0], "g", seq)
            good.close()
            assert flooder.poll() is None, "the flood ended before the good tenant was done"
            out, _ = flooder.communicate("", timeout=60)  # closes its stdin: the flood stops
        seen = json.loads(out)
        samples = scrape(server.metrics_url)
    finally:
        if flooder is not None and flooder.poll() is None:
            flooder.kill()
        server.stop()

    print(f"flooder saw {seen}")
    assert seen.get("accepted", 0) > 0, seen  # limited, not shut out
    refused = seen.get("ERROR_CODE_RESOURCE_EXHAUSTED:tenant_rate_limited", 0)
    assert refused > 0, seen
    assert seen.get("ERROR_CODE_RESOURCE_EXHAUSTED:tenant_rate_limited:retry_after", 0) == refused, seen
    assert seen.get("extra_stream:RESOURCE_EXHAUSTED:tenant_stream_limit", 0) == EXTRA_STREAMS, seen
    refusal_reasons = {key.split(":")[1] for key in seen if key.startswith("ERROR_CODE_")}
    assert refusal_reasons <= {"tenant_rate_limited", "tenant_pending_limit"}, seen
    # Every refusal the server counted was the flooder's: the good tenant's quota was never touched.
    # (>=: answers to what the flooder left queued when it stopped may never have reached it.)
    assert metric(samples, "aaren_limit_refusals_total", limit="tenant_rate_limited") >= refused
    assert metric(samples, "aaren_limit_refusals_total", limit="server_busy") == 0
