"""The front end <-> engine core IPC: packing keeps every request, outcome and unary result intact
through a frame of plain values (no pickle), and the core's socket answers only the processes that
hold its key, never running what a frame holds."""

from __future__ import annotations

import asyncio
import os
import pickle
import stat
from typing import Any

import grpc
import numpy as np
import pytest
from server_helpers import OpenStream, assert_forecast, ev, stub_for

from aaren.server.contract.columns import (
    ACK,
    ERROR,
    FORECAST,
    ModelDescription,
    Outcomes,
    OutputColumns,
    SampledFuture,
    SessionView,
    StepSummary,
)
from aaren.server.contract.errors import Reasons
from aaren.server.frontends.streams import EventChecker
from aaren.server.ipc import framing
from aaren.server.ipc.packing import (
    RESULTS,
    descriptions_of,
    error_of,
    future_of,
    group_by_signature,
    pack_array,
    pack_descriptions,
    pack_error,
    pack_outcomes,
    pack_requests,
    unpack_outcomes,
    unpack_requests,
)
from aaren.server.tasks.classify.outputs import ClassOutputs
from aaren.server.tasks.event.outputs import EventOutputs
from aaren.server.tasks.series.outputs import SeriesOutputs

CHECKER = EventChecker(5, ("a", "b"), 64)


def through_a_frame(value: object) -> object:
    """``value`` as the other end of the socket reads it."""
    return framing.loads(framing.dumps(["payload", value]))[1]


def test_requests_survive_packing_and_framing():
    requests = [
        (7, CHECKER.request(["x"], [1], [1.0], [2], [[0.5, 1.0]], top_k=2, tenant="acme")),
        (8, CHECKER.request(["y", "", "z"], [1, 2, 3], [1.0, 2.0, float("nan")], [0, 1, 9], [[0, 0]] * 3)),
        (9, CHECKER.request(["w"] * 4, [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0], [4] * 4, [[1, 2]] * 4, last_only=True)),
    ]
    back = unpack_requests(through_a_frame(pack_requests(requests)))
    assert [i for i, _ in back] == [7, 8, 9]
    for (_, want), (_, got) in zip(requests, back, strict=True):
        assert (got.n, got.top_k, got.last_only, got.tenant) == (want.n, want.top_k, want.last_only, want.tenant)
        np.testing.assert_array_equal(got.index, want.index)
        assert got.events.session_ids == want.events.session_ids
        for name in ("seq", "time", "mark", "values"):
            np.testing.assert_array_equal(getattr(got.events, name), getattr(want.events, name), err_msg=name)
        assert got.errors == want.errors
    assert sorted(back[1][1].errors) == [1, 2]  # the empty id, and the bad time and mark


def _event_outputs(time_mean: list[float], top_marks: list[list[int]]) -> EventOutputs:
    f = len(time_mean)
    return EventOutputs(
        np.array(time_mean), np.full((f, 3), 0.5), np.array(top_marks, np.int64), np.full((f, 2), 0.25),
        np.zeros((f, 2)), np.ones((f, 2)),
    )  # fmt: skip


def assert_same_outputs(got: Any, want: Any) -> None:
    """Both None, or typed outputs of one class with equal columns (dtypes included)."""
    assert type(got) is type(want)
    if want is None:
        return
    got_columns, want_columns = got.to_columns(), want.to_columns()
    assert got_columns.keys() == want_columns.keys()
    for name, column in want_columns.items():
        assert got_columns[name].dtype == column.dtype, name
        np.testing.assert_array_equal(got_columns[name], column, err_msg=name)


