"""The count task's OIP codec (torch-free). Inputs: ``TIME`` FP64 [1], ``VALUES`` FP32 [V]. Outputs:
``SEQ`` INT64 [1], ``COUNT`` INT64 [1], ``MEAN`` FP32 [V], ``STD`` FP32 [V]."""

from __future__ import annotations

from aaren.server.contract.columns import ModelDescription
from aaren.server.tasks.oip import INT64, TensorCodec
from aaren_count_task.outputs import CountOutputs


class CountCodec(TensorCodec):
    def __init__(self, d: ModelDescription, default_top_k: int) -> None:
        super().__init__(d, default_top_k)
        v = d.value_width
        self.inputs = [("TIME", "FP64", [1]), ("VALUES", "FP32", [v])]
        self.outputs = [("SEQ", "INT64", [1]), ("COUNT", "INT64", [1]), ("MEAN", "FP32", [v]), ("STD", "FP32", [v])]
        self._ready()

    def encode(self, k: int, seq: int, time: float, outputs: CountOutputs) -> list[bytes]:
        o = outputs
        return [
            INT64.pack(seq),
            INT64.pack(int(o.count[0])),
            o.mean[0].astype("<f4").tobytes(),
            o.std[0].astype("<f4").tobytes(),
        ]

    def parameters(self) -> dict[str, str]:
        return {}
