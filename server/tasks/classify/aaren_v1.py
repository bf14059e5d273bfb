"""The class task's aaren.v1 encoder (``aaren.server.tasks.aaren_v1.Encoder``; torch-free): a
forecast's ``classes`` holds the top ``k`` classes (index, name, probability), likeliest first."""

from __future__ import annotations

from aaren.server.tasks.aaren_v1 import RowWriter, TaskEncoder
from aaren.server.tasks.classify.outputs import ClassOutputs
from aaren.v1 import aaren_pb2 as pb

__all__ = ["ClassEncoder"]


class ClassEncoder(TaskEncoder):
    """Encodes ``ClassOutputs``: each class index with its name (``class_names``) and probability."""

    def rows(self, outputs: ClassOutputs, k: int) -> RowWriter:
        o = outputs
        top, probs, names = o.class_top[:, :k].tolist(), o.class_probs[:, :k].tolist(), self.description.class_names

        def write(out: pb.Forecast, f: int, last_time: float) -> None:
            add = out.classes.classes.add
            for c, p in zip(top[f], probs[f], strict=True):
                item = add()
                item.class_index, item.class_name, item.probability = c, names[c], p

        return write

    def columns(self, block: pb.ForecastColumns, outputs: ClassOutputs, k: int, last_times: list[float]) -> None:
        o = outputs
        top = o.class_top[:, :k]
        block.class_top_k = top.shape[1]
        block.classes.extend(top.reshape(-1).tolist())
        block.class_probabilities.extend(o.class_probs[:, :k].reshape(-1).tolist())
        block.class_names.extend(self.description.class_names)
