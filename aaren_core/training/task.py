"""Training and scoring for the series and class tasks (``python -m aaren_core.training.task``).

Series. A ``SeriesModel`` trains on windows of ``window`` consecutive train steps: after every
position ``t`` of a window it forecasts the next ``horizon`` standardized steps (all inside the
train part), loss ``MSE(mean) + quantile_weight * pinball`` (``series_loss``) on every
``loss_stride``-th position counted back from the window's end. Training on every prefix teaches
the forecast from any amount of history, which is what a stream needs. A ``DLinear`` trains on
``lookback`` windows with MSE, as in TSLib. Model selection: the lowest validation MSE of the
forecast from the last ``lookback`` steps (the protocol every model shares), with early stopping
after ``patience`` epochs without improvement. Test: that restricted score for every model, the
streaming score (all history through the state) for Aaren and GRU, and the naive baselines.

Class. A ``ClassModel`` trains on padded batches of the archive's train part minus a stratified
``val_fraction`` (the archive has no validation part), loss ``CE(final) + aux_weight *
mean_t CE(p_t)``; selection by validation accuracy (ties: lower loss); test: final accuracy and
accuracy after each fraction of the sequence seen.

Everything random derives from ``seed``. ``<out_dir>/best`` holds the checkpoint
(``aaren_core.checkpoint``), ``<out_dir>/metrics.json`` the scores.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import re
import time
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aaren.formats.errors import DataError
from aaren_core.checkpoint import save_checkpoint
from aaren_core.datasets import CLASS_DATASETS, SERIES_DATASETS, load_class, load_series
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.classify.data import ClassData, ClassSet
from aaren_core.tasks.classify.model import ClassModel, ClassModelConfig, class_loss
from aaren_core.tasks.metrics import (
    class_logits,
    early_accuracy,
    model_window_predictor,
    score_series,
    score_streaming,
)
from aaren_core.tasks.series.baselines import DLinear, DLinearConfig, last_value, seasonal_naive, windows
from aaren_core.tasks.series.data import SeriesData, calendar_features
from aaren_core.tasks.series.model import SeriesModel, SeriesModelConfig, series_loss

__all__ = [
    "DEFAULT_DATA",
    "SET_KEYS",
    "TaskResult",
    "TaskTrainConfig",
    "baseline_scores",
    "checkpoint_metadata",
    "command_line",
    "load_task_data",
    "main",
    "score_task",
    "train_task",
]

METRICS_FILE = "metrics.json"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


SET_KEYS: dict[str, str] = {
    "task": "series (forecast the next horizon steps) or class (class probabilities after every step)",
    "model": "backbone: aaren, transformer or gru (series also dlinear)",
    "data": "a data set of aaren_core.datasets (series: power-hourly...; class: JapaneseVowels...)",
    "d_model": "model width",
    "n_layers": "backbone layers",
    "n_heads": "attention heads",
    "d_ff": "feed-forward width (0: the backbone's default)",
    "dropout": "dropout rate",
    "time_decay": "aaren only: age the state by the steps (true/false; default: true for series, false for class)",
    "horizon": "series: steps forecast after each observation (H)",
    "lookback": "series: steps a window model sees; the restricted score's window (L)",
    "window": "series: train window length in steps (the loss is taken inside it)",
    "loss_stride": "series: score every n-th position of a train window",
    "quantiles": "series: quantile levels, comma-separated and increasing",
    "time_features": "series: feed 4 calendar features of the time (true/false)",
    "quantile_weight": "series: weight of the pinball loss (or the Gaussian NLL) beside the MSE",
    "window_offsets": "series: shift the train windows by a random offset each epoch (true/false)",
    "head": "series: quantile (direct quantiles, pinball loss) or gaussian (a Gaussian per step and channel)",
    "val_stride": "series: score every n-th validation origin",
    "aux_weight": "class: weight of the mean cross-entropy over every step (early predictions)",
    "val_fraction": "class: stratified fraction of train held out for model selection",
    "epochs": "most epochs (early stopping may end sooner)",
    "batch_size": "windows (series) or sequences (class) per batch",
    "steps_per_epoch": "most batches per epoch (0: all)",
    "lr": "AdamW learning rate",
    "weight_decay": "AdamW weight decay",
    "grad_clip": "gradient-norm clip (0: none)",
    "patience": "epochs without a better validation score before stopping early",
    "seed": "seed of everything random",
    "threads": "torch CPU threads (0: torch's default)",
    "max_minutes": "time budget in minutes: no new epoch starts once it is spent (0: none)",
    "out_dir": "run directory (best/, metrics.json, report.md)",
    "cache": "wheel cache of the data sets (default $AAREN_WHEEL_CACHE or ~/.cache/aaren/wheels)",
    "name": "served model name in the checkpoint (default: aaren-<task>-<data>)",
}


@dataclasses.dataclass(frozen=True)
class TaskTrainConfig:
    """Everything a task run depends on; ``--set key=value`` sets any field."""

    task: str = "series"
    model: str = "aaren"
    data: str = "power-hourly"
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 0
    dropout: float = 0.0
    #: None: on for series Aaren (measured: it closes the streaming-vs-restricted gap), else off.
    time_decay: bool | None = None

    horizon: int = 96
    lookback: int = 96
    window: int = 192
    loss_stride: int = 1
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
    time_features: bool = True
    quantile_weight: float = 1.0
    #: Series: ``quantile`` (direct quantiles) or ``gaussian`` (``aaren_core.tasks.series.model``).
    head: str = "quantile"
    #: Series: each epoch shifts every train window's start by one random offset below the spacing
    #: of the starts, so windows (and the positions the loss scores) start at every hour of the day
    #: over the epochs. Without it they start every ``window // 4`` steps from step 0: with hourly
    #: data and window 192, always at the same hour. Stored configs without the key read false.
    window_offsets: bool = True
    val_stride: int = 1
    aux_weight: float = 0.0
    val_fraction: float = 0.2

    epochs: int = 10
    batch_size: int = 32
    steps_per_epoch: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    patience: int = 3
    seed: int = 0
    threads: int = 0
    max_minutes: float = 0.0
    out_dir: str = "runs/tasks"
    cache: str = ""
    name: str = ""

    def __post_init__(self) -> None:
        checks = {
            "task in ['class', 'series']": self.task in ("series", "class"),
            "model in ['aaren', 'transformer', 'gru'] (or 'dlinear' for series)": self.model
            in ("aaren", "transformer", "gru") + (("dlinear",) if self.task == "series" else ()),
            "horizon, lookback, window, loss_stride, val_stride >= 1": min(
                self.horizon, self.lookback, self.window, self.loss_stride, self.val_stride
            )
            >= 1,
            "epochs, batch_size, patience >= 1": min(self.epochs, self.batch_size, self.patience) >= 1,
            "steps_per_epoch, threads >= 0": min(self.steps_per_epoch, self.threads) >= 0,
            "0 < val_fraction < 1": 0 < self.val_fraction < 1,
            "lr > 0": self.lr > 0,
            "name empty or [A-Za-z0-9][A-Za-z0-9._-]{0,63}": not self.name or bool(NAME_PATTERN.fullmatch(self.name)),
        }
        failed = [k for k, ok in checks.items() if not ok]
        if failed:
            raise ValueError(f"task config: expected {', '.join(failed)}")

    @property
    def decays(self) -> bool:
        """Whether the backbone ages its state by the steps: ``time_decay``, by default on for a
        series Aaren and off otherwise; never for the Transformer, GRU or DLinear."""
        if self.model != "aaren":
            return False
        return self.task == "series" if self.time_decay is None else self.time_decay

    @property
    def run_name(self) -> str:
        """The served model name: ``name``, or ``aaren-<task>-<data>`` (``aaren-series-power-hourly``)."""
        return self.name or f"aaren-{self.task}-{self.data}"

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> TaskTrainConfig:
        """The config a checkpoint's ``train_config`` stored; keys added since default (``name``)."""
        if record.get("task") not in ("series", "class"):
            raise ValueError(f"train_config: task {record.get('task')!r}; expected 'series' or 'class'")
        # Series runs stored before window offsets existed trained without them.
        if record["task"] == "series":
            record = {"window_offsets": False, **record}
        return cls(task=record["task"]).replace(**{k: v for k, v in record.items() if k != "task"})

    def backbone(self) -> BackboneConfig:
        return BackboneConfig(
            kind=self.model,  # type: ignore[arg-type]
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            dropout=self.dropout,
            time_decay=self.decays,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields, ``time_decay`` as it applies (so a stored config reads the same whatever
        later defaults say)."""
        out = dataclasses.asdict(self)
        out["quantiles"] = list(self.quantiles)
        out["time_decay"] = self.decays
        return out

    def replace(self, **changes: Any) -> TaskTrainConfig:
        """A copy with ``changes``; string values (from ``--set``) are converted to the field's type."""
        hints = typing.get_type_hints(TaskTrainConfig)
        return dataclasses.replace(self, **{k: _coerce(k, v, hints.get(k)) for k, v in changes.items()})


def _coerce(key: str, value: Any, hint: Any) -> Any:
    if hint is None:
        raise ValueError(
            f"unknown task config key {key!r}; expected one of {[f.name for f in dataclasses.fields(TaskTrainConfig)]}"
        )
    if not isinstance(value, str):
        return tuple(value) if hint == tuple[float, ...] else value
    if hint in (bool, bool | None):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{key} must be true or false; got {value!r}")
        return value.lower() in ("true", "1")
    try:
        if hint == tuple[float, ...]:
            return tuple(float(x) for x in value.split(","))
        return hint(value)
    except ValueError:
        kind = "comma-separated numbers" if hint == tuple[float, ...] else getattr(hint, "__name__", str(hint))
        raise ValueError(f"{key}={value!r}; expected {kind}") from None


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """The best model (eval mode), its metrics, and where they were written."""

    model: nn.Module
    metrics: dict[str, Any]
    out_dir: Path


def _rng(config: TaskTrainConfig) -> np.random.Generator:
    torch.manual_seed(config.seed)
    return np.random.default_rng(config.seed)


def _optimizer(model: nn.Module, config: TaskTrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)


def _update(model: nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor, config: TaskTrainConfig) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()


def _batches(starts: np.ndarray, config: TaskTrainConfig) -> list[np.ndarray]:
    batches = [starts[i : i + config.batch_size] for i in range(0, len(starts), config.batch_size)]
    return batches[: config.steps_per_epoch] if config.steps_per_epoch else batches


def baseline_scores(data: SeriesData, lookback: int, horizon: int, part: str = "test") -> dict[str, Any]:
    """Last value and seasonal naive (daily) on ``part``'s origins (the seasonal one needs a day of
    history, so in the train part its origins start a day in)."""
    z = data.standardized()
    period = data.steps_per_day
    return {
        "last_value": score_series(lambda o: last_value(z, o, horizon), data, part, lookback, horizon),
        f"seasonal_naive_{period}": score_series(
            lambda o: seasonal_naive(z, o, horizon, period), data, part, max(lookback, period), horizon
        ),
    }


def shifted_starts(starts: np.ndarray, spacing: int, last: int, rng: np.random.Generator) -> np.ndarray:
    """One epoch's window starts: ``starts`` (every ``spacing`` steps from 0) shifted by one random
    offset in ``[0, spacing)``, those past ``last`` dropped."""
    shifted = starts + int(rng.integers(spacing))
    return shifted[shifted <= last]


def _series_model(config: TaskTrainConfig, data: SeriesData) -> nn.Module:
    if config.model == "dlinear":
        return DLinear(DLinearConfig(config.lookback, config.horizon))
    model = SeriesModel(
        SeriesModelConfig(
            config.backbone(),
            data.n_channels,
            config.horizon,
            config.quantiles,
            4 if config.time_features else 0,
            config.head,
        )
    )
    model.set_normalization(torch.from_numpy(data.mean), torch.from_numpy(data.std))
    return model


def _series_batch_loss(
    model: nn.Module, data: SeriesData, z: np.ndarray, feats: np.ndarray, starts: np.ndarray, config: TaskTrainConfig
) -> torch.Tensor:
    h = config.horizon
    if isinstance(model, DLinear):
        pred = model(torch.from_numpy(windows(z, starts, config.lookback)))
        target = torch.from_numpy(z[starts[:, None] + np.arange(h)[None, :]])
        return (pred - target).square().mean()
    w = config.window
    steps = starts[:, None] + np.arange(w)[None, :]  # [B, W]
    values = torch.from_numpy(data.values[steps])
    tf = torch.from_numpy(feats[steps]) if config.time_features else None
    y, _ = model.prefill(values, tf)
    positions = np.arange((w - 1) % config.loss_stride, w, config.loss_stride)  # scored; always the last
    target_idx = starts[:, None, None] + positions[None, :, None] + 1 + np.arange(h)[None, None, :]  # [B, P, H]
    target = torch.from_numpy(z[target_idx])  # [B, P, H, C]
    forecast = model.heads(y[:, torch.from_numpy(positions)])
    mask = torch.ones(target.shape[:2], dtype=torch.bool)
    levels = torch.tensor(config.quantiles, dtype=target.dtype)
    return series_loss(forecast, target, mask, levels, config.quantile_weight)[0]


def _train_series(config: TaskTrainConfig, data: SeriesData, say: Any) -> tuple[nn.Module, dict[str, Any]]:
    rng = _rng(config)
    model = _series_model(config, data)
    optimizer = _optimizer(model, config)
    z, feats = data.standardized(), calendar_features(data.times)
    train_end = data.part("train")[1]
    spacing = 1
    if isinstance(model, DLinear):
        starts = np.arange(config.lookback, train_end - config.horizon + 1)
    else:
        # Window starts every quarter window: each train step is a scored position ~4 times an epoch.
        spacing = max(1, config.window // 4)
        starts = np.arange(0, train_end - config.window - config.horizon + 1, spacing)
    if starts.size == 0:
        raise DataError(
            f"{data.name}: {train_end} train steps are too few for window/lookback and horizon {config.horizon}"
        )
    best, best_mse, best_epoch, stale, history = copy.deepcopy(model.state_dict()), math.inf, 0, 0, []
    deadline = time.monotonic() + config.max_minutes * 60 if config.max_minutes else math.inf
    for epoch in range(config.epochs):
        model.train()
        losses = []
        if config.window_offsets and spacing > 1:
            epoch_starts = shifted_starts(starts, spacing, train_end - config.window - config.horizon, rng)
        else:
            epoch_starts = starts
        for batch in _batches(rng.permutation(epoch_starts), config):
            loss = _series_batch_loss(model, data, z, feats, batch, config)
            _update(model, optimizer, loss, config)
            losses.append(loss.item())
        model.eval()
        val = score_series(
            model_window_predictor(model, data, config.lookback, config.horizon),
            data, "val", config.lookback, config.horizon, stride=config.val_stride,
        )  # fmt: skip
        history.append(
            {"epoch": epoch, "train_loss": float(np.mean(losses)), "val_mse": val["mse"], "val_mae": val["mae"]}
        )
        say(f"epoch {epoch}: train loss {np.mean(losses):.4f}, val MSE {val['mse']:.4f} MAE {val['mae']:.4f}")
        if val["mse"] < best_mse:
            best, best_mse, best_epoch, stale = copy.deepcopy(model.state_dict()), val["mse"], epoch, 0
        else:
            stale += 1
        if stale >= config.patience or time.monotonic() > deadline:
            break
    model.load_state_dict(best)
    model.eval()
    metrics = {"history": history, "val_mse": best_mse, "best_epoch": best_epoch, "epochs_run": len(history)}
    return model, {**metrics, **score_task(model, config, data)}


def score_task(model: nn.Module, config: TaskTrainConfig, data: SeriesData | ClassData) -> dict[str, Any]:
    """The test scores training reports (``test``, ``baselines``), for ``train_task`` and for
    ``aaren evaluate`` re-scoring a checkpoint from its stored config.

    Series: ``test.restricted`` (the last ``lookback`` steps, every model) and ``test.streaming``
    (all history through the state; Aaren and GRU), MSE and MAE on standardized values, beside
    last value and seasonal naive. Class: ``test.accuracy`` at the end and
    ``test.accuracy_by_fraction`` (keys ``"0.1"``..``"1.0"``), beside the train majority class.
    """
    model.eval()
    if config.task == "series":
        if not isinstance(data, SeriesData):
            raise DataError(f"task series needs SeriesData; got {type(data).__name__}")
        test = {
            "restricted": score_series(
                model_window_predictor(model, data, config.lookback, config.horizon),
                data,
                "test",
                config.lookback,
                config.horizon,
            )
        }
        if isinstance(model, SeriesModel) and config.model in ("aaren", "gru"):
            test["streaming"] = score_streaming(model, data, "test", config.lookback, config.horizon)
        return {"test": test, "baselines": baseline_scores(data, config.lookback, config.horizon)}
    if not isinstance(data, ClassData) or not isinstance(model, ClassModel):
        raise DataError(f"task class needs ClassData and a ClassModel; got {type(data).__name__}")
    scores = early_accuracy(class_logits(model, data.test), data.test.labels)
    majority = int(np.bincount(data.train.labels, minlength=data.n_classes).argmax())
    return {
        "test": {
            "accuracy": scores.final,
            "accuracy_by_fraction": {str(k): v for k, v in scores.by_fraction.items()},
        },
        "baselines": {
            "majority_class": {
                "class": data.class_names[majority],
                "accuracy": float(np.mean(data.test.labels == majority)),
            }
        },
    }


def _padded(data: ClassSet, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seqs = [data.series[i] for i in index]
    n = max(len(s) for s in seqs)
    values = np.zeros((len(seqs), n, seqs[0].shape[1]), dtype=np.float32)
    for j, s in enumerate(seqs):
        values[j, : len(s)] = s
    lengths = torch.tensor([len(s) for s in seqs])
    return torch.from_numpy(values), torch.from_numpy(data.labels[index]), lengths


def _train_class(config: TaskTrainConfig, data: ClassData, say: Any) -> tuple[nn.Module, dict[str, Any]]:
    rng = _rng(config)
    model = ClassModel(ClassModelConfig(config.backbone(), len(data.channels), data.n_classes))
    model.set_normalization(torch.from_numpy(data.mean), torch.from_numpy(data.std))
    optimizer = _optimizer(model, config)
    fit, val = data.validation_split(config.val_fraction, config.seed)
    best, best_key, best_epoch, stale, history = copy.deepcopy(model.state_dict()), (-1.0, 0.0), 0, 0, []
    deadline = time.monotonic() + config.max_minutes * 60 if config.max_minutes else math.inf
    for epoch in range(config.epochs):
        model.train()
        losses = []
        for batch in _batches(rng.permutation(len(fit)), config):
            values, labels, lengths = _padded(fit, batch)
            loss, _ = class_loss(model(values), labels, lengths, config.aux_weight)
            _update(model, optimizer, loss, config)
            losses.append(loss.item())
        model.eval()
        acc = early_accuracy(class_logits(model, val), val.labels, (1.0,)).final if len(val) else 0.0
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), "val_accuracy": acc})
        say(f"epoch {epoch}: train loss {np.mean(losses):.4f}, val accuracy {acc:.3f}")
        key = (acc, -float(np.mean(losses)))
        if key > best_key:
            best, best_key, best_epoch, stale = copy.deepcopy(model.state_dict()), key, epoch, 0
        else:
            stale += 1
        if stale >= config.patience or time.monotonic() > deadline:
            break
    model.load_state_dict(best)
    model.eval()
    metrics = {"history": history, "val_accuracy": best_key[0], "best_epoch": best_epoch, "epochs_run": len(history)}
    return model, {**metrics, **score_task(model, config, data)}


