"""Placeholder: load_series_file is being written on its branch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aaren.formats.errors import DataError

if TYPE_CHECKING:
    from aaren_core.tasks.config import TaskTrainConfig
    from aaren_core.tasks.series.data import SeriesData


def load_series_file(config: TaskTrainConfig) -> SeriesData:
    raise DataError(f"{config.data}: reading a file is not built yet")
