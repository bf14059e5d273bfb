"""What a task's Open Inference Protocol codec is (torch-free): its tensors, declared and encoded.

Every OIP request carries one event of a sequence (a session) as named 1-D input tensors; the
answer is one forecast as named output tensors (raw little-endian bytes, in declared order). A
task's codec (``aaren.server.tasks.registry`` names it; built per served model with
``(description, default_top_k)``) declares:

- ``inputs``: ``(name, datatype, shape)`` as ModelMetadata and ModelConfig show them, plus
  ``accepted``: every datatype an input may come in (the declared one first);
- ``event(seen)``: the decoded inputs (name -> its values) -> ``(time, mark, values)``, the event's
  columns for the engine core;
- ``outputs``: ``(name, datatype, shape)``, ``-1`` for the ``k`` ranked entries a request asks for
  (the ``top_k`` parameter, at most ``ranked``);
- ``encode(k, seq, time, outputs)``: every output of forecast row 0 of the task's typed outputs, as
  bytes in declared order (``SEQ`` first: the seq the event was applied as);
- ``parameters()``: its ModelConfig parameters beyond the ones every model has.

``TensorCodec`` does what every codec shares: the unpacking layouts of the inputs, the response
templates and the selection of requested outputs.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from types import MappingProxyType

from aaren.oip.v2 import grpc_service_pb2 as pb
from aaren.server.contract.columns import ModelDescription, OutputColumns

__all__ = ["FP64", "INT64", "TensorCodec", "TensorSpec"]

#: ``(name, datatype, shape)`` of one tensor.
TensorSpec = tuple[str, str, list[int]]
_STRUCT = {"FP64": "d", "FP32": "f", "INT64": "q", "INT32": "i"}
_TYPED = {"FP64": "fp64_contents", "FP32": "fp32_contents", "INT64": "int64_contents", "INT32": "int_contents"}
INT64, FP64 = struct.Struct("<q"), struct.Struct("<d")


class TensorCodec:
    """The shared part of a task's OIP codec (module docstring); a task sets ``inputs`` and
    ``outputs`` (and ``accepted``, for inputs beyond ``TIME`` and ``VALUES``) in ``__init__`` before
    calling ``_ready()``, and defines ``encode`` and ``parameters`` (and ``event``, for a task with marks)."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    #: Input name -> every datatype it may come in, the declared one first.
    accepted: Mapping[str, tuple[str, ...]] = MappingProxyType({"TIME": ("FP64",), "VALUES": ("FP32",)})

    def __init__(self, d: ModelDescription, default_top_k: int) -> None:
        self.description = d
        self.model_name, self.model_version = d.name, d.version
        self.ranked = d.ranked
        self.default_top_k = min(default_top_k or d.ranked, d.ranked)

    def _ready(self) -> None:
        self.input_names = [name for name, _, _ in self.inputs]
        self.output_names = [name for name, _, _ in self.outputs]
        #: (name, datatype) -> (the little-endian struct of its data, its element count, its typed field)
        self.layouts: dict[tuple[str, str], tuple[struct.Struct, int, str]] = {}
        for name, _, shape in self.inputs:
            for datatype in self.accepted[name]:
                code = _STRUCT[datatype]
                self.layouts[(name, datatype)] = (struct.Struct(f"<{shape[0]}{code}"), shape[0], _TYPED[datatype])
        self._templates: dict[tuple[int, tuple[str, ...]], pb.ModelInferResponse] = {}

    def template(self, k: int, names: tuple[str, ...]) -> pb.ModelInferResponse:
        """A response with the output tensors' names, datatypes and shapes filled in (cached:
        copying it is cheaper than building the nested messages for every answer)."""
        key = (k, names)
        cached = self._templates.get(key)
        if cached is None:
            cached = pb.ModelInferResponse(model_name=self.model_name, model_version=self.model_version)
            for name, datatype, shape in self.outputs:
                if name in names:
                    cached.outputs.add(name=name, datatype=datatype, shape=[k if n == -1 else n for n in shape])
            if len(self._templates) < 256:
                self._templates[key] = cached
        return cached

    def requested(self, names: tuple[str, ...], k: int, seq: int, time: float, outputs: OutputColumns) -> list[bytes]:
        """The raw bytes of the requested outputs (``names``, in declared order) of one forecast."""
        columns = self.encode(k, seq, time, outputs)
        if len(names) == len(columns):
            return columns
        return [c for c, name in zip(columns, self.output_names, strict=True) if name in names]

    def event(self, seen: dict[str, tuple[float, ...] | tuple[int, ...]]) -> tuple[float, int, list[float]]:
        """``TIME`` and ``VALUES`` -> the event's columns (mark 0: a task of one mark)."""
        return float(seen["TIME"][0]), 0, list(seen["VALUES"])

    def encode(self, k: int, seq: int, time: float, outputs: OutputColumns) -> list[bytes]:
        raise NotImplementedError

    def parameters(self) -> dict[str, str]:
        raise NotImplementedError