DEFAULT_DATA = {"series": "power-hourly", "class": "JapaneseVowels"}


def load_task_data(config: TaskTrainConfig) -> SeriesData | ClassData:
    """Read ``config.data`` (a name of ``SERIES_DATASETS`` or ``CLASS_DATASETS``, by task) from the
    wheel cache; ``DataError`` for an unknown name or a missing wheel."""
    known = SERIES_DATASETS if config.task == "series" else CLASS_DATASETS
    if config.data not in known:
        raise DataError(f"unknown {config.task} data set {config.data!r}; expected one of {sorted(known)}")
    cache = config.cache or None
    return load_series(config.data, cache) if config.task == "series" else load_class(config.data, cache)


def checkpoint_metadata(config: TaskTrainConfig, data: SeriesData | ClassData) -> dict[str, Any]:
    """What ``train_task`` stores beside the weights: ``task``, ``data``, ``source``, ``name`` (the
    served model name), ``channels``, ``train_config``; series also ``horizon``, ``quantiles``,
    ``step_seconds`` (the regular step, ``SeriesData.period``) and ``time_unit`` (``"seconds"``:
    event times are seconds since the Unix epoch, the calendar features come from them); class
    also ``class_names``."""
    meta: dict[str, Any] = {"task": config.task, "data": config.data, "source": data.source, "name": config.run_name}
    if isinstance(data, SeriesData):
        meta |= {
            "channels": list(data.channels),
            "horizon": config.horizon,
            "quantiles": list(config.quantiles),
            "step_seconds": float(data.period),
            "time_unit": "seconds",
        }
    else:
        meta |= {"channels": list(data.channels), "class_names": list(data.class_names)}
    return {**meta, "train_config": config.to_dict()}


