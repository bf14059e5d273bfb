"""The policy task's OIP codec (``aaren.server.tasks.oip``; torch-free).

A sequence is an episode. Inputs: ``TIME`` FP64 [1] (the step t), ``VALUES`` FP32 [1 + S] (the target
return on the sequence's first request, the last action's reward afterwards, then the observation).
Outputs: ``SEQ`` INT64 [1], ``ACTION`` FP32 [A] (the next action) and ``RETURN_TO_GO`` FP32 [1]."""

from __future__ import annotations

from aaren.server.contract.columns import ModelDescription
from aaren.server.tasks.oip import INT64, TensorCodec
from aaren.server.tasks.policy.outputs import PolicyOutputs

__all__ = ["PolicyCodec"]


class PolicyCodec(TensorCodec):
    def __init__(self, d: ModelDescription, default_top_k: int) -> None:
        super().__init__(d, default_top_k)
        self.inputs = [("TIME", "FP64", [1]), ("VALUES", "FP32", [d.value_width])]
        self.outputs = [("SEQ", "INT64", [1]), ("ACTION", "FP32", [d.action_width]), ("RETURN_TO_GO", "FP32", [1])]
        self._ready()

    def encode(self, k: int, seq: int, time: float, outputs: PolicyOutputs) -> list[bytes]:
        return [
            INT64.pack(seq),
            outputs.action[0].astype("<f4").tobytes(),
            outputs.return_to_go[:1].astype("<f4").tobytes(),
        ]

    def parameters(self) -> dict[str, str]:
        d = self.description
        return {"env": d.env, "action_width": str(d.action_width), "target_return": repr(float(d.target_return))}
