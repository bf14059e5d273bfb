"""Regularly sampled series in plain numpy, with TSLib-style splits.

Series (task ``series``). ``SeriesData`` holds one multivariate series: ``times [T]`` (seconds
since the epoch, UTC), ``values [T, C]`` (raw units) and channel names, cut chronologically into
train / val / test as the Time-Series-Library (TSLib) does:

- ETT style (``ett_borders``): 12 / 4 / 4 months of 30 days from the start, the rest unused;
- custom style (``ratio_borders``): the first 70 % train, the last 20 % test, the 10 % between val.

TSLib starts a held-out part's first input window ``L`` steps before its border, so the first
forecast of val or test is made at the border; ``SeriesData.forecast_origins`` follows that.
Standardization ``z = (x - mean) / std`` is fitted on the train part only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from aaren.formats.errors import DataError

__all__ = [
    "PARTS",
    "SeriesData",
    "calendar_features",
    "ett_borders",
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
        inputs only). ``[n_windows]`` int64, in order."""
        start, end = self.part(name)
        first = max(start, lookback)
        origins = np.arange(first, end - horizon + 1, dtype=np.int64)
        if origins.size == 0:
            raise DataError(
                f"{self.name}: part {name!r} ({end - start} steps) has no window of lookback {lookback} "
                f"and horizon {horizon}"
            )
        return origins
