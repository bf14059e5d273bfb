"""The config the series and class tasks share: ``TaskTrainConfig``, its ``--set`` keys, its data.

Read and written by the one config I/O of ``aaren_core.config``; a checkpoint stores it
as ``train_config`` beside ``checkpoint_metadata``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from aaren.formats.models import default_max_gap_steps
from aaren_core.config import ConfigRecord, field_defaults
from aaren_core.config import command_line as generic_command_line
from aaren_core.datasets import CLASS_DATASETS, SERIES_DATASETS, load_class, load_series
from aaren_core.nn.backbones import BackboneConfig, BackboneSizes
from aaren_core.tasks.classify.data import ClassData
from aaren_core.tasks.event.data import DataError
from aaren_core.tasks.series.data import SeriesData
from aaren_core.training.knobs import TrainKnobs

__all__ = [
    "DEFAULT_DATA",
    "SET_KEYS",
    "TaskTrainConfig",
    "checkpoint_metadata",
    "command_line",
    "load_task_data",
]

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

SET_KEYS: dict[str, str] = {
    "task": "series (forecast the next horizon steps) or class (class probabilities after every step)",
    "model": "backbone: aaren, transformer or gru (series also dlinear)",
    "data": "a data set of aaren_core.datasets (series: power-hourly...; class: JapaneseVowels...), or a file "
    "(series: CSV/Parquet of a time column and channels; class: a .ts file or a CSV/Parquet of session_id, time, "
    "channels..., label)",
    "time_column": "series file: the column of the times (ISO datetimes or Unix seconds)",
    "channels": "series file: the channels, comma-separated (default: every numeric column but the time)",
    "step_seconds": "series file: the grid's step in seconds (0: the most common gap between times)",
    "split": "series: ratio (TSLib's 70/10/20) or ett (12/4/4 months of 30 days); default: the data set's, "
    "ratio for a file",
    "split_at": "series: a time (ISO or Unix seconds); the test part starts there",
    "max_gap_steps": "series: most missing steps a served stream may skip at once (0: one week of steps)",
    "test_data": "class: a test file of the same format as --data (default: a stratified 20% of --data)",
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
@field_defaults(d_model=32, batch_size=32, lr=1e-3, weight_decay=0.0, out_dir="runs/tasks", epochs=10, patience=3)
class TaskTrainConfig(TrainKnobs, BackboneSizes, ConfigRecord):
    """Everything a task run depends on; ``--set key=value`` sets any field. The backbone's sizes
    are ``BackboneSizes`` (narrower by default), its kind is ``model``; how it trains,
    ``TrainKnobs`` (fewer epochs of larger batches by default) and the keys below them."""

    task: str = "series"
    model: str = "aaren"
    data: str = "power-hourly"
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

    steps_per_epoch: int = 0
    cache: str = ""
    #: Keys for a file (``data`` a path); added after the others, so stored records keep their order.
    time_column: str = "time"
    channels: tuple[str, ...] = ()
    step_seconds: float = 0.0
    split: str = ""
    split_at: str = ""
    max_gap_steps: int = 0
    test_data: str = ""

    CONFIG_NAME: ClassVar[str] = "task config"
    RECORD_LEADS: ClassVar[tuple[str, ...]] = ("task", "model", "data")

    def __post_init__(self) -> None:
        checks = {
            "task in ['class', 'series']": self.task in ("series", "class"),
            "model in ['aaren', 'transformer', 'gru'] (or 'dlinear' for series)": self.model
            in ("aaren", "transformer", "gru") + (("dlinear",) if self.task == "series" else ()),
            "horizon, lookback, window, loss_stride, val_stride >= 1": min(
                self.horizon, self.lookback, self.window, self.loss_stride, self.val_stride
            )
            >= 1,
            **self.knob_checks(),
            "steps_per_epoch >= 0": self.steps_per_epoch >= 0,
            "0 < val_fraction < 1": 0 < self.val_fraction < 1,
            "split in ['', 'ratio', 'ett']": self.split in ("", "ratio", "ett"),
            "step_seconds >= 0, max_gap_steps >= 0": self.step_seconds >= 0 and self.max_gap_steps >= 0,
            "name empty or [A-Za-z0-9][A-Za-z0-9._-]{0,63}": not self.name or bool(NAME_PATTERN.fullmatch(self.name)),
        }
        self.require(checks)

    @property
    def decays(self) -> bool:
        """Whether the backbone ages its state by the steps: ``time_decay``, by default on for a
        series Aaren and off otherwise; never for the Transformer, GRU or DLinear."""
        if self.model != "aaren":
            return False
        return self.task == "series" if self.time_decay is None else self.time_decay

    @property
    def run_name(self) -> str:
        """The served model name: ``name``, or ``aaren-<task>-<data>`` (``aaren-series-power-hourly``;
        for a file, its name without suffixes, other characters than ``[A-Za-z0-9._-]`` as ``-``)."""
        if self.name:
            return self.name
        if self.is_file_data:
            stem = re.sub(r"[^A-Za-z0-9._-]", "-", Path(self.data).name.split(".")[0]).strip("-._") or "file"
            return f"aaren-{self.task}-{stem}"[:64]
        return f"aaren-{self.task}-{self.data}"

    @property
    def is_file_data(self) -> bool:
        """Whether ``data`` is a file rather than a name of the built-in sets."""
        known = SERIES_DATASETS if self.task == "series" else CLASS_DATASETS
        return self.data not in known

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> TaskTrainConfig:
        """The config a checkpoint's ``train_config`` stored; keys added since default (``name``)."""
        if record.get("task") not in ("series", "class"):
            raise ValueError(f"train_config: task {record.get('task')!r}; expected 'series' or 'class'")
        # Series runs stored before window offsets existed trained without them.
        if record["task"] == "series":
            record = {"window_offsets": False, **record}
        return cls(task=record["task"]).replace(**{k: v for k, v in record.items() if k != "task"})  # type: ignore[no-any-return]

    def backbone(self) -> BackboneConfig:
        return BackboneConfig.sized_as(self, self.model, self.decays)

    def to_dict(self) -> dict[str, Any]:
        """The fields, ``time_decay`` as it applies (so a stored config reads the same whatever
        later defaults say)."""
        return {**super().to_dict(), "time_decay": self.decays}


