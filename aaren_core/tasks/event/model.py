"""The event forecaster: event embedding -> backbone -> forecast heads.

An event is ``(dt, mark, values)``: the gap since the session's previous event (0 for its first),
a mark id and ``V`` raw values. Features at event ``k`` predict event ``k + 1``. The model runs
in parallel over whole sequences (training, history ingestion) or one event at a time per
session (serving), with the same numbers either way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aaren_core.attention.state import State
from aaren_core.config import ConfigRecord
from aaren_core.nn.backbones import Backbone, BackboneConfig, build_backbone
from aaren_core.tasks.event.heads import ForecastHeads, HeadOutput, mark_nll, value_nll

__all__ = ["EventModel", "EventModelConfig", "EventSizes", "ForecastTensors", "NLLTerms"]

DEFAULT_QUANTILES = (0.1, 0.5, 0.9)


@dataclasses.dataclass(frozen=True)
class EventSizes:
    """The forecaster's sizes beside its backbone's, as its config and the train config both hold
    them: ``n_components`` of the log-normal mixture of the next gap, ``time_features`` of the
    previous gap (an even number: ``EventEmbedding``'s sines and cosines)."""

    n_components: int = 8
    time_features: int = 8


@dataclasses.dataclass(frozen=True)
class EventModelConfig(EventSizes, ConfigRecord):
    """Sizes of the forecaster: its backbone, the data schema's widths, the heads (``EventSizes``);
    and two facts of the training data the forecast summaries need (``aaren_core.tasks.event.heads``):
    ``gap_max``, the largest training gap (bounds the point forecast; 0: not recorded, see
    ``ForecastHeads.gap_bound``), and ``time_resolution``, the resolution the times are recorded at
    (the served quantiles are those of the gap recorded at it; 0: continuous times), both in the
    data's time unit."""

    CONFIG_NAME: ClassVar[str] = "event model config"
    RECORD_LEADS: ClassVar[tuple[str, ...]] = ("backbone", "num_marks", "value_width")

    backbone: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    num_marks: int = 16
    value_width: int = 0
    gap_max: float = 0.0
    time_resolution: float = 0.0

    def __post_init__(self) -> None:
        if self.num_marks < 1 or self.value_width < 0 or self.n_components < 1 or self.time_features % 2:
            raise ValueError(
                f"need num_marks >= 1, value_width >= 0, n_components >= 1 and an even time_features; got {self}"
            )
        for name in ("gap_max", "time_resolution"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} is {value}; expected a finite number >= 0 (0: not known)")


@dataclasses.dataclass(frozen=True)
class NLLTerms:
    """Negative log-likelihood per predicted event ``[B, N-1]`` (0 where ``mask`` is False)."""

    time: Tensor
    mark: Tensor
    value: Tensor
    mask: Tensor

    @property
    def total(self) -> Tensor:
        return self.time + self.mark + self.value

    def mean(self) -> dict[str, Tensor]:
        """Mean per predicted event of each term and the total."""
        n = self.mask.sum().clamp_min(1)
        return {k: (getattr(self, k) * self.mask).sum() / n for k in ("time", "mark", "value", "total")}


@dataclasses.dataclass(frozen=True)
class ForecastTensors:
    """A forecast summary over ``B`` rows: the gap's point forecast ``time_mean [B]`` (float64: the
    mean truncated at ``ForecastHeads.gap_bound``) and quantiles ``[B, Q]`` (of the gap recorded at
    ``time_resolution`` where the model has one, float64 so that they stay on its grid), the ``k``
    most likely marks ``[B, k]`` with probabilities, value means and stds ``[B, V]`` (raw units)."""

    time_mean: Tensor
    time_quantiles: Tensor
    top_marks: Tensor
    top_probs: Tensor
    value_mean: Tensor
    value_std: Tensor


class EventEmbedding(nn.Module):
    """``(dt [...], mark [...], values [..., V]) -> x [..., d_model]``.

    ``x = E[mark] + W_t phi(dt) + W_v standardize(values)`` (computed as one matmul) with
    ``phi(dt) = [log1p(dt), sin(2^j log1p(dt)), cos(2^j log1p(dt))]`` for ``j < F / 2``.
    """

    def __init__(self, config: EventModelConfig, heads: ForecastHeads) -> None:
        super().__init__()
        d = config.backbone.d_model
        self.mark = nn.Embedding(config.num_marks, d)
        self.time = nn.Linear(1 + config.time_features, d)
        self.value = nn.Linear(config.value_width, d) if config.value_width else None
        self.register_buffer("freqs", 2.0 ** torch.arange(config.time_features // 2, dtype=torch.float32))
        self._heads = [heads]  # a list so the module is not registered twice
        self._fused: tuple[tuple[tuple[int, int], ...], Tensor, Tensor] | None = None

    def _time_value_projection(self) -> tuple[Tensor, Tensor]:
        """One linear map ``[phi(dt), values] -> [..., d]`` with the value standardization folded in:
        ``W_t phi + W_v (v - mean) / std + b = [W_t, W_v / std] [phi, v] + (b_t + b_v - W_v mean / std)``.
        Cached while autograd is off (serving), keyed on parameter versions."""
        heads = self._heads[0]
        params = (self.time.weight, self.time.bias)
        if self.value is not None:
            params += (self.value.weight, self.value.bias, heads.value_mean, heads.value_std)
        # Under torch.compile the fusion is traced into the graph instead (data pointers cannot be).
        cacheable = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
        key = tuple((p.data_ptr(), p._version) for p in params) if cacheable else ()
        if cacheable and self._fused is not None and self._fused[0] == key:
            return self._fused[1], self._fused[2]
        weight, bias = self.time.weight, self.time.bias
        if self.value is not None:
            scaled = self.value.weight / heads.value_std  # [d, V]
            weight = torch.cat([weight, scaled], dim=1)
            bias = bias + self.value.bias - scaled @ heads.value_mean
        if cacheable:
            self._fused = (key, weight, bias)
        return weight, bias

    def forward(self, dt: Tensor, marks: Tensor, values: Tensor) -> Tensor:
        log_dt = torch.log1p(dt.to(self.freqs.dtype).clamp_min(0)).unsqueeze(-1)  # [..., 1]
        angles = log_dt * self.freqs  # [..., F/2]
        features = [log_dt, torch.sin(angles), torch.cos(angles)]
        if self.value is not None:
            features.append(values.to(self.freqs.dtype))
        x = F.linear(torch.cat(features, dim=-1), *self._time_value_projection())
        return x + self.mark(marks)


class EventModel(nn.Module):
    """Embedding, backbone and heads; the state is the backbone's state."""

    def __init__(self, config: EventModelConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone: Backbone[Any] = build_backbone(config.backbone)
        self.heads = ForecastHeads(
            config.backbone.d_model,
            config.num_marks,
            config.value_width,
            config.n_components,
            gap_max=config.gap_max,
            time_resolution=config.time_resolution,
        )
        self.embed = EventEmbedding(config, self.heads)

    def set_normalization(self, log_dt_mean: float, log_dt_std: float, value_mean: Tensor, value_std: Tensor) -> None:
        """Fix the standardization of log gaps and values (from training data) before training."""
        self.heads.log_dt_mean.fill_(log_dt_mean)
        self.heads.log_dt_std.fill_(max(log_dt_std, 1e-3))
        self.heads.value_mean.copy_(value_mean)
        self.heads.value_std.copy_(value_std.clamp_min(1e-6))

    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        return self.backbone.init_state(batch, device)

    def _scaled_gaps(self, dt: Tensor) -> Tensor | None:
        """Gaps in units of the training data's typical (geometric mean) gap, for a time-decay backbone."""
        if not self.config.backbone.time_decay:
            return None
        return dt.to(self.heads.log_dt_mean.dtype).clamp_min(0) * torch.exp(-self.heads.log_dt_mean)

    def prefill(self, dt: Tensor, marks: Tensor, values: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """``dt, marks [B, N]``, ``values [B, N, V]`` -> ``(y [B, N, d_model], state)`` in parallel."""
        return self.backbone.prefill(self.embed(dt, marks, values), state, self._scaled_gaps(dt))

    def forward(self, dt: Tensor, marks: Tensor, values: Tensor) -> Tensor:
        return self.prefill(dt, marks, values)[0]

    def step(self, dt: Tensor, marks: Tensor, values: Tensor, state: State) -> tuple[Tensor, State]:
        """One event per row: ``dt, marks [B]``, ``values [B, V]`` -> ``(y [B, d_model], state)``."""
        return self.backbone.step(self.embed(dt, marks, values), state, self._scaled_gaps(dt))

    def nll(self, dt: Tensor, marks: Tensor, values: Tensor, mask: Tensor, scored: Tensor | None = None) -> NLLTerms:
        """NLL of event ``k + 1`` given events ``<= k``, for ``[B, N]`` padded sequences.

        ``mask [B, N]`` marks real events; ``scored [B, N]`` (default: every real event but the
        first) the events to predict, e.g. without a held-out part's context (``EventBatch.scored``).
        Gaps of predicted events must be positive (dequantize tied times first).
        """
        y = self.forward(dt, marks, values)[:, :-1]  # [B, N-1, d]
        out = self.heads(y)
        target_mask = mask[:, 1:] & mask[:, :-1] if scored is None else scored[:, 1:] & mask[:, :-1]
        tau = dt[:, 1:].to(y.dtype)
        if bool(((tau <= 0) & target_mask).any()):
            raise ValueError("gaps of predicted events must be > 0; dequantize tied event times before nll()")
        tau = torch.where(target_mask, tau, torch.ones_like(tau))
        time = -out.time.log_prob(tau)
        mark = mark_nll(out, marks[:, 1:])
        value = value_nll(out, values[:, 1:].to(y.dtype), self.heads.value_std)
        zero = torch.zeros_like(time)
        return NLLTerms(
            time=torch.where(target_mask, time, zero),
            mark=torch.where(target_mask, mark, zero),
            value=torch.where(target_mask, value, zero),
            mask=target_mask,
        )

    def forecast(self, y: Tensor, quantiles: tuple[float, ...] = DEFAULT_QUANTILES, top_k: int = 3) -> ForecastTensors:
        """Summaries of the next event from features ``y [B, d_model]`` (``ForecastTensors``): the point
        forecast ``E[tau | tau <= U]`` (``LogNormalMixture.truncated_mean``, ``U = heads.gap_bound()``)
        and the quantiles of the gap recorded at ``time_resolution`` (``discrete_quantiles``; of the
        continuous gap when it is 0)."""
        out: HeadOutput = self.heads(y)
        probs = torch.softmax(out.mark_logits, dim=-1)
        top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        levels = torch.tensor(quantiles, dtype=y.dtype, device=y.device)
        resolution = self.config.time_resolution
        gap_quantiles = out.time.discrete_quantiles(levels, resolution) if resolution else out.time.quantiles(levels)
        return ForecastTensors(
            time_mean=out.time.truncated_mean(self.heads.gap_bound()),
            time_quantiles=gap_quantiles,
            top_marks=top.indices,
            top_probs=top.values,
            value_mean=out.value_mean,
            value_std=out.value_std,
        )

    def sample_paths(
        self, y: Tensor, state: State, horizon: int, num_samples: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Sample ``num_samples`` futures of ``horizon`` events for ONE session.

        ``y [1, d_model]`` and ``state`` (batch 1) are the session's now -> gaps ``[S, horizon]``,
        marks ``[S, horizon]``, values ``[S, horizon, V]``; each sampled event is fed back with ``step``.
        """
        feats = y.expand(num_samples, -1)
        state = type(state).stack([state] * num_samples)
        gaps, marks, values = [], [], []
        for _ in range(horizon):
            out = self.heads(feats)
            gap = out.time.sample(generator)
            mark = torch.multinomial(torch.softmax(out.mark_logits, -1), 1, generator=generator).squeeze(-1)
            noise = torch.randn(out.value_mean.shape, generator=generator, dtype=y.dtype, device=y.device)
            value = out.value_mean + out.value_std * noise
            gaps.append(gap)
            marks.append(mark)
            values.append(value)
            feats, state = self.step(gap, mark, value, state)
        return torch.stack(gaps, 1), torch.stack(marks, 1), torch.stack(values, 1)
