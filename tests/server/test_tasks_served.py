"""Series and class models served beside an event model, by name (issue 13's serving acceptance).

One repository folder holds three tiny models (event, series, class); real servers stream them in
both process layouts and both response layouts, and what comes back equals the models' offline
outputs on the same events (invariant 4): event by event, as histories in one message (the
parallel scan), across a Redis-backed restart, and through the unary calls.
"""

from __future__ import annotations

import queue
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton
from server_helpers import (
    CALL_TIMEOUT_S,
    OpenStream,
    assert_event_error,
    assert_rpc_error,
    metric,
    outcome,
    rpc_error,
    scrape,
    stub_for,
)
from servers import repository_of
from tritonclient.utils import InferenceServerException
from typer.testing import CliRunner

from aaren.cli.app import app
from aaren.client import EventIn
from aaren.v1 import aaren_pb2 as pb
from aaren_core.checkpoint import load_checkpoint, save_checkpoint
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.classify.model import ClassModel, ClassModelConfig
from aaren_core.tasks.series.data import calendar_features
from aaren_core.tasks.series.model import SeriesModel, SeriesModelConfig

HOUR = 3600.0
START = 1_700_000_000.0  # a Tuesday, 22:13 UTC: calendar features differ from step to step
CHANNELS = ["load", "temperature"]
CLASSES = ["rest", "walk", "run", "jump"]
LEVELS = (0.1, 0.5, 0.9)
ATOL = 2e-4


def _series_model(seed: int = 0) -> SeriesModel:
    torch.manual_seed(seed)
    backbone = BackboneConfig(kind="aaren", d_model=8, n_layers=2, n_heads=2)
    model = SeriesModel(SeriesModelConfig(backbone, len(CHANNELS), 3, LEVELS, 4)).eval()
    model.set_normalization(torch.tensor([10.0, -2.0]), torch.tensor([3.0, 0.5]))
    return model


def _class_model(seed: int = 0) -> ClassModel:
    torch.manual_seed(seed)
    backbone = BackboneConfig(kind="aaren", d_model=8, n_layers=2, n_heads=2)
    model = ClassModel(ClassModelConfig(backbone, 3, len(CLASSES))).eval()
    model.set_normalization(torch.tensor([0.0, 1.0, -1.0]), torch.tensor([1.0, 2.0, 0.5]))
    return model


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(tiny_checkpoint, root / "default")
    save_checkpoint(
        root / "series",
        _series_model(),
        {
            "task": "series",
            "name": "tiny-series",
            "channels": CHANNELS,
            "horizon": 3,
            "quantiles": list(LEVELS),
            "step_seconds": HOUR,
            "time_unit": "seconds",
        },
    )
    save_checkpoint(
        root / "class", _class_model(), {"task": "class", "name": "tiny-class", "channels": ["x", "y", "z"],
                                          "class_names": CLASSES},
    )  # fmt: skip
    return root


@pytest.fixture
def start_server(start_server, frontends, repository):
    return repository_of(start_server, frontends, repository)


def _series_events(session: str, n: int, seed: int, first_seq: int = 1, t0: float = START) -> list[pb.Event]:
    rng = np.random.default_rng(seed)
    values = rng.normal([10.0, -2.0], [3.0, 0.5], size=(n, 2))
    return [
        pb.Event(session_id=session, seq=first_seq + i, time=t0 + (first_seq - 1 + i) * HOUR, values=v.tolist())
        for i, v in enumerate(values)
    ]


def _class_events(session: str, n: int, seed: int) -> list[pb.Event]:
    rng = np.random.default_rng(seed)
    values = rng.normal(0.0, 1.5, size=(n, 3))
    return [pb.Event(session_id=session, seq=i + 1, time=float(i), values=v.tolist()) for i, v in enumerate(values)]


def _offline_series(repository: Path, events: list[pb.Event]) -> tuple[np.ndarray, np.ndarray]:
    """The model's forecasts after every event, offline: mean ``[N, H, C]``, quantiles ``[N, H, C, Q]``."""
    model = load_checkpoint(repository / "series").model
    values = torch.tensor([list(e.values) for e in events])[None]
    times = calendar_features(np.array([e.time for e in events]))
    with torch.no_grad():
        raw = model.to_raw(model(values, torch.from_numpy(times)[None]))
    return raw.mean[0].numpy(), raw.quantiles[0].numpy()


