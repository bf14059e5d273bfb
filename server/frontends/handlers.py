"""A gRPC service's method handlers from its descriptor, for the front ends that register one.

Each rpc gets its request class's parser and its response class's serializer; a method named in
``passthrough`` takes its requests as the wire bytes they are and answers with wire bytes, which gRPC
sends as they are (the aaren.v1 stream reads its requests into columns in one compiled pass, and writes
its forecasts as bytes: a message in between cost every request and reply a pass of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

__all__ = ["add_service"]

_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_service(
    server: grpc.aio.Server,
    service: ServiceDescriptor,
    behaviour: Callable[[MethodDescriptor], Callable[..., Any]],
    *,
    name: str | None = None,
    passthrough: Collection[str] = (),
) -> None:
    """Register every rpc of ``service`` on ``server`` under ``name`` (default: the descriptor's full
    name), each served by ``behaviour(method)``."""
    name = name or service.full_name
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        serialize = message_factory.GetMessageClass(method.output_type).SerializeToString
        raw = method.name in passthrough
        handlers[method.name] = _KINDS[(method.client_streaming, method.server_streaming)](
            behaviour(method),  # type: ignore[arg-type]
            request_deserializer=None if raw else message_factory.GetMessageClass(method.input_type).FromString,
            response_serializer=bytes if raw else serialize,  # bytes(b) is b itself
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    if hasattr(server, "add_registered_method_handlers"):
        server.add_registered_method_handlers(name, handlers)
