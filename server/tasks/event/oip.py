"""The event task's OIP codec (``aaren.server.tasks.oip``; torch-free).

Inputs: ``TIME`` FP64 [1] (the event's time), ``MARK`` INT64 (or INT32) [1], ``VALUES`` FP32 [V]
(when V > 0). Outputs, per forecast: ``SEQ`` INT64 [1], ``MEAN_GAP`` FP64 [1] and
``EXPECTED_TIME`` FP64 [1] (time + mean gap), ``GAP_QUANTILES`` FP64 [Q] (at ``quantile_levels``),
``TOP_MARKS`` INT64 [k] and ``TOP_PROBS`` FP64 [k] (k: the ``top_k`` parameter, else the server's
default), ``VALUE_MEAN`` / ``VALUE_STD`` FP64 [V] (when V > 0)."""

from __future__ import annotations

from aaren.server.contract.columns import ModelDescription
from aaren.server.tasks.event.outputs import EventOutputs
from aaren.server.tasks.oip import FP64, INT64, TensorCodec

__all__ = ["EventCodec"]


class EventCodec(TensorCodec):
    def __init__(self, d: ModelDescription, default_top_k: int) -> None:
        super().__init__(d, default_top_k)
        self.width = d.value_width
        self.inputs = [("TIME", "FP64", [1]), ("MARK", "INT64", [1])]
        self.accepted = {"TIME": ("FP64",), "MARK": ("INT64", "INT32"), "VALUES": ("FP32",)}
        self.outputs = [
            ("SEQ", "INT64", [1]),
            ("MEAN_GAP", "FP64", [1]),
            ("EXPECTED_TIME", "FP64", [1]),
            ("GAP_QUANTILES", "FP64", [len(d.quantiles)]),
            ("TOP_MARKS", "INT64", [-1]),
            ("TOP_PROBS", "FP64", [-1]),
        ]
        if self.width:
            self.inputs.append(("VALUES", "FP32", [self.width]))
            self.outputs += [("VALUE_MEAN", "FP64", [self.width]), ("VALUE_STD", "FP64", [self.width])]
        self._ready()

    def event(self, seen: dict[str, tuple[float, ...] | tuple[int, ...]]) -> tuple[float, int, list[float]]:
        return float(seen["TIME"][0]), int(seen["MARK"][0]), list(seen["VALUES"]) if self.width else []

    def encode(self, k: int, seq: int, time: float, outputs: EventOutputs) -> list[bytes]:
        o = outputs
        mean = float(o.time_mean[0])
        columns = [
            INT64.pack(seq),
            FP64.pack(mean),
            FP64.pack(time + mean),
            o.time_quantiles[0].astype("<f8").tobytes(),
            o.top_marks[0, :k].astype("<i8").tobytes(),
            o.top_probs[0, :k].astype("<f8").tobytes(),
        ]
        if self.width:
            columns += [o.value_mean[0].astype("<f8").tobytes(), o.value_std[0].astype("<f8").tobytes()]
        return columns

    def parameters(self) -> dict[str, str]:
        d = self.description
        return {
            "quantile_levels": ",".join(repr(q) for q in d.quantiles),
            "mark_names": ",".join(d.mark_names),
            "num_marks": str(d.num_marks),
            "default_top_k": str(self.default_top_k),
        }