def train_task(config: TaskTrainConfig, data: SeriesData | ClassData | None = None, verbose: bool = True) -> TaskResult:
    """Train, select, score and save (module docstring). ``data`` replaces reading ``config.data``."""
    if config.threads:
        torch.set_num_threads(config.threads)

    def say(message: str) -> None:
        if verbose:
            print(message, flush=True)

    loaded = data if data is not None else load_task_data(config)
    if config.task == "series":
        if not isinstance(loaded, SeriesData):
            raise DataError(f"task series needs SeriesData; got {type(loaded).__name__}")
        model, metrics = _train_series(config, loaded, say)
    else:
        if not isinstance(loaded, ClassData):
            raise DataError(f"task class needs ClassData; got {type(loaded).__name__}")
        model, metrics = _train_class(config, loaded, say)
    metrics = {
        "task": config.task,
        "name": config.run_name,
        "data": config.data,
        "source": loaded.source,
        "config": config.to_dict(),
        **metrics,
    }
    metrics["parameters"] = sum(p.numel() for p in model.parameters())
    out = Path(config.out_dir)
    meta = checkpoint_metadata(config, loaded)
    meta["selection"] = {k: metrics[k] for k in ("val_mse", "val_accuracy", "best_epoch", "epochs_run") if k in metrics}
    version = save_checkpoint(out / "best", model, meta)
    metrics["model_version"] = version
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    return TaskResult(model, metrics, out)


