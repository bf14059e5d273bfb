"""Event data: loaders accept well-formed files, reject malformed ones clearly; batches pad correctly."""

from __future__ import annotations

import csv
import datetime as dt
import json
import sys

import numpy as np
import pytest
import torch

from aaren.formats.errors import DataError
from aaren.formats.flights import flights_path
from aaren_core.tasks.event.data import iterate_batches, pad_batch
from aaren_core.tasks.event.files import load_events, write_events
from aaren_core.tasks.event.flights import load_flights, load_flights_aircraft
from aaren_core.tasks.event.resolution import time_resolution
from aaren_core.tasks.event.schema import EventSchema, fit_standardization
from aaren_core.tasks.event.sequences import EventSequence
from aaren_core.tasks.event.splits import choose_split, split_at_times, split_by_time, split_cutoffs


def write_csv(path, header, rows):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_parquet(path, columns):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table(columns), path)
    return path


GOOD_ROWS = [
    ["b", 0.5, "click", 1.0, 10],
    ["a", 1.0, "view", 2.0, 20],
    ["b", 0.5, "view", 3.0, 30],
    ["a", 4.0, "click", 4.0, 40],
    ["b", 2.5, "buy", 5.0, 50],
]


@pytest.fixture
def good_csv(tmp_path):
    return write_csv(tmp_path / "events.csv", ["session_id", "time", "mark", "price", "qty"], GOOD_ROWS)


def test_csv_string_marks_numeric_times(good_csv):
    seqs, schema = load_events(good_csv)
    assert [s.session_id for s in seqs] == ["b", "a"]  # file order of first appearance
    assert schema.mark_names == ("buy", "click", "view") and schema.value_names == ("price", "qty")
    assert schema.time_unit == "seconds"
    b, a = seqs
    np.testing.assert_array_equal(b.times, [0.5, 0.5, 2.5])
    np.testing.assert_array_equal(b.marks, [1, 2, 0])
    np.testing.assert_array_equal(a.values, [[2.0, 20.0], [4.0, 40.0]])
    assert b.times.dtype == np.float64 and b.marks.dtype == np.int64 and b.values.dtype == np.float32
    np.testing.assert_allclose(schema.value_mean, [3.0, 30.0])
    np.testing.assert_allclose(schema.value_std, [np.std([1, 2, 3, 4, 5]), np.std([10, 20, 30, 40, 50])])


def test_csv_int_marks_are_ids_and_value_columns_select(tmp_path):
    path = write_csv(
        tmp_path / "e.csv", ["mark", "x", "session_id", "time", "y"], [[2, 1, "s", 0, 5], [0, 2, "s", 1, 5]]
    )
    seqs, schema = load_events(path, value_columns=["x"])
    assert schema.mark_names == ("0", "1", "2") and schema.value_names == ("x",)
    np.testing.assert_array_equal(seqs[0].marks, [2, 0])
    assert schema.value_std == (0.5,)
    _, constant = load_events(path, value_columns=["y"])
    assert constant.value_std == (1e-6,)  # std floor


def test_iso_times_convert_to_time_unit(tmp_path):
    rows = [["s", "2024-01-01T00:00:00Z", "a"], ["s", "2024-01-01T01:30:00+00:00", "a"], ["s", "2024-01-01T02:00", "b"]]
    path = write_csv(tmp_path / "e.csv", ["session_id", "time", "mark"], rows)
    epoch = dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp()
    seqs, schema = load_events(path)
    np.testing.assert_allclose(seqs[0].times - epoch, [0, 5400, 7200])
    assert schema.value_width == 0 and seqs[0].values.shape == (3, 0)
    seqs, schema = load_events(path, time_unit="minutes")
    np.testing.assert_allclose(seqs[0].times - epoch / 60, [0, 90, 120])
    assert schema.time_unit == "minutes"
    seqs, _ = load_events(path, time_unit="hours")
    np.testing.assert_allclose(seqs[0].times - epoch / 3600, [0, 1.5, 2])


def test_parquet_matches_csv(good_csv, tmp_path):
    cols = list(zip(*GOOD_ROWS, strict=True))
    path = write_parquet(
        tmp_path / "events.parquet",
        {"session_id": list(cols[0]), "time": list(cols[1]), "mark": list(cols[2]), "price": cols[3], "qty": cols[4]},
    )
    pq_seqs, pq_schema = load_events(path)
    csv_seqs, csv_schema = load_events(good_csv)
    assert pq_schema == csv_schema
    for p, c in zip(pq_seqs, csv_seqs, strict=True):
        assert p.session_id == c.session_id
        np.testing.assert_array_equal(p.times, c.times)
        np.testing.assert_array_equal(p.marks, c.marks)
        np.testing.assert_array_equal(p.values, c.values)


