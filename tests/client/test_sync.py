"""The blocking client against a real server, from a plain thread and from inside a running event
loop (a Jupyter cell), reused across calls; the tiny model: 5 marks m0..m4, values a and b."""

from __future__ import annotations

import asyncio
import threading

import pytest

import aaren
from aaren.client import AarenError, AckOut, EventIn, ForecastOut, SyncClient


def ev(sid: str, seq: int, time: float, mark: int = 0) -> EventIn:
    return EventIn(sid, seq, time, mark, [0.5, 1.0])


def exercise(client: SyncClient, sid: str) -> None:
    """Every method once, twice for apply (the stream stays open between calls)."""
    model = client.describe_model()
    assert model.mark_names == ("m0", "m1", "m2", "m3", "m4") and model.value_names == ("a", "b")
    first = client.apply([ev(sid, 1, 10.0, 1)])
    assert isinstance(first.results[0], ForecastOut) and first.results[0].seq == 1
    second = client.apply([ev(sid, 2, 11.0, 2), ev(sid, 1, 10.0, 1)])
    forecast, duplicate = second.results
    assert isinstance(forecast, ForecastOut) and forecast.last_time == 11.0
    assert isinstance(duplicate, AckOut) and duplicate.duplicate and duplicate.seq == 1
    assert client.forecast(sid).forecast == forecast
    session = client.get_session(sid)
    assert (session.last_seq, session.n_events) == (2, 2)
    assert client.end_session(sid).existed
    with pytest.raises(AarenError) as info:
        client.get_session(sid)
    assert info.value.code == "NOT_FOUND"


def test_sync_client_in_a_plain_thread(start_server):
    srv = start_server()
    failures: list[BaseException] = []

    def script():
        try:
            with SyncClient(srv.address) as client:
                exercise(client, "plain")
                assert not client.closed
            assert client.closed
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=script)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    if failures:
        raise failures[0]


def test_sync_client_inside_a_running_event_loop_across_cells(start_server):
    """A notebook runs each cell's code in a thread whose loop is running: asyncio.run would refuse."""
    srv = start_server()
    loop = asyncio.new_event_loop()
    try:

        async def cell_1() -> SyncClient:
            assert asyncio.get_running_loop() is loop
            client = aaren.Client(srv.address)
            exercise(client, "cell")
            return client

        async def cell_2(client: SyncClient) -> None:
            exercise(client, "cell")  # same client, same stream, a new session of the same name
            client.close()
            client.close()  # idempotent

        client = loop.run_until_complete(cell_1())
        loop.run_until_complete(cell_2(client))
        assert client.closed and not client._thread.is_alive()
        with pytest.raises(RuntimeError, match="closed"):
            client.describe_model()
    finally:
        loop.close()


def test_sync_client_reopens_its_stream_after_the_server_ends_it(start_server):
    srv = start_server()
    with SyncClient(srv.address) as client:
        assert isinstance(client.apply([ev("r", 1, 1.0)]).results[0], ForecastOut)

        async def cancel() -> None:
            client._stream.cancel()  # the stream dies under the client (as when the server restarts)

        client.run(cancel())
        assert isinstance(client.apply([ev("r", 2, 2.0)]).results[0], ForecastOut)


def test_sync_client_to_a_dead_address_fails_cleanly():
    with SyncClient("127.0.0.1:1", timeout=2) as client, pytest.raises(AarenError) as info:
        client.wait_ready(0.5)
    assert info.value.code == "UNAVAILABLE"


def test_sync_client_called_from_its_own_loop_says_so_instead_of_hanging(start_server):
    srv = start_server()
    with SyncClient(srv.address) as client:

        async def inside() -> None:
            client.describe_model()

        with pytest.raises(RuntimeError, match="its own event loop"):
            client.run(inside())
        assert client.describe_model().num_marks == 5