def test_outcomes_survive_packing_and_framing():
    outputs = _event_outputs([1.5, 2.5], [[1, 0], [0, 1]])
    items = [
        (
            1,
            Outcomes(
                np.array([FORECAST, ACK], np.int8),
                np.array([0, 3]),
                {},
                np.array([0]),
                outputs.take(slice(0, 1)),
            ),
        ),
        (2, Outcomes.refused(Reasons.too_many_events(20_000, 10_000))),
        (
            3,
            Outcomes(
                np.array([ERROR, FORECAST], np.int8),
                np.zeros(2, np.int64),
                {0: Reasons.seq_gap("s", 9, 2)},
                np.array([1]),
                outputs.take(slice(1, 2)),
            ),
        ),
    ]
    back = unpack_outcomes(through_a_frame(pack_outcomes(items)), lambda i: EventOutputs)
    assert [i for i, _ in back] == [1, 2, 3]
    for (_, want), (_, got) in zip(items, back, strict=True):
        np.testing.assert_array_equal(got.kind, want.kind)
        np.testing.assert_array_equal(got.last_seq, want.last_seq)
        np.testing.assert_array_equal(got.forecast_index, want.forecast_index)
        assert got.errors == want.errors and got.request_error == want.request_error
        assert_same_outputs(got.outputs, want.outputs)


def test_outcomes_of_several_models_travel_in_one_frame_per_set_of_columns():
    """Each model's batcher answers on its own: one flush may hold event, series (of two horizons)
    and class outcomes, which cannot share columns; each reaches its request whole."""

    def forecast(outputs: OutputColumns) -> Outcomes:
        return Outcomes(np.array([FORECAST], np.int8), np.zeros(1, np.int64), {}, np.array([0]), outputs)

    items = [
        (1, forecast(_event_outputs([1.5], [[1, 0]]))),
        (2, forecast(SeriesOutputs(np.ones((1, 3, 2)), np.ones((1, 3, 2, 3))))),
        (3, Outcomes.refused(Reasons.too_many_events(20_000, 10_000))),
        (4, forecast(SeriesOutputs(np.zeros((1, 4, 2)), np.zeros((1, 4, 2, 3))))),
        (5, forecast(ClassOutputs(np.array([[2, 0, 1]]), np.array([[0.5, 0.3, 0.2]])))),
        (6, forecast(_event_outputs([0.5], [[0, 1]]))),
    ]
    classes = {i: type(o.outputs) for i, o in items if o.outputs is not None}
    with pytest.raises((KeyError, ValueError)):
        pack_outcomes(items)  # what one frame for all of them did
    groups = group_by_signature(items)
    assert sorted(i for group in groups for i, _ in group) == [1, 2, 3, 4, 5, 6] and len(groups) == 4
    back = dict(
        item for group in groups for item in unpack_outcomes(through_a_frame(pack_outcomes(group)), classes.get)
    )
    for i, want in items:
        assert back[i].request_error == want.request_error
        assert_same_outputs(back[i].outputs, want.outputs)


def test_descriptions_errors_and_unary_results_survive_framing():
    """The dataclasses a front end gets from the core come back equal, as their own types."""
    described = ModelDescription(
        "m", "v1", "aaren", 16, 2, 2, 5, 2, 1234, 96, ("a", "b", "c", "d", "e"), ("x", "y"), "seconds", "cpu",
        quantiles=(0.1, 0.5, 0.9), task="series", horizon=3, step_seconds=3600.0, class_names=("p", "q"),
    )  # fmt: skip
    assert descriptions_of(through_a_frame(pack_descriptions([described]))) == (described,)
    for error in (Reasons.seq_gap("s", 9, 2), Reasons.over_limit("rate", "slow down", 0.25), None):
        assert error_of(through_a_frame(pack_error(error))) == error
    session = SessionView("s", 7, 12.5, 1.0e9, 1.1e9, "v1", b"\x00\xffstate", 9, 1.2e9)
    pack, unpack = RESULTS["get_session"]
    assert unpack(through_a_frame(pack(session))) == session
    future = SampledFuture(
        "s", 7, 12.5, _event_outputs([1.5], [[3, 1]]), 2,
        [StepSummary(1, 14.0, [13.0, 14.0, 15.0], [(3, 0.75), (1, 0.25)])],
        [[14.0, 15.5]], [[3, 1]], [[[0.5, 1.0], [0.25, 2.0]]],
    )  # fmt: skip
    pack, _ = RESULTS["forecast"]
    back = future_of(through_a_frame(pack(future)), EventOutputs)
    assert isinstance(back, SampledFuture) and back.steps == future.steps
    assert (back.session_id, back.seq, back.last_time, back.top_k) == ("s", 7, 12.5, 2)
    assert (back.times, back.marks, back.values) == (future.times, future.marks, future.values)
    assert_same_outputs(back.outputs, future.outputs)


