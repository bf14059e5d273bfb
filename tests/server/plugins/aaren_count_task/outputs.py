"""The count task's output columns (torch-free)."""

from __future__ import annotations

import dataclasses

import numpy as np

from aaren.server.contract.columns import OutputColumns


@dataclasses.dataclass(frozen=True)
class CountOutputs(OutputColumns):
    """Per forecast (F of them): events so far ``count [F]`` (int64), each value's running mean
    ``mean [F, V]`` and standard deviation ``std [F, V]`` (times the model's scale)."""

    count: np.ndarray
    mean: np.ndarray
    std: np.ndarray
