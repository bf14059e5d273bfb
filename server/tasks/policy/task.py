"""The policy task on the engine core: ``PolicyTask``, a return-conditioned policy served per episode.

A session is an episode and each event one environment step ``t`` (its time: t). Its values are
``[1 + S]``: ``values[0]`` is the target return ``R_0`` on the session's first event and the reward
``r_{t-1}`` of the last action afterwards, ``values[1:]`` the observation ``s_t``. The model
(``aaren_core.tasks.policy.model.PolicyModel.step``) feeds ``a_{t-1}``, ``R_t = R_{t-1} - r_{t-1}`` and
``s_t`` and answers the next action ``a_t`` and ``R_t``; its state (the backbone's, the last action,
``R_t``, ``t``) has a constant size, and is the session's row in the store.

``FEATURES [A + 1]`` is ``[a_t, R_t]``: what the last step answered, so a forecast from a stored state
(``Forecast``) repeats it. A run of ``L > 1`` events of one episode is stepped position by position
(each step's tokens need the action the one before produced; there is no parallel form).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aaren.server.tasks.policy.outputs import PolicyOutputs
from aaren.server.tasks.runs import RunColumns, RunTask
from aaren_core.attention.state import State
from aaren_core.checkpoint import Checkpoint
from aaren_core.tasks.policy.model import PolicyModel
from aaren_core.tasks.policy.rollout import default_target_return

__all__ = ["PolicyTask", "from_checkpoint"]


class PolicyTask(RunTask):
    """Task ``policy``: a ``PolicyModel`` on a constant-state backbone (aaren or gru); outputs
    ``PolicyOutputs`` (module docstring)."""

    task = "policy"
    model: PolicyModel

    def __init__(
        self, model: PolicyModel, *, version: str, name: str, metadata: dict[str, Any], device: torch.device
    ) -> None:
        c = model.config
        self.last_width = c.act_dim + 1
        super().__init__(model, version=version, device=device)
        obs = self.checkpoint_names(metadata.get("obs_names"), c.obs_dim, "observations", prefix="obs_")
        env = str(metadata.get("env") or "")
        target = metadata.get("target_return")
        if target is None:
            target = default_target_return(env, default=0.0)
        fresh = model.init_state(1, device="cpu")
        self.description = self.describe(
            name,
            value_names=("reward", *obs),
            state_bytes=model.state_nbytes(fresh) + 4 * self.last_width,
            task=self.task,
            num_marks=1,
            mark_names=("step",),
            time_unit="steps",
            action_width=c.act_dim,
            env=env,
            target_return=float(target),
        )

    # ------------------------------------------------------------------ RunTask's parts

    def _event_inputs(self, runs: RunColumns) -> tuple[Tensor, Tensor]:
        """``rewards [A]`` (the target return on a first step) and ``observations [A, S]``."""
        values = torch.from_numpy(runs.values).to(self.device, torch.float32).view(len(runs.dt), -1)
        return values[:, 0], values[:, 1:]

    def _step_events(self, inputs: tuple[Tensor, Tensor], flat: Tensor, state: State) -> tuple[Tensor, State]:
        """One environment step of ``R`` episodes: ``FEATURES [R, A + 1]`` (``[a_t, R_t]``) and the new state."""
        rewards, observations = inputs
        action, rtg, state = self.model.step(observations[flat], rewards[flat], state)
        return torch.cat([action.float(), rtg.float().unsqueeze(-1)], dim=-1), state

    def _prefill_events(
        self, inputs: tuple[Tensor, Tensor], flat: Tensor, shape: tuple[int, int], state: State
    ) -> tuple[Tensor, State]:
        """``R`` runs of ``L`` steps, stepped position by position: ``FEATURES [R, L, A + 1]``, end state."""
        n_runs, length = shape
        positions = flat.view(n_runs, length)
        out = []
        for j in range(length):
            features, state = self._step_events(inputs, positions[:, j], state)
            out.append(features)
        return torch.stack(out, dim=1), state

    def empty_outputs(self, top_k: int) -> PolicyOutputs:
        return PolicyOutputs(np.zeros((0, self.model.config.act_dim), np.float32), np.zeros(0, np.float32))

    @torch.inference_mode()
    def forecast_outputs(self, features: Tensor, top_k: int) -> PolicyOutputs:
        """``FEATURES [F, A + 1]`` -> ``action [F, A]``, ``return_to_go [F]``."""
        if not len(features):
            return self.empty_outputs(top_k)
        f = features.float().cpu().numpy()
        a = self.model.config.act_dim
        return PolicyOutputs(np.ascontiguousarray(f[:, :a]), np.ascontiguousarray(f[:, a]))


def from_checkpoint(ckpt: Checkpoint, device: torch.device, quantiles: Sequence[float], **_: Any) -> PolicyTask:
    """The task of a loaded policy-model checkpoint (its registry entry's executor)."""
    metadata = ckpt.metadata
    name = str(metadata.get("name") or f"aaren-policy-{metadata.get('env', 'model')}")
    return PolicyTask(ckpt.model, version=ckpt.model_version, name=name, metadata=metadata, device=device)
