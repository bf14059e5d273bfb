"""Limits and backpressure: each refusal is RESOURCE_EXHAUSTED naming the limit, with a retry hint,
and hits only the tenant that crossed it."""

from __future__ import annotations

import time

import grpc
import pytest
from server_helpers import (
    CALL_TIMEOUT_S,
    OpenStream,
    assert_event_error,
    assert_forecast,
    ev,
    hold_model_steps,
    metric,
    reason_of,
    scrape,
    stub_for,
    wait_until,
)

from aaren.server.core import limits
from aaren.server.security.auth import hash_token, new_token
from aaren.v1 import aaren_pb2 as pb

RETRY_KEY = "aaren-retry-after-ms"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    values = {"tenant-a": new_token(), "tenant-b": new_token()}
    path = tmp_path_factory.mktemp("limits") / "tokens.txt"
    path.write_text("".join(f"{tenant} {hash_token(token)}\n" for tenant, token in values.items()))
    return values, path


def meta(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


class SteppedClock:
    """A monotonic clock that moves only when the test steps it: the buckets see no time pass
    however slow the machine is."""

    def __init__(self) -> None:
        self.now = 1024.0  # and steps of 1/8 s: exact in binary, so the hints are exact

    def __call__(self) -> float:
        return self.now


def test_tenant_event_rate_is_limited_with_a_retry_hint_and_other_tenants_go_on(start_server, tokens, monkeypatch):
    values, path = tokens
    clock = SteppedClock()
    monkeypatch.setattr(limits, "clock", clock)  # the core (and its buckets) runs in this process
    srv = start_server(auth_tokens_file=path, tenant_events_per_s=2.0, tenant_burst_events=10)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        a = OpenStream(stub, metadata=meta(values["tenant-a"]))
        b = OpenStream(stub, metadata=meta(values["tenant-b"]))
        burst = [ev(f"s{i}", 1, 1.0) for i in range(10)]
        assert all(r.HasField("forecast") for r in a.send(burst).results)
        refused = a.send([ev("x", 1, 1.0)])
        error = refused.request_error
        assert (error.code, error.reason) == (pb.ERROR_CODE_RESOURCE_EXHAUSTED, "tenant_rate_limited"), refused
        # An empty bucket refills one event in 1 / (2 events/s): no time has passed, so the hint is exact.
        assert error.retry_after_ms == 500 and "2 events/s" in error.message and "retry in" in error.message
        # B has its own bucket.
        assert all(r.HasField("forecast") for r in b.send(burst).results)
        clock.now += 0.375  # short of the hint: still refused, with the rest of the wait
        still = a.send([ev("x", 1, 1.0)]).request_error
        assert (still.reason, still.retry_after_ms) == ("tenant_rate_limited", 125), still
        clock.now += 0.125  # the hint has passed: A may go on
        assert_forecast(a.send([ev("x", 1, 1.0)]).results[0], "x", 1)
        a.close()
        b.close()
    samples = scrape(srv.metrics_url)
    assert metric(samples, "aaren_limit_refusals_total", limit="tenant_rate_limited") == 2
    assert metric(samples, "aaren_events_rejected_total", reason="tenant_rate_limited") == 2


def test_streams_per_tenant_are_limited_others_still_open(start_server, tokens):
    values, path = tokens
    srv = start_server(auth_tokens_file=path, max_streams_per_tenant=2)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        open_ = [OpenStream(stub, metadata=meta(values["tenant-a"])) for _ in range(2)]
        for i, stream in enumerate(open_):
            assert_forecast(stream.send([ev(f"s{i}", 1, 1.0)]).results[0], f"s{i}", 1)
        third = OpenStream(stub, metadata=meta(values["tenant-a"]))
        third.put([ev("s9", 1, 1.0)])
        with pytest.raises(grpc.RpcError) as info:
            third.next()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason_of(info.value) == "tenant_stream_limit"
        assert dict(info.value.trailing_metadata())[RETRY_KEY] == "1000"
        third.end_requests()
        other = OpenStream(stub, metadata=meta(values["tenant-b"]))
        assert_forecast(other.send([ev("s0", 1, 1.0)]).results[0], "s0", 1)
        other.close()
        open_[0].close()  # a slot frees up
        again = OpenStream(stub, metadata=meta(values["tenant-a"]))
        assert_forecast(again.send([ev("s9", 1, 1.0)]).results[0], "s9", 1)
        again.close()
        open_[1].close()


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_sessions_per_tenant_are_limited(start_server, tokens, store, request):
    values, path = tokens
    settings = {"auth_tokens_file": path, "max_sessions_per_tenant": 2}
    if store == "redis":
        settings["store_url"] = request.getfixturevalue("redis_url")
    srv = start_server(**settings)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        a = OpenStream(stub, metadata=meta(values["tenant-a"]))
        b = OpenStream(stub, metadata=meta(values["tenant-b"]))
        results = a.send([ev("s1", 1, 1.0), ev("s2", 1, 1.0), ev("s4", 1, 1.0)]).results  # one batch
        assert [r.WhichOneof("outcome") for r in results] == ["forecast", "forecast", "error"]
        assert results[2].error.reason == "tenant_session_limit"
        full = a.send([ev("s3", 1, 1.0), ev("s1", 2, 2.0)]).results
        assert_event_error(full[0], pb.ERROR_CODE_RESOURCE_EXHAUSTED, "tenant_session_limit", ["holds 2 sessions"])
        assert_forecast(full[1], "s1", 2)  # existing sessions go on
        assert_forecast(b.send([ev("s3", 1, 1.0)]).results[0], "s3", 1)  # another tenant is not counted
        stub.EndSession(pb.EndSessionRequest(session_id="s2"), metadata=meta(values["tenant-a"]), timeout=5)
        time.sleep(5.1 if store == "redis" else 0)  # the Redis count is cached for 5 s
        assert_forecast(a.send([ev("s3", 1, 1.0)]).results[0], "s3", 1)
        a.close()
        b.close()


def test_server_pending_bound_pushes_back_while_the_model_is_busy(start_server):
    srv = start_server(max_pending_events=4, model_thread=True)
    entered, release = hold_model_steps(srv)
    try:
        with grpc.insecure_channel(srv.address) as channel:
            stream = OpenStream(stub_for(channel))
            first = stream.put([ev("a", 1, 1.0)])
            assert entered.wait(CALL_TIMEOUT_S)  # the model holds 1 event; 3 more may wait
            queued = stream.put([ev("b", 1, 1.0), ev("c", 1, 1.0), ev("d", 1, 1.0)])
            wait_until(lambda: metric(scrape(srv.metrics_url), "aaren_pending_events") == 4, "4 events pending")
            over = stream.put([ev("e", 1, 1.0)])
            # Released only once the server has read (and refused) it: else the held batch may finish first.
            wait_until(
                lambda: metric(scrape(srv.metrics_url), "aaren_limit_refusals_total", limit="server_busy") == 1,
                "the fifth event refused",
            )
            release.set()
            answers = {r.request_id: r for r in (stream.next(), stream.next(), stream.next())}
            assert answers[over].request_error.reason == "server_busy"
            assert answers[over].request_error.retry_after_ms == 100
            assert answers[first].results[0].HasField("forecast")
            assert all(r.HasField("forecast") for r in answers[queued].results)
            assert_forecast(stream.send([ev("e", 1, 1.0)]).results[0], "e", 1)
            stream.close()
    finally:
        release.set()


def test_client_keepalive_at_the_permitted_interval_is_not_cut_off(start_server):
    srv = start_server(min_client_ping_interval_s=1.0)
    options = [
        ("grpc.keepalive_time_ms", 1000),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    with grpc.insecure_channel(srv.address, options=options) as channel:
        stream = OpenStream(stub_for(channel))
        assert_forecast(stream.send([ev("k", 1, 1.0)]).results[0], "k", 1)
        time.sleep(4.0)  # about four pings on an idle stream: a GOAWAY too_many_pings would end it
        assert_forecast(stream.send([ev("k", 2, 2.0)]).results[0], "k", 2)
        stream.close()
