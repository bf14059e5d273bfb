"""What a replayed series or classification file says about the served forecasts, against the file's own truth.

``TaskScorer`` sees every ``StreamResult`` of ``aaren replay`` and, once it is over, scores:

- series: each forecast after observation ``seq`` against the session's next H observations in the
  file (origins whose H steps all lie in the file): MSE and MAE in the data's raw units over every
  step and channel, beside the last-value forecast of the same origins (repeat the observation), and
  how often the truth fell inside the outermost quantile band;
- class: for sessions with a ``label``, the accuracy of the prediction after the last step and after
  each fraction ``f`` of ``FRACTIONS`` of the sequence seen (the prediction after ``ceil(f n)`` of its
  ``n`` steps, at least one), keyed ``"0.1"`` .. ``"1.0"``: the fractions, steps and keys of the
  offline scores (``aaren_core.tasks.classify.metrics``), so a replay of the test file prints what
  ``aaren evaluate`` does.

Plain Python on the client (no numpy needed): a replay holds few enough forecasts.
"""

from __future__ import annotations

import math
from typing import Any

from aaren.client.client import ClassForecastOut, ModelInfoOut, SeriesForecastOut, StreamResult
from aaren.client.events_file import EventSource

__all__ = ["FRACTIONS", "TaskScorer"]

#: The offline scores' ``DEFAULT_FRACTIONS`` (that module loads torch; a test checks they agree).
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class TaskScorer:
    def __init__(self, source: EventSource, model: ModelInfoOut) -> None:
        self.task = model.task
        self.model = model
        self.values: dict[str, dict[int, list[float]]] = {}
        for e in [*source.history, *source.events]:
            self.values.setdefault(e.session_id, {})[e.seq] = list(e.values)
        self.labels = source.labels
        self.series: dict[tuple[str, int], SeriesForecastOut] = {}
        self.classes: dict[tuple[str, int], str] = {}

    def see(self, result: StreamResult) -> None:
        for r in result.forecasts:
            if isinstance(r, SeriesForecastOut):
                self.series[(r.session_id, r.seq)] = r
            elif isinstance(r, ClassForecastOut):
                self.classes[(r.session_id, r.seq)] = r.predicted

    def summary(self) -> dict[str, Any]:
        """The scores (module docstring); empty when the file holds nothing to score against."""
        return self._series_summary() if self.task == "series" else self._class_summary()

    def _series_summary(self) -> dict[str, Any]:
        sq = ab = sq_last = ab_last = 0.0
        inside = n = origins = 0
        low, high = (
            (min(self.model.quantile_levels), max(self.model.quantile_levels)) if self.model.quantile_levels else (0, 0)
        )
        for (sid, seq), f in self.series.items():
            steps = self.values.get(sid, {})
            truth = [steps.get(seq + h + 1) for h in range(len(f.means))]
            if any(t is None for t in truth):
                continue
            origins += 1
            now = steps[seq]
            for h, row in enumerate(truth):
                assert row is not None
                for c, x in enumerate(row):
                    err, err_last = f.means[h][c] - x, now[c] - x
                    sq, ab = sq + err * err, ab + abs(err)
                    sq_last, ab_last = sq_last + err_last * err_last, ab_last + abs(err_last)
                    if f.quantiles and f.quantiles[low][h][c] <= x <= f.quantiles[high][h][c]:
                        inside += 1
                    n += 1
        if not n:
            return {}
        return {
            "origins": origins,
            "mse": sq / n,
            "mae": ab / n,
            "last_value_mse": sq_last / n,
            "last_value_mae": ab_last / n,
            f"coverage_q{low:g}_q{high:g}": inside / n,
            "units": "raw (the data's own)",
        }

    def _class_summary(self) -> dict[str, Any]:
        scored = [sid for sid in self.labels if sid in self.values]
        if not scored:
            return {}
        by_fraction: dict[str, float] = {}
        for fraction in FRACTIONS:
            right = 0
            for sid in scored:
                n = max(self.values[sid])
                seen = max(1, math.ceil(fraction * n - 1e-9))
                right += self.classes.get((sid, seen)) == self.labels[sid]
            by_fraction[str(fraction)] = right / len(scored)
        return {"sequences": len(scored), "accuracy": by_fraction["1.0"], "accuracy_by_fraction": by_fraction}
