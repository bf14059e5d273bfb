"""The series task's OIP codec (``aaren.server.tasks.oip``; torch-free).

Inputs: ``TIME`` FP64 [1] (the observation's time, Unix seconds: it gives the calendar features),
``VALUES`` FP32 [C] (the channels, ``value_names``). Outputs, per forecast: ``SEQ`` INT64 [1],
``SERIES_MEAN`` FP64 [H, C] and ``SERIES_QUANTILES`` FP64 [H, C, Q] (the next H steps in the data's
units, at ``quantile_levels``), ``FILLED_STEPS`` INT64 [1] (the missing steps the server filled before
the event: docs/tasks.md "A live series with gaps"). ``VALUES`` may hold NaN (a missing value)."""

from __future__ import annotations

from aaren.server.contract.columns import ModelDescription
from aaren.server.tasks.oip import INT64, TensorCodec
from aaren.server.tasks.series.outputs import SeriesOutputs

__all__ = ["SeriesCodec"]


class SeriesCodec(TensorCodec):
    def __init__(self, d: ModelDescription, default_top_k: int) -> None:
        super().__init__(d, default_top_k)
        h, c, q = d.horizon, d.value_width, len(d.quantiles)
        self.inputs = [("TIME", "FP64", [1]), ("VALUES", "FP32", [c])]
        self.outputs = [
            ("SEQ", "INT64", [1]),
            ("SERIES_MEAN", "FP64", [h, c]),
            ("SERIES_QUANTILES", "FP64", [h, c, q]),
            ("FILLED_STEPS", "INT64", [1]),
        ]
        self._ready()

    def encode(self, k: int, seq: int, time: float, outputs: SeriesOutputs) -> list[bytes]:
        o = outputs
        return [
            INT64.pack(seq),
            o.series_mean[0].astype("<f8").tobytes(),
            o.series_quantiles[0].astype("<f8").tobytes(),
            INT64.pack(int(o.filled_steps[0])),
        ]

    def parameters(self) -> dict[str, str]:
        d = self.description
        return {
            "quantile_levels": ",".join(repr(q) for q in d.quantiles),
            "horizon": str(d.horizon),
            "step_seconds": repr(d.step_seconds),
        }
