"""DataFrames in and out against a real server: the tiny event model (5 marks m0..m4, values a and
b), and the bundled series and class models (``series-power``, ``class-vowels``) served beside it,
whose frames must equal the client's own stream answers and the models' offline outputs."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from aaren.client import AarenClient, AarenError, EventIn, SyncClient, apply_frame, events_from_frame
from aaren.formats.errors import DataError
from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.series.data import calendar_features

MARK_COLUMNS = [f"p_m{i}" for i in range(5)]


def events(sid: str = "s", times=(1.0, 2.5, 4.0), marks=("m1", "m3", "m0")) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "session_id": sid,
            "time": list(times),
            "mark": list(marks),
            "a": [0.5 * i for i in range(len(times))],
            "b": [1.0] * len(times),
        }
    )


def test_frame_in_forecasts_out_with_named_columns(start_server):
    srv = start_server()
    frame = pd.concat([events("x"), events("y", times=(3.0, 3.0), marks=(2, 4))], ignore_index=True)
    with SyncClient(srv.address) as client:
        model = client.describe_model()
        out = client.apply_frame(frame)
        direct = client.forecast("x").forecast
    assert list(out.columns) == [
        "session_id",
        "seq",
        "time",
        "outcome",
        "error",
        "mean_gap",
        "expected_time",
        *[f"gap_q{q:g}" for q in model.quantile_levels],
        *MARK_COLUMNS,
        "a_mean",
        "a_std",
        "b_mean",
        "b_std",
    ]
    assert "gap_q0.5" in out.columns
    assert out["seq"].tolist() == [1, 2, 3, 1, 2]
    assert out["time"].tolist() == frame["time"].tolist()
    assert (out["outcome"] == "forecast").all() and out["error"].isna().all()
    assert out[MARK_COLUMNS].sum(axis=1).to_numpy() == pytest.approx(1.0, abs=1e-5)
    quantiles = out[[f"gap_q{q:g}" for q in model.quantile_levels]].to_numpy()
    assert (quantiles[:, 1:] >= quantiles[:, :-1]).all()
    assert (out[["a_std", "b_std"]] > 0).all().all()
    # The last row of x is the server's forecast of x from its current state.
    last = out[out["session_id"] == "x"].iloc[-1]
    assert last["mean_gap"] == pytest.approx(direct.mean_gap)
    assert [last[f"gap_q{q:g}"] for q in direct.quantiles] == pytest.approx(list(direct.quantiles.values()))
    assert {m: last[f"p_m{m}"] for m, _ in direct.marks} == pytest.approx(dict(direct.marks))
    assert [last["a_mean"], last["b_mean"]] == pytest.approx([v for v, _ in direct.values])


def test_running_a_cell_twice_continues_the_sessions_seqs(start_server):
    """Without a seq column a rerun is numbered after the server's last seq: never all duplicates."""
    srv = start_server()
    latest = pd.DataFrame({"session_id": ["u", "v"], "time": [5.0, 7.0], "mark": ["m2", "m2"], "a": 0.0, "b": 1.0})
    with SyncClient(srv.address) as client:
        first = client.apply_frame(latest)
        second = client.apply_frame(latest)  # the same DataFrame: the same time again is a next event
        assert first["seq"].tolist() == [1, 1] and second["seq"].tolist() == [2, 2]
        assert (first["outcome"] == "forecast").all() and (second["outcome"] == "forecast").all()
        assert second["mean_gap"].notna().all()
        assert client.get_session("u").last_seq == 2

        history = events("w")
        once = client.apply_frame(history)
        again = client.apply_frame(history)
        assert once["seq"].tolist() == [1, 2, 3] and (once["outcome"] == "forecast").all()
        # Its times are earlier than the session's last: the rerun says so per event, not silently nothing.
        assert again["seq"].tolist() == [4, 5, 6]
        assert (again["outcome"] == "error").all()
        reasons = [e.split(":")[0] for e in again["error"]]
        assert reasons == ["time_before_last", "seq_gap", "seq_gap"]  # nothing applied: 5 and 6 have a gap
        assert client.get_session("w").last_seq == 3
        assert again[MARK_COLUMNS].iloc[0].isna().all()

        restarted = client.apply_frame(history, restart=True)
        assert restarted["seq"].tolist() == [1, 2, 3]
        pd.testing.assert_frame_equal(restarted, once)

        later = client.apply_frame(events("w", times=(9.0, 10.0), marks=("m4", "m4")))
        assert later["seq"].tolist() == [4, 5] and (later["outcome"] == "forecast").all()


