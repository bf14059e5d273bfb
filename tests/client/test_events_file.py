"""Reading event files (CSV, Parquet) for a served model, with clear errors."""

from __future__ import annotations

import datetime as dt
import gzip
import re

import pytest

from aaren.client.client import EventIn
from aaren.client.events_file import EventsFileError, ModelSchema, group_by_session, load_source, read_events
from aaren.client.replay import schedule, stream_index

TINY = ModelSchema(time_unit="minutes", mark_names=("m0", "m1", "m2", "m3", "m4"), value_names=("a", "b"), num_marks=5)


def write(tmp_path, text: str, name: str = "events.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_csv_events_numbered_per_session_and_interleaved_by_time(tmp_path):
    path = write(
        tmp_path,
        "session_id,time,mark,b,a\n"  # value columns in any order
        "s1,1.0,m1,20,10\n"
        "s1,4.0,m0,21,11\n"
        "s1,4.0,m2,22,12\n"
        "s2, 2.5 ,m4,-1,-2\n"
        "s2,3,3,0,0\n",  # "3" is no mark name here, but an id of the model's marks: m3
    )
    source = read_events(path, TINY)
    assert source.n_sessions == 2 and source.time_unit == "minutes"
    assert source.events == [
        EventIn("s1", 1, 1.0, 1, [10.0, 20.0]),
        EventIn("s2", 1, 2.5, 4, [-2.0, -1.0]),
        EventIn("s2", 2, 3.0, 3, [0.0, 0.0]),
        EventIn("s1", 2, 4.0, 0, [11.0, 21.0]),
        EventIn("s1", 3, 4.0, 2, [12.0, 22.0]),
    ]
    assert [e.seq for e in group_by_session(source.events)["s1"]] == [1, 2, 3]
    assert load_source(str(path), TINY).events == source.events


def test_marks_are_the_models_names_or_ids_and_anything_else_is_refused(tmp_path):
    """As the README offers: names or ids, a name winning over an id that reads the same."""
    path = write(tmp_path, "session_id,time,mark,a,b\nx,0,m4,1,1\nx,1,4,1,1\nx,2, 0 ,1,1\n")
    assert [e.mark for e in read_events(path, TINY).events] == [4, 4, 0]
    named = ModelSchema(time_unit="minutes", mark_names=("1", "0"), value_names=("a", "b"), num_marks=2)
    path.write_text("session_id,time,mark,a,b\nx,0,0,1,1\nx,1,1,1,1\n")
    assert [e.mark for e in read_events(path, named).events] == [1, 0]  # by name, not as ids
    for bad in ("5", "-1", "m9", "2.0"):
        path.write_text(f"session_id,time,mark,a,b\nx,0,m0,1,1\nx,1,{bad},1,1\n")
        with pytest.raises(
            EventsFileError,
            match=rf"events\.csv: line 3: unknown mark '{re.escape(bad)}'; expected one of the model's marks "
            r"\['m0', 'm1', 'm2', 'm3', 'm4'\] \(5 marks\) or an integer id in 0\.\.4",
        ):
            read_events(path, TINY)


def test_integer_marks_by_name_or_as_ids(tmp_path):
    path = write(tmp_path, "session_id,time,mark\nx,0,2\nx,1,02\n")
    named = ModelSchema(time_unit="seconds", mark_names=("0", "1", "2"), num_marks=3)
    assert [e.mark for e in read_events(path, named).events] == [2, 2]
    unnamed = ModelSchema(time_unit="seconds", num_marks=3)
    assert [e.mark for e in read_events(path, unnamed).events] == [2, 2]
    with pytest.raises(EventsFileError, match=r"line 2: mark '2' is not a mark of the model .* 0\.\.1"):
        read_events(path, ModelSchema(time_unit="seconds", num_marks=2))


def test_iso_times_in_the_models_unit(tmp_path):
    path = write(
        tmp_path,
        "session_id,time,mark,a,b\n"
        "u,2024-03-01T00:00:00,m0,1,1\n"  # naive: UTC
        "u,2024-03-01T01:30:00+01:00,m1,1,1\n"  # = 00:30 UTC
        "u,2024-03-01 02:00:00Z,m1,1,1\n",
    )
    epoch_min = dt.datetime(2024, 3, 1, tzinfo=dt.UTC).timestamp() / 60
    assert [e.time for e in read_events(path, TINY).events] == [epoch_min, epoch_min + 30, epoch_min + 120]
    hours = ModelSchema("hours", TINY.mark_names, TINY.value_names, 5)
    assert read_events(path, hours).events[1].time == pytest.approx(epoch_min / 60 + 0.5)
    with pytest.raises(
        EventsFileError, match=r"line 2: time '2024-03-01T00:00:00' is a datetime but the time unit is unknown"
    ):
        read_events(path, ModelSchema("", TINY.mark_names, TINY.value_names, 5))


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", r"empty file; expected a header line session_id,time,mark"),
        ("session_id,time,a,b\nx,1,1,1\n", r"missing required column\(s\) \['mark'\]"),
        ("session_id,time,mark,a\nx,1,m0,1\n", r"value columns \['a'\] do not match the model's \['a', 'b'\]"),
        ("session_id,time,mark,a,b,c\nx,1,m0,1,1,1\n", r"value columns \['a', 'b', 'c'\] .* \(unexpected \['c'\]\)"),
        ("session_id,time,mark,a,b\nx,1,m0,1,1\nx,2,m0,1\n", r"line 3 has 4 fields; expected 5"),
        ("session_id,time,mark,a,b\nx,1,m0,1,-inf\n", r"line 2: value column 'b' is '-inf'; expected a finite number"),
        ("session_id,time,mark,a,b\nx,1,m0,1,NA\n", r"line 2: value column 'b' is missing"),
        ("session_id,time,mark,a,b\nx,1,m0,1,oops\n", r"line 2: value column 'b' is 'oops'; expected a finite number"),
        ("session_id,time,mark,a,b\nx,soon,m0,1,1\n", r"line 2: time 'soon' is neither a number nor an ISO-8601"),
        ("session_id,time,mark,a,b\nx,inf,m0,1,1\n", r"line 2: time 'inf' is not finite"),
        ("session_id,time,mark,a,b\nx,,m0,1,1\n", r"line 2: empty time"),
        ("session_id,time,mark,a,b\n ,1,m0,1,1\n", r"line 2: empty session_id"),
        ("session_id,time,mark,a,b\nx,1,,1,1\n", r"line 2: empty mark"),
        (
            "session_id,time,mark,a,b\nx,1,m0,1,1\nx,2024-01-01,m0,1,1\n",
            r"line 3: time '2024-01-01' is a datetime but line 2 has a number; expected all times of one kind",
        ),
        (
            "session_id,time,mark,a,b\nx,5,m0,1,1\ny,1,m0,1,1\nx,4,m0,1,1\n",
            r"line 4: session 'x' has time 4.0 after 5.0 at line 2; expected non-decreasing times within a session",
        ),
        ("session_id,time,mark,a,b\n", r"no events; expected at least one row"),
    ],
)
def test_malformed_files_name_file_line_and_expectation(tmp_path, text, error):
    path = write(tmp_path, text)
    with pytest.raises(EventsFileError, match=r"events\.csv: " + error):
        read_events(path, TINY)


