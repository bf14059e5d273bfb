"""aaren consume through a real server and a real Redis: events from a stream, forecasts to a stream.

Each forecast must equal what a gRPC ``Stream`` of the same events answers (the consumer speaks
aaren.v1 to the core), every event is answered once, bad messages go to the dead-letter stream with
their catalogue reason, and nothing stops the consumer.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import grpc
import pytest
import redis
from generated import random_events
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nats_process import nats_server_fixture  # noqa: F401 (the nats_server fixture)
from redis_process import RedisProcess
from server_helpers import OpenStream, get_session, metric, scrape, stub_for, wait_until

from aaren.server.contract.errors import ConfigError
from aaren.server.frontends.eventlog.addresses import Member, open_source, open_writer, read_all
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


class Logs:
    """One log system of the tests (Redis Streams or NATS JetStream): URLs of fresh names, and the
    sink read back, through the project's own writer and reader."""

    def __init__(self, kind: str, base: str) -> None:
        self.kind, self.base = kind, base
        self.tag = uuid.uuid4().hex[:8]

    def url(self, name: str, **params: str) -> str:
        name = f"{name}-{self.tag}" if self.kind == "redis" else f"{name}.{self.tag}"
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"{self.base}/{name}" + (f"?{query}" if query else "")

    def write(self, url: str, events: list[pb.Event], content_type: str = JSON) -> None:
        async def go() -> None:
            writer = open_writer(url)
            await writer.write([encode_event(e, content_type) for e in events], content_type)
            await writer.close()

        asyncio.run(go())

    def entries(self, url: str, n: int, timeout_s: float = 60) -> list[dict[bytes, bytes]]:
        """The sink's first ``n`` messages as ``{b"data": ..., b"content-type": ...}``, waited for."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                read = asyncio.run(read_all(url))
            except ConfigError:  # JetStream: the consumer has not created the sink's stream yet
                read = []
            if len(read) >= n or time.monotonic() > deadline:
                return [_entry(data, fields) for _, data, fields in read]
            time.sleep(0.1)

    def pending(self, url: str, members: int = 1) -> int:
        """Messages of the source handed out and not acknowledged, or not yet handed out, summed
        over the groups (durables) of ``members`` consumer members."""

        async def go() -> int:
            total = 0
            for index in range(members):
                source = open_source(url, Member(index, members))
                await source.open()
                stats = await source.stats()
                await source.close()
                total += stats.pending + stats.lag
            return total

        return asyncio.run(go())


def _entry(data: bytes, fields: dict) -> dict[bytes, bytes]:
    content_type = fields.get("content-type") or fields.get("Content-Type") or fields.get(b"content-type") or JSON
    if isinstance(content_type, bytes):
        content_type = content_type.decode()
    return {b"data": data, b"content-type": content_type.encode()}


@pytest.fixture(params=["redis", "nats"])
def logs(request: pytest.FixtureRequest) -> Logs:
    """Both log systems: a real redis-server and a real nats-server with JetStream."""
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        return Logs("redis", f"redis-stream://127.0.0.1:{server.port}")
    server = request.getfixturevalue("nats_server")
    return Logs("nats", server.url)


@pytest.mark.parametrize("content_type", [JSON, PROTOBUF])
def test_every_event_answered_once_as_grpc_answers_it(start_server: Callable, logs: Logs, content_type: str) -> None:
    source, sink = logs.url("events"), logs.url("forecasts")
    events = interleaved(sessions=7, per_session=12)
    logs.write(source, events, content_type)
    srv = start_server(consume_source=source, consume_sink=sink, consume_batch=32)
    got = forecasts_of(logs.entries(sink, len(events)))
    assert set(got) == {(e.session_id, e.seq) for e in events}
    reference = start_server()  # a second server, fed the same events over gRPC
    want = over_grpc(reference.address, events)
    for key, forecast in got.items():
        assert_same(forecast, want[key])
    # Every message is acknowledged once its forecast is out: nothing pending, nothing unread.
    deadline = time.monotonic() + 10
    while logs.pending(source) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert logs.pending(source) == 0
    srv.stop()


def test_bad_messages_are_dead_letters_and_the_consumer_goes_on(start_server: Callable, redis_server) -> None:
    events_stream, forecasts_stream = _names()
    base = f"redis-stream://127.0.0.1:{redis_server.port}"
    client = redis.Redis(port=redis_server.port)
    good = random_events("good", 4)
    write(f"{base}/{events_stream}", good[:2])
    client.xadd(events_stream, {"data": b"{not json"})
    client.xadd(events_stream, {"data": encode_event(random_events("other", 1)[0], JSON), "model": "no-such-model"})
    write(f"{base}/{events_stream}", [pb.Event(session_id="wide", seq=1, time=1.0, values=[1.0, 2.0, 3.0])])
    write(f"{base}/{events_stream}", [random_events("gap", 3)[2]])  # seq 3 of a session that has no seq 1
    write(f"{base}/{events_stream}", good[2:])
    srv = start_server(
        consume_source=f"{base}/{events_stream}", consume_sink=f"{base}/{forecasts_stream}", consume_gap_wait_s=0.5
    )
    got = forecasts_of(sink_entries(client, forecasts_stream, len(good)))
    assert set(got) == {("good", seq) for seq in range(1, 5)}
    deadline = time.monotonic() + 30
    while client.xlen(f"{forecasts_stream}.dead") < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    dead = [fields for _, fields in client.xrange(f"{forecasts_stream}.dead")]
    reasons = sorted(fields[b"reason"].decode() for fields in dead)
    assert reasons == ["malformed_message", "model_unknown", "session_not_found", "values_wrong_width"]
    by_reason = {fields[b"reason"]: fields for fields in dead}
    assert by_reason[b"malformed_message"][b"data"] == b"{not json"  # the message as it came
    assert b"no message filled the gap within 0.5 s" in by_reason[b"session_not_found"][b"error"]
    assert by_reason[b"model_unknown"][b"model"] == b"no-such-model"
    # the consumer acknowledges a message after its dead letter is written (and counted): wait for the last ack
    while client.xpending(events_stream, "aaren")["pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.xpending(events_stream, "aaren")["pending"] == 0
    samples = scrape(srv.metrics_url)
    source = f"redis-stream:{events_stream}"
    assert metric(samples, "aaren_log_messages_total", source=source, outcome="forecast") == len(good)
    assert metric(samples, "aaren_log_messages_total", source=source, outcome="dead_letter") == 4
    assert metric(samples, "aaren_log_dead_letters_total", source=source, reason="session_not_found") == 1


def test_a_gap_filled_later_in_the_log_waits_for_it(start_server: Callable, redis_server) -> None:
    """A log written out of order: seq 2 before seq 1. Seq 2 waits (within the gap wait) and is
    applied once seq 1 is, both answered, nothing dead."""
    events_stream, forecasts_stream = _names()
    base = f"redis-stream://127.0.0.1:{redis_server.port}"
    events = random_events("late", 3)
    write(f"{base}/{events_stream}", [events[1], events[0], events[2]])
    start_server(consume_source=f"{base}/{events_stream}", consume_sink=f"{base}/{forecasts_stream}")
    client = redis.Redis(port=redis_server.port)
    got = forecasts_of(sink_entries(client, forecasts_stream, 3))
    assert set(got) == {("late", 1), ("late", 2), ("late", 3)}
    assert not client.exists(f"{forecasts_stream}.dead")


def test_target_mode_drives_a_running_server(start_server: Callable, redis_server, tmp_path) -> None:
    """``aaren consume --target``: no model in the consumer; the server applies the events (its
    sessions exist after) and the forecasts are the ones a gRPC stream gets."""
    events_stream, forecasts_stream = _names()
    base = f"redis-stream://127.0.0.1:{redis_server.port}"
    events = interleaved(sessions=3, per_session=5)
    write(f"{base}/{events_stream}", events, PROTOBUF)
    server = start_server()
    log = (tmp_path / "consumer.log").open("wb")
    consumer = subprocess.Popen(
        [sys.executable, "-c", "from aaren.cli.app import app; app()", "consume",
         "--source", f"{base}/{events_stream}", "--sink", f"{base}/{forecasts_stream}",
         "--target", server.address, "--metrics-port", "0", "--format", "json"],
        stdout=subprocess.PIPE, stderr=log,
    )  # fmt: skip
    try:
        assert consumer.stdout is not None
        assert f"through {server.address}" in consumer.stdout.readline().decode()
        client = redis.Redis(port=redis_server.port)
        entries = sink_entries(client, forecasts_stream, len(events))
        assert {fields[b"content-type"] for fields in entries} == {JSON.encode()}
        got = forecasts_of(entries)
        want = over_grpc(start_server().address, events)
        assert set(got) == set(want)
        for key, forecast in got.items():
            assert_same(forecast, want[key])
        with grpc.insecure_channel(server.address) as channel:
            session = get_session(stub_for(channel), "s1")
        assert session is not None and session.last_seq == 5
    finally:
        consumer.send_signal(signal.SIGTERM)
        assert consumer.wait(30) == 0
        log.close()


def test_health_follows_the_source(start_server: Callable, tmp_path) -> None:
    """Readiness: NOT_SERVING while the consumed log's Redis is down, SERVING again once it is back;
    the events written before and after are all answered."""
    source_redis = RedisProcess(tmp_path / "redis", aof=True).start()
    try:
        events_stream, forecasts_stream = _names()
        base = f"redis-stream://127.0.0.1:{source_redis.port}"
        events = random_events("h", 6)
        write(f"{base}/{events_stream}", events[:3])
        srv = start_server(
            consume_source=f"{base}/{events_stream}",
            consume_sink=f"{base}/{forecasts_stream}",
            store_check_interval_s=0.1,
        )
        with grpc.insecure_channel(srv.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def status() -> int:
                return health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status

            wait_until(lambda: status() == health_pb2.HealthCheckResponse.SERVING, "SERVING")
            source_redis.kill()
            wait_until(lambda: status() == health_pb2.HealthCheckResponse.NOT_SERVING, "NOT_SERVING")
            source_redis.start()
            wait_until(lambda: status() == health_pb2.HealthCheckResponse.SERVING, "SERVING again")
        write(f"{base}/{events_stream}", events[3:])
        client = redis.Redis(port=source_redis.port)
        assert set(forecasts_of(sink_entries(client, forecasts_stream, 6))) == {("h", s) for s in range(1, 7)}
        # The gauge follows the consumer's reads and its stats loop: a stats call caught by the kill may
        # answer its error after a read already found the log again, until the next read sets it back.
        label = f"redis-stream:{events_stream}"
        wait_until(lambda: metric(scrape(srv.metrics_url), "aaren_log_source_up", source=label) == 1, "source up")
    finally:
        source_redis.kill()


def test_a_forecast_computed_again_is_the_one_first_sent(start_server: Callable) -> None:
    """After a crash the consumer offers a duplicate's forecast again, computed from the stored state
    (``Forecast``): it is the forecast ``Stream`` sent for that event, after a run of events (the
    scan) and after single events (the batched step): byte for byte for the event task, within float
    rounding for series and class (the sink keeps whichever came first)."""
    from aaren.server.settings import bundled_repository

    srv = start_server(checkpoint=None, models_dir=bundled_repository(), frontends=0)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        served = stub.DescribeModel(pb.DescribeModelRequest()).served_models
        assert len(served) >= 3
        for model in served:
            d = stub.DescribeModel(pb.DescribeModelRequest(model=model))
            width = len(d.value_names)
            gap = d.step_seconds or 10.0  # a series model's events are on its step grid
            stream = OpenStream(stub)

            def events(seq: int, n: int, model: str = model, width: int = width, gap: float = gap) -> list[pb.Event]:
                return [
                    pb.Event(session_id=f"{model}-{i}", seq=s, time=gap * s + i, mark=0, values=[0.1 * s] * width)
                    for i in range(4)
                    for s in range(seq, seq + n)
                ]

            for batch in (events(1, 5), events(6, 1)):
                last = {r.session_id: r.forecast for r in stream.send(batch, model=model).results}
                assert len(last) == 4, model
                for session_id, sent in last.items():
                    again = stub.Forecast(pb.ForecastRequest(session_id=session_id, model=model)).forecast
                    if d.task == "event":
                        assert again.SerializeToString() == sent.SerializeToString(), (model, session_id)
                    else:  # the series and class heads run batched in the stream: float rounding apart
                        assert_same(again, sent, tolerance=1e-5)