def test_a_seq_column_is_used_as_given(start_server):
    srv = start_server()
    frame = events("z").assign(seq=[1, 2, 3])
    with SyncClient(srv.address) as client:
        client.apply_frame(frame)
        out = client.apply_frame(frame)
    assert out["seq"].tolist() == [1, 2, 3] and (out["outcome"] == "duplicate").all()
    assert out["mean_gap"].isna().all()


def test_apply_frame_with_the_async_client(start_server):
    srv = start_server()

    async def main() -> pd.DataFrame:
        async with AarenClient(srv.address) as client:
            await apply_frame(client, events("q"))
            return await apply_frame(client, events("q", times=(6.0,), marks=(1,)), top_k=2)

    out = asyncio.run(main())
    assert out["seq"].tolist() == [4] and out["outcome"].tolist() == ["forecast"]
    assert out[MARK_COLUMNS].notna().sum(axis=1).tolist() == [2]  # marks outside the top 2 are NaN


def test_events_from_frame_checks_names(start_server):
    srv = start_server()
    with SyncClient(srv.address) as client:
        model = client.describe_model()
    batch = events_from_frame(events("e"), model, {"e": 7})
    assert batch[0] == EventIn("e", 8, 1.0, 1, [0.0, 1.0]) and [e.seq for e in batch] == [8, 9, 10]
    with pytest.raises(ValueError, match=r"unknown mark 'm9'; expected one of the model's marks \['m0'"):
        events_from_frame(events(marks=("m1", "m9", "m0")), model)
    with pytest.raises(ValueError, match=r"missing columns \['b'\]"):
        events_from_frame(events().drop(columns="b"), model)


def test_datetimes_are_read_as_training_reads_them(start_server):
    """The tiny model's unit is minutes: datetimes become minutes since the Unix epoch (naive = UTC)."""
    srv = start_server()
    with SyncClient(srv.address) as client:
        model = client.describe_model()
    stamps = pd.to_datetime(["1970-01-01 00:01", "1970-01-01 00:03:30", "1970-01-02"], format="ISO8601")
    naive = events("d").assign(time=stamps)
    assert [e.time for e in events_from_frame(naive, model)] == [1.0, 3.5, 1440.0]
    aware = naive.assign(time=naive["time"].dt.tz_localize("UTC").dt.tz_convert("Europe/Paris"))
    assert [e.time for e in events_from_frame(aware, model)] == [1.0, 3.5, 1440.0]
    iso = naive.assign(time=["1970-01-01T00:01:00Z", "1970-01-01T01:03:30+01:00", "1970-01-02T00:00:00"])
    assert [e.time for e in events_from_frame(iso, model)] == [1.0, 3.5, 1440.0]


# --- series and class models ------------------------------------------------------------------

BUNDLED = Path(__file__).resolve().parents[2] / "models"
SERIES, CLASS = "series-power", "class-vowels"
HOUR = 3600.0
START = pd.Timestamp("2026-03-02 06:00", tz="UTC")  # a Monday morning: the calendar features move
ATOL, RTOL = 2e-4, 1e-4  # float32 models: the server's batched steps round unlike one offline pass


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    """The tiny event model as the default, beside copies of the bundled series and class models."""
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(tiny_checkpoint, root / "default")
    for name in (SERIES, CLASS):
        shutil.copytree(BUNDLED / name, root / name)
    return root


@pytest.fixture
def start_models(start_server, repository):
    return lambda **settings: start_server(checkpoint=None, models_dir=repository, **settings)


def power(channels: list[str], hours: int, seed: int, start: pd.Timestamp = START) -> pd.DataFrame:
    """Made-up hourly readings of every channel: ``time`` as datetimes, no session_id."""
    rng = np.random.default_rng(seed)
    level = np.array([1.1, 0.12, 240.0, 4.6, 1.1, 1.3, 6.4])[: len(channels)]
    spread = np.array([1.0, 0.1, 3.0, 4.0, 5.0, 5.0, 8.0])[: len(channels)]
    values = np.abs(level + spread * rng.standard_normal((hours, len(channels))))
    return pd.DataFrame(
        {"time": pd.date_range(start, periods=hours, freq="h"), **dict(zip(channels, values.T, strict=True))}
    )


