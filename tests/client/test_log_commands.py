"""``aaren produce`` and ``aaren replay --from-sink`` against a real Redis (and real servers).

produce must append the file's events in replay's order (seq 1.. per session, time order across
sessions) as event messages; a consuming server's sink read back with ``replay --from-sink`` must
give the rows that ``aaren replay --target`` of the same file gives; a bad log or file ends the
command with one line and exit code 1.
"""

from __future__ import annotations

import asyncio
import csv
import json
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from redis_process import free_port
from typer.testing import CliRunner

from aaren.cli.app import app
from aaren.cli.log_commands import match_sink
from aaren.client.client import EventIn, LimitsOut
from aaren.client.model_folder import ModelFolderError, describe_model_folder
from aaren.server.frontends.eventlog.base import JSON, PROTOBUF, LogMessage
from aaren.server.frontends.eventlog.messages import decode_event, encode_forecast
from aaren.server.settings import bundled_repository
from aaren.v1 import aaren_pb2 as pb

SESSIONS = ("alpha", "beta", "gamma")
PER_SESSION = 9
N = len(SESSIONS) * PER_SESSION

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.fixture
def events_csv(tmp_path: Path) -> Path:
    """Sessions one after another in the file (produce must interleave them by time), marks by name,
    the value columns in another order than the model's (b, a)."""
    rng = random.Random(1)
    rows = []
    for sid in SESSIONS:
        t = rng.uniform(0, 3)
        for _ in range(PER_SESSION):
            t += rng.expovariate(0.5)
            rows.append(
                (sid, round(t, 3), f"m{rng.randrange(5)}", round(rng.gauss(0, 2), 3), round(rng.gauss(1, 1), 3))
            )
    path = tmp_path / "events.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["session_id", "time", "mark", "b", "a"])
        writer.writerows((sid, t, m, b, a) for sid, t, m, a, b in rows)
    return path


