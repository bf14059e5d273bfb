"""The policy task's output columns (torch-free: front ends read them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from aaren.server.contract.columns import OutputColumns

__all__ = ["PolicyOutputs"]


@dataclasses.dataclass(frozen=True)
class PolicyOutputs(OutputColumns):
    """Per forecast (F of them, one per environment step): the next ``action [F, A]`` float32 in the
    environment's action space and the model's ``return_to_go [F]`` float32 (``R_t``: the target return
    less the rewards sent so far)."""

    action: np.ndarray
    return_to_go: np.ndarray
