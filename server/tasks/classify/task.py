"""The class task on the engine core: ``ClassTask`` (see ``aaren.server.tasks.recurrent``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aaren.server.tasks.classify.outputs import ClassOutputs
from aaren.server.tasks.recurrent import RecurrentTask
from aaren_core.attention.state import State
from aaren_core.checkpoint import Checkpoint
from aaren_core.tasks.classify.model import ClassModel

__all__ = ["ClassTask", "from_checkpoint"]


class ClassTask(RecurrentTask):
    """Task ``class``: a ``ClassModel`` (its ``FEATURES`` row holds the logits ``[K]``); outputs
    ``ClassOutputs`` (every class is ranked; front ends cut)."""

    task = "class"
    model: ClassModel

    def __init__(
        self, model: ClassModel, *, version: str, name: str, metadata: dict[str, Any], device: torch.device
    ) -> None:
        self.last_width = model.config.n_classes
        super().__init__(model, version=version, device=device)
        c = model.config
        channels = self.checkpoint_names(metadata.get("channels"), c.n_channels, "channels", prefix="value_")
        classes = self.checkpoint_names(metadata.get("class_names"), c.n_classes, "classes")
        self.description = self.describe_channels(
            name,
            channels,
            mark_names=("step",),
            time_unit=str(metadata.get("time_unit", "steps")),
            class_names=classes,
            missing_values=True,  # NaN reads as 0 after standardization (ClassModel._embed), as offline
        )

    def _step(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        return self.model.step(values, state)

    def _prefill(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        return self.model.prefill(values, state)

    def empty_outputs(self, top_k: int) -> ClassOutputs:
        k = self.model.config.n_classes
        return ClassOutputs(np.zeros((0, k), np.int64), np.zeros((0, k), np.float32))

    @torch.inference_mode()
    def forecast_outputs(self, logits: Tensor, top_k: int) -> ClassOutputs:
        """``logits [F, K]`` -> every class by falling probability: ``class_top``, ``class_probs [F, K]``."""
        if not len(logits):
            return self.empty_outputs(top_k)
        probs, top = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True)
        return ClassOutputs(top.cpu().numpy(), probs.cpu().numpy())


def from_checkpoint(ckpt: Checkpoint, device: torch.device, quantiles: Sequence[float], **_: Any) -> ClassTask:
    """The task of a loaded class-model checkpoint (its registry entry's executor)."""
    metadata = ckpt.metadata
    name = str(metadata.get("name") or f"aaren-class-{metadata.get('data', 'model')}")
    return ClassTask(ckpt.model, version=ckpt.model_version, name=name, metadata=metadata, device=device)