def expected_events(path: Path) -> list[tuple[str, int, float, int, list[float]]]:
    """The file's events as replay numbers and orders them, worked out here from the rows."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    seqs: dict[str, int] = {}
    out = []
    for r in rows:
        seq = seqs[r["session_id"]] = seqs.get(r["session_id"], 0) + 1
        out.append((r["session_id"], seq, float(r["time"]), int(r["mark"][1:]), [float(r["a"]), float(r["b"])]))
    return sorted(out, key=lambda e: e[2])


def names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"produce-events-{tag}", f"produce-forecasts-{tag}"


def decoded(client: redis.Redis, stream: str) -> list[tuple[pb.Event, str, dict[bytes, bytes]]]:
    out = []
    for entry_id, fields in client.xrange(stream):
        message = LogMessage(entry_id.decode(), fields[b"data"], fields[b"content-type"].decode(), "")
        message.model = fields.get(b"model", b"").decode()
        got = decode_event(message)
        assert isinstance(got, tuple), got
        out.append((*got, fields))
    return out


@pytest.mark.parametrize("fmt, content_type", [("json", JSON), ("protobuf", PROTOBUF)])
def test_produce_appends_the_files_events_in_replay_order(
    redis_server, tiny_checkpoint, events_csv, fmt, content_type
) -> None:
    stream, _ = names()
    url = f"redis-stream://127.0.0.1:{redis_server.port}/{stream}"
    result = invoke(
        "produce", str(events_csv), "--to", url, "--model-dir", str(tiny_checkpoint), "--batch", "4",
        "--format", fmt, "--model", "tiny", "--no-progress", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["events"] == N and summary["log"] == url and summary["sessions"] == len(SESSIONS)

    entries = decoded(redis.Redis(port=redis_server.port), stream)
    want = expected_events(events_csv)
    assert len(entries) == len(want) == N
    for (event, model, fields), (sid, seq, t, mark, values) in zip(entries, want, strict=True):
        assert (event.session_id, event.seq, event.mark) == (sid, seq, mark)
        assert event.time == pytest.approx(t, abs=1e-9)
        assert list(event.values) == pytest.approx(values, rel=1e-6)  # float32, as replay sends them
        assert model == "tiny" and fields[b"content-type"].decode() == content_type
    # Interleaved by time, not the file's order (one session after another).
    assert [e.session_id for e, _, _ in entries[:PER_SESSION]] != [SESSIONS[0]] * PER_SESSION


def test_produce_limit_server_schema_and_no_password(start_server, redis_server, tiny_checkpoint, events_csv) -> None:
    srv = start_server()
    stream, _ = names()
    url = f"redis-stream://127.0.0.1:{redis_server.port}/{stream}"
    result = invoke("produce", str(events_csv), "--to", url, "--model-dir", str(tiny_checkpoint), "--limit", "5")
    assert result.exit_code == 0, result.output
    assert f"wrote 5 events of {events_csv}" in result.stdout and url in result.stdout
    client = redis.Redis(port=redis_server.port)
    entries = decoded(client, stream)
    assert [(e.session_id, e.seq) for e, _, _ in entries] == [e[:2] for e in expected_events(events_csv)[:5]]
    assert all(m == "" and b"model" not in f for _, m, f in entries)  # no --model: the consumer's default

    # The schema from a server instead of a folder: the same messages.
    again, _ = names()
    served = invoke(
        "produce", str(events_csv), "--to", f"{url[: -len(stream)]}{again}", "-t", srv.address, "--limit", "5"
    )
    assert served.exit_code == 0, served.output
    assert [f for _, _, f in decoded(client, again)] == [f for _, _, f in entries]

    secret = invoke(
        "produce", str(events_csv), "--to", f"redis-stream://user:hunter2@127.0.0.1:{free_port()}/x?grop=1",
        "--model-dir", str(tiny_checkpoint), "--no-progress",
    )  # fmt: skip
    assert secret.exit_code == 1 and "hunter2" not in secret.output and ":***@" in secret.stderr


def wait_for_entries(client: redis.Redis, stream: str, n: int, timeout_s: float = 60) -> int:
    """How many entries the stream holds once it holds ``n`` (a bounded wait: a hang fails the test)."""
    deadline = time.monotonic() + timeout_s
    while client.xlen(stream) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return client.xlen(stream)


def rows_of(path: Path) -> dict[tuple[str, int], dict[str, str]]:
    with path.open() as f:
        rows = {(r["session_id"], int(r["seq"])): r for r in csv.DictReader(f)}
    return rows


def assert_same_rows(got: dict, want: dict) -> None:
    """The same rows: equal texts, numbers within float32 rounding (the consumer asks for rows, replay columns)."""
    assert got.keys() == want.keys()
    for key, row in want.items():
        other = got[key]
        assert other.keys() == row.keys()
        for column, text in row.items():
            if column == "latency_ms":
                continue
            try:
                number = float(text)
            except ValueError:
                assert other[column] == text, (key, column)
            else:
                assert float(other[column]) == pytest.approx(number, rel=1e-6, abs=1e-6), (key, column)


def test_consumed_sink_replays_to_the_rows_of_a_grpc_replay(
    start_server, redis_server, tiny_checkpoint, events_csv, tmp_path
) -> None:
    events, forecasts = names()
    base = f"redis-stream://127.0.0.1:{redis_server.port}"
    produced = invoke(
        "produce", str(events_csv), "--to", f"{base}/{events}", "--model-dir", str(tiny_checkpoint),
        "--batch", "10", "--no-progress",
    )  # fmt: skip
    assert produced.exit_code == 0, produced.output
    consumer = start_server(consume_source=f"{base}/{events}", consume_sink=f"{base}/{forecasts}", consume_batch=16)
    assert wait_for_entries(redis.Redis(port=redis_server.port), forecasts, N) == N

    from_sink = tmp_path / "from-sink.csv"
    result = invoke(
        "replay", str(events_csv), "--from-sink", f"{base}/{forecasts}", "--model-dir", str(tiny_checkpoint),
        "--out", str(from_sink), "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["events"] == summary["with_forecast"] == summary["sink_entries"] == summary["rows"] == N
    assert summary["without_forecast"] == summary["unmatched_entries"] == summary["unreadable_entries"] == 0

    reference = start_server()  # another server, the same file replayed over gRPC
    over_grpc = tmp_path / "grpc.csv"
    result = invoke(
        "replay", str(events_csv), "--target", reference.address, "--out", str(over_grpc), "--no-progress", "--json"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["forecasts"] == N
    assert_same_rows(rows_of(from_sink), rows_of(over_grpc))

    # The model described by a server instead of a folder: the same rows; a limit leaves entries unmatched.
    described = tmp_path / "described.csv"
    result = invoke(
        "replay", str(events_csv), "--from-sink", f"{base}/{forecasts}", "--target", consumer.address,
        "--out", str(described), "--limit", "10",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert f"10 of its 10 events had a forecast, 0 had none; {N - 10} entries matched no event" in text
    limited = rows_of(described)
    assert len(limited) == 10
    assert_same_rows(limited, {k: v for k, v in rows_of(over_grpc).items() if k in limited})


def consume_and_replay(start_server, redis_server, checkpoint: Path, path: Path, out_dir: Path, n: int):
    """``path`` produced to a stream, consumed by a server of ``checkpoint``, read back with
    ``replay --from-sink``; and replayed over gRPC to another server: both ``--json`` summaries and rows."""
    events, forecasts = names()
    base = f"redis-stream://127.0.0.1:{redis_server.port}"
    produced = invoke("produce", str(path), "--to", f"{base}/{events}", "--model-dir", str(checkpoint))
    assert produced.exit_code == 0, produced.output
    start_server(checkpoint=checkpoint, consume_source=f"{base}/{events}", consume_sink=f"{base}/{forecasts}")
    assert wait_for_entries(redis.Redis(port=redis_server.port), forecasts, n) == n
    from_sink, over_grpc = out_dir / "from-sink.csv", out_dir / "grpc.csv"
    sink_result = invoke(
        "replay", str(path), "--from-sink", f"{base}/{forecasts}", "--model-dir", str(checkpoint),
        "--out", str(from_sink), "--json",
    )  # fmt: skip
    assert sink_result.exit_code == 0, sink_result.output
    reference = start_server(checkpoint=checkpoint)
    grpc_result = invoke(
        "replay", str(path), "-t", reference.address, "--out", str(over_grpc), "--no-progress", "--json"
    )
    assert grpc_result.exit_code == 0, grpc_result.output
    return json.loads(sink_result.stdout), json.loads(grpc_result.stdout), rows_of(from_sink), rows_of(over_grpc)


def test_a_files_history_is_produced_first_and_kept_as_replay_keeps_it(
    start_server, redis_server, tiny_checkpoint, events_csv, tmp_path
) -> None:
    """A file with a ``context`` column: its history rows go to the log first (every one answered by
    the consumer), and of them only each session's last forecast is a row, as replay writes it."""
    with events_csv.open() as f:
        header, *rows = list(csv.reader(f))
    seen: dict[str, int] = {}
    with_context = tmp_path / "context.csv"
    with with_context.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*header, "context"])
        for row in rows:
            seen[row[0]] = seen.get(row[0], 0) + 1
            writer.writerow([*row, int(seen[row[0]] <= 3)])
    sink, over_grpc, sink_rows, grpc_rows = consume_and_replay(
        start_server, redis_server, tiny_checkpoint, with_context, tmp_path, N
    )
    assert sink["with_forecast"] == N and sink["without_forecast"] == 0 and sink["unmatched_entries"] == 0
    assert sink["rows"] == len(sink_rows) == N - 2 * len(SESSIONS)  # history: the last of three per session
    assert "history" in over_grpc
    # The consumer stepped through the history one event at a time, the server took it in one prefill.
    assert_same_rows(sink_rows, grpc_rows)


