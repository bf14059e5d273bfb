"""aaren consume through a real server and a real Redis: events from a stream, forecasts to a stream.

Each forecast must equal what a gRPC ``Stream`` of the same events answers (the consumer speaks
aaren.v1 to the core), every event is answered once, bad messages go to the dead-letter stream with
their catalogue reason, and nothing stops the consumer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import grpc
import pytest
import redis
from generated import random_events
from google.protobuf import json_format
from server_helpers import OpenStream, stub_for

from aaren.server.frontends.eventlog.base import JSON, PROTOBUF
from aaren.server.frontends.eventlog.messages import decode_forecast, encode_event
from aaren.server.frontends.eventlog.redis_streams import RedisEventWriter
from aaren.v1 import aaren_pb2 as pb

pytestmark = pytest.mark.layouts


def _names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"events-{tag}", f"forecasts-{tag}"


def interleaved(sessions: int, per_session: int, seed: int = 0) -> list[pb.Event]:
    """Events of ``sessions`` sessions, round robin (each session's in seq order)."""
    streams = [random_events(f"s{i}", per_session, seed=seed + i) for i in range(sessions)]
    return [s[j] for j in range(per_session) for s in streams]


def write(url: str, events: list[pb.Event], content_type: str = JSON, model: str = "") -> None:
    async def go() -> None:
        writer = RedisEventWriter(url)
        await writer.write([encode_event(e, content_type) for e in events], content_type, model)
        await writer.close()

    asyncio.run(go())


def sink_entries(client: redis.Redis, stream: str, n: int, timeout_s: float = 60) -> list[dict[bytes, bytes]]:
    """The sink's first ``n`` entries, waiting for them (a bounded wait: a hang fails the test)."""
    deadline = time.monotonic() + timeout_s
    while True:
        entries = client.xrange(stream)
        if len(entries) >= n or time.monotonic() > deadline:
            return [fields for _, fields in entries]
        time.sleep(0.05)


def forecasts_of(entries: list[dict[bytes, bytes]]) -> dict[tuple[str, int], pb.Forecast]:
    out = {}
    for fields in entries:
        forecast, _ = decode_forecast(fields[b"data"], fields[b"content-type"].decode())
        key = (forecast.session_id, forecast.seq)
        assert key not in out, f"forecast of {key} published twice"
        out[key] = forecast
    return out


def over_grpc(address: str, events: list[pb.Event]) -> dict[tuple[str, int], pb.Forecast]:
    with grpc.insecure_channel(address) as channel:
        response = OpenStream(stub_for(channel)).send(events)
    return {(r.session_id, r.seq): r.forecast for r in response.results}


def assert_same(got: pb.Forecast, want: pb.Forecast, tolerance: float = 1e-6) -> None:
    """The same forecast: equal fields, numbers within ``tolerance`` (relative above 1)."""
    a = json_format.MessageToDict(got)
    b = json_format.MessageToDict(want)
    assert _close(a, b, tolerance), (a, b)


def _close(a: object, b: object, tolerance: float) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tolerance) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, tolerance) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b)) <= tolerance * max(1.0, abs(float(b)))  # type: ignore[arg-type]
    return a == b


@pytest.mark.parametrize("content_type", [JSON, PROTOBUF])
def test_every_event_answered_once_as_grpc_answers_it(start_server: Callable, redis_server, content_type: str) -> None:
    events_stream, forecasts_stream = _names()
    base = f"redis-stream://127.0.0.1:{redis_server.port}"
    events = interleaved(sessions=7, per_session=12)
    write(f"{base}/{events_stream}", events, content_type)
    srv = start_server(
        consume_source=f"{base}/{events_stream}", consume_sink=f"{base}/{forecasts_stream}", consume_batch=32
    )
    client = redis.Redis(port=redis_server.port)
    got = forecasts_of(sink_entries(client, forecasts_stream, len(events)))
    assert set(got) == {(e.session_id, e.seq) for e in events}
    reference = start_server()  # a second server, fed the same events over gRPC
    want = over_grpc(reference.address, events)
    for key, forecast in got.items():
        assert_same(forecast, want[key])
    # Every entry is acknowledged once its forecast is out: the group has nothing pending.
    deadline = time.monotonic() + 10
    while client.xpending(events_stream, "aaren")["pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.xpending(events_stream, "aaren")["pending"] == 0
    srv.stop()
