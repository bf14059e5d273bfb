"""The servers' event loop (``aaren.event_loop``): uvloop where it is installed, asyncio's on request,
and a clear error for a loop that cannot run. ``aaren serve`` is started for real on each loop and
answers a stream on it."""

from __future__ import annotations

import asyncio
import sys

import grpc
import pytest

from aaren import event_loop
from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc
from tests.servers import ServerProcess


async def _running_loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_auto_and_uvloop_run_on_uvloop_asyncio_on_asyncio():
    pytest.importorskip("uvloop", reason="uvloop has no build for this platform")
    assert event_loop.resolve() == event_loop.resolve("uvloop") == "uvloop"
    assert event_loop.run(_running_loop_module()).startswith("uvloop")
    assert event_loop.run(_running_loop_module(), "uvloop").startswith("uvloop")
    assert event_loop.run(_running_loop_module(), "asyncio").startswith("asyncio")


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as where it is not installed: its import fails
    assert event_loop.resolve("auto") == "asyncio"
    assert event_loop.run(_running_loop_module()).startswith("asyncio")
    coro = _running_loop_module()
    with pytest.raises(ValueError, match="uvloop is not installed"):
        event_loop.run(coro, "uvloop")
    assert coro.cr_frame is None  # closed, never started: no "was never awaited" warning


def test_an_unknown_loop_is_refused_with_the_choices():
    coro = _running_loop_module()
    with pytest.raises(ValueError, match="expected one of auto, uvloop, asyncio"):
        event_loop.run(coro, "trio")
    assert coro.cr_frame is None


def _one_forecast(address: str) -> pb.StreamResponse:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ForecastServiceStub(channel)
        d = stub.DescribeModel(pb.DescribeModelRequest(), timeout=30)
        event = pb.Event(session_id="loop-1", seq=1, time=1.0, mark=0, values=[0.5] * d.value_width)
        return next(iter(stub.Stream(iter([pb.StreamRequest(events=[event])]), timeout=30)))


@pytest.mark.parametrize("choice", ["auto", "asyncio"])
def test_the_server_serves_on_the_loop_it_says(tmp_path, tiny_checkpoint, choice):
    expected = "asyncio" if choice == "asyncio" else event_loop.resolve("auto")
    srv = ServerProcess(tmp_path / "server.log", checkpoint=tiny_checkpoint, metrics_port=-1, event_loop=choice)
    try:
        reply = _one_forecast(srv.address)
        assert reply.results[0].HasField("forecast"), reply
        assert f"INFO aaren.server: event loop: {expected}" in srv.log_path.read_text()
    finally:
        srv.stop()


def test_an_unknown_loop_setting_stops_the_server_with_its_choices(tmp_path, tiny_checkpoint):
    with pytest.raises(RuntimeError, match=r"auto.*uvloop.*asyncio"):
        ServerProcess(tmp_path / "server.log", checkpoint=tiny_checkpoint, event_loop="trio")


def test_uvloop_asked_for_where_it_is_missing_stops_the_server_with_a_clear_message(monkeypatch, tiny_checkpoint):
    from aaren.server.app import run
    from aaren.server.settings import ServerSettings

    monkeypatch.setitem(sys.modules, "uvloop", None)  # as where it is not installed
    with pytest.raises(SystemExit, match="aaren serve: event loop 'uvloop': uvloop is not installed"):
        run(ServerSettings(checkpoint=str(tiny_checkpoint), event_loop="uvloop", metrics_port=-1))
