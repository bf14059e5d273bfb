"""A live series with gaps (issue 22): real servers fill a stream's skipped steps and missing values
as training does (docs/tasks.md "A live series with gaps").

A tiny series model of hourly steps (``max_gap_steps`` 5) and a tiny class model are served in both
process layouts. A stream that skips hours and sends NaN values is forecast exactly as the model
forecasts the gap-filled series offline (``SeriesModel.prefill`` over the filled values and their
step times), and each forecast says how many steps were filled; an event off the step grid, after
too long a gap, or before the last time gets its own error; the filled values survive a
Redis-backed restart in the middle of a gap; the replay of a file with gaps and NA cells scores as
the protocol's Replay rule says.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton
from server_helpers import OpenStream, assert_event_error, outcome, stub_for
from servers import repository_of
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
TRAIN_MEAN = [10.0, -2.0]
LEVELS = (0.1, 0.5, 0.9)
HORIZON = 3
MAX_GAP = 5
ATOL = 2e-4
#: The steps a stream sends: 3-4, 8-9 and 12 are skipped.
STEPS = [0, 1, 2, 5, 6, 7, 10, 11, 13]
FILLED = [0, 0, 0, 2, 0, 0, 2, 0, 1]


def _series_model() -> SeriesModel:
    torch.manual_seed(0)
    backbone = BackboneConfig(kind="aaren", d_model=8, n_layers=2, n_heads=2)
    model = SeriesModel(SeriesModelConfig(backbone, len(CHANNELS), HORIZON, LEVELS, 4)).eval()
    model.set_normalization(torch.tensor(TRAIN_MEAN), torch.tensor([3.0, 0.5]))
    return model


def _class_model() -> ClassModel:
    torch.manual_seed(1)
    backbone = BackboneConfig(kind="aaren", d_model=8, n_layers=2, n_heads=2)
    model = ClassModel(ClassModelConfig(backbone, 3, 4)).eval()
    model.set_normalization(torch.tensor([0.0, 1.0, -1.0]), torch.tensor([1.0, 2.0, 0.5]))
    return model


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    root = tmp_path_factory.mktemp("gap-models")
    shutil.copytree(tiny_checkpoint, root / "default")
    save_checkpoint(
        root / "series",
        _series_model(),
        {"task": "series", "name": "gappy", "channels": CHANNELS, "horizon": HORIZON, "quantiles": list(LEVELS),
         "step_seconds": HOUR, "time_unit": "seconds", "fill": "forward", "max_gap_steps": MAX_GAP},
    )  # fmt: skip
    save_checkpoint(
        root / "class", _class_model(), {"task": "class", "name": "gappy-class", "channels": ["x", "y", "z"]}
    )
    return root


@pytest.fixture
def start_server(start_server, frontends, repository):
    return repository_of(start_server, frontends, repository)


def _values(seed: int, n: int = len(STEPS)) -> np.ndarray:
    """``[n, C]`` observations with NaN cells: the first event's temperature (the train mean fills
    it), one load, and a whole row."""
    values = np.random.default_rng(seed).normal(TRAIN_MEAN, [3.0, 0.5], size=(n, 2))
    values[0, 1] = values[2, 0] = np.nan
    values[4] = np.nan
    return values


def _events(sid: str, values: np.ndarray, steps: list[int] = STEPS, first_seq: int = 1) -> list[pb.Event]:
    return [
        pb.Event(session_id=sid, seq=first_seq + i, time=START + s * HOUR, values=v.tolist())
        for i, (s, v) in enumerate(zip(steps, values, strict=True))
    ]


def _offline(repository: Path, values: np.ndarray, steps: list[int] = STEPS) -> tuple[np.ndarray, np.ndarray]:
    """The model's forecasts after each event, offline, over the gap-filled series: every step from
    the first event's to the last, its input the last observed value of each channel (before any:
    the train mean), its calendar features from its own time. Mean ``[N, H, C]``, quantiles ``[N, H, C, Q]``."""
    model = load_checkpoint(repository / "series").model
    grid = np.arange(steps[0], steps[-1] + 1)
    filled = np.empty((len(grid), len(CHANNELS)), np.float32)
    last = np.array(TRAIN_MEAN)
    by_step = dict(zip(steps, values, strict=True))
    for i, s in enumerate(grid):
        if s in by_step:
            last = np.where(np.isnan(by_step[s]), last, by_step[s])
        filled[i] = last
    times = torch.from_numpy(calendar_features(START + grid * HOUR))[None]
    with torch.no_grad():
        y, _ = model.prefill(torch.from_numpy(filled)[None], times)
        raw = model.to_raw(model.heads(y[0, np.array(steps) - steps[0]]))
    return raw.mean.numpy(), raw.quantiles.numpy()


def _served(response: pb.StreamResponse) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Means ``[F, H, C]``, quantiles ``[F, H, C, Q]`` and filled steps ``[F]`` from either layout."""
    assert not response.HasField("request_error"), response.request_error
    if response.HasField("forecast_columns"):
        block = response.forecast_columns
        h, c = block.horizon, block.channels
        means = np.array(block.series_means).reshape(-1, h, c)
        return means, np.array(block.series_quantiles).reshape(-1, h, c, 3), list(block.series_filled_steps)
    means, quantiles, filled = [], [], []
    for r in response.results:
        assert outcome(r) == "forecast", r
        s = r.forecast.series
        means.append(np.array(s.means).reshape(s.horizon, s.channels))
        quantiles.append(np.array(s.quantiles).reshape(s.horizon, s.channels, 3))
        filled.append(s.filled_steps)
    return np.stack(means), np.stack(quantiles), filled


