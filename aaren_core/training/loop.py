"""The one training loop of every task: optimizer steps on a schedule, validation, early stopping,
a time budget and a progress bar; the task says what a batch, its loss and a validation score are.

``fit(model, optimizer, task, settings)`` runs epochs until ``settings.epochs`` (or the
``stop_after`` epoch of an interrupted run), early stopping or a spent time budget. Each epoch:

1. ``task.batches(epoch)`` gives the epoch's batches (the task seeds its own randomness by epoch);
2. per batch the learning rate is set from ``Schedule.at(step)`` (linear warmup, then cosine
   decay to ``min_lr_ratio * lr``; ``Schedule.constant`` holds ``lr``), ``task.step_loss(batch)``
   gives the loss, and the loop backpropagates, clips the gradient norm to ``grad_clip`` and steps;
3. ``task.validate(train_loss)`` scores the model in eval mode: a ``score`` where lower is better
   (a float, or a tuple compared in order, e.g. with a tie-break on the epoch's train loss); the
   epoch whose raw score is the lowest so far is the best (``task.on_best``), and
   ``EarlyStopping`` watches an exponential moving average of the score;
4. ``task.record`` turns the epoch (``EpochEnd``) into the history's record, ``task.summary`` into
   a line of the log, and ``task.on_epoch_end`` may persist the loop's state (``LoopState``) for a
   resume.

The time budget (``max_minutes``) is checked after each epoch (an epoch once started is
finished). Under ``torchrun`` (``Dist``) rank 0's clock decides for every rank, so all stop at
the same epoch.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

__all__ = [
    "BestInMemory",
    "Dist",
    "EarlyStopping",
    "EpochEnd",
    "LoopSettings",
    "LoopState",
    "Progress",
    "Schedule",
    "StepLoss",
    "TaskLoop",
    "TimeBudget",
    "Validation",
    "fit",
    "json_safe",
    "load_optimizer",
    "replace_dir",
    "save_optimizer",
    "setup_distributed",
]

Score = float | tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Learning rate per optimizer step (from 0): ``lr (step + 1) / warmup_steps`` during the warmup,
    then ``lr (r + (1 - r) (1 + cos(pi p)) / 2)`` with ``r = min_lr_ratio`` and ``p`` the share of
    the remaining ``total_steps`` done. ``min_lr_ratio = 1`` and no warmup is a constant ``lr``."""

    lr: float
    total_steps: int = 0
    warmup_steps: int = 0
    min_lr_ratio: float = 1.0

    @classmethod
    def constant(cls, lr: float) -> Schedule:
        return cls(lr)

    def at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _better(new: Score, best: Score, min_delta: float) -> bool:
    if isinstance(new, tuple):
        return not isinstance(best, tuple) or new < best
    return not isinstance(best, tuple) and new < best - min_delta


@dataclasses.dataclass
class EarlyStopping:
    """Stop when an exponential moving average of the validation score has not improved by
    ``min_delta`` for ``patience`` epochs: ``smoothed = smoothing * smoothed + (1 - smoothing) * val``.
    With ``smoothing = 0`` and ``min_delta = 0`` it counts the epochs since the lowest raw score;
    a tuple score (compared in order) takes that plain rule only.
    """

    patience: int
    min_delta: float = 0.0
    smoothing: float = 0.0
    smoothed: Any = math.nan
    best: Any = math.inf
    bad_epochs: int = 0

    def update(self, val: Score) -> bool:
        """Record one epoch's validation score; True when training should stop."""
        first = isinstance(self.smoothed, float) and math.isnan(self.smoothed)
        if isinstance(val, tuple) or first:
            self.smoothed = val
        else:
            self.smoothed = self.smoothing * self.smoothed + (1 - self.smoothing) * val
        if _better(self.smoothed, self.best, self.min_delta):
            self.best, self.bad_epochs = self.smoothed, 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs >= self.patience

    def state(self) -> dict[str, Any]:
        return {"smoothed": self.smoothed, "best": self.best, "bad_epochs": self.bad_epochs}

    def load(self, state: dict[str, Any]) -> None:
        self.smoothed, self.best = float(state["smoothed"]), float(state["best"])
        self.bad_epochs = int(state["bad_epochs"])


class TimeBudget:
    """A wall-clock budget of ``minutes`` from construction (0: none)."""

    def __init__(self, minutes: float) -> None:
        self.minutes = minutes
        self._t0 = time.perf_counter()

    def spent(self) -> bool:
        return bool(self.minutes) and time.perf_counter() - self._t0 >= self.minutes * 60


@dataclasses.dataclass
class Dist:
    """This process's place under ``torchrun``: ``rank`` of ``world`` (1: one process)."""

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


