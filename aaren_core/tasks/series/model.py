"""The series forecaster (task ``series``): observation embedding -> backbone -> horizon heads.

A session is one regularly sampled series; each event is an observation ``x_t [C]`` (raw units)
with, optionally, ``F`` calendar features of its time (``aaren_core.tasks.series.data.calendar_features``).
Features after observation ``t`` forecast the next ``H`` steps of every channel:

    z_t     = (x_t - mean) / std                      (train statistics, buffers)
    e_t     = W_e [z_t, c_t] + b_e                    [d_model]
    y_t     = backbone(e_1..e_t)                      [d_model], an O(1) state for Aaren
    mu_t    = W_mu y_t + b_mu                         [H, C]     (standardized units)
    q_t^1   = W_1 y_t + b_1,  q_t^j = q_t^{j-1} + softplus(W_j y_t + b_j)   [H, C, Q]

Heads (``SeriesModelConfig.head``). ``quantile`` (the default): the mean is trained with squared
error, the quantiles with the pinball loss ``rho_tau(e) = max(tau e, (tau - 1) e)`` for
``e = target - q``; the cumulative softplus keeps the quantiles ordered. Direct heads need no
distributional assumption (meters and traffic are skewed and bounded), the mean is exactly what
TSLib's MSE scores, and the median (not the mean) is what MAE rewards, so both are reported.
``gaussian``: the same mean, and a Gaussian per step and channel around it,

    sigma_t = softplus(W_s y_t + b_s) + 1e-3          [H, C]
    q_t^j   = mu_t + sigma_t Phi^{-1}(tau_j)          (ordered by construction)

trained with the Gaussian NLL ``log sigma + (y - mu)^2 / (2 sigma^2)`` on a detached mean (so the
mean stays the squared-error estimate). ``bench/series_heads.py`` measures the two against each
other. All outputs are in standardized units; ``to_raw`` maps back.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aaren_core.attention.state import State
from aaren_core.config import ConfigRecord
from aaren_core.nn.backbones import Backbone, BackboneConfig, build_backbone

__all__ = ["HEADS", "SeriesForecast", "SeriesModel", "SeriesModelConfig", "pinball_loss", "series_loss"]

HEADS = ("quantile", "gaussian")


@dataclasses.dataclass(frozen=True)
class SeriesModelConfig(ConfigRecord):
    """Backbone, channel count ``n_channels`` (C), ``horizon`` (H), ``quantiles`` (Q levels,
    increasing, in (0, 1)), ``time_features`` (F: 0, or 4 calendar features)."""

    CONFIG_NAME: ClassVar[str] = "series model config"

    backbone: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    n_channels: int = 1
    horizon: int = 96
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
    time_features: int = 0
    #: ``quantile`` (direct quantiles, pinball loss) or ``gaussian`` (module docstring).
    head: str = "quantile"

    def __post_init__(self) -> None:
        q = tuple(float(x) for x in self.quantiles)
        object.__setattr__(self, "quantiles", q)
        if self.head not in HEADS:
            raise ValueError(f"unknown series head {self.head!r}; expected one of {HEADS}")
        if self.n_channels < 1 or self.horizon < 1 or self.time_features < 0:
            raise ValueError(f"need n_channels >= 1, horizon >= 1, time_features >= 0; got {self}")
        if not q or any(not 0 < x < 1 for x in q) or any(a >= b for a, b in itertools.pairwise(q)):
            raise ValueError(f"quantiles must increase strictly inside (0, 1); got {q}")


@dataclasses.dataclass(frozen=True)
class SeriesForecast:
    """Forecasts of the next ``H`` steps: ``mean [..., H, C]``, ``quantiles [..., H, C, Q]``; the
    Gaussian head also ``std [..., H, C]``."""

    mean: Tensor
    quantiles: Tensor
    std: Tensor | None = None


class SeriesModel(nn.Module):
    """Embedding, backbone and horizon heads (module docstring); the state is the backbone's."""

    def __init__(self, config: SeriesModelConfig) -> None:
        super().__init__()
        self.config = config
        c, h, q, d = config.n_channels, config.horizon, len(config.quantiles), config.backbone.d_model
        self.register_buffer("value_mean", torch.zeros(c))
        self.register_buffer("value_std", torch.ones(c))
        self.embed = nn.Linear(c + config.time_features, d)
        self.backbone: Backbone[Any] = build_backbone(config.backbone)
        self.mean_head = nn.Linear(d, h * c)
        if config.head == "gaussian":
            self.scale_head = nn.Linear(d, h * c)
            normal = torch.distributions.Normal(0.0, 1.0)
            self.register_buffer("z_levels", normal.icdf(torch.tensor(config.quantiles)))
        else:
            self.quantile_head = nn.Linear(d, h * c * q)

    def set_normalization(self, mean: Tensor, std: Tensor) -> None:
        """Fix the standardization (train statistics, ``[C]`` each) before training."""
        self.value_mean.copy_(torch.as_tensor(mean, dtype=self.value_mean.dtype))
        self.value_std.copy_(torch.as_tensor(std, dtype=self.value_std.dtype).clamp_min(1e-6))

    def standardize(self, values: Tensor) -> Tensor:
        """Raw ``[..., C]`` -> standardized ``[..., C]``."""
        return (values.to(self.value_mean.dtype) - self.value_mean) / self.value_std

    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        return self.backbone.init_state(batch, device)

    def _embed(self, values: Tensor, time_features: Tensor | None) -> Tensor:
        z = self.standardize(values)
        if self.config.time_features:
            if time_features is None or time_features.shape[-1] != self.config.time_features:
                raise ValueError(f"expected time_features [..., {self.config.time_features}]")
            z = torch.cat([z, time_features.to(z.dtype)], dim=-1)
        return self.embed(z)

    def _gaps(self, shape: torch.Size, device: torch.device) -> Tensor | None:
        # Regular steps: every gap is one step (a time-decay backbone ages its state by it).
        return torch.ones(shape, device=device) if self.config.backbone.time_decay else None

    def prefill(
        self, values: Tensor, time_features: Tensor | None = None, state: State | None = None
    ) -> tuple[Tensor, State]:
        """``values [B, N, C]`` raw (``time_features [B, N, F]``) -> ``(y [B, N, d_model], state)``."""
        if values.dim() != 3 or values.shape[-1] != self.config.n_channels:
            raise ValueError(f"expected values [B, N, {self.config.n_channels}]; got {tuple(values.shape)}")
        x = self._embed(values, time_features)
        return self.backbone.prefill(x, state, self._gaps(x.shape[:2], x.device))

    def step(self, values: Tensor, time_features: Tensor | None, state: State) -> tuple[Tensor, State]:
        """One observation per row: ``values [B, C]`` -> ``(y [B, d_model], state)``."""
        if values.dim() != 2 or values.shape[-1] != self.config.n_channels:
            raise ValueError(f"expected values [B, {self.config.n_channels}]; got {tuple(values.shape)}")
        x = self._embed(values, time_features)
        return self.backbone.step(x, state, self._gaps(x.shape[:1], x.device))

    def heads(self, y: Tensor) -> SeriesForecast:
        """Features ``y [..., d_model]`` -> forecast (standardized units)."""
        c, h, q = self.config.n_channels, self.config.horizon, len(self.config.quantiles)
        mean = self.mean_head(y).unflatten(-1, (h, c))
        if self.config.head == "gaussian":
            std = F.softplus(self.scale_head(y).unflatten(-1, (h, c))) + 1e-3
            return SeriesForecast(mean, mean.unsqueeze(-1) + std.unsqueeze(-1) * self.z_levels, std)
        raw = self.quantile_head(y).unflatten(-1, (h, c, q))
        quantiles = torch.cat([raw[..., :1], F.softplus(raw[..., 1:])], dim=-1).cumsum(dim=-1)
        return SeriesForecast(mean, quantiles)

    def forward(self, values: Tensor, time_features: Tensor | None = None) -> SeriesForecast:
        """Forecasts after every observation of ``values [B, N, C]``: ``[B, N, H, C(, Q)]``."""
        return self.heads(self.prefill(values, time_features)[0])

    def to_raw(self, forecast: SeriesForecast) -> SeriesForecast:
        """Standardized forecast -> raw units (``x = z std + mean`` per channel)."""
        mean, std = self.value_mean, self.value_std
        scale = None if forecast.std is None else forecast.std * std
        return SeriesForecast(forecast.mean * std + mean, forecast.quantiles * std[:, None] + mean[:, None], scale)


