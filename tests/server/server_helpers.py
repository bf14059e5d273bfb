"""Helpers for the server tests: real gRPC channels and streams, error inspection, metrics scraping.

Kept in its own module (not a conftest) so the tests of this folder share it without fixtures.
"""

from __future__ import annotations

import math
import queue
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
import pytest
import torch
from generated import ev  # noqa: F401  (re-exported; it lives with the generated data)
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import load as load_safetensors
from servers import ServerProcess, frozen_clock_env, layouts_of  # noqa: F401  (re-exported; they live in servers.py)

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc

REASON_KEY = "aaren-error-reason"
SERVICE = "aaren.v1.ForecastService"
CALL_TIMEOUT_S = 20.0  # a deadline on every call so that a server bug fails a test instead of hanging it
_END = object()


def stub_for(channel: grpc.Channel) -> aaren_pb2_grpc.ForecastServiceStub:
    return aaren_pb2_grpc.ForecastServiceStub(channel)


class OpenStream:
    """One Stream call fed from a queue: ``send`` one request and wait for its response."""

    def __init__(
        self,
        stub: aaren_pb2_grpc.ForecastServiceStub,
        timeout: float = CALL_TIMEOUT_S,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self._requests: queue.Queue[object] = queue.Queue()
        self.call = stub.Stream(iter(self._requests.get, _END), timeout=timeout, metadata=tuple(metadata))
        self._n = 0

    def put(self, events: Iterable[pb.Event], **fields: Any) -> str:
        """Send a request without waiting; returns its request_id."""
        self._n += 1
        request_id = f"req-{self._n}"
        self._requests.put(pb.StreamRequest(request_id=request_id, events=list(events), **fields))
        return request_id

    def next(self) -> pb.StreamResponse:
        return next(self.call)

    def send(self, events: Iterable[pb.Event], **fields: Any) -> pb.StreamResponse:
        request_id = self.put(events, **fields)
        response = self.next()
        assert response.request_id == request_id
        return response

    def close(self) -> None:
        """Half-close and wait for the server to end the call (OK when nothing is left)."""
        self._requests.put(_END)
        rest = list(self.call)
        assert rest == [], f"unexpected responses after half-close: {rest}"
        assert self.call.code() == grpc.StatusCode.OK

    def end_requests(self) -> None:
        """Let the request-feeding thread finish (after the call failed or was cancelled)."""
        self._requests.put(_END)


def outcome(result: pb.EventResult) -> str:
    return result.WhichOneof("outcome")


def assert_forecast(result: pb.EventResult, session_id: str, seq: int) -> pb.Forecast:
    assert outcome(result) == "forecast", f"expected a forecast for {session_id!r} seq {seq}; got {result}"
    assert result.session_id == session_id and result.seq == seq and not result.duplicate
    assert result.forecast.session_id == session_id and result.forecast.seq == seq
    assert math.isfinite(result.forecast.next_time.mean) and result.forecast.next_time.mean >= 0
    assert len(result.forecast.values) == 2 and result.forecast.marks
    return result.forecast


def assert_forecasts(response: pb.StreamResponse, expected: Sequence[tuple[str, int]]) -> list[pb.Forecast]:
    assert not response.HasField("request_error"), response.request_error
    assert len(response.results) == len(expected)
    return [assert_forecast(r, sid, seq) for r, (sid, seq) in zip(response.results, expected, strict=True)]


def assert_event_error(
    result: pb.EventResult, code: int, reason: str, message_parts: Sequence[str] = ()
) -> pb.EventError:
    assert outcome(result) == "error", f"expected error {reason!r}; got {result}"
    error = result.error
    assert (pb.ErrorCode.Name(error.code), error.reason) == (pb.ErrorCode.Name(code), reason), error
    for part in message_parts:
        assert part in error.message, f"{part!r} not in message {error.message!r}"
    return error


def rpc_error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, timeout=CALL_TIMEOUT_S, **kwargs)
    return info.value


def reason_of(error: grpc.RpcError) -> str | None:
    return dict(error.trailing_metadata() or ()).get(REASON_KEY)


def assert_rpc_error(error: grpc.RpcError, code: grpc.StatusCode, reason: str, message_parts: Sequence[str] = ()):
    assert (error.code(), reason_of(error)) == (code, reason), (error.code(), error.details(), reason_of(error))
    for part in message_parts:
        assert part in (error.details() or ""), f"{part!r} not in details {error.details()!r}"


def get_session(stub: aaren_pb2_grpc.ForecastServiceStub, session_id: str) -> pb.GetSessionResponse | None:
    """The session with its state bytes, or None when there is none: NOT_FOUND, or an id too long
    to name a session (INVALID_ARGUMENT session_id_too_long)."""
    try:
        return stub.GetSession(pb.GetSessionRequest(session_id=session_id, include_state=True), timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return None
        reason = dict(exc.trailing_metadata() or ()).get("aaren-error-reason")
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT and reason == "session_id_too_long":
            return None
        raise


def state_tensors(info: pb.GetSessionResponse) -> dict[str, torch.Tensor]:
    return load_safetensors(info.state)


def assert_states_close(a: pb.GetSessionResponse, b: pb.GetSessionResponse, atol: float = 1e-5) -> None:
    ta, tb = state_tensors(a), state_tensors(b)
    assert sorted(ta) == sorted(tb)
    for k in ta:
        torch.testing.assert_close(ta[k], tb[k], atol=atol, rtol=1e-5, msg=lambda m, k=k: f"state field {k}: {m}")


def forecast_numbers(f: pb.Forecast) -> list[float]:
    """A forecast as a flat list of numbers (mark ids included), for comparisons with a tolerance."""
    out = [float(f.seq), f.last_time, f.next_time.mean, f.next_time.expected_time]
    out += [q.value for q in f.next_time.quantiles]
    for m in f.marks:
        out += [float(m.mark), m.probability]
    for v in f.values:
        out += [v.mean, v.std]
    return out


def assert_forecasts_close(a: pb.Forecast, b: pb.Forecast, atol: float = 1e-5) -> None:
    na, nb = forecast_numbers(a), forecast_numbers(b)
    assert len(na) == len(nb)
    assert all(abs(x - y) <= atol * max(1.0, abs(y)) for x, y in zip(na, nb, strict=True)), (na, nb)


# ---------------------------------------------------------------- holding the model


def hold_model_steps(srv) -> tuple[threading.Event, threading.Event]:
    """Make the server's model step wait for ``release``; ``entered`` is set when a step is waiting."""
    engine = srv.server.core.task
    apply = engine.apply
    entered, release = threading.Event(), threading.Event()

    def held_apply(*args, **kwargs):
        entered.set()
        release.wait(CALL_TIMEOUT_S)
        return apply(*args, **kwargs)

    engine.apply = held_apply  # instance attribute: the batcher looks it up on every batch
    return entered, release


# ---------------------------------------------------------------- metrics


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as ``{(sample name, sorted labels): value}``, parsed with prometheus_client's parser."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def metric(samples: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"metric {name}{labels} missing; have {sorted({k[0] for k in samples})}"
    return samples[key]


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` until true; the timeout only keeps a broken server from hanging the test."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
