"""Session lifecycle: eviction after the idle TTL and for capacity (docs/architecture.md section 3, "Lifecycle").

The idle sweeper reads a stopped clock (``sweeper_clock``) that the tests move past the TTL by hand:
whether a session is still there never depends on how fast the machine got from one line to the next.
"""

from __future__ import annotations

import time

import grpc
import pytest
from server_helpers import (
    OpenStream,
    assert_event_error,
    assert_forecast,
    assert_forecasts,
    assert_forecasts_close,
    assert_rpc_error,
    ev,
    get_session,
    metric,
    rpc_error,
    scrape,
    stub_for,
    wait_until,
)

from aaren.server.core import engine_core
from aaren.v1 import aaren_pb2 as pb

TTL_S = 0.3  # short, so that the sweeper runs often (every TTL / 4); the clock decides what is idle


class StoppedClock:
    """A wall clock that stands still until the test moves it."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def pass_ttl(self) -> None:
        """Every session written so far is idle past the TTL; none written from now on is."""
        self.now = time.time() + TTL_S


pytestmark = pytest.mark.layouts  # every server of this module runs in both process layouts


@pytest.fixture
def sweeper_clock(monkeypatch) -> StoppedClock:
    """The idle sweeper's clock, stopped (the engine core runs in this process in both layouts)."""
    clock = StoppedClock()
    monkeypatch.setattr(engine_core, "wall_clock", clock)
    return clock


def evicted(samples: dict, cause: str) -> float:
    return metric(samples, "aaren_sessions_evicted_total", cause=cause)


def test_idle_session_is_evicted_after_ttl(start_server, sweeper_clock):
    srv = start_server(idle_ttl_s=TTL_S)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        assert stub.DescribeModel(pb.DescribeModelRequest()).limits.idle_ttl_seconds == TTL_S
        stream = OpenStream(stub)
        assert_forecasts(stream.send([ev("idle", 1, 1.0), ev("idle", 2, 2.0)]), [("idle", 1), ("idle", 2)])
        info = get_session(stub, "idle")
        assert info is not None and info.HasField("expires_at")
        assert info.expires_at.ToNanoseconds() > info.updated_at.ToNanoseconds()
        assert evicted(scrape(srv.metrics_url), "ttl") == 0

        sweeper_clock.pass_ttl()
        wait_until(lambda: get_session(stub, "idle") is None, "the idle session to be evicted")
        error = rpc_error(stub.GetSession, pb.GetSessionRequest(session_id="idle"))
        assert_rpc_error(error, grpc.StatusCode.NOT_FOUND, "session_evicted", ("'idle'", "evicted"))
        error = rpc_error(stub.Forecast, pb.ForecastRequest(session_id="idle"))
        assert_rpc_error(error, grpc.StatusCode.NOT_FOUND, "session_evicted")

        # A late event says why; another session in the same message is served.
        response = stream.send([ev("idle", 3, 3.0), ev("other", 1, 0.0)])
        assert_event_error(
            response.results[0], pb.ERROR_CODE_NOT_FOUND, "session_evicted", ("'idle'", "seq 3", "seq 1")
        )
        assert_forecast(response.results[1], "other", 1)
        samples = scrape(srv.metrics_url)
        assert evicted(samples, "ttl") == 1  # "other" was written after the clock stopped
        assert evicted(samples, "capacity") == 0
        assert metric(samples, "aaren_events_rejected_total", reason="session_evicted") == 1

        # seq 1 starts it again.
        assert_forecasts(stream.send([ev("idle", 1, 5.0)]), [("idle", 1)])
        assert get_session(stub, "idle").last_seq == 1
        stream.close()


def test_capacity_evicts_least_recently_written(start_server):
    srv = start_server(session_capacity=3, store_url="memory://")
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        for sid in ("a", "b", "c"):
            assert_forecasts(stream.send([ev(sid, 1, 1.0)]), [(sid, 1)])
        assert_forecasts(stream.send([ev("a", 2, 2.0)]), [("a", 2)])  # "b" is now the least recently written
        get_session(stub, "b")  # reading does not count as writing
        assert evicted(scrape(srv.metrics_url), "capacity") == 0

        assert_forecasts(stream.send([ev("d", 1, 1.0)]), [("d", 1)])
        assert get_session(stub, "b") is None
        assert_rpc_error(
            rpc_error(stub.GetSession, pb.GetSessionRequest(session_id="b")),
            grpc.StatusCode.NOT_FOUND,
            "session_evicted",
        )
        assert [get_session(stub, sid).last_seq for sid in ("a", "c", "d")] == [2, 1, 1]
        samples = scrape(srv.metrics_url)
        assert evicted(samples, "capacity") == 1
        assert evicted(samples, "ttl") == 0
        assert metric(samples, "aaren_active_sessions") == 3

        response = stream.send([ev("b", 2, 2.0)])
        assert_event_error(response.results[0], pb.ERROR_CODE_NOT_FOUND, "session_evicted", ("'b'",))
        stream.close()


@pytest.mark.parametrize("existing", [False, True], ids=["four-new", "three-written-one-new"])
def test_batch_wider_than_capacity_keeps_what_it_acknowledged(start_server, existing):
    """A batch may hold more sessions than the capacity: every state it acknowledged is stored as
    streamed back, and the next write evicts the least recently written back down to capacity."""
    srv = start_server(session_capacity=3, metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        seq = 1
        if existing:
            assert_forecasts(stream.send([ev(s, 1, 1.0, mark=1) for s in "abc"]), [(s, 1) for s in "abc"])
            seq = 2
        message = [ev(s, seq, 2.0, mark=i, values=(i, -i)) for i, s in enumerate("abc")]
        message.append(ev("d", 1, 2.0, mark=4, values=(3.0, 3.0)))
        streamed = assert_forecasts(stream.send(message), [(e.session_id, e.seq) for e in message])
        assert all(get_session(stub, s) is not None for s in "abcd")
        for forecast in streamed:
            stored = stub.Forecast(pb.ForecastRequest(session_id=forecast.session_id)).forecast
            assert_forecasts_close(stored, forecast)  # 1e-5 relative: float32 quantiles differ by batch width

        assert_forecasts(stream.send([ev("e", 1, 3.0)]), [("e", 1)])
        alive = {s: get_session(stub, s) is not None for s in "abcde"}
        assert alive == {"a": False, "b": False, "c": True, "d": True, "e": True}
        assert_rpc_error(
            rpc_error(stub.GetSession, pb.GetSessionRequest(session_id="a")),
            grpc.StatusCode.NOT_FOUND,
            "session_evicted",
        )
        stream.close()


def test_state_bytes_follows_ttl_eviction(start_server, sweeper_clock):
    srv = start_server(idle_ttl_s=TTL_S)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        assert_forecasts(stream.send([ev("x", 1, 1.0), ev("y", 1, 1.0)]), [("x", 1), ("y", 1)])
        per_session = metric(scrape(srv.metrics_url), "aaren_state_bytes_per_session")
        assert metric(scrape(srv.metrics_url), "aaren_state_bytes") == 2 * per_session
        sweeper_clock.pass_ttl()
        wait_until(lambda: get_session(stub, "x") is None and get_session(stub, "y") is None, "both evicted")
        wait_until(lambda: metric(scrape(srv.metrics_url), "aaren_active_sessions") == 0, "active sessions 0")
        assert metric(scrape(srv.metrics_url), "aaren_state_bytes") == 0
        stream.close()
