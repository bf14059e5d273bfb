"""Ordering across requests, numeric overflow, malformed messages: found in review, each a test."""

from __future__ import annotations

import grpc
from server_helpers import (
    CALL_TIMEOUT_S,
    OpenStream,
    assert_event_error,
    assert_forecasts,
    ev,
    get_session,
    hold_model_steps,
    metric,
    scrape,
    stub_for,
    wait_until,
)

from aaren.v1 import aaren_pb2 as pb


def test_a_sessions_results_arrive_in_order_across_requests(start_server):
    """R1 = [A seq 1, six other sessions], R2 = [A seq 2], both queued while a batch is held. With
    one session per batch, A's batch (both of its events) finishes R2 before R1's other sessions
    are done; R2's answer must still come after R1's."""
    srv = start_server(max_batch_size=1, model_thread=True)
    entered, gate = hold_model_steps(srv)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        busy = stream.put([ev("busy", 1, 1.0)])
        assert entered.wait(CALL_TIMEOUT_S)
        first = stream.put([ev("A", 1, 1.0), *(ev(f"other{i}", 1, 1.0) for i in range(6))])
        second = stream.put([ev("A", 2, 2.0)])
        wait_until(lambda: metric(scrape(srv.metrics_url), "aaren_pending_events") == 9, "both requests queued")
        gate.set()
        responses = [stream.next(), stream.next(), stream.next()]
        assert [r.request_id for r in responses] == [busy, first, second]
        assert_forecasts(responses[2], [("A", 2)])
        stream.close()


def test_overflowing_gap_or_value_is_refused_and_changes_nothing(start_server):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        assert_forecasts(stream.send([ev("g", 1, 0.0), ev("v", 1, 0.0)]), [("g", 1), ("v", 1)])
        before = {s: get_session(stub, s).state for s in "gv"}
        response = stream.send([ev("g", 2, 1e39), ev("v", 2, 1.0, values=(3e38, 0.0)), ev("ok", 1, 1.0)])
        for result in response.results[:2]:
            assert_event_error(result, pb.ERROR_CODE_INVALID_ARGUMENT, "numeric_overflow", ("float32", "Nothing"))
        assert_forecasts(pb.StreamResponse(results=response.results[2:]), [("ok", 1)])
        assert {s: get_session(stub, s).state for s in "gv"} == before
        # The sessions go on with ordinary events.
        assert_forecasts(stream.send([ev("g", 2, 5.0), ev("v", 2, 5.0)]), [("g", 2), ("v", 2)])
        stream.close()


def test_malformed_message_ends_the_stream_with_invalid_argument(start_server):
    srv = start_server(metrics_port=-1)
    good = pb.StreamRequest(request_id="good", events=[ev("s", 1, 1.0)]).SerializeToString()
    bad_utf8 = b"\x12\x04\x0a\x02\xff\xfe"  # events[0].session_id = b"\xff\xfe", not UTF-8
    with grpc.insecure_channel(srv.address) as channel:
        call = channel.stream_stream(
            "/aaren.v1.ForecastService/Stream",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.StreamResponse.FromString,
        )(iter([good, bad_utf8]), timeout=CALL_TIMEOUT_S)
        answers = []
        try:
            for response in call:
                answers.append(response.request_id)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
            assert "malformed request message" in exc.details()
        else:
            raise AssertionError("the stream ended without an error")
        assert answers == ["good"]
