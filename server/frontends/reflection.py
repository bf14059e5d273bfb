"""gRPC server reflection under both names clients ask for: ``grpc.reflection.v1`` and ``v1alpha``.

grpcio-reflection ships only the ``v1alpha`` service (grpc/grpc#38576), while current grpcurl and
grpc-js reflection clients ask for ``grpc.reflection.v1`` first (and some tools only for it). The
two protocols are the same messages under another package name, field for field and number for
number, so the bytes on the wire are the same: ``v1`` is answered by grpcio-reflection's own
servicer, registered a second time under the ``v1`` name. So that ``v1`` can describe itself, its
file descriptor (``v1alpha``'s with the package renamed) is in the pool reflection answers from;
that pool is the servicer's own, so the process's default pool gets no file it did not import.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

__all__ = ["V1ALPHA_SERVICE_NAME", "V1_SERVICE_NAME", "enable_server_reflection"]

V1ALPHA_SERVICE_NAME: str = reflection.SERVICE_NAME
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
# Where grpc keeps the v1 proto (grpc/reflection/v1/reflection.proto in grpc-proto); clients see it
# as the file that defines the v1 service.
V1_FILE_NAME = "grpc/reflection/v1/reflection.proto"


def _v1_file() -> descriptor_pb2.FileDescriptorProto:
    """The ``grpc.reflection.v1`` file: ``v1alpha``'s descriptor with every name moved to ``v1``."""
    file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(file)
    old = f".{file.package}."

    def moved(type_name: str) -> str:
        return f".{V1_PACKAGE}.{type_name.removeprefix(old)}"

    file.name, file.package = V1_FILE_NAME, V1_PACKAGE
    for message in file.message_type:  # v1alpha has no nested messages
        for field in message.field:
            if field.HasField("type_name"):  # a scalar field must keep it unset, not empty
                field.type_name = moved(field.type_name)
    for service in file.service:
        for method in service.method:
            method.input_type, method.output_type = moved(method.input_type), moved(method.output_type)
    return file


def _pool(service_names: Sequence[str]) -> descriptor_pool.DescriptorPool:
    """A pool with the files of ``service_names`` (from the default pool, with their dependencies),
    grpcio-reflection's ``v1alpha`` file and the ``v1`` file."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: FileDescriptor) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:  # a pool takes a file only after what it imports
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        pool.AddSerializedFile(proto.SerializeToString())
        added.add(file.name)

    default = descriptor_pool.Default()
    for name in service_names:
        add(default.FindServiceByName(name).file)
    add(reflection_pb2.DESCRIPTOR)
    pool.AddSerializedFile(_v1_file().SerializeToString())
    return pool


def enable_server_reflection(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Serve reflection for ``service_names`` (full names, in the default descriptor pool, as the
    generated code puts them) on ``server``, as ``grpc.reflection.v1`` and ``v1alpha``; both
    reflection services list themselves too."""
    names = [*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME]
    servicer = reflection.aio.ReflectionServicer(names, pool=_pool(service_names))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    # Same method, same messages: v1alpha's (de)serializers read and write v1's bytes.
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    handler = grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {"ServerReflectionInfo": v1})
    server.add_generic_rpc_handlers((handler,))
