"""The class task on the engine core: ``ClassTask`` (see ``aaren.server.tasks.recurrent``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from aaren.server.tasks.base import Outputs
from aaren.server.tasks.recurrent import RecurrentTask
from aaren_core.attention.state import State
from aaren_core.tasks.classify.model import ClassModel

__all__ = ["CLASS_OUTPUTS", "ClassTask"]

CLASS_OUTPUTS = ("class_top", "class_probs")


class ClassTask(RecurrentTask):
    """Task ``class``: a ``ClassModel``; outputs ``CLASS_OUTPUTS`` (module docstring)."""

    task = "class"
    model: ClassModel

    def __init__(
        self, model: ClassModel, *, version: str, name: str, metadata: dict[str, Any], device: torch.device
    ) -> None:
        super().__init__(model, version=version, device=device)
        c = model.config
        channels = tuple(metadata.get("channels") or (f"value_{i}" for i in range(c.n_channels)))
        classes = tuple(str(x) for x in metadata.get("class_names") or range(c.n_classes))
        if len(channels) != c.n_channels or len(classes) != c.n_classes:
            raise ValueError(
                f"the checkpoint names {len(channels)} channels and {len(classes)} classes; "
                f"its model has {c.n_channels} and {c.n_classes}"
            )
        self.description = self._describe(
            name,
            channels,
            mark_names=("step",),
            time_unit=str(metadata.get("time_unit", "steps")),
            class_names=classes,
        )

    @property
    def last_width(self) -> int:
        return self.model.config.n_classes

    def _step(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        return self.model.step(values, state)

    def _prefill(self, values: Tensor, times: Tensor | None, state: State) -> tuple[Tensor, State]:
        return self.model.prefill(values, state)

    def empty_outputs(self, top_k: int) -> Outputs:
        k = self.model.config.n_classes
        return {"class_top": np.zeros((0, k), np.int64), "class_probs": np.zeros((0, k), np.float32)}

    @torch.inference_mode()
    def forecast_outputs(self, logits: Tensor, top_k: int) -> Outputs:
        """``logits [F, K]`` -> every class by falling probability: ``class_top``, ``class_probs [F, K]``."""
        if not len(logits):
            return self.empty_outputs(top_k)
        probs, top = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True)
        return {"class_top": top.cpu().numpy(), "class_probs": probs.cpu().numpy()}
