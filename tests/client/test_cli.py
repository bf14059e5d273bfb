"""``aaren replay/forecast/session/end/model`` against a real server (typer's CliRunner)."""

from __future__ import annotations

import asyncio
import csv
import json
import random
from collections import Counter

import pytest
from typer.testing import CliRunner

from aaren.cli.app import app
from aaren.client.client import AarenClient

SESSIONS = ("alpha", "beta", "gamma", "delta")
PER_SESSION = 12

runner = CliRunner()


@pytest.fixture
def events_csv(tmp_path):
    rng = random.Random(0)
    rows = []
    for sid in SESSIONS:
        t = rng.uniform(0, 5)
        for _ in range(PER_SESSION):
            t += rng.expovariate(0.5)
            a, b = round(rng.gauss(1, 3), 3), round(rng.gauss(-2, 1), 3)
            rows.append((sid, round(t, 3), f"m{rng.randrange(5)}", a, b))
    rng.shuffle(rows)
    rows.sort(key=lambda r: r[0])  # sessions one after another: replay must interleave them by time
    path = tmp_path / "events.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["session_id", "time", "mark", "b", "a"])
        writer.writerows((sid, t, m, b, a) for sid, t, m, a, b in sorted(rows, key=lambda r: (r[0], r[1])))
    return path


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def unary_forecasts(address: str) -> dict:
    async def main():
        async with AarenClient(address) as client:
            return {sid: (await client.forecast(sid)).forecast for sid in SESSIONS}

    return asyncio.run(main())


