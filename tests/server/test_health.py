"""Standard gRPC health checking and server reflection, with the official client libraries."""

from __future__ import annotations

import json
import queue
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from redis_process import RedisProcess
from server_helpers import CALL_TIMEOUT_S, SERVICE, ServerProcess, reason_of, stub_for, wait_until
from servers import START_TIMEOUT_S

from aaren.server.security.auth import hash_token, new_token
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
    load_models = aaren.server.app.load_models

    def slow_load_models(*args, **kwargs):
        loading.set()
        release.wait(CALL_TIMEOUT_S)
        return load_models(*args, **kwargs)

    monkeypatch.setattr(aaren.server.app, "load_models", slow_load_models)
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
            starter.join(START_TIMEOUT_S)  # the start compiles the kernel where numba's cache is cold
            assert started, "the server did not start"
            response = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=CALL_TIMEOUT_S)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
            assert stub_for(channel).DescribeModel(pb.DescribeModelRequest(), timeout=CALL_TIMEOUT_S).num_marks == 5
    finally:
        release.set()
        starter.join(START_TIMEOUT_S)


# ---------------------------------------------------------------- client-side health checking, Watch

# What the README recommends for round robin over the headless Service: the channel itself watches
# grpc.health.v1.Health/Watch for "" on every backend and sends no call to one that is not SERVING.
HEALTH_CHECKING_SERVICE_CONFIG = json.dumps(
    {"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": ""}}
)
_ENDED = object()


def token_file(directory: Path) -> tuple[Path, str]:
    """A token file with one tenant, and that tenant's token."""
    token = new_token()
    path = directory / "tokens.txt"
    path.write_text(f"tenant-a {hash_token(token)}\n")
    return path, token


def unavailable(call: Callable[[], object]) -> bool:
    """Whether ``call`` fails with UNAVAILABLE (any other failure is raised)."""
    try:
        call()
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            return True
        raise
    return False


@pytest.mark.parametrize("auth", [False, True], ids=["auth-off", "token-auth"])
def test_health_checking_channel_calls_only_a_serving_server(start_server, tmp_path, auth):
    """A channel with client-side health checking reaches the server while it is SERVING, fails fast
    (UNAVAILABLE) while its store is down, and reaches it again once the store is back. A plain
    channel is still answered while the store is down: the refusal comes from the channel's health
    check, so the check really runs. With token auth on, the health service needs no token (the
    channel's health check carries none) while every other call still does."""
    redis = RedisProcess(tmp_path / "redis").start()
    settings: dict[str, object] = {}
    metadata: tuple[tuple[str, str], ...] = ()
    if auth:
        path, token = token_file(tmp_path)
        settings["auth_tokens_file"] = path
        metadata = (("authorization", f"Bearer {token}"),)
    try:
        srv = start_server(store_url=redis.url, store_check_interval_s=0.1, metrics_port=-1, **settings)
        options = [("grpc.service_config", HEALTH_CHECKING_SERVICE_CONFIG)]
        with (
            grpc.insecure_channel(srv.address, options=options) as checked,
            grpc.insecure_channel(srv.address) as plain,
        ):
            stub, plain_stub = stub_for(checked), stub_for(plain)

            def describe(**kwargs: object) -> pb.DescribeModelResponse:
                return stub.DescribeModel(
                    pb.DescribeModelRequest(), timeout=CALL_TIMEOUT_S, metadata=metadata, **kwargs
                )

            assert describe(wait_for_ready=True).num_marks == 5
            if auth:
                with pytest.raises(grpc.RpcError) as info:
                    stub.DescribeModel(pb.DescribeModelRequest(), timeout=CALL_TIMEOUT_S)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

            redis.kill()
            wait_until(lambda: unavailable(describe), "the health-checking channel to refuse calls")
            assert unavailable(describe), "a call went to a server that is NOT_SERVING"
            plain_answer = plain_stub.DescribeModel(
                pb.DescribeModelRequest(), timeout=CALL_TIMEOUT_S, metadata=metadata
            )
            assert plain_answer.num_marks == 5  # the server itself still answers

            redis.start()
            assert describe(wait_for_ready=True).num_marks == 5
            assert describe().num_marks == 5
    finally:
        redis.stop()


