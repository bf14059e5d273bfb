"""``NEXT_SEQ`` (seq 0 with ``next_seq=True``): the engine core numbers an event as its session's next
one, for protocols without seqs (OIP). Driven through a real server's engine core."""

from __future__ import annotations

import asyncio

import numpy as np

from aaren.server.contract.columns import DUPLICATE, ERROR, FORECAST, NEXT_SEQ, Outcomes
from aaren.server.frontends.streams import EventChecker


def submit(srv, events, next_seq=True):
    """``events``: (session_id, seq, time) -> the core's ``Outcomes``."""
    core = srv.server.core

    async def run() -> Outcomes:
        done: asyncio.Future[Outcomes] = asyncio.get_running_loop().create_future()
        d = core.description
        checker = EventChecker(d.num_marks, d.value_names, core.settings.max_session_id_bytes)
        request = checker.request(
            [e[0] for e in events], [e[1] for e in events], [e[2] for e in events], [0] * len(events),
            [(0.0, 0.0)] * len(events), next_seq=next_seq,
        )  # fmt: skip
        core.submit(request, done.set_result)
        return await done

    return srv.call(run())


def test_next_seq_continues_a_session_and_never_starts_one(start_server):
    srv = start_server(metrics_port=-1)
    missing = submit(srv, [("a", NEXT_SEQ, 1.0)])
    assert missing.kind.tolist() == [ERROR] and missing.errors[0].reason == "session_not_found"

    first = submit(srv, [("a", 1, 1.0), ("b", 1, 1.0)])
    assert first.kind.tolist() == [FORECAST, FORECAST]
    # One event of its session in the batch (the vectorised plan).
    one = submit(srv, [("a", NEXT_SEQ, 2.0)])
    assert one.kind.tolist() == [FORECAST] and one.last_seq.tolist() == [2]
    # Several of one session in one request (the plan per session), interleaved with another session,
    # a refused event (time before the last) that takes no seq, and an explicit duplicate.
    many = submit(srv, [("a", NEXT_SEQ, 3.0), ("b", NEXT_SEQ, 2.0), ("a", NEXT_SEQ, 0.5), ("a", NEXT_SEQ, 4.0),
                        ("a", 2, 9.0), ("b", NEXT_SEQ, 3.0)])  # fmt: skip
    assert many.kind.tolist() == [FORECAST, FORECAST, ERROR, FORECAST, DUPLICATE, FORECAST]
    assert many.errors[2].reason == "time_before_last"
    # (a duplicate of a stored seq is acknowledged with the stored last seq, as for aaren.v1)
    assert many.last_seq.tolist() == [3, 2, 0, 4, 2, 3]
    assert len(many.forecast_index) == 4

    # What was stored is what was numbered.
    view = srv.call(srv.server.core.get_session("a"))
    assert (view.last_seq, view.last_time) == (4, 4.0)


def test_seq_zero_is_refused_unless_the_front_end_asks_for_next_seq(start_server):
    srv = start_server(metrics_port=-1)
    refused = submit(srv, [("a", 0, 1.0)], next_seq=False)
    assert refused.kind.tolist() == [ERROR] and refused.errors[0].reason == "seq_zero"
    assert np.array_equal(refused.forecast_index, [])