def test_replay_writes_one_forecast_per_event_matching_the_server(start_server, events_csv, tmp_path):
    srv = start_server()
    out = tmp_path / "forecasts.csv"
    result = invoke(
        "replay", str(events_csv), "--target", srv.address, "--out", str(out), "--streams", "3", "--batch", "2",
        "--no-progress", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    n = len(SESSIONS) * PER_SESSION
    assert summary["events"] == summary["answered"] == summary["forecasts"] == n
    assert summary["errors"] == 0 and summary["errors_by_reason"] == {}
    assert summary["latency_ms"]["p50"] > 0

    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == n and {r["status"] for r in rows} == {"forecast"}
    assert sorted((r["session_id"], int(r["seq"])) for r in rows) == sorted(
        (sid, k) for sid in SESSIONS for k in range(1, PER_SESSION + 1)
    )
    assert list(rows[0])[:9] == [
        *("session_id", "seq", "status", "last_time", "mean_gap", "expected_time"),
        *("q0.1", "q0.5", "q0.9"),
    ]

    for sid, f in unary_forecasts(srv.address).items():
        (row,) = [r for r in rows if r["session_id"] == sid and int(r["seq"]) == PER_SESSION]
        assert f.seq == PER_SESSION
        assert float(row["last_time"]) == f.last_time
        assert float(row["mean_gap"]) == pytest.approx(f.mean_gap, rel=1e-5)
        assert float(row["expected_time"]) == pytest.approx(f.expected_time, rel=1e-6)
        for q, v in f.quantiles.items():
            assert float(row[f"q{q:g}"]) == pytest.approx(v, rel=1e-5)
        assert [row[f"mark_{i + 1}"] for i in range(3)] == [f"m{m}" for m, _ in f.marks]
        assert [float(row[f"p_{i + 1}"]) for i in range(3)] == pytest.approx([p for _, p in f.marks], rel=1e-5)
        assert float(row["a_mean"]) == pytest.approx(f.values[0][0], rel=1e-5, abs=1e-5)
        assert float(row["b_std"]) == pytest.approx(f.values[1][1], rel=1e-5, abs=1e-5)

    # A second replay of the same file is all duplicates (acknowledged, not applied again).
    again = invoke("replay", str(events_csv), "--target", srv.address, "--no-progress", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["duplicates"] == n


def test_replay_takes_marks_as_names_or_ids(start_server, events_csv, tmp_path):
    """The README's "marks as the model's mark names or ids": the same events written with ids
    (``m3`` as ``3``) get the same forecasts; a mark that is neither is refused before sending."""
    srv = start_server()
    with events_csv.open() as f:
        header, *rows = list(csv.reader(f))
    named, ids = tmp_path / "named.csv", tmp_path / "ids.csv"
    for path, prefix, mark in ((named, "n-", lambda m: m), (ids, "i-", lambda m: m.removeprefix("m"))):
        with path.open("w", newline="") as f:
            csv.writer(f).writerows([header, *([prefix + sid, t, mark(m), *v] for sid, t, m, *v in rows)])

    def forecasts(path):
        out = tmp_path / f"{path.stem}.out.csv"
        result = invoke("replay", str(path), "-t", srv.address, "--out", str(out), "--no-progress", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["forecasts"] == len(SESSIONS) * PER_SESSION
        with out.open() as f:
            return {(r.pop("session_id")[2:], r["seq"]): r for r in csv.DictReader(f)}

    by_name, by_id = forecasts(named), forecasts(ids)
    assert by_id.keys() == by_name.keys() and len(by_name) == len(SESSIONS) * PER_SESSION
    for key, row in by_name.items():
        texts = [k for k in row if k in ("seq", "status") or k.startswith(("mark_", "error_"))]
        assert [by_id[key][k] for k in texts] == [row[k] for k in texts]  # the same likely marks, by name
        # The same numbers (up to float32 sums batched another way with the other sessions).
        numbers = [k for k in row if k not in texts and k != "latency_ms"]
        expected = [float(row[k]) for k in numbers]
        assert [float(by_id[key][k]) for k in numbers] == pytest.approx(expected, rel=1e-5, abs=1e-5)

    bad = tmp_path / "bad.csv"
    bad.write_text("session_id,time,mark,a,b\nx,1,m0,1,1\nx,2,5,1,1\n")
    result = invoke("replay", str(bad), "-t", srv.address, "--no-progress")
    assert result.exit_code == 2
    assert "bad.csv: line 3: unknown mark '5'; expected one of the model's marks ['m0', " in result.stderr
    assert "or an integer id in 0..4" in result.stderr


def test_replay_paced_jsonl_limited_sessions(start_server, events_csv, tmp_path):
    srv = start_server()
    out = tmp_path / "forecasts.jsonl"
    result = invoke(
        "replay", str(events_csv), "-t", srv.address, "--out", str(out), "--rate", "400", "--sessions", "2",
        "--limit", "30", "--top-k", "5",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "events/s" in result.stdout and "latency p99" in result.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 30 and {r["status"] for r in rows} == {"forecast"}
    # --sessions 2: a third session starts only once one of the first two has sent all its events.
    counts = Counter(r["session_id"] for r in rows)
    assert len(counts) <= 3 and max(counts.values()) == PER_SESSION
    assert len(rows[0]["marks"]) == 5 and rows[0]["marks"][0][1].startswith("m")
    assert set(rows[0]["quantiles"]) == {"0.1", "0.5", "0.9"}


def test_replay_reports_event_errors_and_bad_files(start_server, tmp_path):
    srv = start_server()
    path = tmp_path / "bad.csv"
    path.write_text("session_id,time,mark,a,b\ns,1,m0,1,1\ns,2,m1,1,1\n")
    (tmp_path / "first.csv").write_text("session_id,time,mark,a,b\ns,5,m0,1,1\n")
    assert invoke("replay", str(tmp_path / "first.csv"), "-t", srv.address, "--no-progress").exit_code == 0
    # seq 1 is now a duplicate; seq 2 has time 2 < 5: rejected, and counted by reason.
    result = invoke("replay", str(path), "-t", srv.address, "--no-progress", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["duplicates"] == 1 and summary["errors_by_reason"] == {"time_before_last": 1}

    path.write_text("session_id,time,mark,a\ns,1,m0,1\n")
    result = invoke("replay", str(path), "-t", srv.address, "--no-progress")
    assert result.exit_code == 2
    assert "bad.csv: value columns ['a'] do not match the model's ['a', 'b']" in result.stderr
    result = invoke("replay", str(path), "-t", srv.address, "--out", str(tmp_path / "x.txt"))
    assert result.exit_code == 2 and "--out" in result.output


def test_forecast_session_end_model_commands(start_server, events_csv, tmp_path):
    srv = start_server()
    assert invoke("replay", str(events_csv), "-t", srv.address, "--no-progress").exit_code == 0

    model = json.loads(invoke("model", "-t", srv.address, "--json").stdout)
    assert model["num_marks"] == 5 and model["value_names"] == ["a", "b"] and model["limits"]["default_top_k"] == 3
    assert "aaren, d_model 16" in invoke("model", "-t", srv.address).stdout

    shown = invoke("forecast", "alpha", "-t", srv.address)
    assert shown.exit_code == 0 and "Next event of 'alpha'" in shown.stdout and "expected gap" in shown.stdout
    sampled = json.loads(invoke("forecast", "alpha", "-t", srv.address, "--horizon", "2", "--samples", "5",
                                "--seed", "1", "--paths", "--json").stdout)  # fmt: skip
    assert sampled["forecast"]["seq"] == PER_SESSION and len(sampled["steps"]) == 2 and len(sampled["paths"]) == 5
    assert "Sampled futures" in invoke("forecast", "alpha", "-t", srv.address, "--horizon", "2").stdout

    state = tmp_path / "alpha.safetensors"
    info = invoke("session", "alpha", "-t", srv.address, "--state-out", str(state))
    assert info.exit_code == 0 and "last seq" in info.stdout and state.stat().st_size > 0
    assert json.loads(invoke("session", "alpha", "-t", srv.address, "--json").stdout)["last_seq"] == PER_SESSION

    assert "ended session 'alpha' (last seq 12)" in invoke("end", "alpha", "-t", srv.address).stdout
    assert "did not exist" in invoke("end", "alpha", "-t", srv.address).stdout
    missing = invoke("forecast", "alpha", "-t", srv.address)
    assert missing.exit_code == 1 and "NOT_FOUND (session_not_found)" in missing.stderr
    assert invoke("session", "alpha", "-t", srv.address).exit_code == 1


@pytest.fixture
def long_sessions_csv(tmp_path):
    """Four sessions of 40 events each over the same 1,000 minutes: a time split by default."""
    rng = random.Random(1)
    rows = []
    for sid in SESSIONS:
        t = rng.uniform(0, 5)
        for _ in range(40):
            t += rng.expovariate(1 / 25)
            rows.append(
                (sid, round(t, 2), f"m{rng.randrange(5)}", round(rng.gauss(1, 3), 3), round(rng.gauss(-2, 1), 3))
            )
    path = tmp_path / "long.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["session_id", "time", "mark", "a", "b"])
        writer.writerows(rows)
    return path


def test_split_export_then_replay_sends_history_first_and_forecasts_the_held_out_events(
    start_server, long_sessions_csv, tmp_path
):
    test_csv = tmp_path / "test.csv"
    result = invoke(
        "split", "export", "--data", str(long_sessions_csv), "--time-unit", "minutes", "--split", "test",
        "--out", str(test_csv),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "split by event time at" in result.output and "chosen by default" in result.output
    with test_csv.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["session_id", "time", "mark", "a", "b", "context"]
    history = [r for r in rows if r["context"] == "1"]
    held = [r for r in rows if r["context"] == "0"]
    in_test = {r["session_id"] for r in held}  # a session that ended before the cutoff has no test part
    assert len(in_test) >= 2 and len(rows) == len(in_test) * 40 and 0 < len(held) < len(history)
    assert max(float(r["time"]) for r in history) < min(float(r["time"]) for r in held)  # one cutoff for all
    n_history = Counter(r["session_id"] for r in history)

    srv = start_server()
    out = tmp_path / "forecasts.csv"
    result = invoke("replay", str(test_csv), "-t", srv.address, "--out", str(out), "--no-progress", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["history"]["events"] == len(history) and summary["history"]["errors"] == 0
    assert summary["history"]["messages"] <= len(in_test)  # each session's history in one message
    assert summary["events"] == summary["forecasts"] == len(held) and summary["errors"] == 0
    with out.open() as f:
        written = list(csv.DictReader(f))
    # Forecasts only from each session's last history event on (that one forecasts the first held-out event).
    expected = sorted((sid, seq) for sid in in_test for seq in range(max(n_history[sid], 1), 41))
    assert sorted((r["session_id"], int(r["seq"])) for r in written) == expected
    assert {r["status"] for r in written} == {"forecast"}

    # The same forecasts as a server that stepped through every event one by one.
    ref = start_server()
    full = tmp_path / "full.csv"
    assert (
        invoke("replay", str(long_sessions_csv), "-t", ref.address, "--out", str(full), "--no-progress").exit_code == 0
    )
    with full.open() as f:
        stepped = {(r["session_id"], r["seq"]): r for r in csv.DictReader(f)}
    for r in written:
        other = stepped[(r["session_id"], r["seq"])]
        for key in ("mean_gap", "q0.1", "q0.5", "q0.9", "a_mean"):
            assert float(r[key]) == pytest.approx(float(other[key]), rel=1e-4, abs=1e-5), (
                r["session_id"],
                r["seq"],
                key,
            )


def test_split_export_errors_get_the_clean_error_box(tmp_path, long_sessions_csv, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    cases = [
        (("split", "export"), "give a checkpoint or --data"),
        (("split", "export", "--data", str(long_sessions_csv), "--split", "all"), "expected train, val or test"),
        (("split", "export", "--data", str(tmp_path / "none.csv")), "no such file"),
        (("split", "export", "--data", str(long_sessions_csv), "--set", "split=random"), "split in"),
        (("split", "export", "--data", str(long_sessions_csv), "--set", "split_at=1e9,2e9"), "leave no val or test"),
    ]
    for args, message in cases:
        result = invoke(*args, "--out", str(tmp_path / "x.csv"))
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output
