"""Regularly sampled series in plain numpy, with TSLib-style splits.

Series (task ``series``). ``SeriesData`` holds one multivariate series: ``times [T]`` (seconds
since the epoch, UTC), ``values [T, C]`` (raw units) and channel names, cut chronologically into
train / val / test as the Time-Series-Library (TSLib) does:

- ETT style (``ett_borders``): 12 / 4 / 4 months of 30 days from the start, the rest unused;
- custom style (``ratio_borders``): the first 70 % train, the last 20 % test, the 10 % between val.

TSLib starts a held-out part's first input window ``L`` steps before its border, so the first
forecast of val or test is made at the border; ``SeriesData.forecast_origins`` follows that.
Standardization ``z = (x - mean) / std`` is fitted on the train part only.

Gaps (``SeriesData.with_gaps``, the rule every part of aaren follows): ``real [T]`` says a row
exists at a step, ``observed [T, C]`` that its channel has a value. ``values`` stay finite: a
missing value is the channel's last observed one (forward fill), before any observation the train
mean. Filled values are inputs only: origins follow real rows, and only observed targets count
(in the loss and in every score). Without gaps both are None.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from aaren.formats.errors import DataError
from aaren.formats.times import iso_utc

__all__ = [
    "PARTS",
    "SeriesData",
    "calendar_features",
    "ett_borders",
    "forward_fill",
    "ratio_borders",
]

PARTS = ("train", "val", "test")
HOURS_PER_MONTH = 30 * 24
SECONDS_PER_DAY = 86_400.0


def ett_borders(n_steps: int, steps_per_hour: int) -> tuple[int, int, int]:
    """TSLib's ``Dataset_ETT_hour`` / ``_minute`` borders: ends of 12, 16 and 20 months of 30 days.

    ``steps_per_hour`` is 1 (ETTh-like) or 4 (ETTm-like). Raises ``DataError`` when the series is
    shorter than 20 such months.
    """
    month = HOURS_PER_MONTH * steps_per_hour
    borders = (12 * month, 16 * month, 20 * month)
    if n_steps < borders[2]:
        raise DataError(f"ETT-style split needs {borders[2]} steps (20 months of 30 days); got {n_steps}")
    return borders


def ratio_borders(n_steps: int, train: float = 0.7, test: float = 0.2) -> tuple[int, int, int]:
    """TSLib's ``Dataset_Custom`` borders: ``int(T train)`` train, ``int(T test)`` test at the end,
    the rest val: ``(n_train, T - n_test, T)``."""
    n_train, n_test = int(n_steps * train), int(n_steps * test)
    if n_train < 1 or n_test < 1 or n_train + n_test >= n_steps:
        raise DataError(f"cannot split {n_steps} steps {train:.0%} / rest / {test:.0%}; expected more steps")
    return n_train, n_steps - n_test, n_steps


def calendar_features(times: np.ndarray) -> np.ndarray:
    """``times [T]`` (seconds since the epoch) -> ``[T, 4]``: sin and cos of the hour of the day and
    of the day of the week, ``(sin 2 pi h / 24, cos 2 pi h / 24, sin 2 pi d / 7, cos 2 pi d / 7)``
    with fractional ``h`` and ``d``. Computed from the time alone, so a server can compute it."""
    t = np.asarray(times, dtype=np.float64)
    day = t / SECONDS_PER_DAY
    hour_angle = 2 * np.pi * (day % 1.0)
    # 1970-01-01 was a Thursday: shift so that 0 is Monday.
    week_angle = 2 * np.pi * (((day + 3.0) % 7.0) / 7.0)
    return np.stack([np.sin(hour_angle), np.cos(hour_angle), np.sin(week_angle), np.cos(week_angle)], axis=1).astype(
        np.float32
    )


def forward_fill(values: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """``values [T, C]`` with NaN -> each NaN replaced by the last finite value of its channel at or
    before it, ``fallback [C]`` before the first one."""
    t = np.arange(len(values))[:, None]
    last = np.maximum.accumulate(np.where(np.isnan(values), -1, t), axis=0)  # [T, C] index of the last value
    filled = np.take_along_axis(values, np.maximum(last, 0), axis=0)
    return np.where(last >= 0, filled, np.broadcast_to(fallback, values.shape))


@dataclasses.dataclass(frozen=True)
class SeriesData:
    """One series with its split: ``times [T]`` float64 seconds, ``values [T, C]`` float32 raw,
    ``borders = (train_end, val_end, test_end)`` step indices, ``mean, std [C]`` fitted on
    ``values[:train_end]``, ``period`` the step in seconds, ``source`` where it came from (a
    stand-in is named as such)."""

    name: str
    times: np.ndarray
    values: np.ndarray
    channels: tuple[str, ...]
    borders: tuple[int, int, int]
    period: float
    source: str = ""
    mean: np.ndarray = dataclasses.field(default=None, repr=False)  # type: ignore[assignment]
    std: np.ndarray = dataclasses.field(default=None, repr=False)  # type: ignore[assignment]
    observed: np.ndarray | None = dataclasses.field(default=None, repr=False)
    real: np.ndarray | None = dataclasses.field(default=None, repr=False)
    split: str = ""

    @classmethod
    def with_gaps(
        cls,
        name: str,
        times: np.ndarray,
        values: np.ndarray,
        real: np.ndarray,
        channels: tuple[str, ...],
        borders: tuple[int, int, int],
        period: float,
        source: str = "",
        split: str = "",
    ) -> SeriesData:
        """A series whose ``values [T, C]`` hold NaN where missing and ``real [T]`` whether a row
        exists: mean and std from the observed train values, then filled (module docstring).
        ``DataError`` when a channel has no observed value in the train part."""
        values = np.asarray(values, dtype=np.float64)
        real = np.asarray(real, dtype=bool)
        observed = ~np.isnan(values) & real[:, None]
        train, seen = values[: borders[0]], observed[: borders[0]]
        empty = [c for c, n in zip(channels, seen.sum(axis=0), strict=True) if n == 0]
        if empty:
            raise DataError(f"{name}: channel {empty[0]!r} has no value in the train part; leave it out (--channels)")
        if observed.all():  # the statistics exactly as a series without gaps gets them
            return cls(name, times, values, channels, borders, period, source, split=split)
        n = seen.sum(axis=0)
        mean = np.where(seen, train, 0.0).sum(axis=0) / n
        std = np.sqrt(np.where(seen, np.square(train - mean), 0.0).sum(axis=0) / n)
        filled = forward_fill(np.where(observed, values, np.nan), mean)
        return cls(
            name, times, filled, channels, borders, period, source,
            mean.astype(np.float32), np.where(std > 1e-8, std, 1.0).astype(np.float32), observed, real, split,
        )  # fmt: skip

    def __post_init__(self) -> None:
        # Copies: pandas hands out read-only arrays, and torch.from_numpy wants writable ones.
        times = np.array(self.times, dtype=np.float64)
        values = np.array(self.values, dtype=np.float32)
        if values.ndim != 2 or times.shape != (values.shape[0],):
            raise DataError(f"{self.name}: expected times [T] and values [T, C]; got {times.shape}, {values.shape}")
        if len(self.channels) != values.shape[1]:
            raise DataError(f"{self.name}: {len(self.channels)} channel names for {values.shape[1]} channels")
        if not np.isfinite(values).all():
            raise DataError(f"{self.name}: values must be finite; fill missing steps before building SeriesData")
        if np.any(np.diff(times) <= 0):
            raise DataError(f"{self.name}: times must increase strictly")
        a, b, c = self.borders
        if not 0 < a < b < c <= values.shape[0]:
            raise DataError(f"{self.name}: borders {self.borders} must satisfy 0 < train < val < test <= T")
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "channels", tuple(self.channels))
        if (self.observed is None) != (self.real is None):
            raise DataError(f"{self.name}: give both observed [T, C] and real [T], or neither")
        if self.observed is not None and self.real is not None:
            observed, real = np.array(self.observed, dtype=bool), np.array(self.real, dtype=bool)
            if observed.shape != values.shape or real.shape != times.shape or (observed & ~real[:, None]).any():
                raise DataError(f"{self.name}: expected observed [T, C] and real [T] with observed only at real steps")
            object.__setattr__(self, "observed", observed)
            object.__setattr__(self, "real", real)
        if self.mean is None or self.std is None:
            train = values[:a].astype(np.float64)
            object.__setattr__(self, "mean", train.mean(axis=0).astype(np.float32))
            # A constant channel keeps std 1 so it standardizes to 0 rather than to inf.
            std = train.std(axis=0)
            object.__setattr__(self, "std", np.where(std > 1e-8, std, 1.0).astype(np.float32))

    @property
    def n_channels(self) -> int:
        return self.values.shape[1]

    @property
    def missing_steps(self) -> int:
        """Steps of the grid with no row (filled)."""
        return 0 if self.real is None else int((~self.real).sum())

    @property
    def missing_values(self) -> int:
        """NA cells of real rows (filled)."""
        if self.observed is None or self.real is None:
            return 0
        return int((~self.observed & self.real[:, None]).sum())

    def target_mask(self, steps: np.ndarray) -> np.ndarray | None:
        """``observed`` at ``steps [...]`` -> ``[..., C]`` bool, or None when everything is observed."""
        return None if self.observed is None else self.observed[steps]

    @property
    def test_from(self) -> str:
        """The time of the test part's first step, ISO UTC (a replay scores from there)."""
        return iso_utc(float(self.times[self.borders[1]]))

    @property
    def steps_per_day(self) -> int:
        """Steps in one day (the seasonal naive baseline's lag)."""
        return max(1, round(SECONDS_PER_DAY / self.period))

    def standardized(self) -> np.ndarray:
        """``[T, C]``: ``(values - mean) / std`` with the train statistics."""
        return ((self.values - self.mean) / self.std).astype(np.float32)

    def part(self, name: str) -> tuple[int, int]:
        """``[start, end)`` steps of ``"train"``, ``"val"`` or ``"test"``."""
        if name not in PARTS:
            raise DataError(f"unknown part {name!r}; expected one of {PARTS}")
        a, b, c = self.borders
        return {"train": (0, a), "val": (a, b), "test": (b, c)}[name]

    def forecast_origins(self, name: str, lookback: int, horizon: int) -> np.ndarray:
        """Steps ``s`` at which TSLib makes a forecast in part ``name``: the inputs are
        ``values[s - lookback : s]`` and the targets ``values[s : s + horizon]``, all targets
        inside the part, every input at or after step 0 (train: the first ``lookback`` steps are
        inputs only); with gaps only right after a real row (``real[s - 1]``). ``[n_windows]``
        int64, in order."""
        start, end = self.part(name)
        first = max(start, lookback)
        origins = np.arange(first, end - horizon + 1, dtype=np.int64)
        if self.real is not None:
            origins = origins[self.real[origins - 1]]
        if origins.size == 0:
            raise DataError(
                f"{self.name}: part {name!r} ({end - start} steps) has no window of lookback {lookback} "
                f"and horizon {horizon}"
            )
        return origins
