"""The count task's execution: a trivial model with a constant-size state, served by ``RunTask.apply``.

State per session: ``total [V]``, ``total_sq [V]`` (sums of the values and of their squares) and
``n_events``. After ``n`` events, ``mean = s * total / n`` and ``std = s * sqrt(total_sq / n - (total / n)^2)``
(``s [V]``: the model's one parameter); ``FEATURES [2V + 1]`` holds ``(mean, std, n)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from aaren.server.contract.columns import ModelDescription
from aaren.server.tasks.runs import RunColumns, RunTask
from aaren_core.attention.state import State
from aaren_core.checkpoint import Checkpoint, register_model
from aaren_count_task.outputs import CountOutputs


@dataclasses.dataclass(frozen=True)
class CountConfig:
    value_width: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, eq=False)
class CountState(State):
    """``total [B, V]``, ``total_sq [B, V]``, ``n_events [B]`` (int64)."""

    kind: ClassVar[str] = "count"

    total: Tensor
    total_sq: Tensor
    n_events: Tensor


class CountModel(nn.Module):
    def __init__(self, config: CountConfig) -> None:
        super().__init__()
        self.config = config
        self.scale = nn.Parameter(torch.ones(config.value_width))

    def init_state(self, batch: int, device: torch.device | str | None = None) -> CountState:
        v = self.config.value_width
        zeros = torch.zeros(batch, v, device=device)
        return CountState(zeros, zeros.clone(), torch.zeros(batch, dtype=torch.long, device=device))

    def prefill(self, values: Tensor, state: CountState) -> tuple[Tensor, CountState]:
        """``values [B, L, V]`` -> ``FEATURES [B, L, 2V + 1]`` after each event, the state after the last."""
        total = state.total[:, None] + values.cumsum(1)
        total_sq = state.total_sq[:, None] + (values * values).cumsum(1)
        n = state.n_events[:, None] + torch.arange(1, values.shape[1] + 1, device=values.device)  # [B, L]
        mean = total / n[..., None]
        std = (total_sq / n[..., None] - mean * mean).clamp_min(0).sqrt()
        features = torch.cat([self.scale * mean, self.scale * std, n[..., None].float()], dim=-1)
        return features, CountState(total[:, -1], total_sq[:, -1], n[:, -1])


class CountTask(RunTask):
    def __init__(self, model: CountModel, *, version: str, name: str, value_names: Sequence[str], device: torch.device):
        self.last_width = 2 * model.config.value_width + 1
        super().__init__(model, version=version, device=device)
        self.width = model.config.value_width
        fresh = model.init_state(1, device="cpu")
        self.description = ModelDescription(
            name=name,
            version=version,
            backbone="count",
            d_model=self.last_width,
            n_layers=0,
            n_heads=0,
            num_marks=1,
            value_width=self.width,
            parameters=self.width,
            state_bytes_per_session=fresh.nbytes + 4 * self.last_width,
            mark_names=("event",),
            value_names=tuple(value_names),
            time_unit="",
            device=str(device),
            task="count",
        )

    def _event_inputs(self, runs: RunColumns) -> Tensor:
        return torch.from_numpy(runs.values).to(self.device, torch.float32).view(len(runs.dt), self.width)

    def _step_events(self, inputs: Tensor, flat: Tensor, state: State) -> tuple[Tensor, State]:
        features, state = self.model.prefill(inputs[flat][:, None], state)
        return features[:, 0], state

    def _prefill_events(
        self, inputs: Tensor, flat: Tensor, shape: tuple[int, int], state: State
    ) -> tuple[Tensor, State]:
        return self.model.prefill(inputs[flat].view(*shape, -1), state)

    def empty_outputs(self, top_k: int) -> CountOutputs:
        return CountOutputs(
            np.zeros(0, np.int64), np.zeros((0, self.width), np.float32), np.zeros((0, self.width), np.float32)
        )

    @torch.inference_mode()
    def forecast_outputs(self, features: Tensor, top_k: int) -> CountOutputs:
        v = self.width
        f = features.cpu()
        return CountOutputs(f[:, -1].round().long().numpy(), f[:, :v].numpy(), f[:, v : 2 * v].numpy())


def from_checkpoint(ckpt: Checkpoint, device: torch.device, quantiles: Sequence[float], **_: Any) -> CountTask:
    metadata = ckpt.metadata
    return CountTask(
        ckpt.model,
        version=ckpt.model_version,
        name=metadata["name"],
        value_names=metadata["value_names"],
        device=device,
    )


register_model("count_model", CountModel, lambda config: CountModel(CountConfig(**config)))
