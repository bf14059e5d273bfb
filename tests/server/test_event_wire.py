"""The event task's wire encoder writes what its rows writer writes: each forecast's bytes parse to
the same ``pb.Forecast`` (the same doubles, bit for bit), for every top_k, with marks whose varints
take one or two bytes, and with NaN and signed values; an encoder without ``wire`` gets the rows
writer's bytes (``wire_rows``)."""

from __future__ import annotations

import numpy as np
import pytest

from aaren.server.contract.columns import ModelDescription
from aaren.server.tasks.aaren_v1 import wire_rows
from aaren.server.tasks.event.aaren_v1 import EventEncoder
from aaren.server.tasks.event.outputs import EventOutputs
from aaren.v1 import aaren_pb2 as pb


def _description(num_marks: int, quantiles: tuple[float, ...], width: int) -> ModelDescription:
    return ModelDescription(
        "m", "v1", "aaren", 16, 2, 2, num_marks, width, 1234, 96, tuple(f"k{i}" for i in range(num_marks)),
        tuple(f"x{i}" for i in range(width)), "seconds", "cpu", quantiles=quantiles,
    )  # fmt: skip


def _outputs(rng: np.random.Generator, f: int, q: int, ranked: int, num_marks: int, width: int) -> EventOutputs:
    marks = np.stack([rng.choice(num_marks, ranked, replace=False) for _ in range(f)]).astype(np.int64)
    marks[0, 0] = num_marks - 1  # the widest varint
    marks[-1, -1] = 0  # a zero, which proto3 leaves out of its own bytes
    probs = rng.random((f, ranked)).astype(np.float32)
    value_mean = rng.standard_normal((f, width)).astype(np.float32)
    if width:
        value_mean[0, 0] = np.nan
    return EventOutputs(
        rng.exponential(1.0, f).astype(np.float32),
        np.sort(rng.exponential(1.0, (f, q)), axis=1).astype(np.float32),
        marks,
        probs,
        value_mean,
        rng.exponential(1.0, (f, width)).astype(np.float32),
    )


def _rows(encoder: EventEncoder, outputs: EventOutputs, k: int, last_times: list[float]) -> list[pb.Forecast]:
    write = encoder.rows(outputs, k)
    out = []
    for f, t in enumerate(last_times):
        forecast = pb.Forecast()
        write(forecast, f, t)
        out.append(forecast)
    return out


def _canonical(data: bytes) -> bytes:
    """``data`` parsed and serialized again: protobuf's own bytes of the same message."""
    return pb.Forecast.FromString(data).SerializeToString(deterministic=True)


@pytest.mark.parametrize(
    ("num_marks", "quantiles", "width"),
    [(16, (0.1, 0.5, 0.9), 2), (300, (0.05, 0.25, 0.5, 0.75, 0.95, 0.99), 0), (2, (0.5,), 5)],
)
def test_wire_bytes_parse_to_what_rows_writes(num_marks: int, quantiles: tuple[float, ...], width: int) -> None:
    rng = np.random.default_rng(num_marks)
    encoder = EventEncoder(_description(num_marks, quantiles, width), 3)
    ranked = min(num_marks, 5)
    outputs = _outputs(rng, 7, len(quantiles), ranked, num_marks, width)
    last_times = (np.cumsum(rng.exponential(1.0, 7)) * 1e6).tolist()
    for k in (1, 2, ranked):
        want = _rows(encoder, outputs, k, last_times)
        got = encoder.wire(outputs, k, last_times)
        assert len(got) == len(want)
        for data, forecast in zip(got, want, strict=True):
            parsed = pb.Forecast.FromString(data)
            # NaN != NaN: compare the canonical bytes, which hold the doubles bit for bit.
            assert _canonical(data) == forecast.SerializeToString(deterministic=True)
            assert len(parsed.marks) == k and len(parsed.next_time.quantiles) == len(quantiles)
        # The generic form (from the rows writer) gives the same forecasts.
        generic = wire_rows(_RowsOnly(encoder))(outputs, k, last_times)
        assert [_canonical(b) for b in generic] == [_canonical(b) for b in got]
        # wire is the block's rows (one compiled pass over every forecast's numbers)
        block = encoder.wire_block(outputs, k, np.array(last_times))
        assert block.dtype == np.uint8 and block.shape == (len(got), len(got[0]))
        assert [row.tobytes() for row in block] == got


def test_no_forecast_gives_no_bytes() -> None:
    encoder = EventEncoder(_description(16, (0.5,), 2), 3)
    assert encoder.wire(EventOutputs.empty(3, 1, 2), 3, []) == []
    assert encoder.wire_block(EventOutputs.empty(3, 1, 2), 3, np.zeros(0)).shape[0] == 0