def _offline_class(repository: Path, events: list[pb.Event]) -> np.ndarray:
    """Class probabilities after every event, offline: ``[N, K]``."""
    model = load_checkpoint(repository / "class").model
    with torch.no_grad():
        logits = model(torch.tensor([list(e.values) for e in events])[None])[0]
    return torch.softmax(logits, -1).numpy()


def _served_series(response: pb.StreamResponse) -> tuple[np.ndarray, np.ndarray]:
    """Means ``[F, H, C]`` and quantiles ``[F, H, C, Q]`` from either layout."""
    assert not response.HasField("request_error"), response.request_error
    if response.HasField("forecast_columns"):
        block = response.forecast_columns
        assert block.model.name == "tiny-series" and list(block.quantile_levels) == list(LEVELS)
        h, c = block.horizon, block.channels
        return np.array(block.series_means).reshape(-1, h, c), np.array(block.series_quantiles).reshape(-1, h, c, 3)
    means, quantiles = [], []
    for r in response.results:
        assert outcome(r) == "forecast", r
        s = r.forecast.series
        assert r.forecast.model.name == "tiny-series" and not r.forecast.HasField("next_time")
        assert list(s.quantile_levels) == list(LEVELS)
        means.append(np.array(s.means).reshape(s.horizon, s.channels))
        quantiles.append(np.array(s.quantiles).reshape(s.horizon, s.channels, 3))
    return np.stack(means), np.stack(quantiles)


def _served_class(response: pb.StreamResponse, k: int) -> list[list[tuple[int, float]]]:
    """Per forecast: (class index, probability) most likely first, from either layout."""
    assert not response.HasField("request_error"), response.request_error
    if response.HasField("forecast_columns"):
        block = response.forecast_columns
        assert block.class_top_k == k and block.model.name == "tiny-class"
        classes = np.array(block.classes).reshape(-1, k)
        probs = np.array(block.class_probabilities).reshape(-1, k)
        return [list(zip(c.tolist(), p.tolist(), strict=True)) for c, p in zip(classes, probs, strict=True)]
    out = []
    for r in response.results:
        assert outcome(r) == "forecast", r
        items = r.forecast.classes.classes
        assert [i.class_name for i in items] == [CLASSES[i.class_index] for i in items]
        out.append([(i.class_index, i.probability) for i in items])
    return out


@pytest.mark.parametrize("layout", [pb.RESPONSE_LAYOUT_ROWS, pb.RESPONSE_LAYOUT_COLUMNS], ids=["rows", "columns"])
def test_series_stream_equals_offline_event_by_event_and_as_one_history(start_server, repository, layout):
    srv = start_server()
    events = _series_events("meter-1", 40, seed=1)
    mean, quantiles = _offline_series(repository, events)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        for i in range(12):  # event by event: the batched step
            got_mean, got_q = _served_series(stream.send([events[i]], model="tiny-series", layout=layout))
            np.testing.assert_allclose(got_mean[0], mean[i], atol=ATOL, rtol=1e-4)
            np.testing.assert_allclose(got_q[0], quantiles[i], atol=ATOL, rtol=1e-4)
        # The rest as one history (the parallel scan), resumed from the stored state.
        got_mean, got_q = _served_series(stream.send(events[12:], model="series", layout=layout))  # the folder name
        np.testing.assert_allclose(got_mean, mean[12:], atol=ATOL, rtol=1e-4)
        np.testing.assert_allclose(got_q, quantiles[12:], atol=ATOL, rtol=1e-4)
        assert (np.diff(got_q, axis=-1) >= 0).all()  # quantiles ordered
        # A resend is acknowledged as a duplicate and changes nothing.
        again = stream.send(events[39:], model="tiny-series", layout=layout)
        assert again.results[0].duplicate and again.results[0].ack.last_seq == 40
        # The same session id under the default (event) model is another session: it starts fresh.
        event_reply = stream.send([pb.Event(session_id="meter-1", seq=1, time=5.0, values=[0.0, 0.0])])
        assert outcome(event_reply.results[0]) == "forecast" and event_reply.results[0].forecast.HasField("next_time")
        stream.close()
        stub = stub_for(channel)
        unary = stub.Forecast(pb.ForecastRequest(session_id="meter-1", model="tiny-series"), timeout=CALL_TIMEOUT_S)
        np.testing.assert_allclose(np.array(unary.forecast.series.means).reshape(3, 2), mean[-1], atol=ATOL)
        error = rpc_error(stub.Forecast, pb.ForecastRequest(session_id="meter-1", model="tiny-series", horizon=5))
        assert_rpc_error(error, grpc.StatusCode.INVALID_ARGUMENT, "sampling_unsupported", ["event models only"])


