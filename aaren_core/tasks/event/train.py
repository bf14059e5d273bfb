"""Training the event forecaster, in one process or under ``torchrun`` with DDP.

``train(config)`` runs the one training loop (``aaren_core.training.loop.fit``) with the event
task's hooks (``EventLoop``): it fits an ``EventModel`` by minimizing the mean total negative
log-likelihood per predicted event (time + mark + values, ``EventModel.nll``) with AdamW, a
linear warmup and a cosine decay. It validates every epoch, keeps the best checkpoint by validation NLL
(``<out_dir>/best``), and after every epoch writes ``<out_dir>/last`` (weights, optimizer state and
the trainer's progress; safetensors and JSON, no pickle) so ``resume=True`` continues exactly
where the run stopped.

Tied times. Event times recorded to a resolution (whole minutes on the flights task) tie often,
and a continuous gap density on tied data rewards a spike at zero. Training data are dequantized
with ``aaren_core.tasks.event.data.dequantize`` (``U(0, jitter)`` added to every time, sequences re-sorted),
with a fresh draw every epoch; validation and test use one fixed draw (``eval_seed``), so every
evaluation of every model scores the same events. Unless ``jitter`` is given, it is the
resolution ``aaren_core.tasks.event.data.time_resolution`` derives from the training times (0, no
dequantization, for continuous times).

Split. A built-in data set has its own fixed split; an events file is split by event time or by
session (``split``; by default by time when sessions are long, see ``aaren_core.tasks.event.data.choose_split``).
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
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from aaren.formats.times import parse_time
from aaren_core.checkpoint import load_checkpoint, save_checkpoint
from aaren_core.config import fields_of
from aaren_core.tasks.event.config import TrainConfig
from aaren_core.tasks.event.data import DataError, EventSequence, pad_batch
from aaren_core.tasks.event.files import load_events
from aaren_core.tasks.event.flights import BUILTIN_DATASETS
from aaren_core.tasks.event.model import EventModel, EventModelConfig, EventSizes
from aaren_core.tasks.event.resolution import TimeResolution, dequantize, time_resolution
from aaren_core.tasks.event.schema import fit_standardization
from aaren_core.tasks.event.splits import DataSplit, EventData, choose_split, split_at_times, split_cutoffs
from aaren_core.training.loop import (
    Dist,
    EarlyStopping,
    EpochEnd,
    LoopSettings,
    LoopState,
    Schedule,
    StepLoss,
    Validation,
    fit,
    json_safe,
    load_optimizer,
    replace_dir,
    save_optimizer,
    setup_distributed,
)

__all__ = [
    "SPLIT_STREAMS",
    "EventLoop",
    "TrainResult",
    "build_model",
    "eval_jitter",
    "fit_log_dt",
    "load_data",
    "lr_at",
    "nll_sums",
    "resolve_config",
    "schedule",
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


@dataclasses.dataclass
class TrainResult(LoopState):
    """What a run produced: the loop's final state (per-epoch ``history``, per-step global
    ``step_losses``, ``best_epoch``...), where it wrote, and the model's parameter count."""

    out_dir: Path = Path()
    parameters: int = 0

    @property
    def best_dir(self) -> Path:
        return self.out_dir / BEST_DIR

    @property
    def last_dir(self) -> Path:
        return self.out_dir / LAST_DIR

    @property
    def best_val(self) -> float:
        """The best epoch's validation NLL."""
        return float(self.best_score)


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
            **fields_of(EventSizes, config),
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
    return schedule(config, total_steps).at(step)


def schedule(config: TrainConfig, total_steps: int) -> Schedule:
    """The run's learning-rate schedule over ``total_steps`` (``aaren_core.training.loop.Schedule``)."""
    return Schedule(config.lr, total_steps, config.warmup_steps, config.min_lr_ratio)


def predicted_events(sequences: Sequence[EventSequence]) -> int:
    """How many events the sequences ask the model to predict (all but each session's first)."""
    return sum(s.predicted for s in sequences)


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


def _make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    # No decay on biases, norms and the learned query/scale vectors: shrinking them is no regularizer.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.98), eps=1e-8)


def _write_best(directory: Path, *, model: EventModel, metadata: dict[str, Any]) -> None:
    save_checkpoint(directory, model, json_safe(metadata))