def test_a_replys_results_in_one_pass_are_what_the_parts_give(start_server) -> None:
    """The stream's replies are assembled in one compiled pass (``_results_block``), from the task's block or
    from its ``wire`` bytes alike, and are protobuf's own message (each forecast's task part as the encoder's
    ``rows`` writes it), for session ids of one and of several UTF-8 bytes, long ones (two-byte length
    varints), and seqs past one varint byte."""
    import asyncio
    import dataclasses

    srv = start_server()
    servicer = srv.server.servicer
    sids = ["a", "é-ü", "s" * 200, "🙂" * 40]
    request = pb.StreamRequest(
        events=[
            pb.Event(session_id=sid, seq=1, time=10.0 * i + 0.5, mark=1, values=[0.5, -1.0])
            for i, sid in enumerate(sids)
        ]
        + [
            pb.Event(session_id=sid, seq=2, time=10.0 * i + 3.25, mark=2, values=[1.5, 0.0])
            for i, sid in enumerate(sids)
        ],
        top_k=2,
    )

    async def answer():
        accepted = servicer.decode(request.SerializeToString(), "")
        future = asyncio.get_running_loop().create_future()
        accepted.submit(accepted.request, future.set_result)
        return accepted.request, await future

    core, outcomes = srv.call(answer())
    assert (outcomes.kind == 0).all() and len(outcomes.kind) == 8
    view = servicer._default
    assert view.block is not None
    one_pass = servicer._results_parts(request, outcomes, view, 2, core)
    by_parts = servicer._results_parts(request, outcomes, dataclasses.replace(view, block=None), 2, core)
    assert one_pass == by_parts
    want = pb.StreamResponse()
    write = view.encoder.rows(outcomes.outputs, 2)
    for f, e in enumerate(request.events):
        result = want.results.add(session_id=e.session_id, seq=e.seq)
        forecast = result.forecast
        forecast.session_id, forecast.seq, forecast.last_time = e.session_id, e.seq, e.time
        forecast.model.CopyFrom(view.ref)
        write(forecast, f, e.time)
    parsed = pb.StreamResponse.FromString(b"".join(one_pass))
    assert parsed.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)
    assert [(r.session_id, r.seq, r.forecast.seq) for r in parsed.results] == [
        (e.session_id, e.seq, e.seq) for e in request.events
    ]


def test_wire_rows_prefers_the_encoders_own() -> None:
    encoder = EventEncoder(_description(16, (0.5,), 2), 3)
    assert wire_rows(encoder) == encoder.wire


class _RowsOnly:
    """An encoder with ``rows`` and ``columns`` only (as a plugin task's may be): the event encoder's."""

    def __init__(self, inner: EventEncoder) -> None:
        self.rows = inner.rows
        self.columns = inner.columns


def test_a_streams_reply_bytes_are_protobufs_own(start_server) -> None:
    """The stream hands gRPC its rows replies as wire bytes (``ForecastServicer._reply``): read as bytes
    off a real call, they are what protobuf writes for the message they parse to (a forecast, an ack, an
    error, with and without a request id), and a refusal still arrives as a message."""
    import grpc

    srv = start_server()
    events = [
        pb.Event(session_id="w", seq=1, time=1.0, mark=1, values=[0.5, -1.0]),
        pb.Event(session_id="w", seq=1, time=1.0, mark=1, values=[0.5, -1.0]),  # a duplicate: an ack
        pb.Event(session_id="w", seq=3, time=2.0, mark=0, values=[0.0, 0.0]),  # a seq gap: an error
    ]
    sent = [
        pb.StreamRequest(request_id="r1", events=events[:1]),
        pb.StreamRequest(events=events[1:]),
        pb.StreamRequest(request_id="r3", model="no-such-model", events=events[:1]),
    ]
    with grpc.insecure_channel(srv.address) as channel:
        call = channel.stream_stream(
            "/aaren.v1.ForecastService/Stream", request_serializer=pb.StreamRequest.SerializeToString
        )
        replies = list(call(iter(sent), timeout=30))
    assert len(replies) == 3 and all(isinstance(r, bytes) for r in replies)
    parsed = [pb.StreamResponse.FromString(r) for r in replies]
    assert [r == p.SerializeToString() for r, p in zip(replies, parsed, strict=True)] == [True] * 3
    assert parsed[0].request_id == "r1" and parsed[0].results[0].WhichOneof("outcome") == "forecast"
    assert [r.WhichOneof("outcome") for r in parsed[1].results] == ["ack", "error"]
    assert parsed[2].request_id == "r3" and parsed[2].request_error.reason == "model_unknown"
