"""Standard gRPC health checking and server reflection, with the official client libraries."""

from __future__ import annotations

import socket
import threading

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
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


# The v1 messages' fields, as grpc-proto's grpc/reflection/v1/reflection.proto numbers them.
REFLECTION_V1_FIELDS = {
    "ServerReflectionRequest": {
        "host": 1,
        "file_by_filename": 3,
        "file_containing_symbol": 4,
        "file_containing_extension": 5,
        "all_extension_numbers_of_type": 6,
        "list_services": 7,
    },
    "ServerReflectionResponse": {
        "valid_host": 1,
        "original_request": 2,
        "file_descriptor_response": 4,
        "all_extension_numbers_response": 5,
        "list_services_response": 6,
        "error_response": 7,
    },
}


def reflect(channel: grpc.Channel, service: str, requests: list) -> list:
    """One ServerReflectionInfo stream on ``service``, as a raw call (v1 and v1alpha share the bytes)."""
    call = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return list(call(iter(requests), timeout=CALL_TIMEOUT_S))


def files_of(response) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    protos = response.file_descriptor_response.file_descriptor_proto
    return {f.name: f for f in map(descriptor_pb2.FileDescriptorProto.FromString, protos)}


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_answers_as_v1_and_v1alpha(start_server, version):
    request = reflection_pb2.ServerReflectionRequest
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        listed, ours, v1_itself, unknown = reflect(
            channel,
            f"grpc.reflection.{version}.ServerReflection",
            [
                request(list_services=""),
                request(file_containing_symbol=SERVICE),
                request(file_containing_symbol="grpc.reflection.v1.ServerReflection"),
                request(file_containing_symbol="no.such.Symbol"),
            ],
        )
    names = {s.name for s in listed.list_services_response.service}
    assert {
        SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names, names

    # What a client does with the answer: load the files (dependencies first) and find the rpcs.
    files = files_of(ours)
    assert set(files) == {"aaren/v1/aaren.proto", "google/protobuf/timestamp.proto"}
    pool = descriptor_pool.DescriptorPool()
    for name in ("google/protobuf/timestamp.proto", "aaren/v1/aaren.proto"):
        pool.Add(files[name])
    get_session = pool.FindServiceByName(SERVICE).FindMethodByName("GetSession")
    assert get_session.output_type.full_name == "aaren.v1.GetSessionResponse"

    # The v1 service describes itself with v1's own names and numbers.
    (v1_file,) = files_of(v1_itself).values()
    assert v1_file.package == "grpc.reflection.v1"
    fields = {m.name: {f.name: f.number for f in m.field} for m in v1_file.message_type}
    assert {name: fields[name] for name in REFLECTION_V1_FIELDS} == REFLECTION_V1_FIELDS
    type_names = [f.type_name for m in v1_file.message_type for f in m.field if f.type_name]
    type_names += [t for m in v1_file.service[0].method for t in (m.input_type, m.output_type)]
    assert type_names and all(t.startswith(".grpc.reflection.v1.") for t in type_names), type_names
    pool.Add(v1_file)
    assert pool.FindServiceByName("grpc.reflection.v1.ServerReflection").methods[0].client_streaming

    assert unknown.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


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
