"""The front door of aaren_core's tasks: train any task, evaluate any checkpoint by its kind.

``train_task(config)`` runs a series or class task through the one training loop
(``aaren_core.training.loop.fit``) with the task's hooks (``tasks/series/train.py``,
``tasks/classify/train.py``), then scores the best model on the test part and saves
``<out_dir>/best`` (``aaren_core.checkpoint``) and ``<out_dir>/metrics.json``; the event task
trains with ``aaren_core.tasks.event.train.train`` (resumable, torchrun/DDP). ``evaluate`` reads a
checkpoint's kind and re-scores it with its task's evaluation, writing ``report.md``,
``metrics.json`` and the plots.

``python -m aaren_core.tasks.run --task event|series|class [--config FILE] [--resume] [--set KEY=VALUE ...]``
is the same as ``aaren train`` without its flags (what ``torchrun`` may run for the event task).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aaren_core.checkpoint import CheckpointError, save_checkpoint
from aaren_core.config import parse_sets
from aaren_core.tasks.classify.data import ClassData
from aaren_core.tasks.classify.model import ClassModel
from aaren_core.tasks.classify.report import class_figures, class_report_text, class_summary
from aaren_core.tasks.classify.train import ClassLoop, class_model, score_class_task
from aaren_core.tasks.config import DEFAULT_DATA, TaskTrainConfig, checkpoint_metadata, load_task_data
from aaren_core.tasks.event.data import DataError
from aaren_core.tasks.report import METRICS_FILE, write_report
from aaren_core.tasks.series.data import SeriesData
from aaren_core.tasks.series.report import series_figures, series_report_text, series_summary
from aaren_core.tasks.series.train import SeriesLoop, score_series_task, series_model
from aaren_core.training.loop import LoopSettings, Schedule, fit

__all__ = [
    "METRICS_FILE",
    "TASKS",
    "Evaluation",
    "TaskResult",
    "checkpoint_task",
    "evaluate",
    "load_task_data",
    "main",
    "score_task",
    "task_summary",
    "train_task",
    "write_task_report",
]

TASKS = ("event", "series", "class")


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """The best model (eval mode), its metrics, and where they were written."""

    model: nn.Module
    metrics: dict[str, Any]
    out_dir: Path


def score_task(model: nn.Module, config: TaskTrainConfig, data: SeriesData | ClassData) -> dict[str, Any]:
    """The test scores training reports (``test``, ``baselines``), for ``train_task`` and for
    ``evaluate`` re-scoring a checkpoint from its stored config: ``score_series_task`` or
    ``score_class_task`` by ``config.task``."""
    if config.task == "series":
        if not isinstance(data, SeriesData):
            raise DataError(f"task series needs SeriesData; got {type(data).__name__}")
        return score_series_task(model, config, data)
    if not isinstance(data, ClassData) or not isinstance(model, ClassModel):
        raise DataError(f"task class needs ClassData and a ClassModel; got {type(data).__name__}")
    return score_class_task(model, config, data)


def train_task(config: TaskTrainConfig, data: SeriesData | ClassData | None = None, verbose: bool = True) -> TaskResult:
    """Train, select, score and save a series or class model (module docstring). ``data`` replaces
    reading ``config.data``; ``verbose`` prints a line per epoch (and a progress bar on a terminal)."""
    if config.threads:
        torch.set_num_threads(config.threads)

    def say(message: str) -> None:
        if verbose:
            print(message, flush=True)

    loaded = data if data is not None else load_task_data(config)
    torch.manual_seed(config.seed)  # the model's initialization
    task: SeriesLoop | ClassLoop
    if config.task == "series":
        if not isinstance(loaded, SeriesData):
            raise DataError(f"task series needs SeriesData; got {type(loaded).__name__}")
        model: nn.Module = series_model(config, loaded)
        task, unit = SeriesLoop(config, loaded, model), "batches"
    else:
        if not isinstance(loaded, ClassData):
            raise DataError(f"task class needs ClassData; got {type(loaded).__name__}")
        model = class_model(config, loaded)
        task, unit = ClassLoop(config, loaded, model), "batches"
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    settings = LoopSettings.of(config, Schedule.constant(config.lr), progress=verbose, unit=unit)
    state = fit(model, optimizer, task, settings, say=say)
    model.load_state_dict(task.best)
    model.eval()
    metrics = {
        "task": config.task,
        "name": config.run_name,
        "data": config.data,
        "source": loaded.source,
        "config": config.to_dict(),
        **task.selection(state),
        **score_task(model, config, loaded),
    }
    metrics["parameters"] = sum(p.numel() for p in model.parameters())
    out = Path(config.out_dir)
    meta = checkpoint_metadata(config, loaded)
    meta["selection"] = {k: metrics[k] for k in ("val_mse", "val_accuracy", "best_epoch", "epochs_run") if k in metrics}
    metrics["model_version"] = save_checkpoint(out / "best", model, meta)
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    return TaskResult(model, metrics, out)


def write_task_report(
    metrics: dict[str, Any], model: nn.Module, data: SeriesData | ClassData, out_dir: str | Path, plots: bool = True
) -> list[str]:
    """Write a series or class run's ``report.md`` (and with ``plots`` its PNGs) into ``out_dir``;
    returns the figure file names."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = TaskTrainConfig.from_dict(metrics["config"])
    if isinstance(data, SeriesData):
        figures = series_figures(model, data, config, out) if plots else []
        text = series_report_text(metrics, data, figures)
    else:
        figures = class_figures(metrics, out) if plots else []
        text = class_report_text(metrics, data, figures)
    write_report(out, text)
    return figures


