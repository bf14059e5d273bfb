"""The front end <-> engine core IPC: packing keeps every request and outcome intact, and the core's
socket answers only the processes that hold its key."""

from __future__ import annotations

import asyncio
import os
import pickle
import stat

import grpc
import numpy as np
import pytest
from server_helpers import OpenStream, assert_forecast, ev, stub_for

from aaren.server.contract.columns import ACK, ERROR, FORECAST, Outcomes
from aaren.server.contract.errors import Reasons
from aaren.server.contract.validation import EventChecker
from aaren.server.ipc.channel import group_by_signature, pack_outcomes, pack_requests, unpack_outcomes, unpack_requests

CHECKER = EventChecker(5, ("a", "b"), 64)


def test_requests_survive_packing_and_pickling():
    requests = [
        (7, CHECKER.request(["x"], [1], [1.0], [2], [[0.5, 1.0]], top_k=2, tenant="acme")),
        (8, CHECKER.request(["y", "", "z"], [1, 2, 3], [1.0, 2.0, float("nan")], [0, 1, 9], [[0, 0]] * 3)),
        (9, CHECKER.request(["w"] * 4, [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0], [4] * 4, [[1, 2]] * 4, last_only=True)),
    ]
    back = unpack_requests(pickle.loads(pickle.dumps(pack_requests(requests), protocol=5)))
    assert [i for i, _ in back] == [7, 8, 9]
    for (_, want), (_, got) in zip(requests, back, strict=True):
        assert (got.n, got.top_k, got.last_only, got.tenant) == (want.n, want.top_k, want.last_only, want.tenant)
        np.testing.assert_array_equal(got.index, want.index)
        assert got.events.session_ids == want.events.session_ids
        for name in ("seq", "time", "mark", "values"):
            np.testing.assert_array_equal(getattr(got.events, name), getattr(want.events, name), err_msg=name)
        assert got.errors == want.errors
    assert sorted(back[1][1].errors) == [1, 2]  # the empty id, and the bad time and mark


def test_outcomes_survive_packing_and_pickling():
    outputs = {"time_mean": np.array([1.5, 2.5]), "top_marks": np.array([[1, 0], [0, 1]])}
    items = [
        (
            1,
            Outcomes(
                np.array([FORECAST, ACK], np.int8),
                np.array([0, 3]),
                {},
                np.array([0]),
                {k: v[:1] for k, v in outputs.items()},
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
                {k: v[1:] for k, v in outputs.items()},
            ),
        ),
    ]
    back = unpack_outcomes(pickle.loads(pickle.dumps(pack_outcomes(items), protocol=5)))
    assert [i for i, _ in back] == [1, 2, 3]
    for (_, want), (_, got) in zip(items, back, strict=True):
        np.testing.assert_array_equal(got.kind, want.kind)
        np.testing.assert_array_equal(got.last_seq, want.last_seq)
        np.testing.assert_array_equal(got.forecast_index, want.forecast_index)
        assert got.errors == want.errors and got.request_error == want.request_error
        assert got.outputs.keys() == want.outputs.keys()
        for name in want.outputs:
            np.testing.assert_array_equal(got.outputs[name], want.outputs[name])


def test_outcomes_of_several_models_travel_in_one_frame_per_set_of_columns():
    """Each model's batcher answers on its own: one flush may hold event, series (of two horizons)
    and class outcomes, which cannot share columns; each reaches its request whole."""

    def forecast(outputs: dict[str, np.ndarray]) -> Outcomes:
        return Outcomes(np.array([FORECAST], np.int8), np.zeros(1, np.int64), {}, np.array([0]), outputs)

    items = [
        (1, forecast({"time_mean": np.array([1.5]), "top_marks": np.array([[1, 0]])})),
        (2, forecast({"series_mean": np.ones((1, 3, 2)), "series_quantiles": np.ones((1, 3, 2, 3))})),
        (3, Outcomes.refused(Reasons.too_many_events(20_000, 10_000))),
        (4, forecast({"series_mean": np.zeros((1, 4, 2)), "series_quantiles": np.zeros((1, 4, 2, 3))})),
        (5, forecast({"class_top": np.array([[2, 0, 1]]), "class_probs": np.array([[0.5, 0.3, 0.2]])})),
        (6, forecast({"time_mean": np.array([0.5]), "top_marks": np.array([[0, 1]])})),
    ]
    with pytest.raises((KeyError, ValueError)):
        pack_outcomes(items)  # what one frame for all of them did
    groups = group_by_signature(items)
    assert sorted(i for group in groups for i, _ in group) == [1, 2, 3, 4, 5, 6] and len(groups) == 4
    back = dict(item for group in groups for item in unpack_outcomes(pickle.loads(pickle.dumps(pack_outcomes(group)))))
    for i, want in items:
        assert back[i].outputs.keys() == want.outputs.keys() and back[i].request_error == want.request_error
        for name, column in want.outputs.items():
            np.testing.assert_array_equal(back[i].outputs[name], column)


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
        frame = pickle.dumps(("hello", 99))
        writer.write(len(frame).to_bytes(4, "little") + frame)
        await writer.drain()
        answer = await reader.read()  # the core closes the connection without a word
        writer.close()
        return answer

    assert asyncio.run(intrude()) == b""
    assert len(srv.server.core_server.connections) == 1  # only the real front end
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        assert_forecast(stream.send([ev("after-intruder", 1, 1.0)]).results[0], "after-intruder", 1)
        stream.close()
