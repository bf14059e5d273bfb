"""The policy task's aaren.v1 encoder (``aaren.server.tasks.aaren_v1.Encoder``; torch-free): a
forecast's ``policy`` holds the next action and the return-to-go; the columns layout packs them as
``actions [F * A]`` and ``returns_to_go [F]`` with ``action_width`` A."""

from __future__ import annotations

from aaren.server.tasks.aaren_v1 import RowWriter, TaskEncoder
from aaren.server.tasks.policy.outputs import PolicyOutputs
from aaren.v1 import aaren_pb2 as pb

__all__ = ["PolicyEncoder"]


class PolicyEncoder(TaskEncoder):
    """Encodes ``PolicyOutputs`` (``k`` does not apply: a policy ranks nothing)."""

    def rows(self, outputs: PolicyOutputs, k: int) -> RowWriter:
        actions, rtg = outputs.action.tolist(), outputs.return_to_go.tolist()

        def write(out: pb.Forecast, f: int, last_time: float) -> None:
            policy = out.policy
            policy.action.extend(actions[f])
            policy.return_to_go = rtg[f]

        return write

    def columns(self, block: pb.ForecastColumns, outputs: PolicyOutputs, k: int, last_times: list[float]) -> None:
        block.action_width = outputs.action.shape[1]
        block.actions.extend(outputs.action.reshape(-1).tolist())
        block.returns_to_go.extend(outputs.return_to_go.tolist())