def test_parquet_timestamps_and_int_marks(tmp_path):
    pa = pytest.importorskip("pyarrow")
    stamps = [dt.datetime(2024, 1, 1, tzinfo=dt.UTC), dt.datetime(2024, 1, 1, 0, 1, tzinfo=dt.UTC)]
    path = write_parquet(
        tmp_path / "e.parquet",
        {
            "session_id": [7, 7],
            "time": pa.array(stamps, type=pa.timestamp("ns", tz="UTC")),
            "mark": pa.array([1, 3], type=pa.int32()),
        },
    )
    seqs, schema = load_events(path, time_unit="minutes")
    assert seqs[0].session_id == "7" and schema.num_marks == 4
    np.testing.assert_allclose(seqs[0].times, [stamps[0].timestamp() / 60, stamps[0].timestamp() / 60 + 1])


def test_schema_given_maps_by_name_and_keeps_stats(good_csv, tmp_path):
    _, schema = load_events(good_csv)
    reordered = write_csv(
        tmp_path / "later.csv", ["qty", "price", "session_id", "time", "mark"], [[99, 7.0, "c", 0, "view"]]
    )
    seqs, same = load_events(reordered, schema=schema)
    assert same is schema
    np.testing.assert_array_equal(seqs[0].values, [[7.0, 99.0]])  # columns in schema order
    assert seqs[0].marks.tolist() == [schema.mark_id("view")]


@pytest.mark.parametrize(
    ("header", "rows", "match"),
    [
        (
            ["session_id", "mark", "v"],
            [["a", "x", 1]],
            r"missing required column\(s\) \['time'\].*found \['session_id'",
        ),
        (["session_id", "time", "mark"], [["a", "", "x"]], r"line 2: empty time"),
        (
            ["session_id", "time", "mark"],
            [["a", "0", "x"], ["a", "nan", "x"]],
            r"line 3: time 'nan' is not finite",
        ),
        (["session_id", "time", "mark"], [["a", "inf", "x"]], r"line 2: time 'inf' is not finite"),
        (["session_id", "time", "mark"], [["a", "yesterday", "x"]], r"line 2: time 'yesterday' is neither"),
        (
            ["session_id", "time", "mark"],
            [["a", "0", "x"], ["a", "2024-01-01", "x"]],
            r"line 3: .* is a datetime but line 2 has a number",
        ),
        (
            ["session_id", "time", "mark"],
            [["a", "5", "x"], ["b", "1", "x"], ["a", "3", "x"]],
            r"line 4: session 'a' has time 3.0 after 5.0 at line 2; expected non-decreasing",
        ),
        (
            ["session_id", "time", "mark", "v"],
            [["a", "0", "x", "nan"]],
            r"line 2: value column 'v' is missing; expected a finite number",
        ),
        (
            ["session_id", "time", "mark", "v"],
            [["a", "0", "x", ""]],
            r"line 2: value column 'v' is missing; expected a finite number",
        ),
        (
            ["session_id", "time", "mark", "v"],
            [["a", "0", "x", "inf"]],
            r"line 2: value column 'v' is 'inf'; expected a finite number",
        ),
        (["session_id", "time", "mark", "v"], [["a", "0", "x", "1e"]], r"line 2: value column 'v' is '1e'; expected"),
        (["session_id", "time", "mark"], [["a", "0", ""]], r"line 2: empty mark"),
        (["session_id", "time", "mark"], [["", "0", "x"]], r"line 2: empty session_id"),
        (["session_id", "time", "mark"], [["a", "0"]], r"line 2 has 2 fields; expected 3"),
        (["session_id", "time", "mark"], [], r"no events"),
    ],
)
def test_malformed_csv_raises_clear_error(tmp_path, header, rows, match):
    path = write_csv(tmp_path / "bad.csv", header, rows)
    with pytest.raises(DataError, match=match) as info:
        load_events(path)
    assert "bad.csv" in str(info.value)


