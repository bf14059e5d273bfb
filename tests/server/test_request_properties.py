"""Property-based tests (hypothesis) of the server with random and malformed requests.

Whatever arrives (random field values, NaN and infinities, huge and negative numbers, unicode and
control characters in session ids, seqs in any order, bytes that are not a message at all), the
server answers every event, never with INTERNAL or UNKNOWN, and a session's state changes only
through valid events applied in seq order: an oracle replays the same events and must agree with
every answer and with the stored seq of every session afterwards.
"""

from __future__ import annotations

import itertools
import math

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from server_helpers import CALL_TIMEOUT_S, stub_for

from aaren.v1 import aaren_pb2 as pb

NUM_MARKS, VALUE_WIDTH, MAX_ID_BYTES = 5, 2, 256
FORBIDDEN = {pb.ERROR_CODE_INTERNAL, pb.ERROR_CODE_UNKNOWN}
UINT64_MAX = 2**64 - 1
_examples = itertools.count()


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    from servers import ServerThread

    with ServerThread(checkpoint=tiny_checkpoint, metrics_port=-1) as srv, grpc.insecure_channel(srv.address) as ch:
        yield ch


session_ids = st.one_of(
    st.sampled_from(["a", "b", "é-ü", "🙂", "x\x00y", "", "s" * (MAX_ID_BYTES + 1), "🙂" * 65]),
    st.text(max_size=6),
)
seqs = st.one_of(st.integers(0, 6), st.integers(0, UINT64_MAX))
times = st.one_of(
    st.floats(0, 50),
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 1e300, -1e300, 5e-324]),
    st.floats(allow_nan=True, allow_infinity=True),
)
marks = st.one_of(st.integers(0, NUM_MARKS), st.integers(0, 2**32 - 1))
values = st.one_of(
    st.lists(st.floats(-10, 10), min_size=VALUE_WIDTH, max_size=VALUE_WIDTH),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4),
)
events = st.builds(lambda *a: a, session_ids, seqs, times, marks, values)
requests = st.lists(st.lists(events, min_size=1, max_size=6), min_size=1, max_size=4)


def as_sent(value: float) -> float:
    """The value a ``repeated float`` field carries: float32, so a finite double past float32's
    range arrives as infinity (and is then not finite on the server either)."""
    return pb.Event(values=[value]).values[0]


def valid(sid: str, seq: int, time: float, mark: int, vals: list[float]) -> bool:
    return (
        0 < len(sid.encode("utf-8", "surrogatepass")) <= MAX_ID_BYTES
        and seq >= 1
        and math.isfinite(time)
        and 0 <= mark < NUM_MARKS
        and len(vals) == VALUE_WIDTH
        and all(math.isfinite(as_sent(v)) for v in vals)
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=requests)
def test_random_requests_change_state_only_through_valid_in_order_events(server, requests):
    channel = server
    stub = stub_for(channel)
    tag = f"p{next(_examples)}-"
    # Isolate examples: valid ids get a per-example prefix; invalid ones stay invalid.
    scoped = [
        [(tag + sid if 0 < len(sid.encode()) <= MAX_ID_BYTES - 16 else sid, *rest) for sid, *rest in r]
        for r in requests
    ]
    messages = [
        pb.StreamRequest(
            request_id=str(i),
            events=[pb.Event(session_id=s, seq=q, time=t, mark=m, values=v) for s, q, t, m, v in r],
        )
        for i, r in enumerate(scoped)
    ]
    responses = list(stub.Stream(iter(messages), timeout=CALL_TIMEOUT_S))
    assert [r.request_id for r in responses] == [m.request_id for m in messages]

    last: dict[str, tuple[int, float]] = {}
    for request, response in zip(scoped, responses, strict=True):
        assert not response.HasField("request_error"), response.request_error
        assert len(response.results) == len(request)
        for (sid, seq, time, mark, vals), result in zip(request, response.results, strict=True):
            kind = result.WhichOneof("outcome")
            assert kind is not None, result
            assert result.session_id == sid and result.seq == seq
            seen_seq, seen_time = last.get(sid, (0, -math.inf))
            ok = valid(sid, seq, time, mark, vals)
            if kind == "error":
                assert result.error.code not in FORBIDDEN, result
                assert result.error.reason and result.error.message
                # An event the oracle would apply may only fail for float32 overflow.
                if ok and seq == seen_seq + 1 and time >= seen_time and (seen_seq or seq == 1):
                    assert result.error.reason == "numeric_overflow", result
                continue
            assert ok, f"an invalid event was accepted: {result}"
            if kind == "ack":
                assert result.duplicate and seq <= seen_seq == result.ack.last_seq, result
                continue
            assert seq == seen_seq + 1 and time >= seen_time, f"applied out of order: {result}"
            last[sid] = (seq, time)
            event("applied")

    for sid in {e[0] for r in scoped for e in r if valid(*e)}:
        try:
            info = stub.GetSession(pb.GetSessionRequest(session_id=sid), timeout=CALL_TIMEOUT_S)
            stored = info.last_seq
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            stored = 0
        assert stored == last.get(sid, (0, 0.0))[0], sid


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=64), method=st.sampled_from(["GetSession", "Forecast", "EndSession", "Stream"]))
def test_bytes_that_are_not_a_message_are_invalid_argument_never_internal(server, payload, method):
    channel = server
    path = f"/aaren.v1.ForecastService/{method}"
    try:
        if method == "Stream":
            call = channel.stream_stream(path, request_serializer=bytes, response_deserializer=bytes)
            list(call(iter([payload]), timeout=CALL_TIMEOUT_S))
        else:
            call = channel.unary_unary(path, request_serializer=bytes, response_deserializer=bytes)
            call(payload, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        # Bytes that happen to parse are a request like any other (e.g. NOT_FOUND for no session).
        assert exc.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (exc.code(), exc.details())
    assert stub_for(channel).DescribeModel(pb.DescribeModelRequest(), timeout=CALL_TIMEOUT_S).num_marks == NUM_MARKS