def test_a_class_models_sink_scores_as_its_replay(start_server, redis_server, tmp_path) -> None:
    from generated import tiny_class_model, write_checkpoint

    checkpoint = write_checkpoint(
        tmp_path / "class-ckpt", tiny_class_model(), "tiny-class", task="class", channels=["a", "b"],
        class_names=["x", "y", "z"],
    )  # fmt: skip
    rng = random.Random(2)
    path = tmp_path / "trials.csv"
    n = 0
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["session_id", "time", "a", "b", "label"])
        for trial in range(6):
            for step in range(rng.randrange(4, 9)):
                writer.writerow(
                    [f"t{trial}", step, round(rng.gauss(0, 1), 3), round(rng.gauss(0, 1), 3), "xyz"[trial % 3]]
                )
                n += 1
    sink, over_grpc, sink_rows, grpc_rows = consume_and_replay(
        start_server, redis_server, checkpoint, path, tmp_path, n
    )
    assert sink["with_forecast"] == n and sink["without_forecast"] == 0
    assert sink["class"]["sequences"] == 6
    assert sink["class"] == over_grpc["class"]
    assert_same_rows(sink_rows, grpc_rows)


def test_match_sink_counts_missing_unmatched_repeated_and_unreadable() -> None:
    history = [EventIn("h", 1, 0.5), EventIn("h", 2, 0.7)]
    events = [EventIn("a", 1, 1.0), EventIn("b", 1, 1.5), EventIn("a", 2, 2.0), EventIn("h", 3, 2.5)]

    def entry(sid: str, seq: int, content_type: str = JSON) -> tuple[str, bytes, dict[str, str]]:
        forecast = pb.Forecast(session_id=sid, seq=seq, last_time=float(seq))
        return ("0-1", encode_forecast(forecast, content_type, "src"), {"content-type": content_type})

    entries = [
        entry("a", 2), entry("h", 1), entry("h", 2, PROTOBUF), entry("a", 1), entry("a", 1), entry("zz", 1),
        ("0-2", b"{not json", {"content-type": JSON}),
    ]  # fmt: skip
    result, match = match_sink(entries, history, events)
    assert match.summary() == {
        "events": 6, "with_forecast": 4, "without_forecast": 2, "sink_entries": 7, "unmatched_entries": 1,
        "repeated_entries": 1, "unreadable_entries": 1,
    }  # fmt: skip
    # Rows as replay keeps them: a session's last history event, then the held-out events in order.
    assert [(r.session_id, r.seq) for r in result.results] == [("h", 2), ("a", 1), ("a", 2)]


