"""Graceful shutdown: health NOT_SERVING while draining, in-flight events answered, streams closed
with UNAVAILABLE, new calls refused."""

from __future__ import annotations

import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_helpers import (
    CALL_TIMEOUT_S,
    OpenStream,
    assert_event_error,
    assert_forecasts,
    ev,
    hold_model_steps,
    stub_for,
    wait_until,
)

from aaren.v1 import aaren_pb2 as pb

pytestmark = pytest.mark.layouts  # every server of this module runs in both process layouts


def health_status(channel: grpc.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT_S).status


def test_graceful_shutdown_answers_in_flight_events_then_closes_streams(start_server):
    srv = start_server(metrics_port=-1, model_thread=True)  # the gate holds the worker thread
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        assert_forecasts(stream.send([ev("a", 1, 1.0)]), [("a", 1)])
        assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING

        entered, release = hold_model_steps(srv)
        in_flight = stream.put([ev("a", 2, 2.0), ev("b", 1, 1.0)])
        assert entered.wait(CALL_TIMEOUT_S), "the in-flight batch never reached the model"

        stopper = threading.Thread(target=srv.stop, kwargs={"grace": 10.0}, name="stopper")
        stopper.start()
        try:
            for service in ("", "aaren.v1.ForecastService"):
                wait_until(
                    lambda service=service: (
                        health_status(channel, service) == health_pb2.HealthCheckResponse.NOT_SERVING
                    ),
                    f"health of {service!r} to be NOT_SERVING while draining",
                )
            # New events are refused while draining, with a clear error; the stream stays open.
            refused_id = stream.put([ev("a", 3, 3.0)])
            # Released only once the server has read (and refused) it: else the drain may end first.
            # (The registry itself: the metrics port closes as the drain starts.)
            registry = srv.server.metrics.registry
            wait_until(
                lambda: registry.get_sample_value("aaren_events_rejected_total", {"reason": "shutting_down"}) == 1,
                "the event sent while draining refused",
            )
        finally:
            release.set()

        # Answers leave in request order: the in-flight events first, then the refusal.
        answered = stream.next()
        assert answered.request_id == in_flight
        assert_forecasts(answered, [("a", 2), ("b", 1)])
        refused = stream.next()
        assert refused.request_id == refused_id
        assert_event_error(refused.results[0], pb.ERROR_CODE_UNAVAILABLE, "shutting_down", ("shutting down",))
        with pytest.raises(grpc.RpcError) as info:
            stream.next()
        stream.end_requests()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in info.value.details()
        stopper.join(CALL_TIMEOUT_S)
        assert not stopper.is_alive()

    with grpc.insecure_channel(srv.address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            stub_for(channel).DescribeModel(pb.DescribeModelRequest(), timeout=CALL_TIMEOUT_S)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError) as info:
            OpenStream(stub_for(channel)).send([ev("c", 1, 1.0)])
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_idle_stream_closed_with_unavailable_on_shutdown(start_server):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        assert_forecasts(stream.send([ev("a", 1, 1.0)]), [("a", 1)])
        srv.stop(grace=5.0)
        with pytest.raises(grpc.RpcError) as info:
            stream.next()
        stream.end_requests()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in info.value.details()
