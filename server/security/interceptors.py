"""gRPC server interceptors: token authentication, and malformed requests answered as such.

Each wraps the method handler grpc found, keeping its shape (unary or streaming on either side) and,
for a streaming response, its style: grpc.aio runs an async generator (``yield`` each response) and a
coroutine that writes with ``context.write`` (grpc's own ``HealthServicer.Watch``) differently, so
a wrapper must be of the same style as the behaviour it wraps (``_streaming``).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from aaren.server.security.auth import TokenTable, current_tenant

__all__ = ["MalformedRequestInterceptor", "TokenAuthInterceptor"]

UNAUTHENTICATED_METHODS_PREFIX = "/grpc.health.v1.Health/"
REASON_METADATA_KEY = "aaren-error-reason"

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]


def _bearer(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without a known bearer token (UNAUTHENTICATED); sets ``current_tenant``."""

    def __init__(self, table: TokenTable, on_refused: Callable[[str], None] = lambda reason: None) -> None:
        self.table = table
        self.on_refused = on_refused

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(UNAUTHENTICATED_METHODS_PREFIX):
            return handler
        token = _bearer(handler_call_details.invocation_metadata)
        tenant = self.table.tenant_of(token) if token is not None else None
        if tenant is None:
            reason = "token_missing" if token is None else "token_invalid"
            self.on_refused(reason)
            return _refusal(handler, reason)
        return _with_tenant(handler, tenant)


def _refusal(handler: grpc.RpcMethodHandler, reason: str) -> grpc.RpcMethodHandler:
    message = (
        "no bearer token: send metadata 'authorization: Bearer <token>'"
        if reason == "token_missing"
        else "the bearer token is not valid here"
    )

    async def abort(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, message, trailing_metadata=((REASON_METADATA_KEY, reason),)
        )

    async def abort_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await abort(request, context)
        yield  # never reached: makes this an async generator, as grpc expects of a streaming handler

    return _same_kind(handler, abort, abort_stream)


def _streaming(
    behavior: Callable[..., Any], before: Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]
) -> Callable[..., Any]:
    """``behavior`` (a response-streaming handler) with ``await before(request, context)`` run first,
    in the same style as ``behavior``.

    grpc.aio dispatches on the handler's kind (``inspect.iscoroutinefunction`` first, then
    ``isasyncgenfunction``): a coroutine writes its responses itself with ``context.write`` and
    returns None, so it must stay a coroutine; wrapping it in ``async for`` fails every call
    ("'async for' requires an object with __aiter__ method, got coroutine").
    """
    if inspect.iscoroutinefunction(behavior):

        async def write(request: Any, context: grpc.aio.ServicerContext) -> None:
            await before(request, context)
            await behavior(request, context)

        return write

    async def generate(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await before(request, context)
        async for response in behavior(request, context):
            yield response

    return generate


def _with_tenant(handler: grpc.RpcMethodHandler, tenant: str) -> grpc.RpcMethodHandler:
    async def set_tenant(request: Any, context: grpc.aio.ServicerContext) -> None:
        current_tenant.set(tenant)

    def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await set_tenant(request, context)
            return await behavior(request, context)

        return call

    def streaming(behavior: Callable[..., Any]) -> Callable[..., Any]:
        return _streaming(behavior, set_tenant)

    return _same_kind(handler, unary, streaming, wrap=True)


def _same_kind(
    handler: grpc.RpcMethodHandler,
    unary_response: Callable[..., Any],
    stream_response: Callable[..., Any],
    *,
    wrap: bool = False,
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` whose behaviour is replaced (or, ``wrap``, wrapped)."""
    codec = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}

    def pick(behavior: Callable[..., Any], make: Callable[..., Any]) -> Callable[..., Any]:
        if not wrap:
            return make
        return make(behavior)

    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(pick(handler.unary_unary, unary_response), **codec)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(pick(handler.unary_stream, stream_response), **codec)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(pick(handler.stream_unary, unary_response), **codec)
    return grpc.stream_stream_rpc_method_handler(pick(handler.stream_stream, stream_response), **codec)


class _Malformed:
    """Stands in for a request message that did not parse."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


async def _reject_malformed(request: Any, context: grpc.aio.ServicerContext) -> None:
    """Aborts the call (INVALID_ARGUMENT, reason malformed_request) when its request did not parse."""
    if isinstance(request, _Malformed):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"malformed request message: {request.error}",
            trailing_metadata=((REASON_METADATA_KEY, "malformed_request"),),
        )


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    """A unary request that does not parse as its message type gets INVALID_ARGUMENT ("malformed
    request message: ...", reason malformed_request), not grpc's UNKNOWN with a Python exception name."""

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None or handler.request_streaming:
            # Streamed requests are parsed as the servicer reads them; it answers a DecodeError with
            # INVALID_ARGUMENT itself, so the hot path keeps no extra layer.
            return handler
        parse = handler.request_deserializer

        def lenient(data: bytes) -> Any:
            try:
                return parse(data)
            except Exception as exc:  # whatever the parser raises, the bytes were not a message
                return _Malformed(exc)

        def unary_request(behavior: Callable[..., Any], streaming_response: bool) -> Callable[..., Any]:
            if streaming_response:
                return _streaming(behavior, _reject_malformed)

            async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await _reject_malformed(request, context)
                return await behavior(request, context)

            return call

        codec = {"request_deserializer": lenient, "response_serializer": handler.response_serializer}
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(unary_request(handler.unary_unary, False), **codec)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(unary_request(handler.unary_stream, True), **codec)
        return handler