def _write_last(
    directory: Path,
    *,
    model: EventModel,
    optimizer: torch.optim.Optimizer,
    metadata: dict[str, Any],
    trainer_state: dict[str, Any],
) -> None:
    """The resumable checkpoint: the model, the optimizer's tensors and the trainer's progress (JSON)."""
    save_checkpoint(directory, model, json_safe(metadata))
    state = {**trainer_state, "optimizer": save_optimizer(directory / OPTIMIZER_FILE, optimizer)}
    (directory / TRAINER_FILE).write_text(json.dumps(json_safe(state)) + "\n")


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
    ctx, device, created_group = setup_distributed(config.device, config.threads)
    try:
        return _train(config, ctx, device, resume, data, stop_after_epochs, log)
    finally:
        if created_group:
            dist.destroy_process_group()


def _read_resume(last_dir: Path, config: TrainConfig) -> dict[str, Any]:
    trainer_path = last_dir / TRAINER_FILE
    if not trainer_path.is_file():
        raise FileNotFoundError(f"cannot resume: no {trainer_path}; train without --resume first")
    saved: dict[str, Any] = json.loads(trainer_path.read_text())
    saved_config = saved["config"]
    changed = [k for k in _RESUME_KEYS if k != "epochs" and saved_config.get(k) != config.to_dict()[k]]
    if changed:
        raise ValueError(f"cannot resume {last_dir}: the config differs in {changed}")
    return saved


class EventLoop:
    """The event task's part of the training loop (``aaren_core.training.loop.TaskLoop``): batches
    of dequantized sessions sharded over the ranks, the summed NLL as the loss, the validation NLL
    as the score, ``best/`` and ``last/`` written on rank 0."""

    def __init__(
        self,
        config: TrainConfig,
        data: EventData,
        model: EventModel,
        optimizer: torch.optim.Optimizer,
        ctx: Dist,
        device: torch.device,
        metadata: dict[str, Any],
    ) -> None:
        self.config, self.data, self.model, self.optimizer = config, data, model, optimizer
        self.ctx, self.device, self.metadata = ctx, device, metadata
        val_seqs, _ = eval_jitter(data.val, config, "val")
        if config.length_buckets:
            val_seqs = sorted(val_seqs, key=len)  # less padding; the summed NLL does not depend on the order
        self.val_seqs = val_seqs
        self.net: nn.Module = _NLLSums(model)
        if ctx.active:
            self.net = nn.parallel.DistributedDataParallel(
                self.net, device_ids=[device.index] if device.type == "cuda" else None
            )
        out_dir = Path(config.out_dir)
        self.out_dir, self.best_dir, self.last_dir = out_dir, out_dir / BEST_DIR, out_dir / LAST_DIR

    def batches(self, epoch: int) -> list[list[EventSequence]]:
        config = self.config
        # Everything random in this epoch derives from (seed, epoch): resuming replays it exactly.
        torch.manual_seed(config.seed * 1_000_003 + epoch)
        rng = np.random.default_rng([config.seed, epoch])
        train_seqs = dequantize(self.data.train, config.jitter, rng)[0] if config.jitter else list(self.data.train)
        order = rng.permutation(len(train_seqs))
        return [
            [train_seqs[int(i)] for i in members]
            for members in batch_order(order, [len(s) for s in train_seqs], config, rng)
        ]

    def step_loss(self, global_batch: list[EventSequence]) -> StepLoss:
        ctx = self.ctx
        count = predicted_events(global_batch)
        shard = global_batch[ctx.rank :: ctx.world]
        # A rank with no sequence still runs forward/backward (weight 0): DDP needs every rank.
        weight = ctx.world / max(count, 1) if shard else 0.0
        batch = pad_batch(shard or global_batch[:1], self.data.schema, raw_values=True).to(self.device)
        sums = self.net(batch.dt, batch.marks, batch.values, batch.mask, batch.scored)
        batch_sum = ctx.all_reduce(sums[:3].detach().sum().double() * (1.0 if shard else 0.0))
        return StepLoss(sums[:3].sum() * weight, float(batch_sum), count)

    def validate(self, train_loss: float) -> Validation:
        ctx = self.ctx
        val_sums = torch.zeros(4, dtype=torch.float64, device=self.device)
        val_sums += nll_sums(
            self.model, self.val_seqs[ctx.rank :: ctx.world], self.data, self.config.eval_batch_size, self.device
        )
        val = _val_metrics(ctx.all_reduce(val_sums))
        return Validation(val["total"], val)

    def record(self, end: EpochEnd) -> dict[str, Any]:
        return {
            "epoch": end.epoch,
            "step": end.step,
            "train_loss": end.train_loss,
            "val": end.validation.metrics,
            "val_smoothed": end.smoothed,
            "lr": end.lr,
            "seconds": end.seconds,
            "events_per_s": end.items / end.seconds,
            "best": end.improved,
        }

    def summary(self, end: EpochEnd, record: dict[str, Any]) -> str:
        val = end.validation.metrics
        return (
            f"epoch {end.epoch}/{self.config.epochs}  train {record['train_loss']:.4f}  val {val['total']:.4f} "
            f"(time {val['time']:.4f} mark {val['mark']:.4f} value {val['value']:.4f})  "
            f"{record['events_per_s']:,.0f} ev/s  {end.seconds:.1f}s{'  *best' if end.improved else ''}"
            f"{'  early stop' if end.stop else ''}"
        )

    def _metadata(self, end: EpochEnd) -> dict[str, Any]:
        return {**self.metadata, "val_metrics": end.validation.metrics, "epoch": end.epoch, "step": end.step}

    def on_best(self, end: EpochEnd) -> None:
        if self.ctx.rank == 0:
            replace_dir(self.best_dir, functools.partial(_write_best, model=self.model, metadata=self._metadata(end)))

    def on_epoch_end(self, state: LoopState, stopper: EarlyStopping, end: EpochEnd) -> None:
        if self.ctx.rank != 0:
            return
        trainer_state = {
            "config": self.config.to_dict(),
            "epoch": state.epoch,
            "step": state.step,
            "best_val": state.best_score,
            "best_epoch": state.best_epoch,
            "early_stopping": stopper.state(),
            "stopped_early": state.stopped_early,
            "train_seconds": state.train_seconds,
            "history": state.history,
            "step_losses": state.step_losses,
        }
        write = functools.partial(
            _write_last,
            model=self.model,
            optimizer=self.optimizer,
            metadata=self._metadata(end),
            trainer_state=trainer_state,
        )
        replace_dir(self.last_dir, write)
        (self.out_dir / HISTORY_FILE).write_text(json.dumps(json_safe(state.history), indent=1) + "\n")


