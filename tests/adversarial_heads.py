"""Adversarial forecast heads for the tests of the served point forecast (core and server)."""

from __future__ import annotations

import torch

from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.event.model import EventModel, EventModelConfig

GAP_MAX = 500.0
RESOLUTION = 1 / 60


def adversarial_model(seed: int, *, gap_max: float = GAP_MAX, resolution: float = RESOLUTION) -> EventModel:
    """A tiny model whose time head is set so that one component has a negligible weight and the
    largest location and log scale the clamps allow, with a wide log-gap std, plus random nastiness:
    huge or tiny logits, locations and scales pinned at either clamp, large weights."""
    g = torch.Generator().manual_seed(seed)
    config = EventModelConfig(
        backbone=BackboneConfig(kind="aaren", d_model=8, n_layers=1, n_heads=2),
        num_marks=3,
        value_width=1,
        n_components=4,
        gap_max=gap_max,
        time_resolution=resolution,
    )
    torch.manual_seed(seed)
    model = EventModel(config).eval()
    log_dt_std = float(torch.empty(()).uniform_(0.5, 3.0, generator=g))
    model.set_normalization(
        float(torch.empty(()).uniform_(-2, 4, generator=g)), log_dt_std, torch.zeros(1), torch.ones(1)
    )
    k = config.n_components
    with torch.no_grad():
        time = model.heads.time
        time.weight.mul_(torch.empty(()).uniform_(0, 20, generator=g))
        bias = torch.randn(3 * k, generator=g) * 30  # far past every clamp, either way
        bias[0] = -float(torch.empty(()).uniform_(15, 60, generator=g))  # the negligible weight...
        bias[k] = 1e3  # ...at the largest location
        bias[2 * k] = 1e3  # ...and the largest spread
        time.bias.copy_(bias)
    return model
