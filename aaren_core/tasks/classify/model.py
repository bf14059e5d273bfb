"""The sequence classifier (task ``class``): step embedding -> backbone -> class logits after every step.

A session is one labelled sequence of observations ``x_t [C]``; after each the model gives class
probabilities (early classification), and the last one is the sequence's prediction:

    z_t = (x_t - mean) / std, 0 where missing       [C]
    y_t = backbone(W_e z_1 + b_e, ..., W_e z_t + b_e)   [d_model]
    p_t = softmax(W_c y_t + b_c)                    [K]

Loss (``class_loss``): cross-entropy of the final prediction, plus ``aux_weight`` times the mean
cross-entropy over every step of the sequence (the early predictions), so probabilities sharpen
as steps arrive instead of only at the end.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aaren_core.attention.state import State
from aaren_core.config import ConfigRecord
from aaren_core.nn.backbones import Backbone, BackboneConfig, build_backbone

__all__ = ["ClassModel", "ClassModelConfig", "class_loss", "final_logits"]


@dataclasses.dataclass(frozen=True)
class ClassModelConfig(ConfigRecord):
    """Backbone, channel count ``n_channels`` (C), class count ``n_classes`` (K)."""

    CONFIG_NAME: ClassVar[str] = "class model config"

    backbone: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    n_channels: int = 1
    n_classes: int = 2

    def __post_init__(self) -> None:
        if self.n_channels < 1 or self.n_classes < 2:
            raise ValueError(f"need n_channels >= 1 and n_classes >= 2; got {self}")


class ClassModel(nn.Module):
    """Embedding, backbone and a linear class head (module docstring); the state is the backbone's."""

    def __init__(self, config: ClassModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.backbone.d_model
        self.register_buffer("value_mean", torch.zeros(config.n_channels))
        self.register_buffer("value_std", torch.ones(config.n_channels))
        self.embed = nn.Linear(config.n_channels, d)
        self.backbone: Backbone[Any] = build_backbone(config.backbone)
        self.head = nn.Linear(d, config.n_classes)

    def set_normalization(self, mean: Tensor, std: Tensor) -> None:
        """Fix the standardization (train statistics, ``[C]`` each) before training."""
        self.value_mean.copy_(torch.as_tensor(mean, dtype=self.value_mean.dtype))
        self.value_std.copy_(torch.as_tensor(std, dtype=self.value_std.dtype).clamp_min(1e-6))

    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        return self.backbone.init_state(batch, device)

    def _embed(self, values: Tensor) -> Tensor:
        z = (values.to(self.value_mean.dtype) - self.value_mean) / self.value_std
        return self.embed(torch.nan_to_num(z, nan=0.0))

    def _gaps(self, shape: torch.Size, device: torch.device) -> Tensor | None:
        return torch.ones(shape, device=device) if self.config.backbone.time_decay else None

    def prefill(self, values: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """``values [B, N, C]`` raw -> ``(logits [B, N, K], state)`` in parallel."""
        if values.dim() != 3 or values.shape[-1] != self.config.n_channels:
            raise ValueError(f"expected values [B, N, {self.config.n_channels}]; got {tuple(values.shape)}")
        x = self._embed(values)
        y, state = self.backbone.prefill(x, state, self._gaps(x.shape[:2], x.device))
        return self.head(y), state

    def step(self, values: Tensor, state: State) -> tuple[Tensor, State]:
        """One step per row: ``values [B, C]`` -> ``(logits [B, K], state)``."""
        if values.dim() != 2 or values.shape[-1] != self.config.n_channels:
            raise ValueError(f"expected values [B, {self.config.n_channels}]; got {tuple(values.shape)}")
        x = self._embed(values)
        y, state = self.backbone.step(x, state, self._gaps(x.shape[:1], x.device))
        return self.head(y), state

    def forward(self, values: Tensor) -> Tensor:
        """Logits after every step: ``values [B, N, C] -> [B, N, K]``."""
        return self.prefill(values)[0]


def final_logits(logits: Tensor, lengths: Tensor) -> Tensor:
    """The prediction at each sequence's last real step: ``logits [B, N, K]``, ``lengths [B]`` -> ``[B, K]``."""
    index = (lengths.to(logits.device) - 1).clamp_min(0)
    return logits[torch.arange(logits.shape[0], device=logits.device), index]


def class_loss(
    logits: Tensor, labels: Tensor, lengths: Tensor, aux_weight: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """``CE(final) + aux_weight * mean_t CE(p_t)`` over right-padded ``logits [B, N, K]``,
    ``labels [B]``, ``lengths [B]``. Returns the loss and its terms (``final``, ``early``)."""
    final = F.cross_entropy(final_logits(logits, lengths), labels)
    terms = {"final": final}
    if aux_weight <= 0:
        return final, terms
    n = logits.shape[1]
    mask = torch.arange(n, device=logits.device)[None, :] < lengths.to(logits.device)[:, None]  # [B, N]
    every = F.cross_entropy(logits.flatten(0, 1), labels.repeat_interleave(n), reduction="none").view_as(mask)
    # Each sequence weighs the same whatever its length: mean over its steps, then over sequences.
    early = ((every * mask).sum(1) / mask.sum(1).clamp_min(1)).mean()
    terms["early"] = early
    return final + aux_weight * early, terms