def test_unknown_mark_at_inference_names_mark_and_row(good_csv, tmp_path):
    _, schema = load_events(good_csv)
    path = write_csv(
        tmp_path / "new.csv",
        ["session_id", "time", "mark", "price", "qty"],
        [["z", 0, "view", 1, 1], ["z", 1, "refund", 1, 1]],
    )
    with pytest.raises(DataError, match=r"line 3: unknown mark 'refund'.*'buy', 'click', 'view'"):
        load_events(path, schema=schema)


def test_value_columns_must_match_schema(good_csv, tmp_path):
    _, schema = load_events(good_csv)
    path = write_csv(tmp_path / "new.csv", ["session_id", "time", "mark", "price", "tax"], [["z", 0, "view", 1, 1]])
    with pytest.raises(DataError, match=r"missing \['qty'\], unexpected \['tax'\]"):
        load_events(path, schema=schema)
    with pytest.raises(DataError, match=r"value column\(s\) \['nope'\] not in the file"):
        load_events(path, value_columns=["nope"])


def test_bad_inputs_outside_the_rows(tmp_path, good_csv):
    with pytest.raises(DataError, match="unsupported file type"):
        load_events(tmp_path / "x.json")
    with pytest.raises(DataError, match="time_unit 'fortnights'"):
        load_events(good_csv, time_unit="fortnights")
    path = write_csv(tmp_path / "big.csv", ["session_id", "time", "mark"], [["a", 0, 10**9]])
    with pytest.raises(DataError, match="integer mark 1000000000"):
        load_events(path)


def test_schema_round_trip_and_standardize():
    schema = EventSchema(("a", "b"), ("x", "y"), "minutes", (1.0, -2.0), (2.0, 0.5))
    back = EventSchema.from_dict(json.loads(json.dumps(schema.to_dict())))
    assert back == schema and back.num_marks == 2 and back.value_width == 2
    values = np.array([[3.0, -1.0], [1.0, -2.0]])
    z = schema.standardize(values)
    np.testing.assert_allclose(z, [[1.0, 2.0], [0.0, 0.0]])
    np.testing.assert_allclose(schema.unstandardize(z), values)
    assert schema.mark_id("b") == 1
    with pytest.raises(DataError, match="unknown mark 'c'"):
        schema.mark_id("c")
    with pytest.raises(DataError, match=r"expected \[\.\.\., 2\]"):
        schema.standardize(np.zeros((3, 1)))
    with pytest.raises(DataError, match="missing keys"):
        EventSchema.from_dict({"mark_names": ["a"]})
    with pytest.raises(DataError, match="value_std must be finite and > 0"):
        EventSchema(("a",), ("x",), "seconds", (0.0,), (0.0,))


def seq(sid, times, marks, values=None):
    values = np.zeros((len(times), 1)) if values is None else values
    return EventSequence(sid, np.asarray(times, float), np.asarray(marks), np.asarray(values))