@pytest.mark.parametrize("layout", [pb.RESPONSE_LAYOUT_ROWS, pb.RESPONSE_LAYOUT_COLUMNS], ids=["rows", "columns"])
def test_a_stream_that_skips_hours_and_sends_nan_forecasts_as_the_filled_series_does_offline(
    start_server, repository, layout
):
    values = _values(seed=1)
    mean, quantiles = _offline(repository, values)
    srv = start_server()
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        for i, event in enumerate(_events("one-by-one", values)):
            got_mean, got_q, filled = _served(stream.send([event], model="gappy", layout=layout))
            assert filled == [FILLED[i]], i
            np.testing.assert_allclose(got_mean[0], mean[i], atol=ATOL, rtol=1e-4)
            np.testing.assert_allclose(got_q[0], quantiles[i], atol=ATOL, rtol=1e-4)
        # The whole history in one message (the parallel scan over the expanded run), and a history
        # split over two messages, the second starting after a gap: the same numbers.
        got_mean, got_q, filled = _served(stream.send(_events("history", values), model="gappy", layout=layout))
        assert filled == FILLED
        np.testing.assert_allclose(got_mean, mean, atol=ATOL, rtol=1e-4)
        np.testing.assert_allclose(got_q, quantiles, atol=ATOL, rtol=1e-4)
        events = _events("split", values)
        first, *_ = _served(stream.send(events[:3], model="gappy", layout=layout))
        later, _, filled = _served(stream.send(events[3:], model="gappy", layout=layout))
        assert filled == FILLED[3:]
        np.testing.assert_allclose(np.concatenate([first, later]), mean, atol=ATOL, rtol=1e-4)
        # Many sessions in one batch, each with its own gaps and NaN cells (runs of several lengths).
        other = _values(seed=2)[:5]
        mixed = [*_events("m1", values[:4], STEPS[:4]), *_events("m2", other, [0, 3, 4, 9, 10])]
        got_mean, _, filled = _served(stream.send(mixed, model="gappy", layout=layout))
        assert filled == [0, 0, 0, 2, 0, 2, 0, 4, 0]
        np.testing.assert_allclose(got_mean[:4], mean[:4], atol=ATOL, rtol=1e-4)
        np.testing.assert_allclose(got_mean[4:], _offline(repository, other, [0, 3, 4, 9, 10])[0], atol=ATOL, rtol=1e-4)
        stream.close()