@pytest.mark.parametrize("layout", [pb.RESPONSE_LAYOUT_ROWS, pb.RESPONSE_LAYOUT_COLUMNS], ids=["rows", "columns"])
def test_class_probabilities_sharpen_per_event_and_equal_offline(start_server, repository, layout):
    srv = start_server()
    a, b = _class_events("trial-a", 9, seed=2), _class_events("trial-b", 5, seed=3)
    probs_a, probs_b = _offline_class(repository, a), _offline_class(repository, b)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        # Two sessions in one message, interleaved; top_k beyond the class count lists them all.
        mixed = [a[0], b[0], a[1], b[1]]
        served = _served_class(stream.send(mixed, model="tiny-class", layout=layout, top_k=10), len(CLASSES))
        for got, want in zip(served, [probs_a[0], probs_b[0], probs_a[1], probs_b[1]], strict=True):
            assert [c for c, _ in got] == np.argsort(-want, kind="stable").tolist()
            np.testing.assert_allclose([p for _, p in got], np.sort(want)[::-1], atol=1e-5)
        # The rest of trial a as one history, top 2 only.
        served = _served_class(stream.send(a[2:], model="tiny-class", layout=layout, top_k=2), 2)
        for got, want in zip(served, probs_a[2:], strict=True):
            assert [c for c, _ in got] == np.argsort(-want, kind="stable")[:2].tolist()
            np.testing.assert_allclose([p for _, p in got], np.sort(want)[::-1][:2], atol=1e-5)
        stream.close()


def test_describe_model_names_every_model_its_task_and_its_shapes(start_server):
    srv = start_server()
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        default = stub.DescribeModel(pb.DescribeModelRequest(), timeout=CALL_TIMEOUT_S)
        assert (default.name, default.task) == ("tiny", "event")
        assert list(default.served_models) == ["tiny", "tiny-class", "tiny-series"]
        series = stub.DescribeModel(pb.DescribeModelRequest(model="tiny-series"), timeout=CALL_TIMEOUT_S)
        assert (series.task, series.horizon, series.step_seconds) == ("series", 3, HOUR)
        assert list(series.value_names) == CHANNELS and list(series.quantile_levels) == list(LEVELS)
        assert series.time_unit == "seconds" and series.value_width == 2
        classes = stub.DescribeModel(pb.DescribeModelRequest(model="class"), timeout=CALL_TIMEOUT_S)
        assert (classes.name, classes.task, list(classes.class_names)) == ("tiny-class", "class", CLASSES)
        error = rpc_error(stub.DescribeModel, pb.DescribeModelRequest(model="nope"))
        assert_rpc_error(error, grpc.StatusCode.NOT_FOUND, "model_unknown", ["'nope'", "'tiny-series'"])


def test_each_model_checks_its_own_events_and_an_unknown_model_is_refused(start_server):
    srv = start_server()
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        wrong_width = pb.Event(session_id="m", seq=1, time=START, values=[1.0, 2.0, 3.0])
        reply = stream.send([wrong_width, *_series_events("m2", 1, seed=4)], model="tiny-series")
        assert_event_error(
            reply.results[0], pb.ERROR_CODE_INVALID_ARGUMENT, "values_wrong_width", ["expected 2 (load, temperature)"]
        )
        assert outcome(reply.results[1]) == "forecast"
        refused = stream.send(_series_events("m", 1, seed=4), model="nope")
        assert refused.request_error.reason == "model_unknown" and "'tiny-series'" in refused.request_error.message
        stream.close()
        samples = scrape(srv.metrics_url)
        assert metric(samples, "aaren_model_events_total", model="tiny-series", outcome="applied") == 1
        assert metric(samples, "aaren_model_events_total", model="tiny-series", outcome="rejected") == 1
        assert metric(samples, "aaren_model_sessions", model="tiny-series") == 1
        # The unknown model's event counts in the service's totals only, never as the default model's.
        assert metric(samples, "aaren_events_total", outcome="rejected") == 2
        assert metric(samples, "aaren_model_events_total", model="tiny", outcome="rejected") == 0
        stub = stub_for(channel)
        small = stub.GetSession(pb.GetSessionRequest(session_id="m2", model="tiny-series"), timeout=CALL_TIMEOUT_S)
        assert small.model.name == "tiny-series" and small.last_seq == 1
        assert metric(samples, "aaren_model_state_bytes_per_session", model="tiny-series") == small.state_bytes
        error = rpc_error(stub.GetSession, pb.GetSessionRequest(session_id="m2"))  # the default model has none
        assert_rpc_error(error, grpc.StatusCode.NOT_FOUND, "session_not_found")


