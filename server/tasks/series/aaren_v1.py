"""The series task's aaren.v1 encoder (``aaren.server.tasks.aaren_v1.Encoder``; torch-free): a
forecast's ``series`` holds the H x C means and H x C x Q quantiles, flat, in the data's units, and
the steps the server filled before the event (``filled_steps``)."""

from __future__ import annotations

from aaren.server.tasks.aaren_v1 import RowWriter, TaskEncoder
from aaren.server.tasks.series.outputs import SeriesOutputs
from aaren.v1 import aaren_pb2 as pb

__all__ = ["SeriesEncoder"]


class SeriesEncoder(TaskEncoder):
    """Encodes ``SeriesOutputs`` at the model's quantile levels."""

    def rows(self, outputs: SeriesOutputs, k: int) -> RowWriter:
        o = outputs
        levels = self.description.quantiles

        def write(out: pb.Forecast, f: int, last_time: float) -> None:
            mean, quantiles = o.series_mean[f], o.series_quantiles[f]  # [H, C], [H, C, Q]
            series = out.series
            series.horizon, series.channels = mean.shape[0], mean.shape[1]
            series.means.extend(mean.reshape(-1).tolist())
            series.quantiles.extend(quantiles.reshape(-1).tolist())
            series.quantile_levels.extend(levels)
            series.filled_steps = int(o.filled_steps[f])

        return write

    def columns(self, block: pb.ForecastColumns, outputs: SeriesOutputs, k: int, last_times: list[float]) -> None:
        o = outputs
        mean = o.series_mean  # [F, H, C]
        block.horizon, block.channels = mean.shape[1], mean.shape[2]
        block.quantile_levels.extend(self.description.quantiles)
        block.series_means.extend(mean.reshape(-1).tolist())
        block.series_quantiles.extend(o.series_quantiles.reshape(-1).tolist())
        block.series_filled_steps.extend(o.filled_steps.tolist())