def test_off_the_grid_a_gap_too_long_and_an_earlier_time_each_get_their_own_error(start_server, repository):
    srv = start_server()
    last = START + HOUR
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        assert [outcome(r) for r in stream.send(_events("g", _values(3)[:2], [0, 1]), model="gappy").results] == [
            "forecast"
        ] * 2

        def one(seq: int, time: float, values: list[float] | None = None) -> pb.EventResult:
            event = pb.Event(session_id="g", seq=seq, time=time, values=values or [10.0, -2.0])
            return stream.send([event], model="gappy").results[0]

        off = one(3, last + 1.5 * HOUR)
        assert_event_error(
            off, pb.ERROR_CODE_INVALID_ARGUMENT, "time_off_step_grid", [str(last + 1.5 * HOUR), str(last), "3600"]
        )
        assert_event_error(one(3, last), pb.ERROR_CODE_INVALID_ARGUMENT, "time_off_step_grid", [str(last)])
        too_long = one(3, last + (MAX_GAP + 2) * HOUR)
        gap_parts = [f"{MAX_GAP + 1} missing steps", "at most 5"]
        assert_event_error(too_long, pb.ERROR_CODE_FAILED_PRECONDITION, "gap_too_long", gap_parts)
        assert_event_error(one(3, last - HOUR), pb.ERROR_CODE_FAILED_PRECONDITION, "time_before_last", [str(last)])
        # +-inf is still no value; NaN is a missing one, filled.
        assert_event_error(
            one(3, last + HOUR, [float("inf"), 1.0]), pb.ERROR_CODE_INVALID_ARGUMENT, "values_not_finite"
        )
        ok = one(3, last + (MAX_GAP + 1) * HOUR + 0.0005, [float("nan"), -1.0])  # the longest gap, within 1 ms
        assert outcome(ok) == "forecast" and ok.forecast.series.filled_steps == MAX_GAP
        last += (MAX_GAP + 1) * HOUR + 0.0005

        # The same checks between the events of one request: each against the last applied one.
        batch = [
            pb.Event(session_id="g", seq=4, time=last + 0.5 * HOUR, values=[1.0, 2.0]),
            pb.Event(session_id="g", seq=4, time=last + 2 * HOUR, values=[1.0, 2.0]),
            pb.Event(session_id="g", seq=5, time=last + 2 * HOUR, values=[1.0, 2.0]),
            pb.Event(session_id="g", seq=5, time=last + 100 * HOUR, values=[1.0, 2.0]),
            pb.Event(session_id="g", seq=5, time=last + 3 * HOUR, values=[float("nan"), 2.0]),
        ]
        results = stream.send(batch, model="gappy").results
        assert_event_error(results[0], pb.ERROR_CODE_INVALID_ARGUMENT, "time_off_step_grid")
        assert outcome(results[1]) == "forecast" and results[1].forecast.series.filled_steps == 1
        assert_event_error(results[2], pb.ERROR_CODE_INVALID_ARGUMENT, "time_off_step_grid")
        assert_event_error(results[3], pb.ERROR_CODE_FAILED_PRECONDITION, "gap_too_long", ["97 missing steps"])
        assert outcome(results[4]) == "forecast" and results[4].forecast.series.filled_steps == 0

        # The event model takes no missing values; the class model does, and reads NaN as its
        # offline forward does (0 after standardization). Neither has a step grid.
        nan_event = pb.Event(session_id="e", seq=1, time=5.0, mark=0, values=[float("nan"), 1.0])
        assert_event_error(
            stream.send([nan_event], model="tiny").results[0], pb.ERROR_CODE_INVALID_ARGUMENT, "values_not_finite"
        )
        trial = np.array([[0.5, np.nan, 1.0], [np.nan, np.nan, np.nan], [1.0, 2.0, -1.0]])
        sent = [
            pb.Event(session_id="c", seq=i + 1, time=float(i) * 0.7, values=v.tolist()) for i, v in enumerate(trial)
        ]
        got = stream.send(sent, model="gappy-class", top_k=4).results
        model = load_checkpoint(repository / "class").model
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor(trial, dtype=torch.float32)[None])[0], -1).numpy()
        for r, want in zip(got, probs, strict=True):
            assert outcome(r) == "forecast"
            by_class = {c.class_index: c.probability for c in r.forecast.classes.classes}
            np.testing.assert_allclose([by_class[k] for k in range(4)], want, atol=1e-5)
        stream.close()


def test_the_filled_values_survive_a_redis_backed_restart_in_the_middle_of_a_gap(start_server, repository, redis_url):
    values = _values(seed=4)
    mean, _ = _offline(repository, values)
    events = _events("meter", values)
    srv = start_server(store_url=redis_url)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        _, _, filled = _served(stream.send(events[:3], model="gappy"))  # its last load is NaN: a filled value
        assert filled == FILLED[:3]
        stream.close()
    srv.stop()
    again = start_server(store_url=redis_url)
    with grpc.insecure_channel(again.address) as channel:
        stream = OpenStream(stub_for(channel))
        got, _, filled = _served(stream.send(events[3:], model="gappy", layout=pb.RESPONSE_LAYOUT_COLUMNS))
        assert filled == FILLED[3:]
        np.testing.assert_allclose(got, mean[3:], atol=ATOL, rtol=1e-4)
        stream.close()


