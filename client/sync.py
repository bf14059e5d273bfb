"""A synchronous client for scripts and notebooks: ``SyncClient`` (also ``aaren.Client``).

It runs an ``AarenClient`` on an event loop of its own in a background thread and waits for each
call from the calling thread. ``asyncio.run`` would not do: inside Jupyter the calling thread
already runs a loop, and a grpc.aio channel is bound to the loop it was made on, so one private
loop keeps the channel and the stream alive across calls and cells.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, Unpack

from aaren.client.client import (
    AarenClient,
    ChannelOptions,
    EventIn,
    EventStream,
    RequestOptions,
    StreamResult,
)
from aaren.client.frames import DEFAULT_SESSION, apply_frame

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SyncClient"]

T = TypeVar("T")
P = ParamSpec("P")


def _blocking(
    method: Callable[Concatenate[AarenClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncClient, P], T]:
    """``AarenClient.method`` as a blocking ``SyncClient`` method, with the same arguments and docstring."""

    @functools.wraps(method)
    def call(self: SyncClient, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.run(method(self._client, *args, **kwargs))

    return call


class SyncClient:
    """Blocking client of one aaren server: ``with SyncClient("host:port") as client: ...``.

    The arguments are ``AarenClient``'s. ``apply`` sends events on one stream that the client opens
    on first use and keeps open (reopened if it failed); ``close`` ends it, the channel and the
    thread. Safe to call from a thread with a running event loop (a notebook cell), and from
    several threads (calls run one after another on the client's loop).
    """

    def __init__(self, target: str, **options: Unpack[ChannelOptions]) -> None:
        self.target = target
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="aaren-sync-client", daemon=True)
        self._thread.start()
        self._stream: EventStream | None = None
        self._closed = False

        async def make() -> AarenClient:
            return AarenClient(target, **options)

        try:
            self._client = self._run(make())
        except BaseException:
            self._stop_loop()
            raise

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self._stop_loop()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def aio(self) -> AarenClient:
        """The async client underneath (its coroutines must run on this client's loop: see ``run``)."""
        return self._client

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the client's loop and return its result (for the async API's extras)."""
        if self._closed:
            coro.close()
            raise RuntimeError("the client is closed")
        return self._run(coro, timeout)

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            # Waiting on the loop from its own thread would block it forever.
            raise RuntimeError("a SyncClient method was called from its own event loop; await client.aio instead")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def close(self) -> None:
        """End the stream (waiting for its answers), close the channel and stop the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._aclose())
        finally:
            self._stop_loop()

    async def _aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            try:
                await stream.close()
            finally:
                await self._client.close()
        else:
            await self._client.close()

    def _stop_loop(self) -> None:
        if threading.current_thread() is self._thread:
            self._loop.call_soon(self._loop.stop)
            return
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()

    # The unary calls, blocking: AarenClient's own signatures and docstrings (one copy of each).
    wait_ready = _blocking(AarenClient.wait_ready)
    describe_model = _blocking(AarenClient.describe_model)
    forecast = _blocking(AarenClient.forecast)
    get_session = _blocking(AarenClient.get_session)
    end_session = _blocking(AarenClient.end_session)

    def apply(self, events: Sequence[EventIn], **options: Unpack[RequestOptions]) -> StreamResult:
        """Send ``events`` (any sessions, in order) in one request and return its result
        (``EventStream.apply``, which takes the same ``options``): one outcome per event, a forecast
        for each applied one. ``model``: the served model by name (None or "": the default)."""
        return self.run(self._apply(list(events), **options))

    async def _apply(self, events: list[EventIn], **options: Unpack[RequestOptions]) -> StreamResult:
        stream = self._stream
        if stream is None or stream.error is not None or stream.finished:
            stream = self._stream = self._client.stream()
            stream.open()
        return await stream.apply(events, **options)

    def apply_frame(
        self,
        events: pd.DataFrame,
        *,
        model: str = "",
        restart: bool = False,
        top_k: int = 0,
        session_id: str = DEFAULT_SESSION,
    ) -> pd.DataFrame:
        """``aaren.client.frames.apply_frame``: a DataFrame of events (an event, series or class
        model's, by ``model`` name; "" the default) in, one of outcomes and forecasts out."""
        return self.run(
            apply_frame(
                self._client, events, model=model, restart=restart, top_k=top_k, session_id=session_id,
                apply=self._apply,
            )
        )  # fmt: skip