def test_pad_batch_shapes_mask_and_gaps():
    schema = EventSchema(("a", "b", "c"), ("v",), "seconds", (10.0,), (2.0,))
    s1 = seq("one", [1.0, 1.0, 4.0], [0, 2, 1], [[10.0], [12.0], [8.0]])
    s2 = seq("two", [5.0], [2], [[14.0]])
    batch = pad_batch([s1, s2], schema)
    assert batch.times.shape == (2, 3) and batch.values.shape == (2, 3, 1)
    assert batch.times.dtype == torch.float64 and batch.dt.dtype == torch.float32
    assert batch.marks.dtype == torch.int64 and batch.mask.dtype == torch.bool
    assert batch.lengths.tolist() == [3, 1] and batch.session_ids == ("one", "two")
    assert batch.mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.dt.tolist() == [[0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]
    assert batch.marks.tolist() == [[0, 2, 1], [2, 0, 0]]
    assert batch.values[..., 0].tolist() == [[0.0, 1.0, -1.0], [2.0, 0.0, 0.0]]
    assert batch.times[0].tolist() == [1.0, 1.0, 4.0]
    with pytest.raises(DataError, match=r"mark id 5; expected ids in \[0, 3\)"):
        pad_batch([seq("bad", [0.0], [5])], schema)
    with pytest.raises(DataError, match="expected non-decreasing"):
        seq("bad", [2.0, 1.0], [0, 0])


def test_iterate_batches_is_deterministic():
    schema = EventSchema(("a",), ("v",), "seconds", (0.0,), (1.0,))
    seqs = [seq(f"s{i}", np.arange(i + 1.0), [0] * (i + 1)) for i in range(10)]

    def order(**kw):
        return [b.session_ids for b in iterate_batches(seqs, schema, 4, **kw)]

    assert order(shuffle=False) == [("s0", "s1", "s2", "s3"), ("s4", "s5", "s6", "s7"), ("s8", "s9")]
    assert order(shuffle=True, seed=3) == order(shuffle=True, seed=3)
    assert order(shuffle=True, seed=3) != order(shuffle=True, seed=4)
    assert sorted(sum(order(shuffle=True, seed=3), ())) == sorted(s.session_id for s in seqs)
    assert len(order(shuffle=True, seed=3, drop_last=True)) == 2


def test_split_by_time_and_refit(good_csv):
    seqs, schema = load_events(good_csv)
    early, late = split_by_time(seqs, [0.75])
    assert [s.session_id for s in early] == ["b"] and [s.session_id for s in late] == ["a"]
    refit = fit_standardization(early, schema)
    np.testing.assert_allclose(refit.value_mean, [3.0, 30.0])
    assert refit.mark_names == schema.mark_names


def test_split_at_times_gives_held_out_parts_their_history_as_context():
    a = seq("a", [0.0, 1.0, 2.0, 5.0, 6.0, 9.0], [0, 1, 0, 1, 0, 1])
    late = seq("late", [5.5, 7.0], [0, 0])  # starts after the first cutoff
    early = seq("early", [0.5, 1.5, 2.5], [1, 1, 1])  # ends before it
    train, val, test = split_at_times([a, late, early], (4.0, 8.0))
    assert [(s.session_id, len(s), s.context) for s in train] == [("a", 3, 0), ("early", 3, 0)]
    assert [(s.session_id, len(s), s.context) for s in val] == [("a", 5, 3), ("late", 2, 0)]
    assert [(s.session_id, len(s), s.context) for s in test] == [("a", 6, 5)]
    # Each scored event lies in its split's window, and every event of a session is scored once.
    for part, (lo, hi) in zip((train, val, test), ((-np.inf, 4.0), (4.0, 8.0), (8.0, np.inf)), strict=True):
        for s in part:
            scored = s.times[max(s.context, 1) :]
            assert ((scored >= lo) & (scored < hi)).all()
    assert sum(s.predicted for s in train + val + test) == (6 - 1) + (2 - 1) + (3 - 1)
    schema = EventSchema(("x", "y"), ("v",), "seconds", (0.0,), (1.0,))
    batch = pad_batch(val, schema)
    assert batch.scored.tolist() == [[False, False, False, True, True], [False, True, False, False, False]]
    assert batch.mask.tolist() == [[True] * 5, [True, True, False, False, False]]
    with pytest.raises(DataError, match="expected two finite times c1 < c2"):
        split_at_times([a], (8.0, 4.0))
    with pytest.raises(DataError, match=r"context 7; expected 0 <= context <= 6"):
        EventSequence("a", a.times, a.marks, a.values, 7)


def test_context_events_are_read_but_not_scored():
    """A held-out part's NLL equals the full sequence's NLL restricted to its scored events."""
    from aaren_core.nn.backbones import BackboneConfig
    from aaren_core.tasks.event.model import EventModel, EventModelConfig

    torch.manual_seed(0)
    model = EventModel(
        EventModelConfig(backbone=BackboneConfig(d_model=8, n_layers=1, n_heads=2), num_marks=2, value_width=1)
    )
    rng = np.random.default_rng(0)
    full = seq("s", np.cumsum(rng.uniform(0.1, 2.0, 12)), rng.integers(0, 2, 12))
    held = EventSequence("s", full.times, full.marks, full.values, context=7)
    schema = EventSchema(("x", "y"), ("v",), "seconds", (0.0,), (1.0,))
    b_full, b_held = pad_batch([full], schema), pad_batch([held], schema)
    with torch.no_grad():
        t_full = model.nll(b_full.dt, b_full.marks, b_full.values, b_full.mask, b_full.scored)
        t_held = model.nll(b_held.dt, b_held.marks, b_held.values, b_held.mask, b_held.scored)
    assert int(t_held.mask.sum()) == held.predicted == 5
    torch.testing.assert_close(t_held.total[0, 6:], t_full.total[0, 6:])
    assert (t_held.total[0, :6] == 0).all() and (t_full.total[0, :6] != 0).all()


def sessions_of(times_per_session: list[np.ndarray]) -> list[EventSequence]:
    return [seq(f"s{i}", t, np.zeros(len(t), dtype=np.int64)) for i, t in enumerate(times_per_session)]


def test_time_resolution_is_the_largest_grid_the_gaps_lie_on():
    rng = np.random.default_rng(0)
    # Hours on a quarter-hour grid (offset by 0.1 h, far from 0): 0.25, not 1 and not the gcd of a few gaps.
    quarter = sessions_of([0.1 + 3e5 + np.sort(rng.integers(0, 4000, 60)) / 4 for _ in range(8)])
    r = time_resolution(quarter, "hours")
    assert r.step == 0.25 and r.on_grid == 1.0 and r.ties > 0 and "0.25 hours" in r.how
    # Whole minutes (as the flights): 1; whole seconds in minutes: 1/60.
    assert time_resolution(sessions_of([np.sort(rng.integers(0, 10**6, 50)) * 1.0]), "minutes").step == 1.0
    seconds = sessions_of([np.sort(rng.integers(0, 10**6, 50)) / 60 for _ in range(4)])
    assert time_resolution(seconds, "minutes").step == pytest.approx(1 / 60)
    # Two decimals, and a few off-grid stragglers (under 1%) do not hide the grid.
    cents = np.sort(rng.choice(10**6, 1000, replace=False)) / 100
    cents[::400] += 1e-4  # 3 stragglers: 6 of 999 gaps off the grid
    assert time_resolution(sessions_of([cents]), "days").step == 0.01
    # Continuous times (also at epoch-seconds magnitude): no grid, no ties, no dequantization.
    for base in (0.0, 1.7e9):
        r = time_resolution(sessions_of([base + np.sort(rng.uniform(0, 1e5, 200)) for _ in range(3)]), "seconds")
        assert r.step == 0.0 and r.ties == 0 and "on no common grid, and no gap is 0" in r.how
    # Continuous but tied: the smallest positive gap.
    tied = np.sort(np.concatenate([rng.uniform(0, 100, 50), [7.123456789] * 3]))
    r = time_resolution(sessions_of([tied]), "seconds")
    assert r.step == pytest.approx(np.diff(tied)[np.diff(tied) > 0].min()) and r.ties > 0


def test_long_sessions_choose_the_time_split_short_ones_the_session_split():
    rng = np.random.default_rng(1)
    long = sessions_of([np.sort(rng.uniform(0, 100, 40)) for _ in range(10)])  # each spans the whole range
    cutoffs = split_cutoffs(long, 0.1, 0.1)
    all_times = np.concatenate([s.times for s in long])
    assert (all_times < cutoffs[0]).mean() == pytest.approx(0.8, abs=0.01)
    assert (all_times >= cutoffs[1]).mean() == pytest.approx(0.1, abs=0.01)
    chosen = choose_split(long, cutoffs, "hours")
    assert chosen.method == "time" and chosen.cutoffs == cutoffs and "10 of 10 sessions (100%)" in chosen.reason
    assert "by event time at" in chosen.describe("hours") and "hours" in chosen.describe("hours")
    short = sessions_of([d + np.sort(rng.uniform(0, 0.5, 10)) for d in range(100)])  # a day each, 100 days
    chosen = choose_split(short, split_cutoffs(short, 0.1, 0.1))
    assert chosen.method == "sessions" and chosen.cutoffs is None and "fewer than half" in chosen.reason
    with pytest.raises(DataError, match="tied times leave a window empty"):
        split_cutoffs(sessions_of([np.array([0.0] + [5.0] * 20)]), 0.1, 0.1)


def test_write_events_writes_a_part_that_reads_back_with_its_context(tmp_path):
    a = EventSequence("a", [0.0, 1.25, 2.5, 5.0, 6.0], [0, 1, 0, 1, 0], [[0.1], [0.2], [0.3], [0.4], [0.5]], 3)
    b = EventSequence("b", [0.5, 5.5], [1, 1], [[1.5], [2.5]], 0)
    schema = EventSchema(("x", "y"), ("v",), "hours", (0.0,), (1.0,))
    path = tmp_path / "test.csv"
    assert write_events(path, [a, b], schema) == 7
    with path.open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["session_id", "time", "mark", "v", "context"]
    assert rows[1:4] == [["a", "0.0", "x", "0.1", "1"], ["b", "0.5", "y", "1.5", "0"], ["a", "1.25", "y", "0.2", "1"]]
    back, back_schema = load_events(path, time_unit="hours")
    assert back_schema.value_names == ("v",) and back_schema.mark_names == ("x", "y")
    assert [(s.session_id, len(s), s.context) for s in back] == [("a", 5, 3), ("b", 2, 0)]
    np.testing.assert_array_equal(back[0].times, a.times)
    np.testing.assert_array_equal(back[0].values, a.values)
    rows[1][4], rows[3][4] = "0", "1"  # a's first row held out, its second context: out of order
    write_csv(path, rows[0], rows[1:])
    with pytest.raises(DataError, match="line 4: session 'a' has a context row after a held-out row"):
        load_events(path)


@pytest.fixture(scope="module")
def flights():
    try:
        flights_path()
    except DataError as e:
        pytest.skip(str(e))
    return load_flights()  # about 1.5 s


def test_real_flights(flights):
    train, val, test = flights.train, flights.val, flights.test
    assert (len(train), len(val), len(test)) == (819, 93, 183)  # 273, 31 and 61 days at 3 airports
    assert flights.schema.num_marks == 16 and flights.schema.mark_names == tuple(sorted(flights.schema.mark_names))
    assert flights.schema.value_names == ("dep_delay", "distance") and flights.schema.time_unit == "minutes"
    # Whole minutes that tie: the derived resolution (training's default jitter) stays 1 minute.
    derived = time_resolution(train, "minutes")
    assert derived.step == 1.0 and derived.ties > 0.1
    assert flights.split is not None and flights.split.method == "sessions"
    dates = {}
    for split, seqs in (("train", train), ("val", val), ("test", test)):
        for s in seqs:
            origin, date = s.session_id.split("/")
            assert origin in {"EWR", "JFK", "LGA"}
            dates.setdefault(split, []).append(dt.date.fromisoformat(date))
            assert len(s) > 0 and (np.diff(s.times) >= 0).all()
            # Minutes since midnight of the scheduled date: a day's sequence never reaches another date's start.
            assert s.times.min() >= 0 and s.times.max() < 2 * 24 * 60
    assert max(dates["train"]) < min(dates["val"]) and max(dates["val"]) < min(dates["test"])
    assert {d.month for d in dates["train"]} == set(range(1, 10)) and {d.month for d in dates["val"]} == {10}
    assert len({s.session_id for s in train + val + test}) == 1095
    assert sum(len(s) for s in train + val + test) == 336_776 - 8_255  # cancelled flights dropped
    means = np.concatenate([s.values for s in train]).astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(flights.schema.value_mean, means, rtol=1e-5)


def test_real_flights_sessions_hold_exactly_their_origin_and_date(flights):
    import collections
    import io
    import zipfile

    with zipfile.ZipFile(flights_path()) as z, z.open("flights.csv") as f:
        counts = collections.Counter(
            f"{r['origin']}/{int(r['year']):04d}-{int(r['month']):02d}-{int(r['day']):02d}"
            for r in csv.DictReader(io.TextIOWrapper(f, encoding="utf-8"))
            if r["dep_delay"] != "NA"
        )
    seqs = flights.train + flights.val + flights.test
    assert {s.session_id: len(s) for s in seqs} == dict(counts)


def test_real_flights_by_aircraft():
    try:
        flights_path()
    except DataError as e:
        pytest.skip(str(e))
    data = load_flights_aircraft()
    assert data.schema.num_marks == 16 and data.schema.mark_names[-1] == "other"
    assert time_resolution(data.train, "minutes").step == 1.0 and data.split.method == "time"
    oct1, nov1 = 273 * 1440.0, 304 * 1440.0
    for part, (lo, hi) in zip(
        (data.train, data.val, data.test), ((0, oct1), (oct1, nov1), (nov1, 366 * 1440.0)), strict=True
    ):
        assert part and len({s.session_id for s in part}) == len(part)
        for s in part:
            scored = s.times[max(s.context, 1) :]
            assert scored.size and ((scored >= lo) & (scored < hi)).all()
    # Every departure of an aircraft but its first is scored exactly once over the three parts
    # (each part is a prefix of the aircraft's whole sequence).
    length: dict[str, int] = {}
    for s in data.train + data.val + data.test:
        length[s.session_id] = max(length.get(s.session_id, 0), len(s))
    assert sum(s.predicted for s in data.train + data.val + data.test) == sum(n - 1 for n in length.values())


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    (tmp_path / "e.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"needs pyarrow; install it with `pip install pyarrow`"):
        load_events(tmp_path / "e.parquet")
