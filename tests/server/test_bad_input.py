"""Bad input over a real Stream (issue 4, "Bad input (each a test)"; docs/architecture.md section 3).

Each bad event must get a precise ErrorCode, reason and message, change no state, and leave the
stream and every other session going.
"""

from __future__ import annotations

import math
import random

import grpc
import pytest
from server_helpers import (
    OpenStream,
    assert_event_error,
    assert_forecast,
    assert_forecasts,
    assert_forecasts_close,
    assert_rpc_error,
    assert_states_close,
    ev,
    get_session,
    metric,
    rpc_error,
    scrape,
    stub_for,
    wait_until,
)

from aaren.v1 import aaren_pb2 as pb

INVALID = pb.ERROR_CODE_INVALID_ARGUMENT
PRECONDITION = pb.ERROR_CODE_FAILED_PRECONDITION
NOT_FOUND = pb.ERROR_CODE_NOT_FOUND


def check_rejected(
    srv,
    bad: pb.Event,
    code: int,
    reason: str,
    message_parts: tuple[str, ...],
    *,
    prior: tuple[pb.Event, ...] = (),
    fixed: pb.Event | None = None,
) -> pb.EventError:
    """Apply ``prior``; send ``bad`` with a good event of another session in one message; check the
    error, that ``bad``'s session did not change, that the stream goes on, and that ``fixed`` (the
    corrected event, same seq) then applies."""
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        first = [ev("other", 1, 0.0), *prior]
        assert_forecasts(stream.send(first), [(e.session_id, e.seq) for e in first])
        before = get_session(stub, bad.session_id) if bad.session_id else None

        response = stream.send([bad, ev("other", 2, 1.0, mark=3, values=(1.0, -1.0))])
        assert not response.HasField("request_error")
        assert len(response.results) == 2
        result = response.results[0]
        assert (result.session_id, result.seq, result.duplicate) == (bad.session_id, bad.seq, False)
        error = assert_event_error(result, code, reason, message_parts)
        assert_forecast(response.results[1], "other", 2)

        if bad.session_id:  # the bad event changed nothing
            after = get_session(stub, bad.session_id)
            if before is None:
                assert after is None, f"a rejected event created session {bad.session_id!r}"
            else:
                assert after is not None
                assert (after.last_seq, after.last_time, after.state) == (
                    before.last_seq,
                    before.last_time,
                    before.state,
                )

        # The stream goes on, for the other session and for the bad event's session once fixed.
        following = [ev("other", 3, 2.0)] + ([fixed] if fixed is not None else [])
        assert_forecasts(stream.send(following), [(e.session_id, e.seq) for e in following])
        stream.close()
        return error