def test_series_state_stays_one_size_and_survives_a_restart_with_redis(start_server, repository, redis_url):
    url = redis_url
    events = _series_events("meter-r", 300, seed=5)
    mean, _ = _offline_series(repository, events)
    srv = start_server(store_url=url)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        stream.send(events[:1], model="tiny-series")
        stub = stub_for(channel)
        first = stub.GetSession(pb.GetSessionRequest(session_id="meter-r", model="tiny-series"), timeout=CALL_TIMEOUT_S)
        stream.send(events[1:200], model="tiny-series")
        later = stub.GetSession(pb.GetSessionRequest(session_id="meter-r", model="tiny-series"), timeout=CALL_TIMEOUT_S)
        assert first.state_bytes == later.state_bytes and later.last_seq == 200
        stream.close()
    srv.stop()
    again = start_server(store_url=url)
    with grpc.insecure_channel(again.address) as channel:
        stream = OpenStream(stub_for(channel))
        got, _ = _served_series(stream.send(events[200:], model="tiny-series", layout=pb.RESPONSE_LAYOUT_COLUMNS))
        np.testing.assert_allclose(got, mean[200:], atol=ATOL, rtol=1e-4)
        stream.close()


def test_the_python_client_reads_series_and_class_forecasts_in_both_layouts(start_server, repository):
    from aaren.client import ClassForecastOut, SeriesForecastOut, SyncClient

    srv = start_server()
    series = [EventIn(e.session_id, e.seq, e.time, values=list(e.values)) for e in _series_events("s", 6, seed=6)]
    trial = [EventIn(e.session_id, e.seq, e.time, values=list(e.values)) for e in _class_events("t", 4, seed=7)]
    mean, quantiles = _offline_series(repository, _series_events("s", 6, seed=6))
    probs = _offline_class(repository, _class_events("t", 4, seed=7))
    with SyncClient(srv.address) as client:
        info = client.describe_model("tiny-series")
        assert (info.task, info.horizon, info.served_models[0]) == ("series", 3, "tiny")
        rows = client.apply(series[:3], model="tiny-series").forecasts
        cols = client.apply(series[3:], model="tiny-series", columns=True).forecasts
        for i, f in enumerate(rows + cols):
            assert isinstance(f, SeriesForecastOut) and f.seq == i + 1
            np.testing.assert_allclose(f.means, mean[i], atol=ATOL, rtol=1e-4)
            np.testing.assert_allclose(f.quantiles[0.9], quantiles[i, :, :, 2], atol=ATOL, rtol=1e-4)
        got = client.apply(trial[:2], model="tiny-class", top_k=2).forecasts
        got += client.apply(trial[2:], model="tiny-class", top_k=2, columns=True).forecasts
        for f, want in zip(got, probs, strict=True):
            assert isinstance(f, ClassForecastOut)
            assert f.predicted == CLASSES[int(np.argmax(want))] and len(f.classes) == 2
            np.testing.assert_allclose([p for _, p in f.classes], np.sort(want)[::-1][:2], atol=1e-5)
        last = client.forecast("t", model="tiny-class").forecast
        assert isinstance(last, ClassForecastOut) and last.class_indices[0] == int(np.argmax(probs[-1]))
        assert client.end_session("t", model="tiny-class").existed


