"""The series task's output columns (torch-free: front ends read them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from aaren.server.contract.columns import OutputColumns

__all__ = ["SeriesOutputs"]


@dataclasses.dataclass(frozen=True)
class SeriesOutputs(OutputColumns):
    """Per forecast (F of them), the next H steps of C channels in the data's raw units: means
    ``series_mean [F, H, C]`` and quantiles ``series_quantiles [F, H, C, Q]`` (at the model's levels);
    ``filled_steps [F]`` int64: the missing steps the server filled before the forecast's event (0
    when it was the next step, and for a forecast from a stored state; zeros when not given)."""

    series_mean: np.ndarray
    series_quantiles: np.ndarray
    filled_steps: np.ndarray = None  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        if self.filled_steps is None:
            object.__setattr__(self, "filled_steps", np.zeros(len(self.series_mean), np.int64))