def task_summary(metrics: dict[str, Any]) -> str:
    """One line of a series or class run's test scores."""
    return series_summary(metrics) if metrics["task"] == "series" else class_summary(metrics)


def checkpoint_task(checkpoint: str | Path) -> str:
    """The task of a checkpoint: the ``task`` its metadata names (series, class, policy), else ``event``
    (read as JSON; an unreadable directory is the event evaluation's to report). A policy run
    directory (its checkpoint in ``best/``) is ``policy`` too."""
    task = _metadata_task(Path(checkpoint))
    if task is None and _metadata_task(Path(checkpoint) / "best") == "policy":
        return "policy"
    return task if task in ("series", "class", "policy") else "event"


def _metadata_task(checkpoint: Path) -> str | None:
    try:
        return str(json.loads((checkpoint / "config.json").read_text())["metadata"]["task"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What ``evaluate`` did: the checkpoint's ``task``, the ``metrics`` written, a one-line ``summary``."""

    task: str
    metrics: dict[str, Any]
    summary: str


def evaluate(
    checkpoint: str | Path,
    *,
    split: str = "test",
    out_dir: str | Path | None = None,
    plots: bool = True,
    data_path: str | None = None,
    data: Any = None,
    rollout: dict[str, Any] | None = None,
) -> Evaluation:
    """Score ``checkpoint`` with its task's evaluation (``checkpoint_task``) and, with ``out_dir``,
    write ``metrics.json``, ``report.md`` and the plots there.

    Event: ``split`` (train, val or test) of the events file it was trained on (``data_path``:
    another one), beside the no-history and constant baselines. Series and class: the test split
    of the data set its stored config names, scored as training scored it, beside its baselines
    (no ``split`` but test, no ``data_path``). Policy: ``rollout`` episodes in its environment
    (``aaren_core.tasks.policy.train.evaluate_policy``'s keywords: ``episodes``, ``target_return``,
    ``seed``, ``max_steps``); a run directory's checkpoint is its ``best/``. ``data`` replaces
    reading the data (tests).
    """
    task = checkpoint_task(checkpoint)
    if task == "policy":
        from aaren_core.tasks.policy.train import evaluate_policy, policy_summary

        path = Path(checkpoint)
        ckpt = path if (path / "config.json").is_file() else path / "best"
        result = evaluate_policy(ckpt, out_dir=out_dir, **(rollout or {}))
        where = f"; metrics in {out_dir}" if out_dir is not None else ""
        return Evaluation("policy", result, policy_summary(result) + where)
    if task == "event":
        from aaren_core.tasks.event.report import evaluate_checkpoint, event_summary

        result = evaluate_checkpoint(
            checkpoint, split=split, out_dir=out_dir, plots=plots, data_path=data_path, data=data
        )
        return Evaluation("event", result, event_summary(result, out_dir))
    if split != "test":
        raise ValueError(f"--split {split}: a series or class checkpoint is scored on its test split only")
    if data_path is not None:
        raise ValueError("--data is for event checkpoints; a series or class checkpoint reads the data set it names")
    metrics = _evaluate_task_checkpoint(checkpoint, out_dir=out_dir, plots=plots, data=data)
    where = f"; report in {out_dir}" if out_dir is not None else ""
    return Evaluation(task, metrics, task_summary(metrics) + where)


def _evaluate_task_checkpoint(
    checkpoint: str | Path,
    *,
    out_dir: str | Path | None,
    plots: bool,
    data: SeriesData | ClassData | None,
) -> dict[str, Any]:
    """Re-score a ``train_task`` checkpoint on its test split as training did; returns the metrics
    (training's keys less ``history``, which the checkpoint does not keep)."""
    from aaren_core.checkpoint import load_checkpoint

    ckpt = load_checkpoint(checkpoint)
    meta = ckpt.metadata
    if meta.get("task") not in ("series", "class") or "train_config" not in meta:
        raise ValueError(f"{checkpoint}: not a series or class checkpoint from `aaren train --task series|class`")
    config = TaskTrainConfig.from_dict(meta["train_config"])
    loaded = data if data is not None else load_task_data(config)
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


def main(argv: Sequence[str] | None = None) -> None:
    """Train one task from a config file and ``--set`` keys; print where the best checkpoint went."""
    parser = argparse.ArgumentParser(prog="python -m aaren_core.tasks.run", description=main.__doc__)
    parser.add_argument("--task", choices=TASKS, default="event")
    parser.add_argument("--config", type=Path, help="event: a .json or .toml train config")
    parser.add_argument("--resume", action="store_true", help="event: continue from <out_dir>/last")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any config key")
    args = parser.parse_args(argv)
    try:
        changes = parse_sets(args.set)
        if args.task == "event":
            from aaren_core.tasks.event.config import TrainConfig
            from aaren_core.tasks.event.train import train

            base = TrainConfig.from_file(args.config) if args.config else TrainConfig()
            result = train(base.replace(**changes), resume=args.resume)
            if int(os.environ.get("RANK", "0")) == 0:
                print(json.dumps({"best_dir": str(result.best_dir), "best_val": result.best_val}))
            return
        if args.config or args.resume:
            raise ValueError(f"--config and --resume are for the event task; with --task {args.task} use --set")
        config = TaskTrainConfig(task=args.task).replace(**{"data": DEFAULT_DATA[args.task], **changes})
        task_result = train_task(config)
    except (DataError, CheckpointError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    shown = {k: v for k, v in task_result.metrics.items() if k in ("test", "baselines", "parameters")}
    print(json.dumps(shown, indent=2))


if __name__ == "__main__":
    main()
