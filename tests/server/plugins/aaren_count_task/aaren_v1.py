"""The count task's aaren.v1 encoder (torch-free): each value's running mean and std as the
forecast's ``values`` (the count is the seq)."""

from __future__ import annotations

from aaren.server.contract.columns import ModelDescription
from aaren.server.tasks.aaren_v1 import RowWriter
from aaren.v1 import aaren_pb2 as pb
from aaren_count_task.outputs import CountOutputs


class CountEncoder:
    """Encodes ``CountOutputs``."""

    def __init__(self, description: ModelDescription, default_top_k: int) -> None:
        pass

    def rows(self, outputs: CountOutputs, k: int) -> RowWriter:
        o = outputs
        means, stds = o.mean.tolist(), o.std.tolist()

        def write(out: pb.Forecast, f: int, last_time: float) -> None:
            for m, sd in zip(means[f], stds[f], strict=True):
                item = out.values.add()
                item.mean, item.std = m, sd

        return write

    def columns(self, block: pb.ForecastColumns, outputs: CountOutputs, k: int, last_times: list[float]) -> None:
        o = outputs
        block.value_means.extend(o.mean.reshape(-1).tolist())
        block.value_stds.extend(o.std.reshape(-1).tolist())
