"""Forecast heads: the next gap as a log-normal mixture, the next mark, the next values.

The time head is the intensity-free temporal point process of Shchur et al. (2020): the gap
``tau > 0`` to the next event has density

    p(tau) = sum_k pi_k LogNormal(tau; mu_k, sigma_k)
           = sum_k pi_k N(log tau; mu_k, sigma_k) / tau

so the log-likelihood is exact, the mean is ``sum_k pi_k exp(mu_k + sigma_k^2 / 2)`` in closed form
and quantiles come from bisection on the CDF ``sum_k pi_k Phi((log tau - mu_k) / sigma_k)``.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ForecastHeads", "HeadOutput", "LogNormalMixture"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
MIN_LOG_SCALE = -7.0
MAX_LOG_SCALE = 3.0


@dataclasses.dataclass(frozen=True)
class LogNormalMixture:
    """Mixture of ``K`` log-normals over ``[...]`` batch dims: ``logits, loc, log_scale [..., K]``.

    ``loc`` and ``log_scale`` are the mean and log std of ``log tau``.
    """

    logits: Tensor
    loc: Tensor
    log_scale: Tensor

    @property
    def log_weights(self) -> Tensor:
        return torch.log_softmax(self.logits, dim=-1)

    def log_prob(self, tau: Tensor) -> Tensor:
        """``log p(tau)`` for ``tau [...] > 0`` -> ``[...]``."""
        log_tau = torch.log(tau).unsqueeze(-1)  # [..., 1]
        z = (log_tau - self.loc) * torch.exp(-self.log_scale)
        log_normal = -0.5 * z.square() - self.log_scale - _LOG_SQRT_2PI  # density of log tau, [..., K]
        return torch.logsumexp(self.log_weights + log_normal, dim=-1) - log_tau.squeeze(-1)

    def cdf(self, tau: Tensor) -> Tensor:
        """``P(gap <= tau)`` for ``tau [...]`` (``tau <= 0`` gives 0) -> ``[...]``."""
        log_tau = torch.log(tau.clamp_min(torch.finfo(tau.dtype).tiny)).unsqueeze(-1)
        z = (log_tau - self.loc) * torch.exp(-self.log_scale)
        return (torch.softmax(self.logits, dim=-1) * torch.special.ndtr(z)).sum(-1)

    def mean(self) -> Tensor:
        """``E[tau] = sum_k pi_k exp(mu_k + sigma_k^2 / 2)`` -> ``[...]``."""
        return torch.exp(torch.logsumexp(self.log_weights + self.loc + 0.5 * torch.exp(2 * self.log_scale), dim=-1))

    def quantiles(self, levels: Tensor, iterations: int = 48) -> Tensor:
        """Gap quantiles at ``levels [Q]`` in (0, 1) -> ``[..., Q]``, by bisection on ``log tau``.

        Every component's quantile brackets the mixture's, so the search starts from
        ``[min_k mu_k - 9 sigma_k, max_k mu_k + 9 sigma_k]``; 48 halvings leave an error far below
        float precision.
        """
        scale = torch.exp(self.log_scale)
        lo = (self.loc - 9 * scale).amin(-1, keepdim=True).expand(*self.loc.shape[:-1], levels.numel()).clone()
        hi = (self.loc + 9 * scale).amax(-1, keepdim=True).expand_as(lo).clone()
        weights = torch.softmax(self.logits, dim=-1).unsqueeze(-2)  # [..., 1, K]
        loc, inv_scale = self.loc.unsqueeze(-2), torch.exp(-self.log_scale).unsqueeze(-2)
        target = levels.to(lo)
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)  # [..., Q]
            below = (weights * torch.special.ndtr((mid.unsqueeze(-1) - loc) * inv_scale)).sum(-1) < target
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        return torch.exp(0.5 * (lo + hi))

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """One gap per batch element -> ``[...]``."""
        probs = torch.softmax(self.logits, dim=-1)
        flat = probs.reshape(-1, probs.shape[-1])
        k = torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1]).unsqueeze(-1)
        loc = self.loc.gather(-1, k).squeeze(-1)
        scale = torch.exp(self.log_scale.gather(-1, k).squeeze(-1))
        noise = torch.randn(loc.shape, generator=generator, dtype=loc.dtype, device=loc.device)
        return torch.exp(loc + scale * noise)


@dataclasses.dataclass(frozen=True)
class HeadOutput:
    """What the heads predict for the next event, over batch dims ``[...]``.

    ``time``: the gap distribution (in the data's time unit); ``mark_logits [..., M]``;
    ``value_mean, value_std [..., V]`` in the data's raw units (``V`` may be 0).
    """

    time: LogNormalMixture
    mark_logits: Tensor
    value_mean: Tensor
    value_std: Tensor


class ForecastHeads(nn.Module):
    """Linear heads from backbone features ``y [..., d_model]`` to a ``HeadOutput``.

    The gap mixture works on ``log tau`` standardized by buffers ``log_dt_mean, log_dt_std``
    (fitted on training gaps); values are predicted in standardized units and mapped back with
    buffers ``value_mean, value_std`` (fitted on training values).
    """

    def __init__(self, d_model: int, num_marks: int, value_width: int, n_components: int) -> None:
        super().__init__()
        self.n_components = n_components
        self.time = nn.Linear(d_model, 3 * n_components)
        self.mark = nn.Linear(d_model, num_marks)
        self.value = nn.Linear(d_model, 2 * value_width) if value_width else None
        self.register_buffer("log_dt_mean", torch.zeros(()))
        self.register_buffer("log_dt_std", torch.ones(()))
        self.register_buffer("value_mean", torch.zeros(value_width))
        self.register_buffer("value_std", torch.ones(value_width))

    def forward(self, y: Tensor) -> HeadOutput:
        logits, loc, log_scale = self.time(y).chunk(3, dim=-1)
        log_scale = log_scale.clamp(MIN_LOG_SCALE, MAX_LOG_SCALE)
        time = LogNormalMixture(
            logits=logits,
            loc=loc * self.log_dt_std + self.log_dt_mean,
            log_scale=log_scale + torch.log(self.log_dt_std),
        )
        if self.value is None:
            empty = y.new_zeros(*y.shape[:-1], 0)
            return HeadOutput(time, self.mark(y), empty, empty)
        mean, log_std = self.value(y).chunk(2, dim=-1)
        std = torch.exp(log_std.clamp(MIN_LOG_SCALE, MAX_LOG_SCALE))
        return HeadOutput(time, self.mark(y), mean * self.value_std + self.value_mean, std * self.value_std)

    def standardize_values(self, values: Tensor) -> Tensor:
        """Raw values ``[..., V]`` -> standardized ``[..., V]``."""
        return (values - self.value_mean) / self.value_std


def value_nll(out: HeadOutput, values: Tensor, std_scale: Tensor) -> Tensor:
    """Gaussian NLL of raw ``values [..., V]`` in standardized units (summed over ``V``) -> ``[...]``.

    Measured in standardized units (``- log std_j`` of each column added), so columns of
    different scales weigh alike and the figure is comparable across datasets.
    """
    z = (values - out.value_mean) / out.value_std
    return (0.5 * z.square() + torch.log(out.value_std / std_scale) + _LOG_SQRT_2PI).sum(-1)


def mark_nll(out: HeadOutput, marks: Tensor) -> Tensor:
    """Categorical NLL of ``marks [...]`` -> ``[...]``."""
    logits = out.mark_logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), marks.reshape(-1), reduction="none").view(marks.shape)
