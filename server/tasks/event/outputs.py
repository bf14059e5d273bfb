"""The event task's output columns (torch-free: front ends read them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from aaren.server.contract.columns import OutputColumns

__all__ = ["OUTPUT_NAMES", "EventOutputs"]


@dataclasses.dataclass(frozen=True)
class EventOutputs(OutputColumns):
    """Per forecast (F of them) of the next event: the gap's mean ``time_mean [F]`` and quantiles
    ``time_quantiles [F, Q]`` (at the server's levels), the ``k`` likeliest marks ``top_marks [F, k]``
    (int64) with their probabilities ``top_probs [F, k]``, the values' means and stds
    ``value_mean, value_std [F, V]`` (raw units)."""

    time_mean: np.ndarray
    time_quantiles: np.ndarray
    top_marks: np.ndarray
    top_probs: np.ndarray
    value_mean: np.ndarray
    value_std: np.ndarray

    @classmethod
    def empty(cls, k: int, q: int, v: int) -> EventOutputs:
        """No forecast: ``[0, ...]`` columns of these widths."""
        return cls(
            np.zeros(0),
            np.zeros((0, q)),
            np.zeros((0, k), np.int64),
            np.zeros((0, k)),
            np.zeros((0, v)),
            np.zeros((0, v)),
        )


#: The column names, in order (``EventOutputs.to_columns()``'s keys).
OUTPUT_NAMES = tuple(f.name for f in dataclasses.fields(EventOutputs))