def test_model_folder_describes_the_model_as_its_server_does(start_server, tiny_checkpoint) -> None:
    srv = start_server()
    served = asyncio.run(_describe(srv.address))
    limits = LimitsOut(*[0] * 6, served.limits.default_top_k, 0.0)
    read = describe_model_folder(tiny_checkpoint, quantiles=served.quantile_levels, limits=limits)
    for field in (
        "name", "version", "backbone", "d_model", "n_layers", "n_heads", "num_marks", "value_width", "mark_names",
        "value_names", "time_unit", "task", "horizon", "step_seconds", "class_names", "quantile_levels",
    ):  # fmt: skip
        assert getattr(read, field) == getattr(served, field), field
    # The bundled repository: a folder of checkpoints, picked by name or folder, `default` first.
    repo = bundled_repository()
    assert describe_model_folder(repo, quantiles=(0.5,), limits=limits).name == "aaren-flights"
    series = describe_model_folder(repo, model="series-power", quantiles=(0.5,), limits=limits)
    assert (series.task, series.horizon, series.step_seconds) == ("series", 24, 3600.0)
    assert series.quantile_levels == (0.1, 0.5, 0.9)
    assert describe_model_folder(repo, model="class-vowels", quantiles=(), limits=limits).task == "class"
    # The series and class models' facts too, the gap bound and missing values among them.
    bundled = start_server(checkpoint=None, models_dir=str(repo))
    for name in ("aaren-series-power", "aaren-class-vowels"):
        served = asyncio.run(_describe(bundled.address, name))
        read = describe_model_folder(repo, model=name, quantiles=served.quantile_levels, limits=limits)
        for field in ("name", "task", "value_names", "horizon", "step_seconds", "class_names", "missing_values"):
            assert getattr(read, field) == getattr(served, field), (name, field)
        assert read.max_gap_steps == served.max_gap_steps == (168 if name == "aaren-series-power" else 0)
        assert served.missing_values
    with pytest.raises(ModelFolderError, match="no model named 'nope'"):
        describe_model_folder(repo, model="nope", quantiles=(), limits=limits)


async def _describe(address: str, model: str = ""):
    from aaren.client.client import AarenClient

    async with AarenClient(address) as client:
        return await client.describe_model(model)


