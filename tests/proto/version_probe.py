"""Run by tests/proto/test_versions.py inside a throwaway venv: which gRPC stack is imported, and a
real round trip through the aaren server and client on it. Prints one JSON object on stdout.

Not a test module (pytest does not collect it): it must run in another interpreter, whose
grpcio/protobuf are the ones under test.
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings
from typing import Any


def _stack() -> dict[str, dict[str, str]]:
    """Version and file of each package of the gRPC stack this interpreter imports."""
    from importlib.metadata import version

    import google.protobuf
    import grpc
    import grpc_health
    import grpc_reflection

    modules = {
        "grpcio": grpc,
        "protobuf": google.protobuf,
        "grpcio-health-checking": grpc_health,
        "grpcio-reflection": grpc_reflection,
    }
    return {name: {"version": version(name), "file": str(module.__file__)} for name, module in modules.items()}


def _reflect(address: str) -> tuple[list[str], str, list[str]]:
    """The services the server lists through reflection v1alpha, the Stream rpc's input type from
    the descriptors it sends, and the services listed through reflection v1."""
    import grpc
    from google.protobuf import descriptor_pool
    from grpc_reflection.v1alpha import reflection_pb2
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = sorted(database.get_services())
        service = descriptor_pool.DescriptorPool(database).FindServiceByName("aaren.v1.ForecastService")
        stream = service.FindMethodByName("Stream")
        v1 = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        (listed,) = v1(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30)
        return services, stream.input_type.full_name, sorted(s.name for s in listed.list_services_response.service)


async def _round_trip() -> dict[str, Any]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from aaren.client import AarenClient, EventIn
    from aaren.server.app import AarenServer
    from aaren.server.settings import ServerSettings

    server = AarenServer(
        ServerSettings(address="127.0.0.1:0", metrics_port=-1, device="cpu", torch_threads=1, frontends=0)
    )
    await server.start()
    try:
        address = f"127.0.0.1:{server.grpc_port}"
        async with AarenClient(address, timeout=30) as client:
            model = await client.describe_model()
            async with client.stream() as stream:
                result = await stream.apply(
                    [
                        EventIn("s", 1, 0.0, 0, [0.0] * model.value_width),
                        EventIn("s", 2, 1.5, 1 % model.num_marks, [1.0] * model.value_width),
                    ]
                )
            session = await client.get_session("s")
        async with grpc.aio.insecure_channel(address) as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        # grpc_reflection's client is synchronous: off the loop that serves it.
        services, stream_input, v1_services = await asyncio.to_thread(_reflect, address)
        return {
            "model": model.name,
            "forecast_seqs": [f.seq for f in result.forecasts],
            "errors": [e.reason for e in result.errors],
            "session_last_seq": session.last_seq,
            "health": health_pb2.HealthCheckResponse.ServingStatus.Name(health.status),
            "reflection_services": services,
            "reflected_stream_input": stream_input,
            "reflection_v1_services": v1_services,
        }
    finally:
        await server.stop(1.0)


def main() -> int:
    out: dict[str, Any] = {"stack": _stack()}
    # The generated code's own version checks: an error, or a warning about a too old or too new
    # gencode, means this end of the range is not really supported.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from aaren.v1 import aaren_pb2, aaren_pb2_grpc  # noqa: F401 (imported for its checks)
    out["import_warnings"] = [str(w.message) for w in caught]
    out["round_trip"] = asyncio.run(asyncio.wait_for(_round_trip(), timeout=120))
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