def setup_distributed(device_name: str, threads: int) -> tuple[Dist, torch.device, bool]:
    """Join the process group when launched by torchrun; the device (``auto``: this rank's GPU if
    any, else the CPU); whether we created the group. ``threads`` 0 keeps torch's default (split
    over the local ranks on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_name == "auto":
        device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(device_name)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    created = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        created = True
    if threads:
        torch.set_num_threads(threads)
    elif world > 1 and device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    return Dist(rank, world, local_rank), device, created


@dataclasses.dataclass(frozen=True)
class StepLoss:
    """One batch: ``loss`` to minimize, and for the log the batch's summed loss ``total`` over
    ``count`` items (the epoch's train loss is ``sum(total) / sum(count)``)."""

    loss: Tensor
    total: float
    count: int


@dataclasses.dataclass(frozen=True)
class Validation:
    """One validation: ``score`` (lower is better) and the task's ``metrics``."""

    score: Score
    metrics: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class EpochEnd:
    """What the loop knows after an epoch: ``epoch`` (epochs done, from 1), optimizer ``step``s so
    far, ``train_loss``, ``items`` trained on, ``seconds``, the learning rate of its last step, the
    ``validation``, the early stopping's ``smoothed`` score, and whether it is the best so far and
    the last."""

    epoch: int
    step: int
    train_loss: float
    items: int
    seconds: float
    lr: float
    validation: Validation
    smoothed: Any
    improved: bool
    stop: bool


@dataclasses.dataclass
class LoopState:
    """The loop's progress, all a resumed run needs besides the weights and the optimizer."""

    epoch: int = 0
    step: int = 0
    best_score: Any = math.inf
    best_epoch: int = -1
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    step_losses: list[float] = dataclasses.field(default_factory=list)
    train_seconds: float = 0.0
    stopped_early: bool = False


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """How long the loop trains: at most ``epochs``, no new epoch past the budget ``max_minutes``
    (0: none), and this call ends after ``stop_after`` epochs in all, as an interruption would; how
    each step updates: the ``schedule`` and ``grad_clip`` (0: none); early stopping (``patience``,
    ``min_delta``, ``smoothing``); and a progress bar whose rate counts ``unit``."""

    epochs: int
    max_minutes: float = 0.0
    stop_after: int | None = None

    schedule: Schedule = dataclasses.field(kw_only=True)
    grad_clip: float = 0.0

    patience: int = 1
    min_delta: float = 0.0
    smoothing: float = 0.0

    progress: bool = False
    unit: str = "items"

    @classmethod
    def of(cls, config: object, schedule: Schedule, **given: Any) -> LoopSettings:
        """The settings a train config holds under these names (``epochs``, ``grad_clip``,
        ``patience``...; those it lacks keep their defaults), with ``schedule`` and the caller's
        ``given`` ones (``unit``, ``stop_after``...)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "schedule" and f.name not in given]
        held = {name: getattr(config, name) for name in names if hasattr(config, name)}
        return cls(schedule=schedule, **held, **given)


class TaskLoop(Protocol):
    """What a task tells the loop (module docstring)."""

    def batches(self, epoch: int) -> Sequence[Any]: ...

    def step_loss(self, batch: Any) -> StepLoss: ...

    def validate(self, train_loss: float) -> Validation: ...

    def record(self, end: EpochEnd) -> dict[str, Any]: ...

    def summary(self, end: EpochEnd, record: dict[str, Any]) -> str: ...

    def on_best(self, end: EpochEnd) -> None: ...

    def on_epoch_end(self, state: LoopState, stopper: EarlyStopping, end: EpochEnd) -> None: ...


class BestInMemory:
    """The part of a ``TaskLoop`` for a task that keeps its best weights in memory (``best``) and
    persists nothing per epoch; ``selected`` reports the choice as training's metrics do (epochs
    counted from 0). ``self.model`` is the model trained."""

    model: nn.Module
    best: dict[str, Tensor]

    def keep(self) -> None:
        self.best = copy.deepcopy(self.model.state_dict())

    def on_best(self, end: EpochEnd) -> None:
        self.keep()

    def on_epoch_end(self, state: LoopState, stopper: EarlyStopping, end: EpochEnd) -> None:
        pass

    def selected(self, state: LoopState, key: str, value: float) -> dict[str, Any]:
        """``history``, ``key: value`` (the best validation score), ``best_epoch``, ``epochs_run``."""
        return {
            "history": state.history,
            key: value,
            "best_epoch": max(state.best_epoch - 1, 0),
            "epochs_run": len(state.history),
        }


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: TaskLoop,
    settings: LoopSettings,
    *,
    state: LoopState | None = None,
    stopper: EarlyStopping | None = None,
    ctx: Dist | None = None,
    say: Callable[[str], None] = lambda message: None,
) -> LoopState:
    """Train ``model`` as the module docstring says, from ``state`` (a resumed run's) or from scratch;
    returns the final state. ``say`` gets one line per epoch (and the budget's notice)."""
    ctx = ctx or Dist()
    state = state or LoopState()
    stopper = stopper or EarlyStopping(settings.patience, settings.min_delta, settings.smoothing)
    last_epoch = settings.epochs if settings.stop_after is None else min(settings.epochs, settings.stop_after)
    budget = TimeBudget(settings.max_minutes)
    progress = Progress(settings.progress and ctx.rank == 0, settings.unit)
    out_of_time = False
    while state.epoch < last_epoch and not state.stopped_early and not out_of_time:
        t0 = time.perf_counter()
        batches = task.batches(state.epoch)
        model.train()
        total, items = 0.0, 0
        progress.start(state.epoch, settings.epochs, len(batches))
        for batch in batches:
            for group in optimizer.param_groups:
                group["lr"] = settings.schedule.at(state.step)
            step = task.step_loss(batch)
            optimizer.zero_grad(set_to_none=True)
            step.loss.backward()
            if settings.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            optimizer.step()
            state.step += 1
            state.step_losses.append(step.total / max(step.count, 1))
            total += step.total
            items += step.count
            progress.advance(state.step_losses[-1], items)
        model.eval()
        validation = task.validate(total / max(items, 1))
        seconds = time.perf_counter() - t0
        state.train_seconds += seconds
        state.epoch += 1
        improved = _better(validation.score, state.best_score, 0.0)
        stop = stopper.update(validation.score)
        end = EpochEnd(
            epoch=state.epoch,
            step=state.step,
            train_loss=total / max(items, 1),
            items=items,
            seconds=seconds,
            lr=settings.schedule.at(state.step - 1),
            validation=validation,
            smoothed=stopper.smoothed,
            improved=improved,
            stop=stop,
        )
        record = task.record(end)
        state.history.append(record)
        progress.stop()
        if improved:
            state.best_score, state.best_epoch = validation.score, state.epoch
            task.on_best(end)
        state.stopped_early = stop
        say(task.summary(end, record))
        task.on_epoch_end(state, stopper, end)
        ctx.barrier()
        if settings.max_minutes:
            # Every rank must take the same decision, so rank 0's clock decides for all.
            spent = float(budget.spent()) if ctx.rank == 0 else 0.0
            device = next(model.parameters()).device
            out_of_time = bool(ctx.all_reduce(torch.tensor(spent, dtype=torch.float64, device=device)) > 0)
            if out_of_time and state.epoch < last_epoch and not state.stopped_early:
                say(
                    f"time budget of {settings.max_minutes:g} min spent after epoch {state.epoch}; "
                    f"best epoch {state.best_epoch}"
                )
    return state


class Progress:
    """A rich progress bar per epoch (loss, ``unit``/s) on stderr, when enabled, rich is installed and
    stderr is a terminal (logs to files get the per-epoch lines only)."""

    def __init__(self, enabled: bool, unit: str = "items") -> None:
        self.unit = unit
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

    def start(self, epoch: int, epochs: int, steps: int) -> None:
        if not self.enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self._bar = Bar(
            TextColumn(f"epoch {epoch + 1}/{epochs}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}  {task.fields[rate]:,.0f} " + self.unit + "/s"),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task("train", total=steps, loss=math.nan, rate=0.0)
        self._t0 = time.perf_counter()

    def advance(self, loss: float, items: int) -> None:
        if self._bar is not None:
            rate = items / max(time.perf_counter() - self._t0, 1e-9)
            self._bar.update(self._task, advance=1, loss=loss, rate=rate)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def save_optimizer(path: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Optimizer tensors to safetensors at ``path`` (no pickle); returns the JSON-ready rest (param groups)."""
    state = optimizer.state_dict()
    tensors = {
        f"{index}.{key}": value.detach().cpu().contiguous()
        for index, entries in state["state"].items()
        for key, value in entries.items()
        if isinstance(value, Tensor)
    }
    save_file(tensors, str(path))
    return {"param_groups": state["param_groups"]}


def load_optimizer(path: Path, groups: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """The optimizer state ``save_optimizer`` wrote (tensors at ``path``, ``groups`` its return)."""
    state: dict[int, dict[str, Tensor]] = {}
    for name, value in load_file(str(path)).items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": groups["param_groups"]})


def replace_dir(target: Path, write: Callable[[Path], None]) -> None:
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


def json_safe(x: Any) -> Any:
    """``x`` with non-finite floats as strings (``"inf"``, ``"nan"``) and tuples as lists, for strict JSON."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x
