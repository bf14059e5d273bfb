"""Placeholder: load_class_files is being written on its branch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aaren.formats.errors import DataError

if TYPE_CHECKING:
    from aaren_core.tasks.classify.data import ClassData
    from aaren_core.tasks.config import TaskTrainConfig


def load_class_files(config: TaskTrainConfig) -> ClassData:
    raise DataError(f"{config.data}: reading a file is not built yet")
