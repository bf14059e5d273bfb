"""Acknowledgement means durable, and a session's results arrive in the order its events were sent,
also for a resent (duplicate) event that is batched with the original."""

from __future__ import annotations

import threading

import grpc
import pytest
from server_helpers import (
    CALL_TIMEOUT_S,
    OpenStream,
    assert_forecast,
    assert_forecasts,
    ev,
    get_session,
    metric,
    scrape,
    stub_for,
    wait_until,
)

pytestmark = pytest.mark.layouts  # every server of this module runs in both process layouts


class BatchGate:
    """Holds every model step of the server until the test releases it, one batch at a time."""

    def __init__(self, srv, n: int = 8) -> None:
        self.entered = [threading.Event() for _ in range(n)]
        self.release = [threading.Event() for _ in range(n)]
        self._calls = 0
        engine = srv.server.core.task
        apply = engine.apply

        def held_apply(*args, **kwargs):
            k = self._calls  # the engine core runs one batch at a time, on one worker thread
            self._calls += 1
            self.entered[k].set()
            self.release[k].wait(CALL_TIMEOUT_S)
            return apply(*args, **kwargs)

        engine.apply = held_apply

    def open_all(self) -> None:
        for event in self.release:
            event.set()


def test_resent_event_batched_with_original_is_answered_after_it(start_server):
    srv = start_server(model_thread=True)  # the gate holds the worker thread, not the event loop
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        assert_forecasts(
            stream.send([ev("a", 1, 1.0), ev("a", 2, 2.0), ev("a", 3, 3.0)]), [("a", i) for i in (1, 2, 3)]
        )

        gate = BatchGate(srv)
        try:
            busy = stream.put([ev("x", 1, 1.0)])
            assert gate.entered[0].wait(CALL_TIMEOUT_S)
            # While batch 0 computes, seq 4 of "a" is sent, then resent (a client retrying).
            original = stream.put([ev("a", 4, 4.0)])
            resent = stream.put([ev("a", 4, 4.0)])
            wait_until(lambda: metric(scrape(srv.metrics_url), "aaren_pending_events") == 3, "both copies queued")
            gate.release[0].set()
            assert stream.next().request_id == busy
            # Batch 1 holds both copies; nothing of it is stored yet.
            assert gate.entered[1].wait(CALL_TIMEOUT_S)
            assert get_session(stub, "a").last_seq == 3
            gate.release[1].set()
        finally:
            gate.open_all()

        first, second = stream.next(), stream.next()
        assert [first.request_id, second.request_id] == [original, resent], (
            "the duplicate's acknowledgement arrived before the original event's result"
        )
        assert_forecast(first.results[0], "a", 4)
        dup = second.results[0]
        assert dup.duplicate and dup.ack.last_seq == 4
        stream.close()