def _train(
    config: TrainConfig,
    ctx: Dist,
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
    train_fixed, _ = eval_jitter(data.train, config, "train")
    log_dt = fit_log_dt(train_fixed)
    model = build_model(config, data, log_dt).to(device)
    optimizer = _make_optimizer(model, config)
    steps_per_epoch = math.ceil(len(data.train) / config.batch_size)
    parameters = sum(p.numel() for p in model.parameters())
    metadata = {
        "name": config.run_name,
        "schema": data.schema.to_dict(),
        "train_config": config.to_dict(),
        "dequantization": dequantization,
        "split": None if data.split is None else data.split.to_dict(),
        "log_dt": {"mean": log_dt[0], "std": log_dt[1]},
        "parameters": parameters,
    }
    last_dir = Path(config.out_dir) / LAST_DIR
    state = LoopState()
    stopper = EarlyStopping(config.patience, config.min_delta, config.smoothing)
    if resume:
        saved = _read_resume(last_dir, config)
        model.load_state_dict(load_checkpoint(last_dir).model.state_dict())
        load_optimizer(last_dir / OPTIMIZER_FILE, saved["optimizer"], optimizer)
        state = LoopState(
            epoch=saved["epoch"],
            step=saved["step"],
            best_score=float(saved["best_val"]),
            best_epoch=saved["best_epoch"],
            history=saved["history"],
            step_losses=saved["step_losses"],
            train_seconds=saved["train_seconds"],
            stopped_early=saved["stopped_early"],
        )
        stopper.load(saved["early_stopping"])
        say(f"resuming {last_dir} after epoch {state.epoch}")
    task = EventLoop(config, data, model, optimizer, ctx, device, metadata)
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
    settings = LoopSettings.of(
        config, schedule(config, steps_per_epoch * config.epochs), stop_after=stop_after_epochs, unit="ev"
    )
    state = fit(model, optimizer, task, settings, state=state, stopper=stopper, ctx=ctx, say=say)
    return TrainResult(**vars(state), out_dir=task.out_dir, parameters=parameters)