class Watcher(threading.Thread):
    """One Health/Watch call; every status it streams goes to ``statuses``, then ``_ENDED``."""

    def __init__(self, address: str, service: str) -> None:
        super().__init__(name=f"watch-{service or 'server'}", daemon=True)
        self.channel = grpc.insecure_channel(address)
        self.call = health_pb2_grpc.HealthStub(self.channel).Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=60
        )
        self.statuses: queue.Queue[object] = queue.Queue()
        self.code: grpc.StatusCode | None = None

    def run(self) -> None:
        try:
            for response in self.call:
                self.statuses.put(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
        except grpc.RpcError as exc:
            self.code = exc.code()
        finally:
            self.statuses.put(_ENDED)

    def next(self) -> object:
        return self.statuses.get(timeout=CALL_TIMEOUT_S)

    def close(self) -> None:
        self.call.cancel()
        self.join(CALL_TIMEOUT_S)
        self.channel.close()


def test_watch_streams_store_outage_and_draining(start_server, tmp_path):
    """Health/Watch, for the whole server and for the forecast service, streams SERVING, NOT_SERVING
    when the store goes down, SERVING when it is back, NOT_SERVING when the server drains, and then
    ends: the watcher learns of every change without polling."""
    redis = RedisProcess(tmp_path / "redis").start()
    try:
        srv = start_server(store_url=redis.url, store_check_interval_s=0.1, metrics_port=-1)
        watchers = [Watcher(srv.address, service) for service in ("", SERVICE)]
        try:
            for watcher in watchers:
                watcher.start()
            assert [w.next() for w in watchers] == ["SERVING", "SERVING"], [w.code for w in watchers]
            redis.kill()
            assert [w.next() for w in watchers] == ["NOT_SERVING", "NOT_SERVING"]
            redis.start()
            assert [w.next() for w in watchers] == ["SERVING", "SERVING"]
            srv.stop(grace=1.0)
            assert [w.next() for w in watchers] == ["NOT_SERVING", "NOT_SERVING"]
            assert [w.next() for w in watchers] == [_ENDED, _ENDED]
            assert all(w.code is not None and w.code != grpc.StatusCode.UNKNOWN for w in watchers)
        finally:
            for watcher in watchers:
                watcher.close()
    finally:
        redis.stop()


# ---------------------------------------------------------------- what a server process says


def server_health(address: str) -> str:
    with grpc.insecure_channel(address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def test_a_server_started_while_its_store_is_down_logs_it(tmp_path, tiny_checkpoint):
    """The first store check is logged when it fails (not only a later change), and so is the store
    coming up: an operator reading the log learns why health says NOT_SERVING."""
    redis = RedisProcess(tmp_path / "redis")  # not started yet: nothing listens on its port
    srv = ServerProcess(
        tmp_path / "server.log",
        checkpoint=tiny_checkpoint,
        store_url=redis.url,
        store_check_interval_s=0.1,
        metrics_port=-1,
    )
    try:
        assert server_health(srv.address) == "NOT_SERVING"
        down = f"ERROR aaren.server: session store {redis.url} is not answering: health NOT_SERVING until it does"
        assert down in srv.log_path.read_text(), srv.log_path.read_text()[-3000:]
        redis.start()
        wait_until(lambda: server_health(srv.address) == "SERVING", "health SERVING")
        up = "INFO aaren.server: session store answers: health SERVING"
        wait_until(lambda: up in srv.log_path.read_text(), "the store coming up in the log")
    finally:
        srv.stop()
        redis.stop()


def test_ready_line_says_metrics_off(tmp_path, tiny_checkpoint):
    """With --metrics-port -1 the line scripts wait for says "metrics off", not "metrics on port 0"."""
    srv = ServerProcess(tmp_path / "server.log", checkpoint=tiny_checkpoint, metrics_port=-1)
    try:
        assert srv.ready_line == f"aaren: listening on port {srv.grpc_port}, metrics off"
        assert srv.metrics_port is None
        assert server_health(srv.address) == "SERVING"
    finally:
        srv.stop()
