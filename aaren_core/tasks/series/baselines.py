"""Series baselines on standardized values: last value, seasonal naive, a DLinear-style linear model.

All forecast the ``H`` steps from an origin ``s`` (the first step not seen):

- last value:      x_hat[s + h] = x[s - 1]
- seasonal naive:  x_hat[s + h] = x[s - P + (h mod P)]      (P: steps per day)
- DLinear (Zeng et al. 2023, as in TSLib, ``individual=False``): the lookback ``w [L, C]`` splits
  into a trend ``t = MA_k(w)`` (moving average, ends padded with the end values) and the rest
  ``r = w - t``; ``x_hat = W_r r + W_t t`` with ``W_r, W_t [H, L]`` shared by all channels.

The naive ones read the whole standardized series ``z [T, C]`` at the origins (so a daily period
longer than the lookback still works); DLinear reads windows ``[B, L, C]``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aaren_core.config import ConfigRecord
from aaren_core.tasks.event.data import DataError

__all__ = ["DLinear", "DLinearConfig", "last_value", "seasonal_naive", "windows"]


def _check_origins(origins: np.ndarray, need: int, what: str) -> None:
    if origins.size and origins.min() < need:
        raise DataError(f"{what} needs origins >= {need} (steps of history); got {int(origins.min())}")


def last_value(z: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
    """``z [T, C]``, ``origins [B]`` -> ``[B, H, C]``: the last observed value repeated."""
    _check_origins(origins, 1, "last value")
    return np.repeat(z[origins - 1][:, None, :], horizon, axis=1)


def seasonal_naive(z: np.ndarray, origins: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """``z [T, C]``, ``origins [B]`` -> ``[B, H, C]``: the value one period earlier, the last
    observed period repeated for ``H > period``."""
    _check_origins(origins, period, f"seasonal naive (period {period})")
    lags = origins[:, None] - period + (np.arange(horizon) % period)[None, :]  # [B, H]
    return z[lags]


def windows(z: np.ndarray, origins: np.ndarray, lookback: int) -> np.ndarray:
    """``z [T, C]`` -> the lookbacks ``z[s - L : s]`` of each origin, ``[B, L, C]`` (a copy)."""
    _check_origins(origins, lookback, f"a lookback of {lookback}")
    view = np.lib.stride_tricks.sliding_window_view(z, lookback, axis=0)  # [T - L + 1, C, L]
    return np.ascontiguousarray(view[origins - lookback].transpose(0, 2, 1))


@dataclasses.dataclass(frozen=True)
class DLinearConfig(ConfigRecord):
    """``lookback`` L, ``horizon`` H, moving-average ``kernel`` (odd; TSLib uses 25)."""

    CONFIG_NAME: ClassVar[str] = "dlinear config"

    lookback: int = 96
    horizon: int = 96
    kernel: int = 25

    def __post_init__(self) -> None:
        if self.lookback < 1 or self.horizon < 1 or self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"need lookback, horizon >= 1 and an odd kernel >= 1; got {self}")


class DLinear(nn.Module):
    """``forward(w [B, L, C]) -> [B, H, C]`` (module docstring); weights start at ``1 / L`` as in TSLib."""

    def __init__(self, config: DLinearConfig) -> None:
        super().__init__()
        self.config = config
        self.seasonal = nn.Linear(config.lookback, config.horizon)
        self.trend = nn.Linear(config.lookback, config.horizon)
        with torch.no_grad():
            self.seasonal.weight.fill_(1.0 / config.lookback)
            self.trend.weight.fill_(1.0 / config.lookback)

    def decompose(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """``w [B, L, C]`` -> ``(rest, trend)``, each ``[B, L, C]``."""
        pad = (self.config.kernel - 1) // 2
        x = w.transpose(1, 2)  # [B, C, L]
        padded = torch.cat([x[..., :1].expand(-1, -1, pad), x, x[..., -1:].expand(-1, -1, pad)], dim=-1)
        trend = F.avg_pool1d(padded, self.config.kernel, stride=1).transpose(1, 2)
        return w - trend, trend

    def forward(self, w: Tensor) -> Tensor:
        if w.dim() != 3 or w.shape[1] != self.config.lookback:
            raise ValueError(f"expected windows [B, {self.config.lookback}, C]; got {tuple(w.shape)}")
        rest, trend = self.decompose(w)
        out = self.seasonal(rest.transpose(1, 2)) + self.trend(trend.transpose(1, 2))  # [B, C, H]
        return out.transpose(1, 2)
