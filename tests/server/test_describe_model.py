"""DescribeModel: the served model's fields and the server's limits."""

from __future__ import annotations

import grpc
from generated import TINY_SCHEMA
from server_helpers import OpenStream, assert_forecasts, ev, get_session, stub_for

from aaren.v1 import aaren_pb2 as pb

LIMITS = {
    "max_events_per_request": 7,
    "max_session_id_bytes": 33,
    "max_message_bytes": 123_456,
    "max_horizon": 9,
    "max_num_samples": 50,
    "default_num_samples": 20,
    "default_top_k": 2,
}


def test_describe_model(start_server):
    srv = start_server(metrics_port=-1, idle_ttl_s=42.0, **LIMITS)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        info = stub.DescribeModel(pb.DescribeModelRequest())
        assert info.name == "tiny"
        assert info.version
        assert info.backbone == "aaren"
        assert (info.d_model, info.n_layers, info.n_heads) == (16, 2, 2)
        assert (info.num_marks, info.value_width) == (5, 2)
        assert list(info.mark_names) == TINY_SCHEMA["mark_names"]
        assert list(info.value_names) == TINY_SCHEMA["value_names"]
        assert info.time_unit == TINY_SCHEMA["time_unit"]
        assert list(info.quantile_levels) == [0.1, 0.5, 0.9]
        assert info.device == "cpu"
        assert info.state_bytes_per_session > 0
        assert info.parameters > 0
        for name, value in LIMITS.items():
            assert getattr(info.limits, name) == value, name
        assert info.limits.idle_ttl_seconds == 42.0

        # The description agrees with what sessions and forecasts report.
        stream = OpenStream(stub)
        forecast = assert_forecasts(stream.send([ev("s", 1, 1.0)]), [("s", 1)])[0]
        assert (forecast.model.name, forecast.model.version) == (info.name, info.version)
        assert len(forecast.marks) == LIMITS["default_top_k"]
        assert [q.q for q in forecast.next_time.quantiles] == [0.1, 0.5, 0.9]
        session = get_session(stub, "s")
        assert session.state_bytes == info.state_bytes_per_session
        assert (session.model.name, session.model.version) == (info.name, info.version)
        stream.close()


def test_empty_request_is_a_ping_and_last_per_session_mode(start_server):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        ping = stream.send([])
        assert len(ping.results) == 0 and not ping.HasField("request_error")
        events = [ev("h", i, float(i)) for i in range(1, 6)] + [ev("g", 1, 0.0), ev("g", 2, 1.0)]
        response = stream.send(events, forecast_mode=pb.FORECAST_MODE_LAST_PER_SESSION, top_k=9)
        kinds = [(r.session_id, r.seq, r.WhichOneof("outcome")) for r in response.results]
        assert kinds == [("h", i, "ack") for i in range(1, 5)] + [("h", 5, "forecast"), ("g", 1, "ack")] + [
            ("g", 2, "forecast")
        ]
        assert [r.ack.last_seq for r in response.results[:4]] == [1, 2, 3, 4]
        assert not any(r.duplicate for r in response.results)
        forecast = response.results[4].forecast
        assert len(forecast.marks) == 5  # top_k larger than num_marks: all marks
        probs = [m.probability for m in forecast.marks]
        assert probs == sorted(probs, reverse=True) and abs(sum(probs) - 1) < 1e-5
        stream.close()


def test_sampled_forecast_is_seeded_and_read_only(start_server):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        assert_forecasts(stream.send([ev("s", 1, 10.0), ev("s", 2, 11.0)]), [("s", 1), ("s", 2)])
        before = get_session(stub, "s")
        request = pb.ForecastRequest(session_id="s", horizon=3, num_samples=8, seed=5, include_paths=True)
        a, b = stub.Forecast(request), stub.Forecast(request)
        assert a == b
        assert a.forecast.seq == 2 and a.forecast.last_time == 11.0
        assert [s.step for s in a.steps] == [1, 2, 3]
        assert len(a.paths) == 8 and all(len(p.events) == 3 for p in a.paths)
        for path in a.paths:
            times = [e.time for e in path.events]
            assert times == sorted(times) and times[0] >= 11.0
            assert all(0 <= e.mark < 5 and len(e.values) == 2 for e in path.events)
        assert get_session(stub, "s").state == before.state
        stream.close()
