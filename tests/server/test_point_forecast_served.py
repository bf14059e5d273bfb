"""Through a real server: an adversarial head's streamed point forecast stays within the data's bound,
the streamed quantiles lie on the recorded grid, and both equal the offline model (invariant 4)."""

from __future__ import annotations

import itertools

import grpc
import pytest
import torch
from generated import adversarial_model

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc
from aaren_core.checkpoint import load_checkpoint, save_checkpoint

GAP_MAX = 500.0
RESOLUTION = 1.0  # whole minutes
SCHEMA = {"mark_names": ["a", "b", "c"], "value_names": ["v"], "time_unit": "minutes"}


TIMES = [0.0, 0.0, 3.0, 3.0, 50.0, 51.0, 2000.0, 2000.0, 2001.0, 9000.0]  # whole minutes, with ties


def offline(model, times):
    dt = torch.tensor([0.0] + [b - a for a, b in itertools.pairwise(times)]).unsqueeze(0)
    marks = torch.arange(len(times)).remainder(3).unsqueeze(0)
    values = torch.arange(len(times)).float().view(1, -1, 1)
    with torch.no_grad():
        y = model(dt, marks, values)[0]
        return model.forecast(y, (0.1, 0.5, 0.9)), model.heads(y).time.mean()


@pytest.fixture
def adversarial_checkpoint(tmp_path):
    """The first adversarial head whose plain mean passes the bound tenfold on these events."""
    for seed in range(40):
        model = adversarial_model(seed, gap_max=GAP_MAX, resolution=RESOLUTION)
        if float(offline(model, TIMES)[1].max()) > 10 * GAP_MAX:
            save_checkpoint(tmp_path, model, metadata={"name": "adversarial", "schema": SCHEMA})
            return tmp_path
    raise AssertionError("no adversarial head among 40 seeds explodes the mean")


def test_an_adversarial_head_streams_a_bounded_point_forecast(start_server, adversarial_checkpoint):
    srv = start_server(checkpoint=adversarial_checkpoint)
    stub = aaren_pb2_grpc.ForecastServiceStub(grpc.insecure_channel(srv.address))
    times = TIMES
    events = [pb.Event(session_id="s", seq=i + 1, time=t, mark=i % 3, values=[float(i)]) for i, t in enumerate(times)]
    got = []
    for response in stub.Stream(
        iter(
            [pb.StreamRequest(request_id="0", events=events[:4])]
            + [pb.StreamRequest(request_id=str(i), events=[e]) for i, e in enumerate(events[4:], 1)]
        )
    ):
        got += [r.forecast for r in response.results]
    assert len(got) == len(times)

    want, plain = offline(load_checkpoint(adversarial_checkpoint).model, times)
    assert float(plain.max()) > 10 * GAP_MAX  # the head is adversarial on these events
    for k, f in enumerate(got):
        assert 0 < f.next_time.mean <= GAP_MAX
        assert f.next_time.mean == pytest.approx(float(want.time_mean[k]), rel=1e-5)
        assert f.next_time.expected_time == pytest.approx(times[k] + f.next_time.mean)
        quantiles = [q.value for q in f.next_time.quantiles]
        assert all(q == round(q) for q in quantiles)  # whole minutes: the recorded grid
        # As in test_e2e (float32 searches, 1e-5), and at most one grid step apart.
        assert quantiles == pytest.approx(want.time_quantiles[k].tolist(), rel=1e-5, abs=RESOLUTION)
