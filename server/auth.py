"""Bearer-token authentication with tenants, as one gRPC server interceptor.

Tokens live in a file, one per line: ``<tenant> sha256:<hex digest of the token>`` (blank lines
and ``#`` comments allowed). Only digests are kept, in the file and in memory; a presented token
is hashed and compared with every digest in constant time (``hmac.compare_digest``), so neither
the file nor the timing tells a token. ``aaren token TENANT`` makes a token and its line.

The interceptor checks ``authorization: Bearer <token>`` on every call except the health service,
answers UNAUTHENTICATED when it is missing or unknown, and hands the tenant to the servicer in a
context variable. Tenant names are ``[a-z0-9][a-z0-9_.-]{0,62}``: never a ``/``, which separates
the tenant from the session id in the store's keys.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import hmac
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

__all__ = [
    "AuthError",
    "TokenAuthInterceptor",
    "TokenTable",
    "current_tenant",
    "hash_token",
    "new_token",
]

#: The tenant of the call being served ("" when authentication is off).
current_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("aaren_tenant", default="")

TENANT_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
DIGEST_PATTERN = re.compile(r"sha256:([0-9a-f]{64})")
UNAUTHENTICATED_METHODS_PREFIX = "/grpc.health.v1.Health/"
REASON_METADATA_KEY = "aaren-error-reason"


class AuthError(ValueError):
    """The token file is malformed (the message names the line, never a token)."""


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits)."""
    return "aaren_" + secrets.token_urlsafe(32)


@dataclasses.dataclass(frozen=True)
class TokenTable:
    """Digest -> tenant, from a token file."""

    digests: tuple[tuple[bytes, str], ...]

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        entries: list[tuple[bytes, str]] = []
        for number, raw in enumerate(path.read_text().splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise AuthError(f"{path}:{number}: expected '<tenant> sha256:<64 hex digits>', got {len(parts)} fields")
            tenant, digest = parts
            if not TENANT_PATTERN.fullmatch(tenant):
                raise AuthError(f"{path}:{number}: tenant {tenant!r} must match {TENANT_PATTERN.pattern}")
            match = DIGEST_PATTERN.fullmatch(digest)
            if match is None:
                raise AuthError(
                    f"{path}:{number}: expected a token digest 'sha256:<64 hex digits>' (tokens themselves are never "
                    "stored; `aaren token TENANT` prints the line)"
                )
            entries.append((bytes.fromhex(match.group(1)), tenant))
        if not entries:
            raise AuthError(f"{path}: no tokens; expected lines '<tenant> sha256:<64 hex digits>'")
        return cls(tuple(entries))

    def tenant_of(self, token: str) -> str | None:
        """The token's tenant, or None. Compares with every digest, in constant time each."""
        presented = hashlib.sha256(token.encode()).digest()
        found = None
        for digest, tenant in self.digests:
            if hmac.compare_digest(presented, digest):
                found = tenant
        return found

    @property
    def tenants(self) -> set[str]:
        return {tenant for _, tenant in self.digests}


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
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
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

    return _same_kind(handler, abort, abort)


def _with_tenant(handler: grpc.RpcMethodHandler, tenant: str) -> grpc.RpcMethodHandler:
    def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            current_tenant.set(tenant)
            return await behavior(request, context)

        return call

    def streaming(behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            current_tenant.set(tenant)
            async for response in behavior(request, context):
                yield response

        return call

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
