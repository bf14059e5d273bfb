"""The aaren.v1 stream reads a request's wire bytes into columns in one compiled pass
(``ForecastServicer._read``); anything it does not take as the common request goes to protobuf and the
checks event by event. Held to protobuf's own reading on random requests: where the compiled pass takes
a request, protobuf's path makes the same core request (the same columns, dtypes, options and model);
where protobuf refuses the bytes, the compiled pass never takes them; and the common request (every
event valid, fields as protobuf writes them) is always taken."""

from __future__ import annotations

import math

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from aaren.v1 import aaren_pb2 as pb

NUM_MARKS, WIDTH = 5, 2  # the tiny checkpoint's


@pytest.fixture(scope="module")
def servicer(tiny_checkpoint):
    from servers import ServerThread

    with ServerThread(checkpoint=tiny_checkpoint, metrics_port=-1) as srv:
        servicer = srv.server.servicer
        d = servicer._default.description
        assert (d.num_marks, d.value_width) == (NUM_MARKS, WIDTH)
        yield servicer


def same_request(a, b) -> None:
    """Two core requests hold the same: events, options, refusals (by reason)."""
    assert (a.n, a.top_k, a.last_only, a.tenant, a.model) == (b.n, b.top_k, b.last_only, b.tenant, b.model)
    assert np.array_equal(a.index, b.index) and a.index.dtype == b.index.dtype
    assert {k: e.reason for k, e in a.errors.items()} == {k: e.reason for k, e in b.errors.items()}
    assert a.events.session_ids == b.events.session_ids
    for name in ("seq", "time", "mark", "values"):
        x, y = getattr(a.events, name), getattr(b.events, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=True), name


def same_event(event, want, request_id: str) -> None:
    """A gathered one-event request (``OneEvent``) holds what protobuf's core request holds."""
    rid = request_id.encode()
    assert event.prefix == (b"\x0a" + bytes([len(rid)]) + rid if rid else b"")
    assert (event.session_id, event.seq, event.mark) == (
        want.events.session_ids[0],
        int(want.events.seq[0]),
        int(want.events.mark[0]),
    )
    assert event.time == float(want.events.time[0]) or (math.isnan(event.time) and math.isnan(want.events.time[0]))
    assert event.values.dtype == want.events.values.dtype and np.array_equal(event.values, want.events.values)


VALID = {
    "session_id": ["a", "b", "é", "🙂", "s" * 256, "x\x00y"],
    "seq": [1, 2, 7, 2**62],
    "time": [0.0, 1.5, -3.0, 1e300],
    "mark": [0, 1, NUM_MARKS - 1],
    "values": [[0.0, -1.5], [2.25, 1e30], [3.4e38, 0.5]],
}
ODD = {
    "session_id": ["", "s" * 257],
    "seq": [0, 2**62 + 1, 2**64 - 1],
    "time": [math.nan, math.inf],
    "mark": [NUM_MARKS, 2**32 - 1],
    "values": [[], [0.0], [0.0, 1.0, 2.0], [math.nan, 0.0], [math.inf, 0.0], [0.0, -math.inf]],
}
TWEAKS = {  # bytes added to a request: ones the compiled pass leaves to protobuf, or that protobuf refuses
    "unknown field": b"\x38\x01",
    "forecast_mode again": b"\x18\x02",
    "an unpacked value": b"\x12\x0f\x0a\x01q\x10\x01\x2d"
    + np.float32(1.0).tobytes()
    + b"\x2d"
    + np.float32(2.0).tobytes(),
    "an event's seq twice": b"\x12\x11\x0a\x01q\x10\x01\x10\x02\x2a\x08" + np.zeros(2, np.float32).tobytes(),
    "a top_k past 32 bits": b"\x20\x80\x80\x80\x80\x20",  # protobuf keeps its low 32 bits
    "a negative enum": b"\x28" + b"\xff" * 9 + b"\x01",
    "a cut varint": b"\x20\xff",
    "junk": b"\xff\xff\x01",
}


