"""Forecast heads: the next gap as a log-normal mixture, the next mark, the next values.

The time head is the intensity-free temporal point process of Shchur et al. (2020): the gap
``tau > 0`` to the next event has density

    p(tau) = sum_k pi_k LogNormal(tau; mu_k, sigma_k)
           = sum_k pi_k N(log tau; mu_k, sigma_k) / tau

so the log-likelihood is exact, the mean is ``sum_k pi_k exp(mu_k + sigma_k^2 / 2)`` in closed form
and quantiles come from bisection on the CDF ``sum_k pi_k Phi((log tau - mu_k) / sigma_k)``.

Two summaries make the served forecast robust and honest on any data (``gap_summaries``):

- **Point forecast**: the mean truncated at the largest training gap ``U``,
  ``E[tau | tau <= U] = sum_k pi_k e^(mu_k + sigma_k^2/2) Phi(z_k - sigma_k) / sum_k pi_k Phi(z_k)``,
  ``z_k = (log U - mu_k) / sigma_k``. It never exceeds ``U``, however wide or far a component of
  negligible weight is (the plain mean can be astronomically large), and equals the mean wherever
  the mixture puts no mass past ``U``.
- **Quantiles at the recorded resolution** ``w``: training jitters each recorded time ``t`` to
  ``t + u``, ``u ~ U(0, w)``, and the model learns the jittered gap ``tau``. The recorded gap of
  the next event is ``G = w floor((u + tau) / w)`` (``u`` the jitter of the last event), so
  ``P(G <= n w) = P(tau + u < (n + 1) w) = H((n + 1) w)`` with ``H(x) = (I(x) - I(x - w)) / w`` and
  ``I(x) = int_0^x F = x F(x) - E[tau; tau <= x]`` in closed form. Served quantiles are those of
  ``G``: the smallest ``n w`` with ``H((n + 1) w) >= p``.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "ForecastHeads",
    "HeadOutput",
    "LogNormalMixture",
    "discrete_quantiles",
    "integrated_cdf",
    "log_partial_expectation",
    "truncated_mean",
]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
MIN_LOG_SCALE = -7.0
MAX_LOG_SCALE = 3.0
# Bounds of the gap mixture, in units of the training log-gaps' std. A component's mean is
# exp(mu + sigma^2 / 2): a component with a negligible weight, hence free to drift in training,
# could otherwise make the mixture's mean astronomically large (seen: 4.6e7 minutes) without
# moving the likelihood. With sigma <= e^0.5 and |mu| <= 6 std every component's mean stays
# within a factor of about e^(1.36 s^2) of its median (s: the log-gap std, 1.37 on the flights
# task). Trained components use log scales up to about 0.47 (99th percentile of weighted ones).
MAX_TIME_LOG_SCALE = 0.5
MAX_TIME_LOC = 6.0


def log_partial_expectation(log_weights: Tensor, loc: Tensor, log_scale: Tensor, log_x: Tensor) -> Tensor:
    """``log E[tau; tau <= x] = log sum_k pi_k exp(mu_k + sigma_k^2 / 2) Phi(z_k - sigma_k)`` with
    ``z_k = (log x - mu_k) / sigma_k``, for mixture parameters ``[..., K]`` and ``log_x [..., Q]``
    -> ``[..., Q]``. Computed in log space (``log_ndtr``), so a component whose mean overflows
    float64 still gives a finite term wherever its mass below ``x`` is small.
    """
    scale = torch.exp(log_scale).unsqueeze(-2)  # [..., 1, K]
    z = (log_x.unsqueeze(-1) - loc.unsqueeze(-2)) / scale  # [..., Q, K]
    terms = (log_weights + loc).unsqueeze(-2) + 0.5 * scale.square() + torch.special.log_ndtr(z - scale)
    return torch.logsumexp(terms, dim=-1)


def truncated_mean(log_weights: Tensor, loc: Tensor, log_scale: Tensor, bound: float) -> Tensor:
    """``E[tau | tau <= U]`` of the mixture ``[..., K]`` (float64) -> ``[...]``, at most ``U = bound``.

    ``E[tau | tau <= U] = sum_k pi_k e^(mu_k + sigma_k^2/2) Phi(z_k - sigma_k) / sum_k pi_k Phi(z_k)``,
    ``z_k = (log U - mu_k) / sigma_k``; both sums in log space. Where every component lies far
    past ``U`` the ratio tends to ``U``; the final ``min`` only absorbs rounding.
    """
    log_u = torch.full((*loc.shape[:-1], 1), math.log(bound), dtype=loc.dtype, device=loc.device)
    log_num = log_partial_expectation(log_weights, loc, log_scale, log_u).squeeze(-1)
    log_den = torch.logsumexp(log_weights + torch.special.log_ndtr((log_u - loc) * torch.exp(-log_scale)), dim=-1)
    return torch.exp(log_num - log_den).clamp_max(bound)


def integrated_cdf(log_weights: Tensor, loc: Tensor, log_scale: Tensor, x: Tensor) -> Tensor:
    """``I(x) = int_0^x F(s) ds = x F(x) - E[tau; tau <= x]`` (0 for ``x <= 0``) for mixture parameters
    ``[..., K]`` and ``x [..., Q]`` -> ``[..., Q]`` (float64 in, float64 out)."""
    positive = x > 0
    log_x = torch.log(torch.where(positive, x, torch.ones_like(x)))
    z = (log_x.unsqueeze(-1) - loc.unsqueeze(-2)) * torch.exp(-log_scale).unsqueeze(-2)  # [..., Q, K]
    cdf = (torch.exp(log_weights).unsqueeze(-2) * torch.special.ndtr(z)).sum(-1)
    out = x * cdf - torch.exp(log_partial_expectation(log_weights, loc, log_scale, log_x))
    return torch.where(positive, out.clamp_min(0), torch.zeros_like(out))


def discrete_cdf(log_weights: Tensor, loc: Tensor, log_scale: Tensor, n: Tensor, resolution: float) -> Tensor:
    """``P(G <= n w) = H((n + 1) w) = (I((n + 1) w) - I(n w)) / w`` of the recorded gap ``G`` (see the
    module docstring) for integers ``n [..., Q]`` (as floats, ``n < 0`` gives 0) -> ``[..., Q]``."""
    w = resolution
    upper = integrated_cdf(log_weights, loc, log_scale, (n + 1) * w)
    lower = integrated_cdf(log_weights, loc, log_scale, n * w)
    return torch.where(n >= 0, ((upper - lower) / w).clamp(0, 1), torch.zeros_like(upper))


def discrete_quantiles(
    log_weights: Tensor, loc: Tensor, log_scale: Tensor, quantiles: Tensor, levels: Tensor, resolution: float
) -> Tensor:
    """Quantiles of the recorded gap ``G`` at ``levels [Q]`` from the continuous gap's ``quantiles
    [..., Q]`` (any dtype; the mixture ``[..., K]`` float64) -> ``[..., Q]`` float64 multiples of ``w``.

    ``F(x - w) <= H(x) <= F(x)``, so with ``q`` the continuous quantile the smallest ``m >= 1`` with
    ``H(m w) >= p`` is ``m0 = ceil(q / w)`` or ``m0 + 1``; trying ``m0 - 1`` too absorbs an
    approximate ``q``. The quantile is ``(m - 1) w``. One ``integrated_cdf`` call on the four
    points ``(m0 - 2 .. m0 + 1) w`` gives the three ``H``.
    """
    w = resolution
    m0 = torch.ceil(quantiles.double() / w).clamp_min(1)  # [..., Q]
    steps = torch.arange(-2.0, 2.0, dtype=m0.dtype, device=m0.device)  # [4]
    x = ((m0.unsqueeze(-1) + steps) * w).flatten(-2)  # [..., 4Q]
    i = integrated_cdf(log_weights, loc, log_scale, x).unflatten(-1, (m0.shape[-1], 4))  # [..., Q, 4]
    h = (i[..., 1:] - i[..., :-1]) / w  # H((m0 - 1) w), H(m0 w), H((m0 + 1) w): [..., Q, 3]
    holds = h >= levels.to(h).unsqueeze(-1)
    holds[..., -1] = True  # H((m0 + 1) w) >= F(q) = p up to rounding
    m = m0 - 1 + holds.to(torch.int8).argmax(-1).to(m0)  # the first candidate that holds
    return (m - 1).clamp_min(0) * w


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
        """``E[tau] = sum_k pi_k exp(mu_k + sigma_k^2 / 2)`` -> ``[...]``, in float64: a wide component
        overflows float32 (``exp(sigma^2 / 2)`` passes 3.4e38 once sigma is above about 13)."""
        log_terms = (self.log_weights + self.loc).double() + 0.5 * torch.exp(2 * self.log_scale.double())
        return torch.exp(torch.logsumexp(log_terms, dim=-1))

    def _double(self) -> tuple[Tensor, Tensor, Tensor]:
        return torch.log_softmax(self.logits.double(), dim=-1), self.loc.double(), self.log_scale.double()

    def truncated_mean(self, bound: float) -> Tensor:
        """``E[tau | tau <= bound]`` -> ``[...]`` (float64), at most ``bound``; see ``truncated_mean``."""
        return truncated_mean(*self._double(), bound)

    def discrete_cdf(self, gap: Tensor, resolution: float) -> Tensor:
        """``P(G <= gap)`` of the recorded gap ``G`` at resolution ``w`` for ``gap [...]`` -> ``[...]``
        (float64): ``H((floor(gap / w) + 1) w)``, see ``discrete_cdf``. A ``gap`` within ``1e-6 w``
        below a grid point counts as on it (recorded gaps carry rounding)."""
        n = torch.floor(gap.double() / resolution + 1e-6).unsqueeze(-1)
        return discrete_cdf(*self._double(), n, resolution).squeeze(-1)

    def discrete_quantiles(self, levels: Tensor, resolution: float) -> Tensor:
        """Quantiles of the recorded gap at resolution ``w`` at ``levels [Q]`` -> ``[..., Q]`` (float64
        multiples of ``w``); see ``discrete_quantiles``."""
        return discrete_quantiles(*self._double(), self.quantiles(levels), levels, resolution)

    def quantiles(self, levels: Tensor, stages: int | None = None, grid: int = 8) -> Tensor:
        """Gap quantiles at ``levels [Q]`` in (0, 1) -> ``[..., Q]``, by a refined grid search on ``log tau``.

        Every component's quantile brackets the mixture's, so the search starts from
        ``[min_k mu_k - 9 sigma_k, max_k mu_k + 9 sigma_k]``. Each stage evaluates the CDF on
        ``grid + 1`` points of the current bracket and keeps the cell that holds the level; the
        result interpolates the CDF linearly inside the last cell, then takes one Newton step.
        ``stages`` defaults to 4 (relative error about 1e-6 in float32, its limit) and 7 in float64
        (about 1e-12). A few batched ops where bisection takes dozens: this runs on every event.
        """
        if stages is None:
            stages = 7 if self.loc.dtype == torch.float64 else 4
        scale = torch.exp(self.log_scale)
        shape = (*self.loc.shape[:-1], levels.numel())
        lo = (self.loc - 9 * scale).amin(-1, keepdim=True).expand(shape)  # [..., Q]
        hi = (self.loc + 9 * scale).amax(-1, keepdim=True).expand(shape)
        weights = torch.softmax(self.logits, dim=-1).unsqueeze(-2)  # [..., 1, K]
        loc, inv_scale = self.loc.unsqueeze(-2), torch.exp(-self.log_scale).unsqueeze(-2)  # [..., 1, K]
        target = levels.to(lo)  # [Q]
        frac = torch.linspace(0, 1, grid + 1, dtype=lo.dtype, device=lo.device)  # [G+1]
        for _ in range(stages):
            z = lo.unsqueeze(-1) + (hi - lo).unsqueeze(-1) * frac  # [..., Q, G+1]
            u = (z.unsqueeze(-1) - loc.unsqueeze(-2)) * inv_scale.unsqueeze(-2)  # [..., Q, G+1, K]
            cdf = (weights.unsqueeze(-2) * torch.special.ndtr(u)).sum(-1)  # [..., Q, G+1]
            cell = ((cdf < target.unsqueeze(-1)).sum(-1, keepdim=True) - 1).clamp(0, grid - 1)  # [..., Q, 1]
            lo, hi = z.gather(-1, cell).squeeze(-1), z.gather(-1, cell + 1).squeeze(-1)
            cdf_lo, cdf_hi = cdf.gather(-1, cell).squeeze(-1), cdf.gather(-1, cell + 1).squeeze(-1)
        t = ((target - cdf_lo) / (cdf_hi - cdf_lo).clamp_min(torch.finfo(lo.dtype).tiny)).clamp(0, 1)
        z = lo + t * (hi - lo)  # [..., Q]
        # One Newton step on F(z) = level squares the interpolation error; it stays inside the cell.
        u = (z.unsqueeze(-1) - loc) * inv_scale  # [..., Q, K]
        cdf = (weights * torch.special.ndtr(u)).sum(-1)
        pdf = (weights * inv_scale * torch.exp(-0.5 * u.square())).sum(-1) / math.sqrt(2 * math.pi)
        z = torch.minimum(torch.maximum(z - (cdf - target) / pdf.clamp_min(torch.finfo(z.dtype).tiny), lo), hi)
        return torch.exp(z)

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
    buffers ``value_mean, value_std`` (fitted on training values). ``gap_max`` (the largest
    training gap; 0: not recorded) bounds the point forecast (``gap_bound``); ``time_resolution``
    (the recorded times' resolution ``w``; 0: continuous) is the grid of the served quantiles.
    """

    def __init__(
        self,
        d_model: int,
        num_marks: int,
        value_width: int,
        n_components: int,
        *,
        gap_max: float = 0.0,
        time_resolution: float = 0.0,
    ) -> None:
        super().__init__()
        self.n_components = n_components
        self.gap_max = gap_max
        self.time_resolution = time_resolution
        self.time = nn.Linear(d_model, 3 * n_components)
        self.mark = nn.Linear(d_model, num_marks)
        self.value = nn.Linear(d_model, 2 * value_width) if value_width else None
        self.register_buffer("log_dt_mean", torch.zeros(()))
        self.register_buffer("log_dt_std", torch.ones(()))
        self.register_buffer("value_mean", torch.zeros(value_width))
        self.register_buffer("value_std", torch.ones(value_width))

    def forward(self, y: Tensor) -> HeadOutput:
        logits, loc, log_scale = self.time(y).chunk(3, dim=-1)
        loc = loc.clamp(-MAX_TIME_LOC, MAX_TIME_LOC)
        log_scale = log_scale.clamp(MIN_LOG_SCALE, MAX_TIME_LOG_SCALE)
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

    def gap_bound(self) -> float:
        """The upper bound ``U`` of the point forecast, in the data's time unit: ``gap_max``, or for a
        model that did not record it, ``exp(log_dt_mean + MAX_TIME_LOC * log_dt_std)`` (the largest
        median any component can have)."""
        if self.gap_max > 0:
            return float(self.gap_max)
        return math.exp(float(self.log_dt_mean) + MAX_TIME_LOC * float(self.log_dt_std))

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
