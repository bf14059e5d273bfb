"""The .ts (sktime / UEA) reader: header, variable lengths, ':' dimensions, '?' missing, clear errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from aaren.formats.errors import DataError
from aaren.formats.ts import parse_ts

TINY = """# a comment
@problemName Tiny
@timeStamps false
@missing true
@univariate false
@dimensions 2
@equalLength false
@classLabel true a b c
@data
1,2,3:4,5,6:b
0.5,?:-1e-3,7:a

7:8:c
"""


def test_parses_header_lengths_dimensions_and_missing():
    f = parse_ts(TINY)
    assert f.problem_name == "Tiny"
    assert f.class_names == ("a", "b", "c")
    assert f.labels == ["b", "a", "c"]
    assert [s.shape for s in f.series] == [(3, 2), (2, 2), (1, 2)]
    np.testing.assert_array_equal(f.series[0], [[1, 4], [2, 5], [3, 6]])
    assert np.isnan(f.series[1][1, 0]) and f.series[1][0, 1] == np.float32(-1e-3)
    assert f.n_channels == 2 and f.series[0].dtype == np.float32


def test_unlabelled_univariate():
    f = parse_ts("@problemName U\n@univariate true\n@classLabel false\n@data\n1,2\n3,4,5\n")
    assert f.labels == [] and f.class_names == ()
    assert [s.shape for s in f.series] == [(2, 1), (3, 1)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("@problemName X\n", "no @data"),
        ("@problemName X\n1,2:a\n", "bad.ts:2: expected a @key header line or @data"),
        ("@dimensions 2\n@classLabel true a\n@data\n1,2:a\n", "1 dimensions; @dimensions says 2"),
        ("@classLabel true a\n@data\n1,2:3:a\n", r"lengths \[1, 2\]"),
        ("@classLabel true a\n@data\n1,x:a\n", "'x' is not a number"),
        ("@classLabel true a b\n@data\n1,2:z\n", "label 'z' is not declared"),
        ("@timeStamps true\n@classLabel true a\n@data\n(1,2:a\n", "unbalanced parentheses"),
        ("@timeStamps true\n@classLabel true a\n@data\n(1,2),(1,3):a\n", "time '1' twice"),
        ("@timeStamps true\n@classLabel true a\n@data\n(1,2),(2024-01-01,3):a\n", "mix numbers and datetimes"),
        ("@classLabel true a\n@data\n:a\n", "no values \\(a sequence of length 0\\)"),
        ("@classLabel true a\n@data\n", "no instances"),
        ("@classLabel maybe a\n@data\n1:a\n", "must be true or false"),
    ],
)
def test_malformed_files_raise_data_error(text, message):
    with pytest.raises(DataError, match=message):
        parse_ts(text, source="bad.ts")


def test_aaren_formats_imports_neither_torch_nor_aaren_core():
    """The readers are shared with the torch-free client: only ``ts`` may load numpy."""
    code = (
        "import sys, aaren.formats.events, aaren.formats.flights, aaren.formats.marks, aaren.formats.tables, "
        "aaren.formats.times\n"
        "plain = sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'pandas', 'torch', 'aaren_core'})\n"
        "import aaren.formats.ts\n"
        "print(plain, sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'aaren_core'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "[]"]


def test_one_data_error_for_formats_and_aaren_core():
    """aaren_core's data checks raise the formats' class, so one ``except DataError`` catches both."""
    from aaren.client.events_file import EventsFileError
    from aaren_core.tasks.event.splits import split_cutoffs

    assert EventsFileError is DataError
    with pytest.raises(DataError, match="needs at least 3"):
        split_cutoffs([], 0.1, 0.1)
    with pytest.raises(DataError, match="no @data line"):
        parse_ts("@problemName x\n")


def test_timestamped_values_are_aligned_on_the_union_of_their_stamps():
    text = (
        "@problemName S\n@timeStamps true\n@dimensions 2\n@classLabel true a b\n@data\n"
        "(2007-01-02 00:00:00,2),(2007-01-01 00:00:00,1):(2007-01-03 00:00:00,?),(2007-01-02 00:00:00,5):b\n"
        "(0,1):(0,2):a\n"
    )
    f = parse_ts(text)
    assert f.labels == ["b", "a"] and f.n_channels == 2
    np.testing.assert_array_equal(f.series[0], np.array([[1, np.nan], [2, 5], [np.nan, np.nan]], np.float32))
    np.testing.assert_array_equal(f.series[1], [[1, 2]])