def test_aaren_replay_of_a_series_file_and_a_class_file_writes_and_scores_what_the_models_compute(
    start_server, repository, tmp_path
):
    import datetime as dt
    import json

    import pandas as pd

    srv = start_server()
    events = _series_events("x", 10, seed=8)
    stamps = [dt.datetime.fromtimestamp(e.time, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") for e in events]
    frame = pd.DataFrame({"time": stamps, "temperature": [e.values[1] for e in events],
                          "load": [e.values[0] for e in events]})  # fmt: skip
    frame.to_csv(tmp_path / "meter.csv", index=False)
    out = tmp_path / "series_out.csv"
    summary = json.loads(_aaren("replay", str(tmp_path / "meter.csv"), "-t", srv.address, "--model", "tiny-series",
                                "--out", str(out), "--no-progress", "--json"))  # fmt: skip
    mean, _ = _offline_series(repository, events)
    written = pd.read_csv(out)
    assert len(written) == 10 * 3 and set(written["session_id"]) == {"meter"}
    got = written.sort_values(["seq", "step"])[["load_mean", "temperature_mean"]].to_numpy().reshape(10, 3, 2)
    np.testing.assert_allclose(got, mean, atol=ATOL, rtol=1e-4)
    step_times = written.loc[written["seq"] == 1, "step_time"].to_numpy()
    np.testing.assert_allclose(step_times, [events[0].time + h * HOUR for h in (1, 2, 3)])
    truth = np.array([list(e.values) for e in events])
    errors = np.stack([mean[i] - truth[i + 1 : i + 4] for i in range(7)])  # origins with 3 steps in the file
    assert summary["series"]["origins"] == 7
    np.testing.assert_allclose(summary["series"]["mse"], float((errors**2).mean()), rtol=1e-4)

    # With history rows (a `context` column, as `aaren split export` writes): the forecast after the
    # last history row is written and scored too.
    frame.assign(context=[1] * 4 + [0] * 6).to_csv(tmp_path / "meter_split.csv", index=False)
    split_out = tmp_path / "split_out.csv"
    summary = json.loads(_aaren("replay", str(tmp_path / "meter_split.csv"), "-t", srv.address, "--model",
                                "tiny-series", "--out", str(split_out), "--no-progress", "--json"))  # fmt: skip
    split = pd.read_csv(tmp_path / "split_out.csv")
    assert sorted(set(split["seq"])) == list(range(4, 11)) and summary["series"]["origins"] == 4
    np.testing.assert_allclose(
        split.sort_values(["seq", "step"])[["load_mean"]].to_numpy().reshape(7, 3), mean[3:, :, 0], atol=ATOL
    )

    sequences = {"a": _class_events("a", 6, seed=9), "b": _class_events("b", 3, seed=10)}
    labels = {"a": CLASSES[int(np.argmax(_offline_class(repository, sequences["a"])[-1]))], "b": "jump"}
    rows = [{"session_id": sid, "time": e.time, "x": e.values[0], "y": e.values[1], "z": e.values[2],
             "label": labels[sid]} for sid, evs in sequences.items() for e in evs]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "trials.csv", index=False)
    summary = json.loads(_aaren("replay", str(tmp_path / "trials.csv"), "-t", srv.address, "--model", "tiny-class",
                                "--out", str(tmp_path / "class_out.jsonl"), "--no-progress", "--json"))  # fmt: skip
    expected = (1 + (CLASSES[int(np.argmax(_offline_class(repository, sequences["b"])[-1]))] == "jump")) / 2
    assert summary["class"]["sequences"] == 2 and summary["class"]["accuracy"] == expected
    lines = [json.loads(line) for line in (tmp_path / "class_out.jsonl").read_text().splitlines()]
    assert len(lines) == 9 and all(line["status"] == "forecast" for line in lines)


def test_tenants_share_one_event_budget_over_every_model_and_never_see_each_others_sessions(start_server, tmp_path):
    from aaren.server.security.auth import hash_token, new_token

    tokens = {"tenant-a": new_token(), "tenant-b": new_token()}
    path = tmp_path / "tokens.txt"
    path.write_text("".join(f"{tenant} {hash_token(token)}\n" for tenant, token in tokens.items()))
    srv = start_server(auth_tokens_file=path, tenant_events_per_s=0.5, tenant_burst_events=6)
    a_meta = [("authorization", f"Bearer {tokens['tenant-a']}")]
    b_meta = [("authorization", f"Bearer {tokens['tenant-b']}")]
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        a, b = OpenStream(stub, metadata=a_meta), OpenStream(stub, metadata=b_meta)
        assert all(
            outcome(r) == "forecast" for r in a.send(_series_events("s", 4, seed=11), model="tiny-series").results
        )
        assert all(outcome(r) == "forecast" for r in a.send(_class_events("c", 2, seed=12), model="tiny-class").results)
        refused = a.send(_class_events("d", 1, seed=13), model="tiny-class")  # the burst of 6 is spent
        assert refused.request_error.reason == "tenant_rate_limited"
        # B has its own budget, and A's series session "s" is not B's: B's seq 5 finds no session.
        reply = b.send(_series_events("s", 1, seed=11, first_seq=5), model="tiny-series")
        assert_event_error(reply.results[0], pb.ERROR_CODE_NOT_FOUND, "session_not_found")
        error = rpc_error(stub.GetSession, pb.GetSessionRequest(session_id="s", model="tiny-series"), metadata=b_meta)
        assert_rpc_error(error, grpc.StatusCode.NOT_FOUND, "session_not_found")
        mine = stub.GetSession(
            pb.GetSessionRequest(session_id="s", model="tiny-series"), metadata=a_meta, timeout=CALL_TIMEOUT_S
        )
        assert mine.last_seq == 4
        a.end_requests()
        b.close()


def test_a_tenants_session_limit_counts_its_sessions_of_every_model(start_server, tmp_path):
    from aaren.server.security.auth import hash_token, new_token

    token = new_token()
    path = tmp_path / "tokens.txt"
    path.write_text(f"tenant-a {hash_token(token)}\n")
    srv = start_server(auth_tokens_file=path, max_sessions_per_tenant=2)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel), metadata=[("authorization", f"Bearer {token}")])
        assert outcome(stream.send(_series_events("one", 1, seed=16), model="tiny-series").results[0]) == "forecast"
        assert outcome(stream.send(_class_events("two", 1, seed=17), model="tiny-class").results[0]) == "forecast"
        third = stream.send([pb.Event(session_id="three", seq=1, time=1.0, values=[0.0, 0.0])])
        assert_event_error(third.results[0], pb.ERROR_CODE_RESOURCE_EXHAUSTED, "tenant_session_limit")
        assert outcome(stream.send(_series_events("one", 1, seed=16, first_seq=2), model="tiny-series").results[0]) == (
            "forecast"
        )  # its sessions go on
        stream.close()


