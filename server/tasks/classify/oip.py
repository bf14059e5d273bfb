"""The class task's OIP codec (``aaren.server.tasks.oip``; torch-free).

Inputs: ``TIME`` FP64 [1] (the step's time), ``VALUES`` FP32 [C] (the channels, ``value_names``).
Outputs, per forecast: ``SEQ`` INT64 [1], ``CLASS_TOP`` INT64 [k] (class indices, likeliest first;
their names in ModelConfig's ``class_names``) and ``CLASS_PROBS`` FP64 [k] (k: the ``top_k``
parameter, else the server's default)."""

from __future__ import annotations

from aaren.server.contract.columns import ModelDescription
from aaren.server.tasks.classify.outputs import ClassOutputs
from aaren.server.tasks.oip import INT64, TensorCodec

__all__ = ["ClassCodec"]


class ClassCodec(TensorCodec):
    def __init__(self, d: ModelDescription, default_top_k: int) -> None:
        super().__init__(d, default_top_k)
        self.inputs = [("TIME", "FP64", [1]), ("VALUES", "FP32", [d.value_width])]
        self.outputs = [("SEQ", "INT64", [1]), ("CLASS_TOP", "INT64", [-1]), ("CLASS_PROBS", "FP64", [-1])]
        self._ready()

    def encode(self, k: int, seq: int, time: float, outputs: ClassOutputs) -> list[bytes]:
        o = outputs
        return [
            INT64.pack(seq),
            o.class_top[0, :k].astype("<i8").tobytes(),
            o.class_probs[0, :k].astype("<f8").tobytes(),
        ]

    def parameters(self) -> dict[str, str]:
        return {"class_names": ",".join(self.description.class_names), "default_top_k": str(self.default_top_k)}