@pytest.mark.parametrize(
    "case",
    [
        "unknown scheme",
        "unreachable redis",
        "missing file",
        "bad file",
        "bad url",
        "unknown parameter",
        "bad model dir",
    ],
)
def test_produce_errors_are_one_line_and_exit_1(tmp_path, tiny_checkpoint, events_csv, case: str) -> None:
    port = free_port()
    source, url, model_dir = str(events_csv), f"redis-stream://127.0.0.1:{port}/events", str(tiny_checkpoint)
    expected = {
        "unknown scheme": "unknown scheme 'kafka'; expected one of redis-stream://, nats://",
        "unreachable redis": f"the log redis-stream://127.0.0.1:{port}/events does not answer",
        "missing file": "no-such.csv: no such file",
        "bad file": "bad.csv: line 3: unknown mark 'm9'",
        "bad url": "expected redis-stream://host:port/NAME",
        "unknown parameter": "unknown parameter(s) grop; redis-stream takes db",
        "bad model dir": "holds no config.json",
    }[case]
    if case == "unknown scheme":
        url = "kafka://127.0.0.1:9092/events"
    elif case == "missing file":
        source = str(tmp_path / "no-such.csv")
    elif case == "bad file":
        source = str(tmp_path / "bad.csv")
        Path(source).write_text("session_id,time,mark,a,b\nx,1,m0,1,1\nx,2,m9,1,1\n")
    elif case == "bad url":
        url = "redis-stream://127.0.0.1:6379/"
    elif case == "unknown parameter":
        url += "?grop=x"
    elif case == "bad model dir":
        model_dir = str(tmp_path)
    result = invoke("produce", source, "--to", url, "--model-dir", model_dir, "--no-progress")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_replay_from_sink_errors_are_one_line_and_exit_1(tiny_checkpoint, events_csv, monkeypatch) -> None:
    monkeypatch.setattr("aaren.cli.client_commands.CONNECT_TIMEOUT_S", 0.5)
    port = free_port()
    for url, expected in (
        (f"redis-stream://127.0.0.1:{port}/forecasts", "does not answer"),
        ("kafka://127.0.0.1:1/forecasts", "unknown scheme 'kafka'"),
    ):
        result = invoke("replay", str(events_csv), "--from-sink", url, "--model-dir", str(tiny_checkpoint))
        assert result.exit_code == 1, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], result.stderr
    unreachable = invoke(
        "replay", str(events_csv), "--from-sink", "redis-stream://127.0.0.1:1/x", "-t", f"127.0.0.1:{port}"
    )
    assert unreachable.exit_code == 1 and "UNAVAILABLE" in unreachable.stderr


def test_produce_runs_without_torch(redis_server, tiny_checkpoint, events_csv) -> None:
    """The command and the folder reader load neither torch nor the engine (nor numpy): a producer
    machine needs only the client's dependencies and the log's."""
    stream, _ = names()
    url = f"redis-stream://127.0.0.1:{redis_server.port}/{stream}"
    code = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from aaren.cli.app import app\n"
        f"r = CliRunner().invoke(app, ['produce', {str(events_csv)!r}, '--to', {url!r}, "
        f"'--model-dir', {str(tiny_checkpoint)!r}, '--no-progress'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'aaren_core', 'numpy', 'pandas'))\n"
        "print(json.dumps([r.exit_code, heavy]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [0, []], out.stdout + out.stderr
    assert redis.Redis(port=redis_server.port).xlen(stream) == N


def test_read_all_reads_every_entry_in_order_across_pages(redis_server, monkeypatch) -> None:
    from aaren.server.frontends.eventlog import redis_streams
    from aaren.server.frontends.eventlog.addresses import read_all

    monkeypatch.setattr(redis_streams, "READ_PAGE", 7)  # 20 entries: pages of 7, 7, 6
    stream, _ = names()
    client = redis.Redis(port=redis_server.port)
    ids = [
        client.xadd(stream, {"data": f"body-{i}", "content-type": JSON, "source-id": str(i)}).decode()
        for i in range(20)
    ]
    client.xadd(stream, {"other": "no data"})
    url = f"redis-stream://127.0.0.1:{redis_server.port}/{stream}?dead_letter=x&maxlen=100"  # a sink's URL as it is
    entries = asyncio.run(read_all(url))
    assert [e[0] for e in entries[:20]] == ids
    assert [e[1] for e in entries[:20]] == [f"body-{i}".encode() for i in range(20)]
    assert entries[3][2] == {"content-type": JSON, "source-id": "3"}
    assert entries[20][1:] == (b"", {"other": "no data"})
    assert asyncio.run(read_all(f"redis-stream://127.0.0.1:{redis_server.port}/never-written-{stream}")) == []