def test_oip_and_the_python_client_carry_the_filled_steps(start_server, repository):
    from aaren.client import SeriesForecastOut, SyncClient

    values = _values(seed=5)
    mean, _ = _offline(repository, values)
    srv = start_server()
    with triton.InferenceServerClient(srv.address) as client:
        for i, event in enumerate(_events("oip", values)):
            t = triton.InferInput("TIME", [1], "FP64")
            t.set_data_from_numpy(np.array([event.time], np.float64))
            v = triton.InferInput("VALUES", [2], "FP32")
            v.set_data_from_numpy(np.array(event.values, np.float32))
            r = client.infer("gappy", [t, v], sequence_id="oip-meter", sequence_start=i == 0)
            assert r.as_numpy("FILLED_STEPS").tolist() == [FILLED[i]]
            np.testing.assert_allclose(r.as_numpy("SERIES_MEAN"), mean[i], atol=ATOL, rtol=1e-4)
    sent = [EventIn(e.session_id, e.seq, e.time, values=list(e.values)) for e in _events("py", values)]
    with SyncClient(srv.address) as client:
        rows = client.apply(sent[:4], model="gappy").forecasts
        cols = client.apply(sent[4:], model="gappy", columns=True).forecasts
    assert all(isinstance(f, SeriesForecastOut) for f in rows + cols)
    assert [f.filled_steps for f in rows + cols] == FILLED
    np.testing.assert_allclose([f.means for f in rows + cols], mean, atol=ATOL, rtol=1e-4)


def _aaren(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_aaren_replay_sends_a_files_gaps_and_na_cells_and_scores_by_the_replay_rule(start_server, repository, tmp_path):
    import pandas as pd

    values = _values(seed=6)
    mean, _ = _offline(repository, values)
    times = START + np.array(STEPS) * HOUR
    stamps = [dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") for t in times]
    frame = pd.DataFrame({"time": stamps, "load": values[:, 0], "temperature": values[:, 1]})
    srv = start_server()
    score_from = START + 6 * HOUR

    # The rule, by hand: a forecast after the row at t counts when t + D >= score_from and t + H D
    # is at most the last time; its targets are the rows at t + (h + 1) D, each non-NA cell.
    rows = dict(zip(STEPS, values, strict=True))
    for name, since, expected_origins in (("gappy", None, 7), ("gappy_since", score_from, 4)):
        frame.to_csv(tmp_path / f"{name}.csv", index=False, na_rep="NA")  # a session per file: its name
        errors, origins = [], 0
        for i, s in enumerate(STEPS):
            if (since is not None and START + (s + 1) * HOUR < since) or s + HORIZON > STEPS[-1]:
                continue
            origins += 1
            for h in range(HORIZON):
                target = rows.get(s + h + 1)
                if target is not None:
                    errors += [mean[i, h, c] - target[c] for c in range(2) if not np.isnan(target[c])]
        assert origins == expected_origins
        args = [
            "replay",
            str(tmp_path / f"{name}.csv"),
            "-t",
            srv.address,
            "--model",
            "gappy",
            "--no-progress",
            "--json",
        ]
        if since is not None:
            args += ["--score-from", dt.datetime.fromtimestamp(since, dt.UTC).isoformat()]
        summary = json.loads(_aaren(*args))
        assert (summary["errors"], summary["forecasts"]) == (0, len(STEPS))
        scores = summary["series"]
        assert (scores["origins"], scores["targets"]) == (origins, len(errors))
        assert scores["targets"] + scores["targets_missing"] == origins * HORIZON * 2
        np.testing.assert_allclose(scores["mse"], float(np.mean(np.square(errors))), rtol=1e-5)
        np.testing.assert_allclose(scores["mae"], float(np.mean(np.abs(errors))), rtol=1e-5)


def test_a_series_files_na_cells_read_as_nan_and_infinities_and_an_event_files_na_are_refused(tmp_path):
    import math

    from aaren.client.events_file import EventsFileError, ModelSchema, read_events

    path = tmp_path / "meter.csv"
    path.write_text("time,load,temperature\n0,1.5,NA\n3600,,2.0\n10800,NaN,3.0\n")
    series = ModelSchema("seconds", ("observation",), tuple(CHANNELS), 1, "series")
    got = read_events(path, series).events
    assert [e.time for e in got] == [0.0, 3600.0, 10800.0]  # the skipped hour stays a gap: the server fills it
    assert [[math.isnan(v) for v in e.values] for e in got] == [[False, True], [True, False], [True, False]]
    event_file = tmp_path / "events.csv"
    event_file.write_text("session_id,time,mark,load,temperature\na,0,0,1.5,NA\n")
    with pytest.raises(EventsFileError, match="line 2: value column 'temperature' is missing"):
        read_events(event_file, ModelSchema("seconds", (), tuple(CHANNELS), 1, "event"))
    path.write_text("time,load,temperature\n0,1.5,inf\n")
    with pytest.raises(EventsFileError, match="'inf'; expected a finite number"):
        read_events(path, series)