@pytest.mark.parametrize("bad_time", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_time_not_finite(start_server, bad_time):
    srv = start_server(metrics_port=-1)
    check_rejected(
        srv,
        ev("s", 2, bad_time),
        INVALID,
        "time_not_finite",
        (f"is {bad_time}", "'s'", "seq 2", "expected a finite number"),
        prior=(ev("s", 1, 10.0),),
        fixed=ev("s", 2, 11.0),
    )


@pytest.mark.parametrize("bad_time", [math.nan, math.inf], ids=["nan", "inf"])
def test_time_not_finite_on_first_event_creates_no_session(start_server, bad_time):
    srv = start_server(metrics_port=-1)
    check_rejected(
        srv,
        ev("new", 1, bad_time),
        INVALID,
        "time_not_finite",
        ("expected a finite number",),
        fixed=ev("new", 1, 5.0),
    )


@pytest.mark.parametrize("bad_value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_values_not_finite(start_server, bad_value):
    srv = start_server(metrics_port=-1)
    check_rejected(
        srv,
        ev("s", 2, 11.0, values=(0.5, bad_value)),
        INVALID,
        "values_not_finite",
        ("value 1 (b)", f"is {bad_value}", "expected a finite number"),
        prior=(ev("s", 1, 10.0),),
        fixed=ev("s", 2, 11.0, values=(0.5, 0.25)),
    )


def test_time_earlier_than_last(start_server):
    srv = start_server(metrics_port=-1)
    check_rejected(
        srv,
        ev("s", 3, 11.5),
        PRECONDITION,
        "time_before_last",
        ("11.5", "seq 3", "expected a time >= 12.0"),
        prior=(ev("s", 1, 10.0), ev("s", 2, 12.0)),
        fixed=ev("s", 3, 12.0),  # equal times are allowed
    )


@pytest.mark.parametrize("mark", [5, 2**32 - 1])
def test_mark_out_of_range(start_server, mark):
    # A negative mark cannot be sent: Event.mark is uint32.
    srv = start_server(metrics_port=-1)
    check_rejected(
        srv,
        ev("s", 2, 11.0, mark=mark),
        INVALID,
        "mark_out_of_range",
        (f"mark {mark}", "expected 0..4"),
        prior=(ev("s", 1, 10.0),),
        fixed=ev("s", 2, 11.0, mark=4),
    )


@pytest.mark.parametrize("values", [(), (1.0,), (1.0, 2.0, 3.0)], ids=["0", "1", "3"])
def test_values_wrong_width(start_server, values):
    srv = start_server(metrics_port=-1)
    check_rejected(
        srv,
        ev("s", 2, 11.0, values=values),
        INVALID,
        "values_wrong_width",
        (f"has {len(values)} values", "expected 2", "a, b"),
        prior=(ev("s", 1, 10.0),),
        fixed=ev("s", 2, 11.0),
    )


def test_session_id_empty(start_server):
    srv = start_server(metrics_port=-1)
    check_rejected(srv, ev("", 1, 1.0), INVALID, "session_id_empty", ("empty", "expected 1 or more bytes"))


@pytest.mark.parametrize(
    ("session_id", "n_bytes"), [("x" * 17, 17), ("é" * 9, 18)], ids=["17-ascii", "9-chars-18-bytes"]
)
def test_session_id_too_long(start_server, session_id, n_bytes):
    srv = start_server(metrics_port=-1, max_session_id_bytes=16)
    check_rejected(
        srv,
        ev(session_id, 1, 1.0),
        INVALID,
        "session_id_too_long",
        (f"{n_bytes} bytes", "at most 16"),
        fixed=ev("é" * 8, 1, 1.0),  # 16 bytes: at the limit, accepted
    )


def test_seq_zero(start_server):
    srv = start_server(metrics_port=-1)
    check_rejected(
        srv,
        ev("s", 0, 11.0),
        INVALID,
        "seq_zero",
        ("seq of session 's' is 0", "start at 1"),
        prior=(ev("s", 1, 10.0),),
        fixed=ev("s", 2, 11.0),
    )


def test_seq_gap_changes_nothing(start_server):
    srv = start_server(metrics_port=-1)
    check_rejected(
        srv,
        ev("s", 4, 13.0),
        PRECONDITION,
        "seq_gap",
        ("seq 4", "expected seq 3", "last applied seq is 2"),
        prior=(ev("s", 1, 10.0), ev("s", 2, 12.0)),
        fixed=ev("s", 3, 13.0),
    )
    # check_rejected compared GetSession's last_seq, last_time and state bytes before and after.


def test_rejected_event_makes_later_events_of_its_session_a_gap(start_server):
    """Proto: a rejected event changes nothing, so the session's later events in the request fail with seq_gap."""
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        assert_forecasts(stream.send([ev("s", 1, 1.0)]), [("s", 1)])
        response = stream.send([ev("s", 2, math.nan), ev("other", 1, 1.0), ev("s", 3, 3.0)])
        assert_event_error(response.results[0], INVALID, "time_not_finite")
        assert_forecast(response.results[1], "other", 1)
        assert_event_error(response.results[2], PRECONDITION, "seq_gap", ("seq 3", "expected seq 2"))
        assert get_session(stub, "s").last_seq == 1
        assert_forecasts(stream.send([ev("s", 2, 2.0), ev("s", 3, 3.0)]), [("s", 2), ("s", 3)])
        stream.close()


def test_duplicate_seq_acknowledged_and_not_applied_again(start_server):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        history = [ev("s", i, 10.0 + i, mark=i % 5, values=(0.1 * i, -0.2 * i)) for i in (1, 2, 3)]
        assert_forecasts(stream.send(history), [("s", 1), ("s", 2), ("s", 3)])
        before = get_session(stub, "s")
        assert before.last_seq == 3 and before.state

        # Resent events (even with other content) are acknowledged as duplicates and ignored.
        response = stream.send([ev("s", 2, 99.0, mark=4, values=(5.0, 5.0)), history[2], ev("other", 1, 0.0)])
        for result, seq in zip(response.results[:2], (2, 3), strict=True):
            assert outcome_of(result) == "ack", result
            assert (result.session_id, result.seq, result.duplicate, result.ack.last_seq) == ("s", seq, True, 3)
        assert_forecast(response.results[2], "other", 1)
        after = get_session(stub, "s")
        assert (after.last_seq, after.last_time, after.n_events) == (3, 13.0, 3)
        assert after.state == before.state, "a duplicate changed the state"
        forecast_before = stub.Forecast(pb.ForecastRequest(session_id="s")).forecast

        # A duplicate within one message: the first copy applies, the second is acknowledged only.
        response = stream.send([ev("s", 4, 14.0, mark=1), ev("s", 4, 14.0, mark=1)])
        assert_forecast(response.results[0], "s", 4)
        second = response.results[1]
        assert outcome_of(second) == "ack" and second.duplicate and second.ack.last_seq == 4, second
        assert get_session(stub, "s").last_seq == 4

        # Applied once: equals a session fed the same four events once each.
        ref = [ev("ref", e.seq, e.time, e.mark, e.values) for e in [*history, ev("s", 4, 14.0, mark=1)]]
        assert_forecasts(stream.send(ref), [("ref", i) for i in (1, 2, 3, 4)])
        assert_states_close(get_session(stub, "s"), get_session(stub, "ref"))
        assert_forecasts_close(
            stub.Forecast(pb.ForecastRequest(session_id="s")).forecast,
            _renamed(stub.Forecast(pb.ForecastRequest(session_id="ref")).forecast),
        )
        assert forecast_before.seq == 3
        stream.close()


def outcome_of(result: pb.EventResult) -> str:
    return result.WhichOneof("outcome")


def _renamed(forecast: pb.Forecast) -> pb.Forecast:
    forecast.session_id = "s"
    return forecast


def test_too_many_events_in_one_message(start_server):
    srv = start_server(metrics_port=-1, max_events_per_request=4)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        assert_forecasts(stream.send([ev("other", 1, 0.0)]), [("other", 1)])
        too_many = [ev("other", 2, 1.0)] + [ev(f"n{i}", 1, 1.0) for i in range(4)]
        response = stream.send(too_many)
        assert response.HasField("request_error")
        assert len(response.results) == 0
        error = response.request_error
        assert (pb.ErrorCode.Name(error.code), error.reason) == ("ERROR_CODE_RESOURCE_EXHAUSTED", "too_many_events")
        assert "5 events" in error.message and "at most 4" in error.message, error.message
        # Nothing of it was applied.
        assert get_session(stub, "other").last_seq == 1
        assert all(get_session(stub, f"n{i}") is None for i in range(4))
        # The stream goes on; 4 events (the limit) are accepted.
        assert_forecasts(stream.send(too_many[:4]), [("other", 2), ("n0", 1), ("n1", 1), ("n2", 1)])
        stream.close()


def test_oversized_message_fails_only_its_stream(start_server):
    srv = start_server(max_message_bytes=2048)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        assert stub.DescribeModel(pb.DescribeModelRequest()).limits.max_message_bytes == 2048
        good = OpenStream(stub)
        assert_forecasts(good.send([ev("keep", 1, 0.0)]), [("keep", 1)])

        big = OpenStream(stub)
        events = [ev(f"big-{i}", 1, float(i), values=(1.5, 2.5)) for i in range(200)]
        request = pb.StreamRequest(request_id="big", events=events)
        assert request.ByteSize() > 2048
        big.put(events)
        with pytest.raises(grpc.RpcError) as info:
            big.next()
        big.end_requests()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()

        # The other stream and its session go on; nothing of the oversized message was applied.
        assert_forecasts(good.send([ev("keep", 2, 1.0)]), [("keep", 2)])
        assert get_session(stub, "big-0") is None and get_session(stub, "big-199") is None
        # A new stream works too, and the failed stream is no longer counted as open.
        fresh = OpenStream(stub)
        assert_forecasts(fresh.send([ev("keep", 3, 2.0)]), [("keep", 3)])
        fresh.close()
        wait_until(lambda: metric(scrape(srv.metrics_url), "aaren_open_streams") == 1, "one open stream")
        good.close()


def test_stream_cancelled_mid_batch_leaves_no_partial_state(start_server):
    srv = start_server()
    n_sessions, n_events, per_message = 24, 25, 7  # 7: messages cut across sessions
    rng = random.Random(7)
    events: dict[str, list[pb.Event]] = {}
    for s in range(n_sessions):
        sid, t = f"c{s}", 0.0
        events[sid] = []
        for seq in range(1, n_events + 1):
            t += rng.expovariate(1.0)
            values = (rng.gauss(0, 1), rng.gauss(0, 1))
            events[sid].append(ev(sid, seq, t, mark=rng.randrange(5), values=values))
    interleaved = [events[sid][k] for k in range(n_events) for sid in events]
    messages = [interleaved[i : i + per_message] for i in range(0, len(interleaved), per_message)]

    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        for message in messages:
            stream.put(message)
        acknowledged: dict[str, int] = {}
        first = stream.next()
        for r in first.results:
            assert_forecast(r, r.session_id, r.seq)
            acknowledged[r.session_id] = max(acknowledged.get(r.session_id, 0), r.seq)
        stream.call.cancel()
        stream.end_requests()
        with pytest.raises(grpc.RpcError) as info:
            while True:
                stream.next()
        assert info.value.code() == grpc.StatusCode.CANCELLED

        # Wait until the server has closed the stream and answered everything it accepted.
        def settled() -> bool:
            samples = scrape(srv.metrics_url)
            return metric(samples, "aaren_open_streams") == 0 and metric(samples, "aaren_pending_events") == 0

        wait_until(lambda: settled() and settled(), "the cancelled stream to settle")

        # Each session's state is exactly its first last_seq events: compare with a fresh session
        # fed those events in one message.
        reference = OpenStream(stub)
        for sid, evs in events.items():
            info_ = get_session(stub, sid)
            last_seq = info_.last_seq if info_ is not None else 0
            assert last_seq >= acknowledged.get(sid, 0), f"{sid}: an acknowledged event was lost"
            if last_seq == 0:
                continue
            assert info_.last_time == evs[last_seq - 1].time
            ref_id = f"ref-{sid}"
            prefix = [ev(ref_id, e.seq, e.time, e.mark, e.values) for e in evs[:last_seq]]
            response = reference.send(prefix, forecast_mode=pb.FORECAST_MODE_LAST_PER_SESSION)
            assert_forecast(response.results[-1], ref_id, last_seq)
            assert_states_close(info_, get_session(stub, ref_id))
            got = stub.Forecast(pb.ForecastRequest(session_id=sid)).forecast
            want = stub.Forecast(pb.ForecastRequest(session_id=ref_id)).forecast
            want.session_id = sid
            assert_forecasts_close(got, want)
        # Every session goes on from where it stopped.
        resume = []
        for sid, evs in events.items():
            info_ = get_session(stub, sid)
            last_seq = info_.last_seq if info_ is not None else 0
            if last_seq < n_events:
                resume.append(evs[last_seq])
        if resume:
            assert_forecasts(reference.send(resume), [(e.session_id, e.seq) for e in resume])
        reference.close()


# ---------------------------------------------------------------- unknown and ended sessions


@pytest.mark.parametrize("method", ["Forecast", "GetSession"])
def test_unknown_session_in_unary_calls(start_server, method):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        request = (
            pb.ForecastRequest(session_id="nope") if method == "Forecast" else pb.GetSessionRequest(session_id="nope")
        )
        error = rpc_error(getattr(stub, method), request)
        assert_rpc_error(error, grpc.StatusCode.NOT_FOUND, "session_not_found", ("'nope'", "does not exist"))
        # Ending an unknown session is not an error.
        ended = stub.EndSession(pb.EndSessionRequest(session_id="nope"))
        assert (ended.existed, ended.last_seq) == (False, 0)


@pytest.mark.parametrize(
    ("request_", "code", "reason", "parts"),
    [
        (pb.ForecastRequest(session_id="s", horizon=65), "INVALID_ARGUMENT", "horizon_too_large", ("65", "64")),
        (
            pb.ForecastRequest(session_id="s", horizon=2, num_samples=1001),
            "INVALID_ARGUMENT",
            "num_samples_too_large",
            ("1001", "1000"),
        ),
        (pb.GetSessionRequest(session_id=""), "INVALID_ARGUMENT", "session_id_empty", ("empty",)),
        (pb.ForecastRequest(session_id=""), "INVALID_ARGUMENT", "session_id_empty", ("empty",)),
        (pb.GetSessionRequest(session_id="x" * 300), "INVALID_ARGUMENT", "session_id_too_long", ("300 bytes",)),
        (pb.EndSessionRequest(session_id="x" * 300), "INVALID_ARGUMENT", "session_id_too_long", ("at most 256",)),
    ],
    ids=["horizon", "num_samples", "get-empty-id", "forecast-empty-id", "get-long-id", "end-long-id"],
)
def test_bad_unary_arguments(start_server, request_, code, reason, parts):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        assert_forecasts(stream.send([ev("s", 1, 1.0)]), [("s", 1)])
        method = {
            pb.ForecastRequest: stub.Forecast,
            pb.GetSessionRequest: stub.GetSession,
            pb.EndSessionRequest: stub.EndSession,
        }[type(request_)]
        assert_rpc_error(rpc_error(method, request_), getattr(grpc.StatusCode, code), reason, parts)
        assert get_session(stub, "s").last_seq == 1
        stream.close()


def test_event_with_seq_above_one_for_unknown_session(start_server):
    srv = start_server(metrics_port=-1)
    check_rejected(
        srv,
        ev("ghost", 3, 1.0),
        NOT_FOUND,
        "session_not_found",
        ("'ghost'", "seq 3", "start it again with seq 1"),
        fixed=ev("ghost", 1, 1.0),
    )


def test_ended_session_is_gone_and_restarts_with_seq_one(start_server):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        first = ev("s", 1, 1.0, mark=2, values=(0.3, 0.4))
        assert_forecasts(stream.send([first, ev("s", 2, 2.0), ev("s", 3, 3.0)]), [("s", 1), ("s", 2), ("s", 3)])
        ended = stub.EndSession(pb.EndSessionRequest(session_id="s"))
        assert (ended.existed, ended.last_seq) == (True, 3)
        assert_rpc_error(
            rpc_error(stub.GetSession, pb.GetSessionRequest(session_id="s")),
            grpc.StatusCode.NOT_FOUND,
            "session_not_found",
        )
        assert_rpc_error(
            rpc_error(stub.Forecast, pb.ForecastRequest(session_id="s")), grpc.StatusCode.NOT_FOUND, "session_not_found"
        )
        # A late event of the ended session is refused; another session is not affected.
        response = stream.send([ev("s", 4, 4.0), ev("other", 1, 0.0)])
        assert_event_error(response.results[0], NOT_FOUND, "session_not_found", ("'s'", "seq 4"))
        assert_forecast(response.results[1], "other", 1)
        assert get_session(stub, "s") is None
        assert stub.EndSession(pb.EndSessionRequest(session_id="s")).existed is False
        # seq 1 starts it again from a fresh state.
        restarted = assert_forecasts(stream.send([first]), [("s", 1)])[0]
        fresh = assert_forecasts(stream.send([ev("fresh", 1, 1.0, mark=2, values=(0.3, 0.4))]), [("fresh", 1)])[0]
        fresh.session_id = "s"
        assert_forecasts_close(restarted, fresh)
        info = get_session(stub, "s")
        assert (info.last_seq, info.last_time) == (1, 1.0)
        stream.close()


def test_unspecified_layout_means_rows(start_server):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        requests = [
            pb.StreamRequest(
                request_id=str(layout),
                events=[pb.Event(session_id=f"l{layout}", seq=1, time=1.0, values=[0.5, -1.0])],
                layout=layout,
            )
            for layout in (pb.RESPONSE_LAYOUT_UNSPECIFIED, pb.RESPONSE_LAYOUT_ROWS)
        ]
        unspecified, rows = stub_for(channel).Stream(iter(requests))
    for response in (unspecified, rows):
        assert not response.HasField("forecast_columns") and not response.HasField("request_error")
        assert [r.WhichOneof("outcome") for r in response.results] == ["forecast"]
    a, b = unspecified.results[0].forecast, rows.results[0].forecast
    a.session_id = b.session_id  # the two sessions differ only by name
    assert a == b


def test_unknown_layout_or_forecast_mode_is_refused_whole(start_server):
    srv = start_server()
    with grpc.insecure_channel(srv.address) as channel:
        event = pb.Event(session_id="u", seq=1, time=1.0, values=[0.0, 0.0])
        requests = [
            pb.StreamRequest(request_id="1", events=[event, event], layout=7),
            pb.StreamRequest(request_id="2", events=[event], forecast_mode=9),
            pb.StreamRequest(request_id="3", events=[event], layout=pb.RESPONSE_LAYOUT_COLUMNS),
        ]
        first, second, third = stub_for(channel).Stream(iter(requests))
    assert first.request_error.code == INVALID and not first.results
    assert first.request_error.reason == "layout_unknown"
    assert "layout 7 is not one this server knows; expected one of [0, 1, 2]" in first.request_error.message
    assert second.request_error.code == INVALID and second.request_error.reason == "forecast_mode_unknown"
    # Nothing of the refused requests was applied: the session starts with the third.
    assert list(third.forecast_columns.seq) == [1] and not third.results
    samples = scrape(srv.metrics_url)
    assert metric(samples, "aaren_events_rejected_total", reason="layout_unknown") == 2
    assert metric(samples, "aaren_events_rejected_total", reason="forecast_mode_unknown") == 1
    assert metric(samples, "aaren_events_total", outcome="rejected") == 3
