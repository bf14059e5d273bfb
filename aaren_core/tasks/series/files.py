"""``aaren train --task series --data FILE``: a CSV or Parquet series as ``SeriesData``.

``aaren.formats.series_file`` reads the file onto its grid; the borders are chosen here:

- ``split`` ``""`` or ``ratio``: TSLib's 70 / 10 / 20 of the grid's steps;
- ``split=ett``: TSLib's ETT borders (12 / 4 / 4 months of 30 days), ``steps_per_hour = 3600 / step``;
- ``split_at=TIME`` (ISO or Unix seconds): test from the first step at or after TIME to the end, val
  the last eighth of the steps before it (70 : 10, as the ratio split), train the rest.

Missing steps and values are filled by ``SeriesData.with_gaps`` (forward fill, the train mean before
any value) and never count as targets.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from aaren.formats.errors import DataError
from aaren.formats.series_file import read_series_file
from aaren.formats.times import iso_utc, parse_time
from aaren_core.tasks.series.data import SeriesData, ett_borders, ratio_borders

if TYPE_CHECKING:
    from aaren_core.tasks.config import TaskTrainConfig

__all__ = ["file_borders", "load_series_file"]


def file_borders(n_steps: int, step: float, t0: float, split: str, split_at: str) -> tuple[tuple[int, int, int], str]:
    """``(train_end, val_end, test_end)`` of a file's grid of ``n_steps`` steps of ``step`` seconds from
    ``t0``, and the split in words for the report (module docstring)."""
    if split_at:
        if split == "ett":
            raise DataError("split=ett and split_at both choose the test part; give one")
        at = parse_time(split_at, "seconds")
        test_start = max(0, math.ceil((at - t0) / step - 1e-9))
        if not 0 < test_start < n_steps:
            raise DataError(
                f"split_at {split_at}: the grid runs from {iso_utc(t0)} to {iso_utc(t0 + (n_steps - 1) * step)}; "
                "expected a time inside it"
            )
        train_end = test_start - test_start // 8
        if not 0 < train_end < test_start:
            raise DataError(f"split_at {split_at}: {test_start} steps before it; expected at least 2 for train and val")
        return (train_end, test_start, n_steps), f"test from split_at {iso_utc(t0 + test_start * step)}"
    if split == "ett":
        per_hour = 3600 / step
        if per_hour < 1 or not math.isclose(per_hour, round(per_hour)):
            raise DataError(f"split=ett needs a step that divides an hour; got {step:g} s")
        return ett_borders(n_steps, round(per_hour)), "ett (12/4/4 months of 30 days)"
    return ratio_borders(n_steps), "ratio (70/10/20)"


def load_series_file(config: TaskTrainConfig) -> SeriesData:
    """Read ``config.data`` with ``time_column``, ``channels`` and ``step_seconds``, split by
    ``split`` / ``split_at``; ``DataError`` for anything unusable."""
    path = Path(config.data).expanduser()
    table = read_series_file(path, config.time_column, config.channels, config.step_seconds)
    borders, split = file_borders(len(table.times), table.step, float(table.times[0]), config.split, config.split_at)
    source = f"{path.name}: {table.rows:,} rows, {', '.join(table.channels)}"
    return SeriesData.with_gaps(
        path.name, table.times, table.values, table.real, table.channels, borders, table.step, source, split
    )