def test_frames_hold_plain_values_only():
    """No Python object crosses: an object array, or a value msgpack has no plain form for, is refused."""
    with pytest.raises(TypeError):
        pack_array(np.array(["a", None], dtype=object))
    with pytest.raises(TypeError):
        framing.dumps(["reply", 1, Reasons.internal(), None])  # a dataclass, not its plain form
    assert framing.loads(framing.dumps(["count", 3, "seq_zero", 2, ""])) == ["count", 3, "seq_zero", 2, ""]


async def what_remains(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """What the core still sends before it closes the connection. A close while some of what was
    sent is unread resets the connection (the kernel's RST): that is a close without a word too."""
    try:
        await writer.drain()
        return await reader.read()
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


def test_the_core_socket_is_private_and_refuses_a_connection_without_its_key(start_server):
    srv = start_server(frontends=1)
    path = srv.server.core_server.path
    folder = os.path.dirname(path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    async def intrude() -> bytes:
        reader, writer = await asyncio.open_unix_connection(path)
        key = b"0" * 64
        writer.write(len(key).to_bytes(4, "little") + key)
        frame = framing.dumps(["hello", 99])
        writer.write(len(frame).to_bytes(4, "little") + frame)
        return await what_remains(reader, writer)  # the core closes the connection without a word

    assert asyncio.run(intrude()) == b""
    assert len(srv.server.core_server.connections) == 1  # only the real front end
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        assert_forecast(stream.send([ev("after-intruder", 1, 1.0)]).results[0], "after-intruder", 1)
        stream.close()


class _Planted:
    """Unpickled, it would create ``path``: proof that a frame was run as code."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_a_pickle_from_a_key_holder_is_never_unpickled(start_server, tmp_path):
    """Even a process that holds the key cannot make the core run code: a pickled frame is not
    decoded as one, the connection is dropped, and the service goes on."""
    srv = start_server(frontends=1)
    path = srv.server.core_server.path
    planted = tmp_path / "planted"

    async def send_pickle() -> bytes:
        reader, writer = await asyncio.open_unix_connection(path)
        framing.send_key(writer, srv.server._key.encode())
        framing.write_frame(writer, ["hello", 98])
        welcome = await framing.read_frame(reader)
        assert welcome[0] == "welcome"
        frame = pickle.dumps(("submit", _Planted(str(planted))), protocol=5)
        writer.write(len(frame).to_bytes(4, "little") + frame)
        return await what_remains(reader, writer)  # the core drops the connection

    assert asyncio.run(send_pickle()) == b""
    assert not planted.exists()
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        assert_forecast(stream.send([ev("after-pickle", 1, 1.0)]).results[0], "after-pickle", 1)
        stream.close()


def test_a_front_end_that_answers_a_scrape_late_is_represented_by_its_last_report(start_server):
    """A scrape waits a while for each front end's report; where one answers late (a busy process), its last
    report stands in for it, so that its counters never seem to fall (Prometheus would read a counter restart).
    A real front end beside one that holds the key and answers the first report only."""
    srv = start_server(frontends=1)
    core_server = srv.server.core_server

    async def scrapes() -> list[list[Any]]:
        reader, writer = await asyncio.open_unix_connection(core_server.path)
        framing.send_key(writer, srv.server._key.encode())
        framing.write_frame(writer, ["hello", 97])
        assert (await framing.read_frame(reader))[0] == "welcome"
        answered = 0

        async def answer_once() -> None:
            nonlocal answered
            while True:
                frame = await framing.read_frame(reader)
                if frame[0] == "report" and not answered:
                    answered += 1
                    framing.write_frame(writer, ["report_reply", frame[1], "slow front end's first report"])

        task = asyncio.create_task(answer_once())
        try:
            first = await core_server.collect("metrics", timeout=5.0)
            late = await core_server.collect("metrics", timeout=0.5)
        finally:
            task.cancel()
            writer.close()
        return [first, late]

    first, late = srv.call(scrapes())
    assert len(first) == 2 and "slow front end's first report" in first
    assert len(late) == 2 and "slow front end's first report" in late  # not answered: its last report
    assert [r for r in late if r != "slow front end's first report"]  # the real front end's own, fresh
