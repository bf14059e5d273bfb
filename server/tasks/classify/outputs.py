"""The class task's output columns (torch-free: front ends read them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from aaren.server.contract.columns import OutputColumns

__all__ = ["ClassOutputs"]


@dataclasses.dataclass(frozen=True)
class ClassOutputs(OutputColumns):
    """Per forecast (F of them), every one of K classes by falling probability: class indices
    ``class_top [F, K]`` (int64) and their softmax probabilities ``class_probs [F, K]`` (front ends cut
    to a request's top_k)."""

    class_top: np.ndarray
    class_probs: np.ndarray