DEFAULT_DATA = {"series": "power-hourly", "class": "JapaneseVowels"}


def load_task_data(config: TaskTrainConfig) -> SeriesData | ClassData:
    """Read ``config.data``: a name of ``SERIES_DATASETS`` or ``CLASS_DATASETS`` (by task) from the
    wheel cache, else a file (``aaren_core.tasks.series.files``, ``aaren_core.tasks.classify.files``);
    ``DataError`` for a missing wheel or a bad file."""
    if config.is_file_data:
        if not Path(config.data).expanduser().is_file():
            known = SERIES_DATASETS if config.task == "series" else CLASS_DATASETS
            raise DataError(
                f"unknown {config.task} data set {config.data!r}: no such file, and not one of {sorted(known)}"
            )
        if config.task == "series":
            from aaren_core.tasks.series.files import load_series_file

            return load_series_file(config)
        from aaren_core.tasks.classify.files import load_class_files

        return load_class_files(config)
    if config.test_data:
        raise DataError(f"test_data is for a class file; {config.data} has its own test part")
    cache = config.cache or None
    if config.task == "series":
        return load_series(config.data, cache, split=config.split or None)
    return load_class(config.data, cache)


def checkpoint_metadata(config: TaskTrainConfig, data: SeriesData | ClassData) -> dict[str, Any]:
    """What ``train_task`` stores beside the weights: ``task``, ``data``, ``source``, ``name`` (the
    served model name), ``channels``, ``train_config``; series also ``horizon``, ``quantiles``,
    ``step_seconds`` (the regular step, ``SeriesData.period``) and ``time_unit`` (``"seconds"``:
    event times are seconds since the Unix epoch, the calendar features come from them); class
    also ``class_names``. Series also store the gap rule the server follows: ``fill: "forward"``
    (a missing value is the last one, before any the train mean), ``max_gap_steps`` (most missing
    steps a stream may skip at once; config 0: one week of steps) and ``test_from`` (ISO UTC time of
    the test part's first step)."""
    meta: dict[str, Any] = {"task": config.task, "data": config.data, "source": data.source, "name": config.run_name}
    if isinstance(data, SeriesData):
        meta |= {
            "channels": list(data.channels),
            "horizon": config.horizon,
            "quantiles": list(config.quantiles),
            "step_seconds": float(data.period),
            "time_unit": "seconds",
            "fill": "forward",
            "max_gap_steps": config.max_gap_steps or default_max_gap_steps(data.period),
            "test_from": data.test_from,
        }
    else:
        meta |= {"channels": list(data.channels), "class_names": list(data.class_names)}
    return {**meta, "train_config": config.to_dict()}


def command_line(config: TaskTrainConfig) -> str:
    """The ``aaren train --task ...`` command that runs ``config``: ``--data``, ``--name`` and
    ``--out-dir`` always, ``--set`` for every other key that differs from the defaults."""
    return generic_command_line(config, TaskTrainConfig(task=config.task), always=("task", "data", "name", "out_dir"))
