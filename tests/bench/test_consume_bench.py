"""``bench.consume``'s acceptance check and its tables, on made-up forecasts (no process is started):
an event answered twice, one missing, a forecast naming another event's message, and differences."""

from pathlib import Path

import pytest

import bench.consume as bc
from aaren.client.client import EventIn
from aaren.server.frontends.eventlog.base import JSON
from aaren.server.frontends.eventlog.messages import encode_forecast
from aaren.v1 import aaren_pb2 as pb
from bench.log_servers import SinkEntry

EVENTS = [EventIn("a", 1, 1.0), EventIn("b", 1, 2.0), EventIn("a", 2, 3.0)]
SOURCE_IDS = ["1-0", "2-0", "3-0"]


def forecast(session_id: str, seq: int, delay: float = 10.0) -> pb.Forecast:
    return pb.Forecast(
        session_id=session_id,
        seq=seq,
        last_time=float(seq),
        next_time=pb.TimeForecast(mean=2.0, expected_time=seq + 2.0, quantiles=[pb.Quantile(q=0.5, value=1.5)]),
        marks=[pb.MarkProbability(mark=3, probability=0.25)],
        values=[pb.ValueForecast(mean=delay, std=4.0)],
    )


def sink(pairs: list[tuple[int, float]]) -> list[SinkEntry]:
    """Sink entries answering ``EVENTS[i]`` (by index) with a forecast of that delay."""
    out = []
    for n, (i, delay) in enumerate(pairs):
        e = EVENTS[i]
        body = encode_forecast(forecast(e.session_id, e.seq, delay), JSON, SOURCE_IDS[i])
        out.append((f"{n + 1}-1", body, JSON, SOURCE_IDS[i]))
    return out


def grpc_cell(delay: float = 10.0) -> dict:
    results = [pb.EventResult(session_id=e.session_id, seq=e.seq, forecast=forecast(e.session_id, e.seq, delay))
               for e in EVENTS]  # fmt: skip
    return {"_raws": [pb.StreamResponse(request_id="1", results=results)]}


def consumer_cell(entries: list) -> dict:
    return {"_sink": entries, "_source_ids": list(SOURCE_IDS), "once_by_count": len(entries) == len(EVENTS)}


def test_every_event_once_and_equal():
    chk, mine, theirs = bc.check_pair(EVENTS, consumer_cell(sink([(0, 10.0), (1, 10.0), (2, 10.0)])), grpc_cell(), 1e-5)
    assert chk["once"] and chk["max_diff"] == 0.0 and chk["compared"] == 3 and not chk["over_tolerance"]
    assert mine == theirs


def test_an_event_twice_and_one_missing_are_not_once():
    chk, _, _ = bc.check_pair(EVENTS, consumer_cell(sink([(0, 10.0), (0, 10.0), (2, 10.0)])), grpc_cell(), 1e-5)
    assert not chk["once"]
    assert (chk["missing"], chk["twice"], chk["source_ids_twice"], chk["source_ids_missing"]) == (1, 1, 1, 1)


def test_a_forecast_naming_another_message_is_not_once():
    entries = sink([(0, 10.0), (1, 10.0), (2, 10.0)])
    entries[0], entries[1] = (*entries[0][:3], SOURCE_IDS[1]), (*entries[1][:3], SOURCE_IDS[0])
    chk, _, _ = bc.check_pair(EVENTS, consumer_cell(entries), grpc_cell(), 1e-5)
    assert not chk["once"] and chk["wrong_source_id"] == 2


def test_differences_are_relative_above_one():
    # 10.0002 vs 10.0: 2e-5 relative (over 1e-5); the rest equal.
    chk, _, _ = bc.check_pair(EVENTS, consumer_cell(sink([(0, 10.0), (1, 10.0002), (2, 10.0)])), grpc_cell(), 1e-5)
    assert chk["once"] and chk["over_tolerance"] == 1
    assert chk["max_diff"] == pytest.approx(2e-5, rel=1e-3) and chk["max_diff_at"] == "b seq 1 value0.mean"
    assert bc.difference({"x": 0.5}, {"x": 0.5 + 5e-6}) == (pytest.approx(5e-6), "x")  # absolute below 1
    assert bc.difference({"mark3": 0.2}, {"mark4": 0.2})[0] == float("inf")  # other top marks


def test_events_per_call():
    events = [EventIn("a", 1, 0), EventIn("a", 2, 1), EventIn("b", 1, 2), EventIn("a", 3, 3)]
    assert bc.events_per_call(events, 1) == 1.0
    assert bc.events_per_call(events, 4) == 4.0  # one request: the core's one batch
    assert bc.events_per_call(events, 4, max_events=3) == 2.0  # cut at 3 events: 2 calls
    assert bc.events_per_call(events, 4, max_sessions=1) == 2.0  # 2 sessions, 1 a batch: 2 calls


def test_profile_summary(tmp_path: Path):
    raw = tmp_path / "p.txt"
    raw.write_text(
        "<module> (<string>:1);run (server/app.py:4);step (server/frontends/eventlog/consumer.py:9) 3\n"
        "<module> (<string>:1);run (server/app.py:4);execute_command (redis/asyncio/client.py:5) 1\n"
    )
    text = "\n".join(bc.summarise_profile(raw))
    assert "| consumer (eventlog/) | 75.0 |" in text and "| redis-py client | 25.0 |" in text
    assert "| 75.0 | `step (eventlog/consumer.py)` |" in text and "server/app.py" not in text