def pinball_loss(quantiles: Tensor, target: Tensor, levels: Tensor) -> Tensor:
    """``rho_tau(y - q) = max(tau (y - q), (tau - 1)(y - q))``: ``quantiles [..., Q]``, ``target [...]``,
    ``levels [Q]`` -> ``[..., Q]``. Its expectation is minimized by the tau-quantile."""
    err = target.unsqueeze(-1) - quantiles
    return torch.maximum(levels * err, (levels - 1) * err)


def series_loss(
    forecast: SeriesForecast, target: Tensor, mask: Tensor, levels: Tensor, quantile_weight: float = 1.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean squared error of the mean plus ``quantile_weight`` times the mean pinball loss (the
    quantile head) or the Gaussian NLL around the detached mean (the Gaussian head).

    ``target [B, N, H, C]`` standardized, ``mask`` the entries scored: ``[B, N]`` positions, or
    ``[B, N, H, C]`` entries (a series with gaps: only observed targets). Returns the loss and its
    terms (``mse``, ``mae`` of the mean, ``pinball``; ``nll`` for the Gaussian head), each a mean
    over scored entries.
    """
    if mask.shape == target.shape:
        w = mask.to(target.dtype)
        n = w.sum().clamp_min(1)
    else:
        w = mask.to(target.dtype)[..., None, None]  # [B, N, 1, 1]
        n = (w.sum() * target.shape[-1] * target.shape[-2]).clamp_min(1)
    err = forecast.mean - target
    mse = (err.square() * w).sum() / n
    mae = (err.abs() * w).sum() / n
    pin = (pinball_loss(forecast.quantiles, target, levels).mean(-1) * w).sum() / n
    terms = {"mse": mse, "mae": mae, "pinball": pin}
    if forecast.std is None:
        return mse + quantile_weight * pin, terms
    std = forecast.std
    nll = ((std.log() + 0.5 * ((forecast.mean.detach() - target) / std).square()) * w).sum() / n
    terms["nll"] = nll
    return mse + quantile_weight * nll, terms
