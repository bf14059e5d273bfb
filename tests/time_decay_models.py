"""A tiny event model with a time-decay Aaren backbone, shared by the core and the serving tests."""

from __future__ import annotations

import torch

from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.event.model import EventModel, EventModelConfig


def decay_model(seed: int = 0, value_width: int = 2) -> EventModel:
    """d_model 16, 2 layers, 4 heads, 5 marks, 3 mixture components, normalization set; eval mode."""
    torch.manual_seed(seed)
    cfg = EventModelConfig(
        backbone=BackboneConfig(d_model=16, n_layers=2, n_heads=4, time_decay=True),
        num_marks=5,
        value_width=value_width,
        n_components=3,
    )
    model = EventModel(cfg).eval()
    model.set_normalization(1.5, 0.8, torch.tensor([3.0, -1.0][:value_width]), torch.tensor([2.0, 0.5][:value_width]))
    return model
