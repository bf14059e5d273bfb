"""The event task's aaren.v1 encoder (``aaren.server.tasks.aaren_v1.Encoder``; torch-free).

A forecast's ``next_time`` holds the gap's mean, the expected time (last time + mean gap) and the
gap's quantiles at the server's levels; ``marks`` the top ``k`` marks with probabilities; ``values``
each value's mean and std."""

from __future__ import annotations

from aaren.server.tasks.aaren_v1 import RowWriter, TaskEncoder
from aaren.server.tasks.event.outputs import EventOutputs
from aaren.v1 import aaren_pb2 as pb

__all__ = ["EventEncoder"]


class EventEncoder(TaskEncoder):
    """Encodes ``EventOutputs`` at the server's quantile levels."""

    def rows(self, outputs: EventOutputs, k: int) -> RowWriter:
        o = outputs
        means, quantiles = o.time_mean.tolist(), o.time_quantiles.tolist()
        marks, probs = o.top_marks[:, :k].tolist(), o.top_probs[:, :k].tolist()
        value_means, value_stds = o.value_mean.tolist(), o.value_std.tolist()
        levels = self.description.quantiles

        def write(out: pb.Forecast, f: int, last_time: float) -> None:
            # Written in place, add() then attribute writes: about 2.5x cheaper than building nested
            # messages by keyword (each submessage copied into its parent), 20% cheaper than add(**fields).
            mean = means[f]
            next_time = out.next_time
            next_time.mean = mean
            next_time.expected_time = last_time + mean
            add = next_time.quantiles.add
            for q, v in zip(levels, quantiles[f], strict=True):
                item = add()
                item.q = q
                item.value = v
            add = out.marks.add
            for m, pr in zip(marks[f], probs[f], strict=True):
                item = add()
                item.mark = m
                item.probability = pr
            add = out.values.add
            for m, sd in zip(value_means[f], value_stds[f], strict=True):
                item = add()
                item.mean = m
                item.std = sd

        return write

    def columns(self, block: pb.ForecastColumns, outputs: EventOutputs, k: int, last_times: list[float]) -> None:
        o = outputs
        means = o.time_mean.tolist()
        block.mean_gap.extend(means)
        block.expected_time.extend([t + m for t, m in zip(last_times, means, strict=True)])
        block.quantile_levels.extend(self.description.quantiles)
        block.gap_quantiles.extend(o.time_quantiles.reshape(-1).tolist())
        top = o.top_marks[:, :k]
        block.top_k = top.shape[1]
        block.marks.extend(top.reshape(-1).tolist())
        block.mark_probabilities.extend(o.top_probs[:, :k].reshape(-1).tolist())
        block.value_means.extend(o.value_mean.reshape(-1).tolist())
        block.value_stds.extend(o.value_std.reshape(-1).tolist())
