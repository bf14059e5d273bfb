"""Standard gRPC health checking and server reflection, with the official client libraries."""

from __future__ import annotations

import socket
import threading

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from server_helpers import CALL_TIMEOUT_S, SERVICE, reason_of, stub_for

from aaren.v1 import aaren_pb2 as pb


def test_health_serving(start_server):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE):
            response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT_S)
            assert response.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=CALL_TIMEOUT_S)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_services_and_describes_stream(start_server):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {SERVICE, "grpc.health.v1.Health"} <= services, services

        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName(SERVICE)
        assert {m.name for m in service.methods} == {"Stream", "Forecast", "GetSession", "EndSession", "DescribeModel"}
        stream = service.FindMethodByName("Stream")
        assert stream.client_streaming and stream.server_streaming
        assert stream.input_type.full_name == "aaren.v1.StreamRequest"
        assert stream.output_type.full_name == "aaren.v1.StreamResponse"
        event = pool.FindMessageTypeByName("aaren.v1.Event")
        assert [f.name for f in event.fields] == ["session_id", "seq", "time", "mark", "values"]
        # The dependency on a well-known type resolves through reflection too.
        info = pool.FindMessageTypeByName("aaren.v1.GetSessionResponse")
        assert info.fields_by_name["created_at"].message_type.full_name == "google.protobuf.Timestamp"


def test_not_serving_while_the_model_loads(start_server, monkeypatch):
    import aaren.server.app

    loading, release = threading.Event(), threading.Event()
    load_engine = aaren.server.app.load_engine

    def slow_load_engine(*args, **kwargs):
        loading.set()
        release.wait(CALL_TIMEOUT_S)
        return load_engine(*args, **kwargs)

    monkeypatch.setattr(aaren.server.app, "load_engine", slow_load_engine)
    with socket.socket() as s:  # the port is bound before the model loads; pick it in advance
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started: list = []
    starter = threading.Thread(
        target=lambda: started.append(start_server(metrics_port=-1, address=f"127.0.0.1:{port}")), name="starter"
    )
    starter.start()
    try:
        assert loading.wait(CALL_TIMEOUT_S)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", SERVICE):
                response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT_S)
                assert response.status == health_pb2.HealthCheckResponse.NOT_SERVING, service
            with pytest.raises(grpc.RpcError) as info:
                stub_for(channel).DescribeModel(pb.DescribeModelRequest(), timeout=CALL_TIMEOUT_S)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert reason_of(info.value) == "loading"
            release.set()
            starter.join(CALL_TIMEOUT_S)
            assert started, "the server did not start"
            response = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=CALL_TIMEOUT_S)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
            assert stub_for(channel).DescribeModel(pb.DescribeModelRequest(), timeout=CALL_TIMEOUT_S).num_marks == 5
    finally:
        release.set()
        starter.join(CALL_TIMEOUT_S)