def random_request(rng: np.random.Generator) -> pb.StreamRequest:
    """Events whose fields are valid nine times in ten; options mostly known."""
    events = []
    for _ in range(int(rng.integers(0, 7))):
        fields = {
            k: (v[rng.integers(len(v))] if rng.random() < 0.9 else ODD[k][rng.integers(len(ODD[k]))])
            for k, v in VALID.items()
        }
        events.append(pb.Event(**fields))
    return pb.StreamRequest(
        request_id=["", "r1", "ü"][rng.integers(3)],
        events=events,
        forecast_mode=[0, 1, 2, 2, 7][rng.integers(5)],
        top_k=[0, 1, 3, 2**32 - 1][rng.integers(4)],
        layout=[0, 1, 2, 2, 9][rng.integers(5)],
        model=["", "", "", "no-such-model"][rng.integers(4)],
    )


def protobuf_reading(servicer, raw: bytes):
    """What ``decode`` makes of ``raw`` read by protobuf: its core request, or the refusal's reason."""
    from aaren.server.frontends.streams import RefusedError

    message = pb.StreamRequest.FromString(raw)
    try:
        return servicer.decode(message, "t").request
    except RefusedError as exc:
        return exc.info.reason


def plain(request: pb.StreamRequest) -> bool:
    """Every event valid and known options: the common request."""
    valid = all(
        e.session_id in VALID["session_id"] and e.seq in VALID["seq"] and e.time in VALID["time"]
        and e.mark in VALID["mark"] and list(e.values) in [[np.float32(x) for x in v] for v in VALID["values"]]
        for e in request.events
    )  # fmt: skip
    return valid and request.layout in (0, 1, 2) and request.forecast_mode in (0, 1, 2) and not request.model


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_read_is_protobufs(servicer, seed: int) -> None:
    rng = np.random.default_rng(seed)
    taken = 0
    for case in range(800):
        request = random_request(rng)
        raw = request.SerializeToString()
        tweak = list(TWEAKS)[rng.integers(len(TWEAKS))] if rng.random() < 0.25 else None
        if tweak is not None:
            raw += TWEAKS[tweak]
        elif rng.random() < 0.05 and len(raw) > 2:
            raw, tweak = raw[: int(rng.integers(1, len(raw)))], "cut"
        read = servicer._read(raw, "t")
        try:
            want = protobuf_reading(servicer, raw)
        except DecodeError:
            assert read is None, (case, tweak)  # bytes protobuf refuses are never taken
            continue
        if tweak is None and plain(request):
            assert read is not None, (case, request)  # the common request is read in the compiled pass
        if read is not None:
            taken += 1
            # what protobuf would read otherwise than the first value (a field twice: the last wins)
            twice = tweak == "an event's seq twice" or (tweak == "forecast_mode again" and request.forecast_mode)
            odd = ("unknown field", "an unpacked value", "a negative enum", "a top_k past 32 bits")
            assert tweak not in odd and not twice, (case, tweak)
            assert not isinstance(want, str), (case, want)
            same_request(read.request, want)
            # the stream's read of the same bytes: a one-event request of the rows layout as its numbers
            gathered = servicer._read(raw, "t", gather=True).request
            message = pb.StreamRequest.FromString(raw)
            if want.n == 1 and message.layout != pb.RESPONSE_LAYOUT_COLUMNS:
                same_event(gathered, want, message.request_id)
            else:
                same_request(gathered, want)
    assert taken > 50  # the compiled pass was exercised


def test_what_a_read_keeps_is_its_own(servicer) -> None:
    """The compiled pass reads one-event requests into the model's one set of arrays: what each request keeps of
    them (its core request's columns, a gathered request's numbers) is its own copy, unchanged by later reads."""
    events = [
        pb.Event(session_id=f"s{i}", seq=i + 1, time=0.5 * i, mark=i % NUM_MARKS, values=[float(i), -float(i)])
        for i in range(6)
    ]
    layouts = (pb.RESPONSE_LAYOUT_ROWS, pb.RESPONSE_LAYOUT_COLUMNS)
    requests = [pb.StreamRequest(events=[e], layout=layout) for e in events for layout in layouts]
    many = pb.StreamRequest(events=events)  # more events than the arrays hold
    kept = []
    for request in [*requests, many]:
        raw = request.SerializeToString()
        kept.append((request, servicer._read(raw, "t").request, servicer._read(raw, "t", gather=True).request))
    for request, read, gathered in kept:  # after every read
        want = protobuf_reading(servicer, request.SerializeToString())
        same_request(read, want)
        if want.n == 1 and request.layout != pb.RESPONSE_LAYOUT_COLUMNS:
            same_event(gathered, want, request.request_id)
        else:
            same_request(gathered, want)