def test_concurrent_streams_of_three_models_on_one_connection_are_all_answered(start_server, repository):
    """One connection (one front-end process in the multi-process layout) streams to all three models
    at once: their batchers answer independently, often in the same turn of the core's loop."""
    srv = start_server()
    n = 15
    series = _series_events("mix", n, seed=14)
    trial = _class_events("mix", n, seed=15)
    mean, _ = _offline_series(repository, series)
    probs = _offline_class(repository, trial)
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        streams = {model: OpenStream(stub) for model in ("", "tiny-series", "tiny-class")}
        for i in range(n):
            streams[""].put([pb.Event(session_id="mix", seq=i + 1, time=float(i), values=[0.5, -0.5])])
            streams["tiny-series"].put([series[i]], model="tiny-series")
            streams["tiny-class"].put([trial[i]], model="tiny-class", layout=pb.RESPONSE_LAYOUT_COLUMNS)
        for i in range(n):
            event = streams[""].next()
            assert outcome(event.results[0]) == "forecast" and event.results[0].forecast.HasField("next_time")
            got_mean, _ = _served_series(streams["tiny-series"].next())
            np.testing.assert_allclose(got_mean[0], mean[i], atol=ATOL, rtol=1e-4)
            (top, *_), *_ = _served_class(streams["tiny-class"].next(), 3)
            assert top[0] == int(np.argmax(probs[i]))
        for stream in streams.values():
            stream.close()
        # Ending one model's session leaves the same id under the other models alone.
        stub.EndSession(pb.EndSessionRequest(session_id="mix", model="tiny-class"), timeout=CALL_TIMEOUT_S)
        for model, seq in (("", n), ("tiny-series", n)):
            view = stub.GetSession(
                pb.GetSessionRequest(session_id="mix", model=model, include_state=True), timeout=CALL_TIMEOUT_S
            )
            assert view.last_seq == seq and view.state and len(view.state) > 0
        error = rpc_error(stub.GetSession, pb.GetSessionRequest(session_id="mix", model="tiny-class"))
        assert_rpc_error(error, grpc.StatusCode.NOT_FOUND, "session_not_found")