def test_unreadable_paths(tmp_path):
    with pytest.raises(EventsFileError, match=r"nope\.csv: no such file"):
        read_events(tmp_path / "nope.csv", TINY)
    with pytest.raises(EventsFileError, match=r"events\.txt: unsupported file type; expected \.csv"):
        read_events(write(tmp_path, "x", "events.txt"), TINY)
    with pytest.raises(EventsFileError, match=r"bad\.parquet: not a readable Parquet file"):
        pytest.importorskip("pyarrow")
        read_events(write(tmp_path, "not parquet", "bad.parquet"), TINY)


def test_gzipped_csv(tmp_path):
    path = tmp_path / "events.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("session_id,time,mark,a,b\nx,1,m1,1,2\n")
    assert read_events(path, TINY).events == [EventIn("x", 1, 1.0, 1, [1.0, 2.0])]


def test_parquet_with_timestamps_matches_csv(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    stamps = [dt.datetime(2024, 1, 1, 0, 0, tzinfo=dt.UTC), dt.datetime(2024, 1, 1, 0, 1, 30, tzinfo=dt.UTC)]
    table = pa.table(
        {
            "session_id": ["p", "p"],
            "time": pa.array(stamps, type=pa.timestamp("ms", tz="UTC")),
            "mark": ["m2", "m3"],
            "a": [1.0, 2.0],
            "b": pa.array([3, 4], type=pa.int32()),
        }
    )
    pq.write_table(table, tmp_path / "events.parquet")
    text = "session_id,time,mark,a,b\np,2024-01-01T00:00:00Z,m2,1,3\np,2024-01-01T00:01:30Z,m3,2,4\n"
    csv_path = write(tmp_path, text)
    from_parquet = read_events(tmp_path / "events.parquet", TINY).events
    assert from_parquet == read_events(csv_path, TINY).events
    assert from_parquet[1].time - from_parquet[0].time == pytest.approx(1.5)

    bad = table.set_column(3, "a", pa.array([1.0, None]))
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(EventsFileError, match=r"bad\.parquet: row 1: value column 'a' is missing"):
        read_events(tmp_path / "bad.parquet", TINY)


def test_schedule_limits_sessions_under_way_and_keeps_order():
    events = [EventIn(s, k, float(t), 0) for t, (s, k) in enumerate([("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2)])]
    assert list(schedule(events)) == events
    order = [(e.session_id, e.seq) for e in schedule(events, max_sessions=1)]
    assert order == [("a", 1), ("a", 2), ("b", 1), ("b", 2), ("c", 1)]
    order = [(e.session_id, e.seq) for e in schedule(events, max_sessions=2)]
    assert order == [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 2)]
    assert stream_index("EWR/2013-11-01", 4) == stream_index("EWR/2013-11-01", 4) < 4


def test_a_context_column_separates_each_sessions_history_from_its_held_out_events(tmp_path):
    path = write(
        tmp_path,
        "session_id,time,mark,a,b,context\n"  # as `aaren split export` writes it
        "s1,1.0,m1,1,2,1\n"
        "s2,1.5,m2,1,2,1\n"
        "s1,2.0,m0,1,2,1\n"
        "s2,5.0,m3,1,2,0\n"
        "s1,4.0,m4,1,2,0\n"
        "s3,4.5,m4,1,2,0\n",
    )
    source = read_events(path, TINY)
    assert source.n_sessions == 3
    assert [(e.session_id, e.seq, e.time) for e in source.history] == [("s1", 1, 1.0), ("s1", 2, 2.0), ("s2", 1, 1.5)]
    assert [(e.session_id, e.seq, e.time) for e in source.events] == [("s1", 3, 4.0), ("s3", 1, 4.5), ("s2", 2, 5.0)]
    path.write_text(path.read_text().replace("s1,4.0,m4,1,2,0", "s1,4.0,m4,1,2,0\ns1,4.2,m4,1,2,1"))
    with pytest.raises(EventsFileError, match="line 7: session 's1' has a context row after a held-out row"):
        read_events(path, TINY)
    path.write_text("session_id,time,mark,a,b,context\ns1,1.0,m1,1,2,yes\n")
    with pytest.raises(EventsFileError, match="line 2: column 'context' is 'yes'; expected 1"):
        read_events(path, TINY)
    # A model with a value named context reads the column as that value.
    own = ModelSchema(time_unit="minutes", mark_names=("m1",), value_names=("a", "b", "context"), num_marks=1)
    path.write_text("session_id,time,mark,a,b,context\ns1,1.0,m1,1,2,7\n")
    assert (
        read_events(path, own).events == [EventIn("s1", 1, 1.0, 0, [1.0, 2.0, 7.0])]
        and not read_events(path, own).history
    )


def test_the_client_reads_a_file_as_training_reads_it(tmp_path):
    """One reader (aaren.formats.events): the events ``aaren replay`` sends are the sequences
    ``load_events`` trains and scores on, names or ids, datetimes, context rows and all."""
    np = pytest.importorskip("numpy")
    from aaren_core.tasks.event.files import load_events

    path = write(
        tmp_path,
        "session_id,time,mark,b,a,context\n"
        "s1,2024-03-01T00:00:00,m1,20,10,1\n"
        "s2,2024-03-01T00:01:00,4,-1,-2,0\n"
        "s1,2024-03-01T00:02:30+00:00,m0,21,11,0\n"
        "s2,2024-03-01T00:02:30Z,m3,0,0.5,0\n",
    )
    sequences, schema = load_events(path, time_unit="minutes")
    model = ModelSchema("minutes", schema.mark_names, schema.value_names, schema.num_marks)
    source = read_events(path, model)
    sent = group_by_session([*source.history, *source.events])
    assert sorted(sent) == sorted(s.session_id for s in sequences)
    for seq in sequences:
        events = sent[seq.session_id]
        np.testing.assert_array_equal([e.time for e in events], seq.times)
        np.testing.assert_array_equal([e.mark for e in events], seq.marks)
        np.testing.assert_array_equal(np.array([e.values for e in events], dtype=np.float32), seq.values)
        assert sum(e in source.history for e in events) == seq.context
    # Training learned the names from the file (sorted; "4" among them): both read "4" as that name.
    assert schema.mark_names == ("4", "m0", "m1", "m3")