def command_line(config: TaskTrainConfig) -> str:
    """The ``aaren train --task ...`` command that runs ``config``: ``--data``, ``--name`` and
    ``--out-dir`` always, ``--set`` for every other key that differs from the defaults."""
    default = TaskTrainConfig(task=config.task).to_dict()
    parts = [f"aaren train --task {config.task} --data {config.data}"]
    if config.name:
        parts.append(f"--name {config.name}")
    parts.append(f"--out-dir {config.out_dir}")
    for key, value in config.to_dict().items():
        if key in ("task", "data", "name", "out_dir") or value == default[key]:
            continue
        text = (
            ",".join(f"{v:g}" for v in value)
            if isinstance(value, list)
            else str(value).lower()
            if isinstance(value, bool)
            else str(value)
        )
        parts.append(f"--set {key}={text}")
    return " ".join(parts)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m aaren_core.training.task", description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=["series", "class"], default="series")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any TaskTrainConfig field")
    args = parser.parse_args(argv)
    changes = dict(item.split("=", 1) for item in args.set)
    changes.setdefault("data", DEFAULT_DATA[args.task])
    try:
        config = TaskTrainConfig(task=args.task).replace(**changes)
        result = train_task(config)
    except (DataError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(json.dumps({k: v for k, v in result.metrics.items() if k in ("test", "baselines", "parameters")}, indent=2))


if __name__ == "__main__":
    main()