def test_the_session_commands_take_a_model(start_server):
    srv = start_server()
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        stream.send(_series_events("cli", 2, seed=18), model="tiny-series")
        stream.send(_class_events("cli", 2, seed=19), model="tiny-class")
        stream.close()
    shown = _aaren("forecast", "cli", "-t", srv.address, "--model", "tiny-series")
    assert "load mean" in shown and "+10800 s" in shown  # 3 hourly steps ahead
    shown = _aaren("forecast", "cli", "-t", srv.address, "--model", "tiny-class", "--top-k", "4")
    assert all(name in shown for name in CLASSES)
    assert '"model_name": "tiny-class"' in _aaren(
        "session", "cli", "-t", srv.address, "--model", "tiny-class", "--json"
    )
    assert "ended session 'cli' (last seq 2)" in _aaren("end", "cli", "-t", srv.address, "--model", "tiny-series")
    assert "did not exist" in _aaren("end", "cli", "-t", srv.address, "--model", "tiny-series")


def _aaren(*args: str) -> str:
    """``aaren ARGS`` (the command line in this process): what it printed to stdout; it must exit 0."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def _oip_inputs(event: pb.Event, *extra: triton.InferInput) -> list[triton.InferInput]:
    """A series or class event as OIP tensors: ``TIME`` FP64 [1], ``VALUES`` FP32 [C]."""
    t = triton.InferInput("TIME", [1], "FP64")
    t.set_data_from_numpy(np.array([event.time], np.float64))
    values = np.array(event.values, np.float32)
    v = triton.InferInput("VALUES", [len(values)], "FP32")
    v.set_data_from_numpy(values)
    return [t, v, *extra]


def test_oip_metadata_and_config_of_the_series_and_class_models(start_server):
    srv = start_server()
    with triton.InferenceServerClient(srv.address) as client:
        index = client.get_model_repository_index().models
        assert sorted((m.name, m.state) for m in index) == [(n, "READY") for n in ("tiny", "tiny-class", "tiny-series")]
        assert client.is_model_ready("tiny-series") and client.is_model_ready("tiny-class")
        series = client.get_model_metadata("tiny-series")
        assert (series.platform, [(t.name, t.datatype, list(t.shape)) for t in series.inputs]) == (
            "aaren_series", [("TIME", "FP64", [1]), ("VALUES", "FP32", [2])],
        )  # fmt: skip
        assert [(t.name, t.datatype, list(t.shape)) for t in series.outputs] == [
            ("SEQ", "INT64", [1]), ("SERIES_MEAN", "FP64", [3, 2]), ("SERIES_QUANTILES", "FP64", [3, 2, 3]),
            ("FILLED_STEPS", "INT64", [1]),
        ]  # fmt: skip
        config = client.get_model_config("tiny-series").config
        assert [(o.name, list(o.dims)) for o in config.output] == [
            ("SEQ", [1]), ("SERIES_MEAN", [3, 2]), ("SERIES_QUANTILES", [3, 2, 3]), ("FILLED_STEPS", [1]),
        ]  # fmt: skip
        p = {k: v.string_value for k, v in config.parameters.items()}
        assert (p["task"], p["horizon"], float(p["step_seconds"])) == ("series", "3", HOUR)
        assert p["value_names"] == "load,temperature"
        assert p["quantile_levels"] == "0.1,0.5,0.9"
        classes = client.get_model_metadata("tiny-class")
        assert [(t.name, t.datatype, list(t.shape)) for t in classes.inputs] == [
            ("TIME", "FP64", [1]), ("VALUES", "FP32", [3]),
        ]  # fmt: skip
        assert [(t.name, t.datatype, list(t.shape)) for t in classes.outputs] == [
            ("SEQ", "INT64", [1]), ("CLASS_TOP", "INT64", [-1]), ("CLASS_PROBS", "FP64", [-1]),
        ]  # fmt: skip
        p = {k: v.string_value for k, v in client.get_model_config("tiny-class").config.parameters.items()}
        assert (p["task"], p["class_names"], p["default_top_k"]) == ("class", ",".join(CLASSES), "3")
        # A series model has no MARK: the event task's tensors are refused by name.
        mark = triton.InferInput("MARK", [1], "INT64")
        mark.set_data_from_numpy(np.array([0], np.int64))
        with pytest.raises(InferenceServerException, match="unexpected inference input 'MARK' for model 'tiny-series'"):
            client.infer("tiny-series", _oip_inputs(_series_events("x", 1, seed=0)[0], mark), sequence_id="x")


def test_oip_streams_series_and_class_sequences_equal_to_aaren_v1_and_offline(start_server, repository):
    """tritonclient streams a series sequence (an int id) and a class sequence (a string id) of two
    models interleaved on one stream, START and END; every answer equals aaren.v1's for the same
    events (other sessions) and the models' offline outputs."""
    srv = start_server()
    series, trial = _series_events("v1-meter", 8, seed=20), _class_events("v1-trial", 6, seed=21)
    mean, quantiles = _offline_series(repository, series)
    probs = _offline_class(repository, trial)
    with triton.InferenceServerClient(srv.address) as client, grpc.insecure_channel(srv.address) as channel:
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        sent = []
        for i in range(len(series)):
            client.async_stream_infer("tiny-series", _oip_inputs(series[i]), sequence_id=7, sequence_start=i == 0,
                                      sequence_end=i == len(series) - 1, request_id=f"s{i}")  # fmt: skip
            sent.append(("s", i))
            if i < len(trial):
                client.async_stream_infer("tiny-class", _oip_inputs(trial[i]), sequence_id="trial-ä",
                                          sequence_start=i == 0, parameters={"top_k": 2},
                                          request_id=f"c{i}")  # fmt: skip
                sent.append(("c", i))
        got = [answers.get(timeout=CALL_TIMEOUT_S) for _ in sent]
        client.stop_stream()
        assert [e for _, e in got] == [None] * len(sent)
        assert [r.get_response().id for r, _ in got] == [f"{m}{i}" for m, i in sent]
        oip = {(m, i): r for (m, i), (r, _) in zip(sent, got, strict=True)}

        v1 = OpenStream(stub_for(channel))
        served_mean, served_q = _served_series(v1.send(series, model="tiny-series"))
        served_class = _served_class(v1.send(trial, model="tiny-class", top_k=2), 2)
        v1.close()
        for i in range(len(series)):
            r = oip[("s", i)]
            assert r.as_numpy("SEQ").tolist() == [i + 1] and r.get_response().model_name == "tiny-series"
            # float32 model arithmetic: a history in one call rounds unlike steps (as in test_e2e)
            np.testing.assert_allclose(r.as_numpy("SERIES_MEAN"), served_mean[i], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(r.as_numpy("SERIES_QUANTILES"), served_q[i], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(r.as_numpy("SERIES_MEAN"), mean[i], atol=ATOL, rtol=1e-4)
            np.testing.assert_allclose(r.as_numpy("SERIES_QUANTILES"), quantiles[i], atol=ATOL, rtol=1e-4)
        for i in range(len(trial)):
            r = oip[("c", i)]
            assert r.as_numpy("SEQ").tolist() == [i + 1] and r.as_numpy("CLASS_TOP").shape == (2,)
            assert r.as_numpy("CLASS_TOP").tolist() == [c for c, _ in served_class[i]]
            np.testing.assert_allclose(r.as_numpy("CLASS_PROBS"), [p for _, p in served_class[i]], atol=1e-6)
            np.testing.assert_allclose(r.as_numpy("CLASS_PROBS"), np.sort(probs[i])[::-1][:2], atol=1e-5)

        # END ended the series sequence; the class sequence goes on, unary, at seq 7.
        stub = stub_for(channel)
        error = rpc_error(stub.GetSession, pb.GetSessionRequest(session_id="7", model="tiny-series"))
        assert_rpc_error(error, grpc.StatusCode.NOT_FOUND, "session_not_found")
        more = pb.Event(time=6.0, values=[0.5, 0.0, -0.5])
        assert client.infer("tiny-class", _oip_inputs(more), sequence_id="trial-ä").as_numpy("SEQ").tolist() == [7]
        stats = {s.name: s.inference_stats.success.count for s in client.get_inference_statistics().model_stats}
        assert stats == {"tiny": 0, "tiny-series": 8, "tiny-class": 7}
