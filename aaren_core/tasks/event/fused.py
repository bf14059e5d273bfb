"""The serving fast path: one event step and the forecast of an ``EventModel`` on plain tensors.

``EventModel.step`` followed by ``EventModel.forecast`` is the reference (module by module, the
same code training and offline evaluation run). At batch 1 that is a few hundred small eager ops
and as many Python calls, almost all of it per-op overhead. ``FusedEventModel`` computes the same
numbers (within float32 rounding; ``tests/core/test_fused.py`` compares outputs and final states)
from weights folded once into a few matrices:

- the embedding is ``x = (E + b)[mark] + [phi(dt), v] W^T`` (the time and value maps, the value
  standardization and the bias in one ``addmm`` on a gathered row);
- each Aaren layer uses the folded score/value projection of ``AarenAttention`` and the one-token
  recurrence of docs/architecture.md section 1 without the ``-inf - -inf`` guard, which only an empty
  *result* needs: the new score is finite, so ``m' = max(m, s_t)`` is finite;
- all heads are one ``addmm`` into ``[logits | loc | log_scale | value log std | marks | value
  mean]``, then one ``clamp`` with per-column bounds and one ``addcmul`` with per-column scale and
  shift (the log-gap and value de-standardization);
- gap quantiles come from ``mixture_quantiles``, a search bracketed by the components' own
  quantiles (fewer stages than ``LogNormalMixture.quantiles``), then, for a model with a time
  resolution, ``heads.discrete_quantiles`` (the gap recorded at that resolution); the point
  forecast is ``heads.truncated_mean`` (the same float64 functions the reference calls).

It is a snapshot of the weights: build a new one after changing them. It holds eval-mode
semantics (no dropout). Only the Aaren backbone has a fused step; any backbone has the forecast.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from aaren_core.nn.backbones import AarenModel
from aaren_core.tasks.event import heads

if TYPE_CHECKING:
    from aaren_core.tasks.event.model import EventModel

__all__ = ["FusedEventModel", "FusedLayer", "SearchConstants", "mixture_quantiles", "search_schedule"]

#: The quantile search: ``QUANTILE_STAGES`` grid stages of ``QUANTILE_GRID`` cells each, then
#: ``QUANTILE_NEWTON`` Newton steps from the last cell's midpoint (see ``mixture_quantiles``).
QUANTILE_STAGES = 3
QUANTILE_GRID = 16
QUANTILE_NEWTON = 2
#: ``(stages, grid)`` by the number of rows searched on CPU, where a wide grid's elements cost more
#: than its fewer ops past a few dozen rows (bench/step.py). Each ends in cells of 1/4096 of the
#: bracket, so all are as accurate; elsewhere (GPU: launches cost, elements barely) the default.
CPU_SCHEDULE = ((16, (3, 16)), (256, (4, 8)), (None, (6, 4)))


def search_schedule(rows: int, device: torch.device) -> tuple[int, int]:
    """``(stages, grid)`` for a search over ``rows`` mixtures on ``device``."""
    if device.type != "cpu":
        return QUANTILE_STAGES, QUANTILE_GRID
    return next(schedule for limit, schedule in CPU_SCHEDULE if limit is None or rows <= limit)


_SQRT1_2 = math.sqrt(0.5)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


class SearchConstants(NamedTuple):
    """What ``mixture_quantiles`` needs of the levels ``p [Q]`` and the grid, made once per levels."""

    levels: Tensor  # [Q]: p
    target: Tensor  # [Q]: 2 p - 1
    target_col: Tensor  # [Q, 1]
    ppf: Tensor  # [Q, 1]: Phi^-1(p) / sqrt(2)
    inner: Tensor  # [G - 1]: 1 .. G - 1
    cells: Tensor  # [S + 1]: G^-1 .. G^-S, then G^-S / 2 (the last cell's midpoint)
    sqrt1_2: Tensor  # []
    two_over_sqrt_pi: Tensor  # []
    stages: int
    newton: int

    @classmethod
    def make(
        cls,
        levels: tuple[float, ...],
        dtype: torch.dtype,
        device: torch.device | str | None = None,
        *,
        stages: int = QUANTILE_STAGES,
        grid: int = QUANTILE_GRID,
        newton: int = QUANTILE_NEWTON,
    ) -> SearchConstants:
        if not levels or not all(0 < p < 1 for p in levels) or stages < 1 or grid < 2:
            raise ValueError(f"need levels in (0, 1), stages >= 1 and grid >= 2; got {levels}, {stages}, {grid}")
        p = torch.tensor(levels, dtype=torch.float64, device=device)
        cells = [float(grid) ** -(s + 1) for s in range(stages)]
        cells.append(cells[-1] / 2)

        def const(x: Tensor | list[float] | float) -> Tensor:
            return torch.as_tensor(x, dtype=torch.float64, device=device).to(dtype)

        target = const(2 * p - 1)
        return cls(
            levels=const(p),
            target=target,
            target_col=target.unsqueeze(-1),
            ppf=const(torch.special.ndtri(p) * _SQRT1_2).unsqueeze(-1),
            inner=torch.arange(1, grid, dtype=dtype, device=device),
            cells=const(cells),
            sqrt1_2=const(_SQRT1_2),
            two_over_sqrt_pi=const(_TWO_OVER_SQRT_PI),
            stages=stages,
            newton=newton,
        )


def mixture_quantiles(weights: Tensor, loc: Tensor, inv_scale: Tensor, constants: SearchConstants) -> Tensor:
    """Quantiles of ``exp(Z)`` where ``Z`` has the mixture CDF ``F(z) = sum_k pi_k Phi((z - mu_k) / sigma_k)``.

    ``weights pi [B, K]`` (summing to 1), ``loc mu [B, K]``, ``inv_scale 1 / sigma [B, K]`` and
    ``constants = SearchConstants.make(levels, ...)`` -> ``[B, Q]``.

    ``F <= p`` at ``min_k (mu_k + sigma_k Phi^-1(p))`` and ``F >= p`` at the max (every component is
    below, resp. above, its own level there), so the search starts from that bracket, usually much
    narrower than ``mu +- 9 sigma``. Each of ``S`` stages evaluates ``F`` on the ``G - 1`` inner
    points of the bracket's ``G`` cells and keeps the cell holding the level; then Newton steps
    from the last cell's midpoint, each kept inside that cell, so the error is at most the cell's
    width ``G^-S`` of the bracket whatever the mixture. ``F`` is written with ``erf``:
    ``2 F - 1 = sum_k pi_k erf(u_k)``, ``u_k = (z - mu_k) / (sigma_k sqrt 2)``, with the slope
    ``d(2 F - 1)/dz = sum_k pi_k (2 / sqrt(pi)) exp(-u_k^2) / (sigma_k sqrt 2)``.
    """
    c = constants
    b, k = loc.shape
    inv = inv_scale * c.sqrt1_2  # [B, K]
    loc3, inv3 = loc.unsqueeze(1), inv.unsqueeze(1)  # [B, 1, K]
    lo, hi = torch.aminmax(torch.addcdiv(loc3, c.ppf, inv3), dim=-1)  # [B, Q]
    widths = (hi - lo).unsqueeze(-1) * c.cells  # [B, Q, S + 1]: each stage's cell width
    loc4, inv4 = loc3.unsqueeze(1), inv3.unsqueeze(1)  # [B, 1, 1, K]
    w_col = weights.unsqueeze(-1)  # [B, K, 1]
    target = c.target_col.expand(b, -1, -1).contiguous()  # [B, Q, 1]
    for s in range(c.stages):
        z = torch.addcmul(lo.unsqueeze(-1), widths[..., s : s + 1], c.inner)  # [B, Q, G-1]
        erf = torch.erf((z.unsqueeze(-1) - loc4) * inv4)  # [B, Q, G-1, K]
        two_f = torch.bmm(erf.view(b, -1, k), w_col).view(z.shape)  # 2 F(z) - 1, increasing along the grid
        lo = torch.addcmul(lo, torch.searchsorted(two_f, target).squeeze(-1), widths[..., s])
    hi = lo + widths[..., c.stages - 1]
    z = lo + widths[..., c.stages]
    slope_weights = (weights * inv).mul_(c.two_over_sqrt_pi).unsqueeze(-1)  # [B, K, 1]
    tiny = torch.finfo(z.dtype).tiny
    for _ in range(c.newton):
        u = (z.unsqueeze(-1) - loc3) * inv3  # [B, Q, K]
        two_f = torch.bmm(torch.erf(u), w_col).view(z.shape)
        slope = torch.bmm(torch.exp(u.square().neg_()), slope_weights).view(z.shape)
        z = torch.clamp(z - (two_f - c.target) / slope.clamp_min(tiny), lo, hi)
    return torch.exp(z)


def _raw_gap_rate(rate: Tensor | None, log_dt_mean: Tensor) -> Tensor | None:
    """``lambda [H]`` per typical gap -> per unit of raw gap: ``lambda exp(-log_dt_mean)``."""
    return None if rate is None else (rate * torch.exp(-log_dt_mean)).detach().clone()


@dataclasses.dataclass(frozen=True, eq=False)
class FusedLayer:
    """One ``AarenLayer``'s weights: the norms, the folded score/value map ``[H + d, d]``, the
    output map and the feed-forward; with time decay, ``rate [H]``: the decay per unit of raw gap
    (``lambda_h`` over the typical gap, so the step ages the state by ``rate * dt``)."""

    norm1: tuple[Tensor, Tensor]
    score_value: tuple[Tensor, Tensor]
    out: tuple[Tensor, Tensor]
    norm2: tuple[Tensor, Tensor]
    fc1: tuple[Tensor, Tensor]
    fc2: tuple[Tensor, Tensor]
    eps: tuple[float, float]
    rate: Tensor | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class FusedEventModel:
    """An ``EventModel``'s weights folded for serving (see the module docstring). Build with ``from_model``."""

    d_model: int
    n_heads: int
    n_components: int
    num_marks: int
    value_width: int
    freqs: Tensor  # [F/2]
    mark_table: Tensor  # [M, d]: E + the embedding's bias
    embed_weight: Tensor  # [d, 1 + F + V]
    layers: tuple[FusedLayer, ...] | None  # None: the backbone has no fused step
    final_norm: tuple[Tensor, Tensor, float]
    head: tuple[Tensor, Tensor]  # weight [P, d], bias [P]
    head_low: Tensor  # [P]
    head_high: Tensor  # [P]
    head_scale: Tensor  # [P]
    head_shift: Tensor  # [P]
    exp_sign: Tensor  # [K + V]: -1 on log scales (1 / sigma wanted), +1 on value log stds (std / value_std)
    value_std: Tensor  # [V]
    gap_bound: float  # U of the point forecast E[tau | tau <= U]
    time_resolution: float  # grid of the served quantiles (0: continuous)
    _constants: dict[tuple[tuple[float, ...], torch.dtype, tuple[int, int]], SearchConstants] = dataclasses.field(
        default_factory=dict, repr=False
    )

    @classmethod
    def from_model(cls, model: EventModel) -> FusedEventModel:
        """Fold ``model``'s current weights (autograd off; normal tensors even inside inference mode)."""
        with torch.inference_mode(False), torch.no_grad():
            return cls._fold(model)

    @classmethod
    def _fold(cls, model: EventModel) -> FusedEventModel:
        config = model.config
        embed, forecast_heads = model.embed, model.heads
        weight, bias = embed._time_value_projection()
        layers = None
        if isinstance(model.backbone, AarenModel):
            layers = tuple(
                FusedLayer(
                    norm1=(layer.norm1.weight.detach().clone(), layer.norm1.bias.detach().clone()),
                    score_value=tuple(t.detach().clone() for t in layer.mixer._score_value_projection()),  # type: ignore[arg-type]
                    out=(layer.mixer.out_proj.weight.detach().clone(), layer.mixer.out_proj.bias.detach().clone()),
                    norm2=(layer.norm2.weight.detach().clone(), layer.norm2.bias.detach().clone()),
                    fc1=(layer.ff.fc1.weight.detach().clone(), layer.ff.fc1.bias.detach().clone()),
                    fc2=(layer.ff.fc2.weight.detach().clone(), layer.ff.fc2.bias.detach().clone()),
                    eps=(layer.norm1.eps, layer.norm2.eps),
                    rate=_raw_gap_rate(layer.mixer.decay_rate(), model.heads.log_dt_mean),
                )
                for layer in model.backbone.layers
            )
        norm = model.backbone.norm
        k, m, v = forecast_heads.n_components, config.num_marks, config.value_width
        t_w, t_b = forecast_heads.time.weight, forecast_heads.time.bias  # [3K, d]: logits, loc, log scale
        parts_w, parts_b = [t_w], [t_b]
        if forecast_heads.value is not None:
            parts_w += [forecast_heads.value.weight[v:], forecast_heads.mark.weight, forecast_heads.value.weight[:v]]
            parts_b += [forecast_heads.value.bias[v:], forecast_heads.mark.bias, forecast_heads.value.bias[:v]]
        else:
            parts_w.append(forecast_heads.mark.weight)
            parts_b.append(forecast_heads.mark.bias)
        dt_std, dt_mean = forecast_heads.log_dt_std, forecast_heads.log_dt_mean
        inf = float("inf")

        def fill(*pieces: tuple[int, Tensor | float]) -> Tensor:
            return torch.cat([torch.as_tensor(x, dtype=t_w.dtype, device=t_w.device).expand(n) for n, x in pieces])

        one, zero = 1.0, 0.0
        low = fill(
            (k, -inf),
            (k, -heads.MAX_TIME_LOC),
            (k, heads.MIN_LOG_SCALE),
            (v, heads.MIN_LOG_SCALE),
            (m, -inf),
            (v, -inf),
        )
        high = fill(
            (k, inf),
            (k, heads.MAX_TIME_LOC),
            (k, heads.MAX_TIME_LOG_SCALE),
            (v, heads.MAX_LOG_SCALE),
            (m, inf),
            (v, inf),
        )
        scale = torch.cat(
            [fill((k, one)), dt_std.expand(k), fill((k, one), (v, one), (m, one)), forecast_heads.value_std]
        )
        shift = torch.cat(
            [
                fill((k, zero)),
                dt_mean.expand(k),
                torch.log(dt_std).expand(k),
                fill((v, zero), (m, zero)),
                forecast_heads.value_mean,
            ]
        )
        return cls(
            d_model=config.backbone.d_model,
            n_heads=config.backbone.n_heads,
            n_components=k,
            num_marks=m,
            value_width=v,
            freqs=embed.freqs.detach().clone(),
            mark_table=(embed.mark.weight + bias).detach(),
            embed_weight=weight.detach().clone(),
            layers=layers,
            final_norm=(norm.weight.detach().clone(), norm.bias.detach().clone(), norm.eps),
            head=(torch.cat(parts_w).detach(), torch.cat(parts_b).detach()),
            head_low=low,
            head_high=high,
            head_scale=scale.detach(),
            head_shift=shift.detach(),
            exp_sign=fill((k, -1.0), (v, one)),
            value_std=forecast_heads.value_std.detach().clone(),
            gap_bound=forecast_heads.gap_bound(),
            time_resolution=forecast_heads.time_resolution,
        )

    @property
    def has_step(self) -> bool:
        return self.layers is not None

    def step(
        self, dt: Tensor, marks: Tensor, values: Tensor, m: Tensor, u: Tensor, w: Tensor, n_events: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """One event per row of an Aaren model: ``dt, marks [B]``, ``values [B, V]`` and the state
        ``m, u [B, L, H]``, ``w [B, L, H, Dh]``, ``n_events [B]`` -> ``(y [B, d], m, u, w, n_events)``,
        the new state (the old one is not changed).

        Per layer: ``s, v = W_sv LN1(x) + b_sv``, with time decay ``m <- m - rate dt`` (the state aged
        to this event, ``AarenAttention``), ``m' = max(m, s)``,
        ``u' = u exp(m - m') + exp(s - m')``, ``w' = w exp(m - m') + v exp(s - m')``,
        ``x += W_o (w' / u') + b_o``, ``x += FF(LN2(x))``; ``y = LN(x)``.
        """
        if self.layers is None:
            raise ValueError("this backbone has no fused step; use EventModel.step")
        b, d, h = dt.shape[0], self.d_model, self.n_heads
        gap = dt.clamp_min(0).unsqueeze(-1)  # [B, 1]
        log_dt = torch.log1p(gap)  # [B, 1]
        angles = log_dt * self.freqs  # [B, F/2]
        features = torch.cat([log_dt, torch.sin(angles), torch.cos(angles), values], dim=-1)  # [B, 1 + F + V]
        x = torch.addmm(self.mark_table.index_select(0, marks), features, self.embed_weight.t())  # [B, d]
        ms, us, ws = [], [], []
        for i, layer in enumerate(self.layers):
            sv = F.linear(F.layer_norm(x, (d,), *layer.norm1, layer.eps[0]), *layer.score_value)  # [B, H + d]
            s, v = sv[:, :h], sv[:, h:].view(b, h, -1)  # [B, H], [B, H, Dh]
            m_old = m[:, i] if layer.rate is None else torch.addcmul(m[:, i], gap, layer.rate, value=-1)  # aged
            m_new = torch.maximum(m_old, s)
            c_old = torch.exp(m_old - m_new)  # [B, H]
            c_new = torch.exp(s - m_new)
            u_new = torch.addcmul(c_new, u[:, i], c_old)
            w_new = torch.addcmul(v * c_new.unsqueeze(-1), w[:, i], c_old.unsqueeze(-1))  # [B, H, Dh]
            x = x + F.linear((w_new / u_new.unsqueeze(-1)).view(b, d), *layer.out)
            x = x + F.linear(
                F.gelu(F.linear(F.layer_norm(x, (d,), *layer.norm2, layer.eps[1]), *layer.fc1)), *layer.fc2
            )
            ms.append(m_new)
            us.append(u_new)
            ws.append(w_new)
        y = F.layer_norm(x, (d,), *self.final_norm[:2], self.final_norm[2])
        return y, torch.stack(ms, 1), torch.stack(us, 1), torch.stack(ws, 1), n_events + 1

    def forecast(
        self, y: Tensor, levels: tuple[float, ...], top_k: int | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Summaries of the next event from features ``y [B, d]``: the gap's point forecast ``[B]``
        (float64) and quantiles at ``levels`` ``[B, Q]``, the ``top_k`` (default: all) most likely
        marks and their probabilities ``[B, k]``, value means and stds ``[B, V]``; as
        ``EventModel.forecast``: the point forecast is ``E[tau | tau <= gap_bound]``
        (``heads.truncated_mean``), the quantiles those of the gap recorded at ``time_resolution``.
        """
        k, m, v = self.n_components, self.num_marks, self.value_width
        out = torch.addcmul(
            self.head_shift, torch.clamp(F.linear(y, *self.head), self.head_low, self.head_high), self.head_scale
        )
        scales = torch.exp(out[:, 2 * k : 3 * k + v] * self.exp_sign)  # [B, K + V]: 1 / sigma, value std / value_std
        probs = torch.softmax(out[:, 3 * k + v : 3 * k + v + m], dim=-1)  # [B, M]
        top = probs.topk(m if top_k is None else min(top_k, m), dim=-1)

        time = out[:, : 3 * k].double()  # [B, 3K]
        log_weights, loc, log_scale = torch.log_softmax(time[:, :k], dim=-1), time[:, k : 2 * k], time[:, 2 * k :]
        mean = heads.truncated_mean(log_weights, loc, log_scale, self.gap_bound)

        schedule = search_schedule(y.shape[0], y.device)
        constants = self._constants.get((levels, y.dtype, schedule))
        if constants is None:
            stages, grid = schedule
            constants = SearchConstants.make(levels, y.dtype, y.device, stages=stages, grid=grid)
            self._constants[(levels, y.dtype, schedule)] = constants
        weights = torch.softmax(out[:, :k], dim=-1)
        quantiles = mixture_quantiles(weights, out[:, k : 2 * k], scales[:, :k], constants)
        if self.time_resolution:
            quantiles = heads.discrete_quantiles(
                log_weights, loc, log_scale, quantiles, constants.levels, self.time_resolution
            )  # float64: multiples of the resolution stay on its grid
        value_std = scales[:, k:] * self.value_std
        return mean, quantiles, top.indices, top.values, out[:, 3 * k + v + m :], value_std
