"""Who answers the event-log consumer: the engine core in this process, or a server over aaren.v1.

``CoreAnswerer``: the aaren.v1 codec (``ForecastServicer.answer``) over a ``CoreAPI``, so a log's
event is checked, applied and encoded exactly as a ``Stream`` message's is. ``RemoteAnswerer``: one
open ``Stream`` call to a server at ``--target`` (answers come in request order), reopened when it
breaks; the server's own semantics (seqs, one winner, durable state) hold as for any client.
"""

from __future__ import annotations

import asyncio

import grpc

from aaren.server.contract.errors import Code, ServiceError
from aaren.server.frontends.aaren_v1.servicer import ForecastServicer
from aaren.server.frontends.eventlog.base import LogUnavailableError
from aaren.server.frontends.eventlog.consumer import BeforeStore
from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc

__all__ = ["CoreAnswerer", "RemoteAnswerer"]

#: gRPC codes after which the call is tried again (the server may be back), not reported as an answer.
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})


class CoreAnswerer:
    """The consumer's requests through the aaren.v1 codec attached to the engine core."""

    publishes_before_store = True

    def __init__(self, servicer: ForecastServicer, tenant: str = "") -> None:
        self.servicer = servicer
        self.tenant = tenant

    async def answer(self, request: pb.StreamRequest, before_store: BeforeStore | None = None) -> pb.StreamResponse:
        return await self.servicer.answer(request, self.tenant, before_store)

    async def latest(self, session_id: str, model: str) -> pb.Forecast:
        return await self.servicer.latest(session_id, model, tenant=self.tenant)


class RemoteAnswerer:
    """The consumer's requests over one ``Stream`` call to ``target`` (host:port, plaintext, or TLS
    with ``credentials``); ``token``: a bearer token for a server with tenants."""

    def __init__(
        self, target: str, credentials: grpc.ChannelCredentials | None = None, token: str | None = None
    ) -> None:
        self.target = target
        self._channel = (
            grpc.aio.secure_channel(target, credentials) if credentials else grpc.aio.insecure_channel(target)
        )
        self._stub = pb_grpc.ForecastServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._call: grpc.aio.StreamStreamCall | None = None
        self._lock = asyncio.Lock()  # one request on the call at a time: answers pair with requests

    #: A server elsewhere stores before it answers: the consumer sends layers instead.
    publishes_before_store = False

    async def answer(self, request: pb.StreamRequest, before_store: BeforeStore | None = None) -> pb.StreamResponse:
        if before_store is not None:
            raise ValueError("a remote server cannot wait for a publish before it stores")
        async with self._lock:
            try:
                if self._call is None:
                    self._call = self._stub.Stream(metadata=self._metadata)
                await self._call.write(request)
                response = await self._call.read()
            except grpc.aio.AioRpcError as exc:
                self._call = None
                raise LogUnavailableError(f"server {self.target}: {exc.code().name}: {exc.details()}") from exc
            if response is grpc.aio.EOF:
                self._call = None
                raise LogUnavailableError(f"server {self.target} ended the stream")
            return response

    async def latest(self, session_id: str, model: str) -> pb.Forecast:
        try:
            response = await self._stub.Forecast(
                pb.ForecastRequest(session_id=session_id, model=model), metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _RETRYABLE:
                raise LogUnavailableError(f"server {self.target}: {exc.code().name}: {exc.details()}") from exc
            raise ServiceError(Code(exc.code().value[0]), "remote", exc.details() or "") from exc
        return response.forecast

    async def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        await self._channel.close()
