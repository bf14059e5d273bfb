"""DataFrames in and out against a real server (the tiny model: 5 marks m0..m4, values a and b)."""

from __future__ import annotations

import asyncio

import pandas as pd
import pytest

from aaren.client import AarenClient, EventIn, SyncClient, apply_frame, events_from_frame

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
