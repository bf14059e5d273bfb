"""A tiny untrained policy for Hopper-v5's sizes (S = 11 observations, A = 3 actions; Aaren, d_model 16,
one layer) saved as a checkpoint of kind ``policy_model`` into a models repository folder, and its
offline rollout (``aaren_core.tasks.policy.rollout.rollout``): what the served tests compare with."""

from __future__ import annotations

from pathlib import Path

import torch

ENV = "Hopper-v5"
S, A = 11, 3
NAME = "tiny-policy"
TARGET_RETURN = 360.0


def tiny_policy(seed: int = 0, kind: str = "aaren"):
    """An untrained ``PolicyModel`` with observation statistics of a Hopper's scale (eval mode)."""
    from aaren_core.nn.backbones import BackboneConfig
    from aaren_core.tasks.policy.model import PolicyModel, PolicyModelConfig

    torch.manual_seed(seed)
    backbone = BackboneConfig(kind=kind, d_model=16, n_layers=1, n_heads=1, dropout=0.0)
    model = PolicyModel(PolicyModelConfig(backbone=backbone, obs_dim=S, act_dim=A, context=20))
    model.set_normalization(torch.randn(S) * 0.1, torch.rand(S) + 0.5)
    return model.eval()


def policy_repository(root: Path, seed: int = 0) -> Path:
    """A models repository at ``root`` holding the tiny policy as ``NAME`` (returns ``root``)."""
    from aaren_core.checkpoint import save_checkpoint

    metadata = {"name": NAME, "env": ENV, "target_return": TARGET_RETURN, "dataset": "none", "task": "policy"}
    save_checkpoint(root / "policy", tiny_policy(seed), metadata)
    return root


def offline_rollout(episodes: int, seed: int, max_steps: int, target_return: float = TARGET_RETURN):
    """The offline rollout of the tiny policy (``RolloutResult``)."""
    from aaren_core.tasks.policy.rollout import rollout

    return rollout(tiny_policy(), ENV, episodes, target_return, seed=seed, max_steps=max_steps)
