"""The client's flights source gives exactly the events of ``aaren_core.tasks.event.data.load_flights``."""

from __future__ import annotations

import csv
import datetime as dt
import io
import zipfile

import numpy as np
import pytest

from aaren.client.events_file import (
    EventsFileError,
    ModelSchema,
    flights_path,
    group_by_session,
    load_source,
    read_flights,
)
from aaren_core.tasks.event.flights import load_flights


@pytest.fixture(scope="module")
def real_flights():
    try:
        return flights_path()
    except EventsFileError as exc:
        pytest.skip(str(exc))


def assert_same_events(got, sequences):
    """Client events by session (``got``) hold exactly ``sequences`` (load_flights), event by event."""
    for seq in sequences:
        events = got[seq.session_id]
        assert [e.seq for e in events] == list(range(1, len(seq) + 1))
        np.testing.assert_array_equal(np.array([e.time for e in events]), seq.times)
        np.testing.assert_array_equal(np.array([e.mark for e in events]), seq.marks)
        # What goes on the wire is float32, as load_flights stores values.
        np.testing.assert_array_equal(np.array([e.values for e in events], dtype=np.float32), seq.values)


def assert_interleaved_by_departure(source):
    """Across sessions, events go out in order of actual departure (scheduled date + time)."""

    def absolute(e):
        day = dt.date.fromisoformat(e.session_id.split("/")[1]).toordinal()
        return day * 1440 + e.time

    stamps = [absolute(e) for e in source.events]
    assert stamps == sorted(stamps)


@pytest.fixture(scope="module")
def small_flights(real_flights, tmp_path_factory):
    """Two days of every month from the real file (cancelled flights and all carriers included)."""
    path = tmp_path_factory.mktemp("flights") / "flights.csv"
    with zipfile.ZipFile(real_flights) as z, z.open("flights.csv") as f:
        reader = csv.reader(io.TextIOWrapper(f, encoding="utf-8"))
        header = next(reader)
        day = header.index("day")
        rows = [r for r in reader if r[day] in ("1", "28")]
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("split", ["train", "val", "test", "all"])
def test_flights_splits_equal_load_flights(small_flights, split):
    data = load_flights(small_flights)
    expected = data.train + data.val + data.test if split == "all" else getattr(data, split)
    source = read_flights(split, small_flights)
    assert source.mark_names == data.schema.mark_names
    assert source.value_names == data.schema.value_names == ("dep_delay", "distance")
    assert source.time_unit == data.schema.time_unit == "minutes"
    got = group_by_session(source.events)
    assert sorted(got) == sorted(s.session_id for s in expected) and source.n_sessions == len(expected)
    assert_same_events(got, expected)
    assert_interleaved_by_departure(source)


def test_builtin_flights_source_equals_load_flights_test_split(real_flights):
    source = load_source("flights", ModelSchema())  # default split: test (Nov-Dec)
    expected = load_flights().test
    assert source.n_sessions == len(expected) and len(source.events) == sum(len(s) for s in expected)
    picked = [s for s in expected if s.session_id in ("EWR/2013-11-01", "JFK/2013-12-24", "LGA/2013-12-31")]
    assert len(picked) == 3
    got = group_by_session(source.events)
    assert sorted(got) == sorted(s.session_id for s in expected)
    assert_same_events(got, picked)
    assert_interleaved_by_departure(source)


def test_unknown_split_is_refused():
    with pytest.raises(EventsFileError, match=r"unknown flights split 'march'; expected one of"):
        read_flights("march")
