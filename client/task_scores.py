"""What a replayed series or classification file says about the served forecasts, against the file's own truth.

``TaskScorer`` sees every ``StreamResult`` of ``aaren replay`` and, once it is over, scores:

- series (the Replay rule of docs/tasks.md "A live series with gaps"): a forecast made after the
  row at time ``t`` counts when ``t + D >= score_from`` (``--score-from``; every forecast without
  it) and ``t + H D`` is at most its session's last time; its targets are the rows at
  ``t + (h + 1) D``, each channel counted where the row exists and the cell is not NA. MSE and MAE
  in the data's raw units over the counted targets, beside the last-value forecast of the same
  targets (the last observed value at ``t``, where there is one), and how often the truth fell
  inside the outermost quantile band; with the counts of origins and targets. For a series model
  without a step (``step_seconds`` 0) rows are steps by their seq;
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
    def __init__(self, source: EventSource, model: ModelInfoOut, *, score_from: float | None = None) -> None:
        """``score_from``: series only, the time the scored part starts at (module docstring)."""
        self.task = model.task
        self.model = model
        self.score_from = score_from
        self.values: dict[str, dict[int, list[float]]] = {}
        self.times: dict[str, dict[int, float]] = {}
        for e in [*source.history, *source.events]:
            self.values.setdefault(e.session_id, {})[e.seq] = list(e.values)
            self.times.setdefault(e.session_id, {})[e.seq] = e.time
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

    def _grids(self) -> dict[str, tuple[dict[int, list[float]], dict[int, list[float]], float, float]]:
        """Per session: its rows by step index ``round((t - t0) / D)`` (by seq - 1 without a step),
        the last observed values at each of its rows (NaN before a channel's first), its ``t0``
        and its last time."""
        step = self.model.step_seconds
        grids = {}
        for sid, rows in self.values.items():
            seqs = sorted(rows)
            times = self.times[sid]
            t0 = times[seqs[0]]
            by_step: dict[int, list[float]] = {}
            filled: dict[int, list[float]] = {}
            last = [math.nan] * len(rows[seqs[0]])
            for seq in seqs:
                i = round((times[seq] - t0) / step) if step > 0 else seq - 1
                by_step[i] = rows[seq]
                last = [x if not math.isnan(x) else prev for x, prev in zip(rows[seq], last, strict=True)]
                filled[i] = last
            grids[sid] = (by_step, filled, t0, times[seqs[-1]] if step > 0 else float(len(seqs) - 1))
        return grids

    def _series_summary(self) -> dict[str, Any]:
        sq = ab = sq_last = ab_last = 0.0
        inside = n = n_last = origins = skipped = 0
        levels = self.model.quantile_levels
        low, high = (min(levels), max(levels)) if levels else (0, 0)
        step = self.model.step_seconds
        unit = step if step > 0 else 1.0
        slack = 1e-6 * unit  # times of one grid differ by float rounding only
        grids = self._grids()
        for (sid, seq), f in self.series.items():
            if sid not in grids or seq not in self.times[sid]:
                continue
            by_step, filled, t0, last_time = grids[sid]
            t = f.last_time if step > 0 else float(seq - 1)
            horizon = len(f.means)
            if step > 0 and self.score_from is not None and t + step < self.score_from - slack:
                continue
            if t + horizon * unit > last_time + slack:
                continue
            origin = round((t - t0) / step) if step > 0 else seq - 1
            now = filled.get(origin)
            if now is None:
                continue
            origins += 1
            for h in range(horizon):
                row = by_step.get(origin + h + 1)
                for c in range(len(f.means[h])):
                    x = math.nan if row is None else row[c]
                    if math.isnan(x):
                        skipped += 1
                        continue
                    err = f.means[h][c] - x
                    sq, ab, n = sq + err * err, ab + abs(err), n + 1
                    if not math.isnan(now[c]):
                        err_last = now[c] - x
                        sq_last, ab_last, n_last = sq_last + err_last * err_last, ab_last + abs(err_last), n_last + 1
                    if f.quantiles and f.quantiles[low][h][c] <= x <= f.quantiles[high][h][c]:
                        inside += 1
        if not n:
            return {}
        scores: dict[str, Any] = {
            "origins": origins,
            "targets": n,
            "targets_missing": skipped,
            "mse": sq / n,
            "mae": ab / n,
            "last_value_mse": sq_last / n_last if n_last else math.nan,
            "last_value_mae": ab_last / n_last if n_last else math.nan,
            f"coverage_q{low:g}_q{high:g}": inside / n,
            "units": "raw (the data's own)",
        }
        if self.score_from is not None:
            scores["score_from"] = self.score_from
        return scores

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
