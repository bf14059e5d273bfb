"""The server's interceptors around both styles of response-streaming handler grpc.aio runs: an async
generator that yields its responses, and a coroutine that writes them with ``context.write`` (as grpc's
own ``HealthServicer.Watch`` does). A real grpc.aio server with the interceptors the service installs,
and real channels; the handlers are small ones of this file, so that every shape and style is covered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from aaren.server.security.auth import TokenTable, current_tenant, hash_token, new_token
from aaren.server.security.interceptors import MalformedRequestInterceptor, TokenAuthInterceptor

TOKEN = new_token()
SERVICE = "test.Echo"


async def yield_tenant(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for _ in range(2):
        yield f"{current_tenant.get()}:{request.decode()}".encode()


async def write_tenant(request: bytes, context: grpc.aio.ServicerContext) -> None:
    for _ in range(2):
        await context.write(f"{current_tenant.get()}:{request.decode()}".encode())


async def yield_each(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    async for request in requests:
        yield f"{current_tenant.get()}:{request.decode()}".encode()


async def write_each(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
    while (request := await context.read()) is not grpc.aio.EOF:
        await context.write(f"{current_tenant.get()}:{request.decode()}".encode())


def strict_utf8(data: bytes) -> bytes:
    """A request parser that, like a protobuf one, refuses bytes that are not a message."""
    data.decode()
    return data


HANDLERS = {
    "YieldTenant": grpc.unary_stream_rpc_method_handler(yield_tenant, request_deserializer=strict_utf8),
    "WriteTenant": grpc.unary_stream_rpc_method_handler(write_tenant, request_deserializer=strict_utf8),
    "YieldEach": grpc.stream_stream_rpc_method_handler(yield_each),
    "WriteEach": grpc.stream_stream_rpc_method_handler(write_each),
}


class EchoServer:
    """A grpc.aio server with ``HANDLERS`` behind the service's interceptors, on its own loop."""

    def __init__(self, tokens: Path) -> None:
        self.loop = asyncio.new_event_loop()
        interceptors = [MalformedRequestInterceptor(), TokenAuthInterceptor(TokenTable.load(tokens))]
        self.server = self.loop.run_until_complete(self._start(interceptors))

    async def _start(self, interceptors: list[grpc.aio.ServerInterceptor]) -> grpc.aio.Server:
        server = grpc.aio.server(interceptors=interceptors)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, HANDLERS),))
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server

    def run(self, work: Any) -> Any:
        """Serve while ``work`` (a blocking client call, run in a thread) runs; its result."""
        return self.loop.run_until_complete(asyncio.wait_for(asyncio.to_thread(work), timeout=20))

    def close(self) -> None:
        self.loop.run_until_complete(self.server.stop(None))
        self.loop.close()


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[EchoServer]:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"tenant-a {hash_token(TOKEN)}\n")
    server = EchoServer(tokens)
    yield server
    server.close()


AUTH = (("authorization", f"Bearer {TOKEN}"),)


def failure(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_unary_stream_handlers_of_both_styles(echo: EchoServer) -> None:
    """An async generator and a coroutine that writes: each answers with the caller's tenant, and each is
    refused for a missing token (UNAUTHENTICATED) and for a malformed request (INVALID_ARGUMENT)."""

    def calls() -> dict[str, tuple[list[bytes], grpc.RpcError, grpc.RpcError]]:
        out = {}
        with grpc.insecure_channel(f"127.0.0.1:{echo.port}") as channel:
            for method in ("YieldTenant", "WriteTenant"):
                call = channel.unary_stream(f"/{SERVICE}/{method}")
                answered = list(call(b"x", metadata=AUTH, timeout=10))
                no_token = failure(lambda call=call: list(call(b"x", timeout=10)))
                malformed = failure(lambda call=call: list(call(b"\xff", metadata=AUTH, timeout=10)))
                out[method] = (answered, no_token, malformed)
        return out

    for method, (answered, no_token, malformed) in echo.run(calls).items():
        assert answered == [b"tenant-a:x", b"tenant-a:x"], method
        assert no_token.code() == grpc.StatusCode.UNAUTHENTICATED, (method, no_token.details())
        assert dict(no_token.trailing_metadata())["aaren-error-reason"] == "token_missing", method
        assert malformed.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, malformed.details())
        assert malformed.details().startswith("malformed request message: "), method
        assert dict(malformed.trailing_metadata())["aaren-error-reason"] == "malformed_request", method


def test_stream_stream_handlers_of_both_styles(echo: EchoServer) -> None:
    """An async generator and a coroutine that reads and writes: each answers every request with the
    caller's tenant, and each is refused for a missing token."""

    def calls() -> dict[str, tuple[list[bytes], grpc.RpcError]]:
        out = {}
        with grpc.insecure_channel(f"127.0.0.1:{echo.port}") as channel:
            for method in ("YieldEach", "WriteEach"):
                call = channel.stream_stream(f"/{SERVICE}/{method}")
                answered = list(call(iter([b"a", b"b"]), metadata=AUTH, timeout=10))
                no_token = failure(lambda call=call: list(call(iter([b"a"]), timeout=10)))
                out[method] = (answered, no_token)
        return out

    for method, (answered, no_token) in echo.run(calls).items():
        assert answered == [b"tenant-a:a", b"tenant-a:b"], method
        assert no_token.code() == grpc.StatusCode.UNAUTHENTICATED, (method, no_token.details())
        assert dict(no_token.trailing_metadata())["aaren-error-reason"] == "token_missing", method