def utterances(channels: list[str], lengths: dict[str, int], seed: int) -> pd.DataFrame:
    """Made-up sequences of every channel, one per session, interleaved row by row."""
    rng = np.random.default_rng(seed)
    rows = [(sid, t) for t in range(max(lengths.values())) for sid, n in lengths.items() if t < n]
    values = rng.normal(0.0, 0.5, size=(len(rows), len(channels)))
    return pd.DataFrame(
        {
            "session_id": [s for s, _ in rows],
            "time": [float(t) for _, t in rows],
            **dict(zip(channels, values.T, strict=True)),
        }
    )


def offline_series(name: str, frame: pd.DataFrame, channels: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The model's forecasts after every row, offline: mean ``[N, H, C]``, quantiles ``[N, H, C, Q]``."""
    model = load_checkpoint(BUNDLED / name).model
    seconds = (frame["time"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
    values = torch.tensor(frame[channels].to_numpy(), dtype=torch.float32)[None]
    with torch.no_grad():
        raw = model.to_raw(model(values, torch.from_numpy(calendar_features(seconds))[None]))
    return raw.mean[0].numpy(), raw.quantiles[0].numpy()


def offline_class(name: str, rows: pd.DataFrame, channels: list[str]) -> np.ndarray:
    """Class probabilities after every row of one sequence, offline: ``[N, K]``."""
    model = load_checkpoint(BUNDLED / name).model
    with torch.no_grad():
        logits = model(torch.tensor(rows[channels].to_numpy(), dtype=torch.float32)[None])[0]
    return torch.softmax(logits, -1).numpy()


def series_grids(out: pd.DataFrame, channels: list[str], levels) -> tuple[np.ndarray, np.ndarray]:
    """A series frame's ``<c>_mean`` as ``[N, H, C]`` and ``<c>_q<level>`` as ``[N, H, C, Q]``."""
    h = int(out["step"].max())
    means = out[[f"{c}_mean" for c in channels]].to_numpy().reshape(-1, h, len(channels))
    quantiles = out[[f"{c}_q{q:g}" for c in channels for q in levels]].to_numpy()
    return means, quantiles.reshape(-1, h, len(channels), len(levels))


def test_a_series_frame_comes_back_per_step_equal_to_the_stream_and_the_offline_model(start_models):
    srv = start_models()
    with SyncClient(srv.address) as client:
        model = client.describe_model(SERIES)
        channels, levels, h = list(model.value_names), list(model.quantile_levels), model.horizon
        frame = power(channels, 30, seed=1)
        out = client.apply_frame(frame, model=SERIES)
        # The client's own stream, the same rows as another session in one request.
        direct = client.apply(
            [EventIn("direct", i + 1, t.timestamp(), 0, row) for i, (t, row) in
             enumerate(zip(frame["time"], frame[channels].to_numpy().tolist(), strict=True))],
            model=SERIES,
        ).forecasts  # fmt: skip
        unary = client.forecast("frame", model=SERIES).forecast

    assert list(out.columns) == [
        "session_id", "seq", "time", "outcome", "error", "step", "target_time",
        *[f"{c}_{s}" for c in channels for s in ("mean", *[f"q{q:g}" for q in levels])],
    ]  # fmt: skip
    assert len(out) == 30 * h and (out["session_id"] == "frame").all()  # the frame had no session_id
    assert out["seq"].tolist() == np.repeat(np.arange(1, 31), h).tolist()
    assert out["step"].tolist() == np.tile(np.arange(1, h + 1), 30).tolist()
    assert (out["outcome"] == "forecast").all() and out["error"].isna().all()
    # Datetimes in, UTC datetimes out: each step an hour after the last.
    assert out["time"].tolist() == np.repeat(frame["time"].to_numpy(), h).tolist()
    assert (out["target_time"] - out["time"] == pd.to_timedelta(out["step"], unit="h")).all()

    means, quantiles = series_grids(out, channels, levels)
    want_means, want_quantiles = offline_series(SERIES, frame, channels)
    np.testing.assert_allclose(means, want_means, atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(quantiles, want_quantiles, atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(means, [f.means for f in direct], rtol=1e-6)
    np.testing.assert_allclose(quantiles, [np.stack([f.quantiles[q] for q in levels], -1) for f in direct], rtol=1e-6)
    np.testing.assert_allclose(means[-1], unary.means, atol=ATOL, rtol=RTOL)  # the last row: its forecast now


def test_a_series_rerun_continues_the_seqs_and_restart_repeats_it(start_models):
    srv = start_models()
    with SyncClient(srv.address) as client:
        model = client.describe_model(SERIES)
        channels, levels, h = list(model.value_names), list(model.quantile_levels), model.horizon
        both = power(channels, 20, seed=2).assign(session_id="meter")
        first, later = both.iloc[:12], both.iloc[12:]
        once = client.apply_frame(first, model=SERIES)
        more = client.apply_frame(later, model=SERIES)  # the next hours: seqs 13..20
        assert more["seq"].unique().tolist() == list(range(13, 21)) and (more["outcome"] == "forecast").all()
        want, _ = offline_series(SERIES, both, channels)
        np.testing.assert_allclose(series_grids(more, channels, levels)[0], want[12:], atol=ATOL, rtol=RTOL)

        again = client.apply_frame(first, model=SERIES)  # earlier times than the session's last
        assert again["seq"].unique().tolist() == list(range(21, 33)) and (again["outcome"] == "error").all()
        assert again["error"].iloc[0].startswith("time_before_last: ")
        assert again["Voltage_mean"].isna().all() and len(again) == 12 * h
        assert client.get_session("meter", model=SERIES).last_seq == 20

        restarted = client.apply_frame(first, model=SERIES, restart=True)
        pd.testing.assert_frame_equal(restarted, once)
        assert client.get_session("meter", model=SERIES).last_seq == 12
        # The event model's session of the same id is another one: untouched by the series frames.
        with pytest.raises(AarenError, match="NOT_FOUND"):
            client.get_session("meter")

        # Numbers for times: Unix seconds in, Unix seconds out, the same forecasts.
        seconds = first.assign(time=(first["time"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds())
        numeric = client.apply_frame(seconds, model=SERIES, restart=True)
        assert numeric["target_time"].tolist() == (numeric["time"] + numeric["step"] * HOUR).tolist()
        pd.testing.assert_frame_equal(numeric.drop(columns=["time", "target_time"]),
                                      once.drop(columns=["time", "target_time"]))  # fmt: skip


def test_a_class_frame_gives_the_predicted_class_and_every_probability(start_models):
    srv = start_models()
    with SyncClient(srv.address) as client:
        model = client.describe_model(CLASS)
        channels, classes = list(model.value_names), list(model.class_names)
        frame = utterances(channels, {"a": 9, "b": 5}, seed=3)
        out = client.apply_frame(frame, model=CLASS)
        direct = client.apply(
            [EventIn("direct-a", i + 1, float(i), 0, row) for i, row in
             enumerate(frame[frame["session_id"] == "a"][channels].to_numpy().tolist())],
            model=CLASS, top_k=len(classes),
        ).forecasts  # fmt: skip
        top2 = client.apply_frame(utterances(channels, {"c": 3}, seed=4), model=CLASS, top_k=2)
        more = client.apply_frame(frame[frame["session_id"] == "b"].assign(time=lambda f: f["time"] + 5), model=CLASS)

    p_columns = [f"p_{c}" for c in classes]
    assert list(out.columns) == ["session_id", "seq", "time", "outcome", "error", "predicted", *p_columns]
    assert out["seq"].tolist() == frame.groupby("session_id").cumcount().add(1).tolist()
    assert (out["outcome"] == "forecast").all()
    probs = out[p_columns].to_numpy()
    assert probs.sum(axis=1) == pytest.approx(1.0, abs=1e-5)
    assert out["predicted"].tolist() == [classes[i] for i in probs.argmax(axis=1)]
    for sid in ("a", "b"):
        rows = frame["session_id"] == sid
        np.testing.assert_allclose(probs[rows.to_numpy()], offline_class(CLASS, frame[rows], channels), atol=1e-5)
    a = probs[(frame["session_id"] == "a").to_numpy()]
    np.testing.assert_allclose(a, [[dict(f.classes)[c] for c in classes] for f in direct], rtol=1e-6)
    assert top2[p_columns].notna().sum(axis=1).tolist() == [2, 2, 2]  # classes outside the top 2 are NaN
    assert top2["predicted"].tolist() == top2[p_columns].idxmax(axis=1).str.removeprefix("p_").tolist()
    assert more["seq"].tolist() == [6, 7, 8, 9, 10] and (more["outcome"] == "forecast").all()


def test_series_and_class_frames_with_the_async_client_and_no_session_column(start_models):
    srv = start_models()

    async def main() -> tuple[pd.DataFrame, pd.DataFrame]:
        async with AarenClient(srv.address) as client:
            series = await client.describe_model(SERIES)
            out = await apply_frame(
                client, power(list(series.value_names), 3, seed=5), model=SERIES, session_id="house"
            )
            trial = (await client.describe_model(CLASS)).value_names
            one = utterances(list(trial), {"x": 4}, seed=6).drop(columns="session_id")
            return out, await apply_frame(client, one, model=CLASS, session_id="utterance")

    series_out, class_out = asyncio.run(main())
    assert (series_out["session_id"] == "house").all() and series_out["seq"].unique().tolist() == [1, 2, 3]
    assert (class_out["session_id"] == "utterance").all() and class_out["seq"].tolist() == [1, 2, 3, 4]


def test_bad_series_and_class_frames_say_what_was_expected(start_models):
    srv = start_models()
    with SyncClient(srv.address) as client:
        series, trial = client.describe_model(SERIES), client.describe_model(CLASS)
        frame = power(list(series.value_names), 3, seed=7)
        with pytest.raises(DataError, match=r"^series frame: missing columns \['Voltage'\]; expected time, "
                           r"\[session_id\], \[seq\] and the model's channels \['Global_active_power'"):  # fmt: skip
            client.apply_frame(frame.drop(columns="Voltage"), model=SERIES)
        with pytest.raises(DataError, match=r"^series frame: missing columns \['time'\]"):
            client.apply_frame(frame.drop(columns="time"), model=SERIES)
        bad = frame.astype({"Voltage": object})
        bad.loc[1, "Voltage"] = "230 V"
        with pytest.raises(DataError, match=r"^series frame: column 'Voltage' holds '230 V' \(row 1\), not a number"):
            client.apply_frame(bad, model=SERIES)
        utterance = utterances(list(trial.value_names), {"u": 2}, seed=8)
        with pytest.raises(DataError, match=r"^class frame: missing columns \['dim_11'\]"):
            client.apply_frame(utterance.drop(columns="dim_11"), model=CLASS)
        with pytest.raises(DataError, match=r"^class frame: column 'dim_0' holds 'loud' \(row 0\), not a number"):
            client.apply_frame(utterance.assign(dim_0=["loud", "soft"]), model=CLASS)
        with pytest.raises(DataError, match=r"^class frame: column 'time' holds datetime.*time unit is 'steps'"):
            client.apply_frame(utterance.assign(time=pd.Timestamp("2026-01-01")), model=CLASS)
        with pytest.raises(AarenError, match=r"model_unknown.*'nope'"):
            client.apply_frame(frame, model="nope")
        # An empty frame is an empty answer with the task's columns.
        empty = client.apply_frame(frame.iloc[:0], model=SERIES)
        assert len(empty) == 0 and list(empty.columns)[5:8] == ["step", "target_time", "Global_active_power_mean"]
        assert list(client.apply_frame(utterance.iloc[:0], model=CLASS).columns)[5:7] == ["predicted", "p_1"]
        # A missing cell (NaN, or None in a column of objects) is sent as NaN, for the server to judge.
        gaps = frame.astype({"Voltage": object})
        gaps.loc[0, "Voltage"], gaps.loc[1, "Sub_metering_1"] = None, float("nan")
        sent = events_from_frame(gaps, series, session_id="gappy")
        assert [e.session_id for e in sent] == ["gappy"] * 3 and [e.seq for e in sent] == [1, 2, 3]
        assert np.isnan(sent[0].values[2]) and np.isnan(sent[1].values[4])
        assert np.isfinite(np.delete(np.array([e.values for e in sent]), [2, 4], axis=1)).all()
        assert sent[0].time == START.timestamp() and sent[2].time == START.timestamp() + 2 * HOUR
        # Nothing reached the server.
        for sid, name in (("frame", SERIES), ("u", CLASS)):
            with pytest.raises(AarenError, match="NOT_FOUND"):
                client.get_session(sid, model=name)
