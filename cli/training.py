"""The model commands: ``aaren train``, ``aaren evaluate`` and ``aaren split export``.

They reach into ``aaren_core`` (torch), imported inside each function only, so that loading the
command line and running its client commands never loads torch.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
import typer.core


class TrainCommand(typer.core.TyperCommand):
    """``aaren train --help`` ends with the ``--set`` keys, read from aaren_core when help is shown."""

    def format_help(self, ctx: typer.Context, formatter: typer.core.click.HelpFormatter) -> None:
        from aaren_core.config import format_value
        from aaren_core.datasets import CLASS_DATASETS, SERIES_DATASETS
        from aaren_core.tasks import config as task_config
        from aaren_core.tasks.event.config import SET_KEYS, TrainConfig

        defaults = TrainConfig().to_dict()
        keys = "\n".join(f"  {k}: {text} [default: {_shown(defaults[k])}]" for k, text in SET_KEYS.items())
        task_defaults = task_config.TaskTrainConfig().to_dict()
        task_keys = "\n".join(
            # Parentheses: rich would take "[default: ...]" for markup and drop it.
            f"  {k}: {text} (default: {format_value(task_defaults[k]) or 'none'})"
            for k, text in task_config.SET_KEYS.items()
            if k not in ("task", "data", "out_dir", "name")
        )
        shared = ", ".join(f"--{key.replace('_', '-')}" for key in CONFIG_FLAGS if key != "time_unit")
        self.epilog = (
            f"Keys for --set KEY=VALUE (or a --config file):\n\n{keys}\n\n"
            f"With --task series or --task class (data sets: series {', '.join(SERIES_DATASETS)}; class "
            f"{', '.join(CLASS_DATASETS)}), --set takes these keys instead (the shared flags {shared} work "
            f"too):\n\n{task_keys}"
        )
        super().format_help(ctx, formatter)


def _fail(message: str) -> typer.Exit:
    """Print ``error: message`` to stderr; the caller raises the returned exit (status 1)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _set_items(items: list[str] | None) -> dict[str, str]:
    from aaren_core.config import parse_sets

    try:
        return parse_sets(items or [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--set") from None


def _train_task(task: str, flags: dict[str, object], set_items: list[str] | None) -> None:
    """``aaren train --task series|class``: ``aaren_core.tasks.run.train_task``, then the report."""
    from aaren_core.checkpoint import CheckpointError
    from aaren_core.tasks import run
    from aaren_core.tasks.config import DEFAULT_DATA, TaskTrainConfig
    from aaren_core.tasks.event.data import DataError

    changes = _set_items(set_items)
    if "task" in changes:
        raise _fail("give the task with --task, not --set task=...")
    try:
        cfg = TaskTrainConfig(task=task).replace(**{"data": DEFAULT_DATA[task], **flags, **changes})
        # Files are stored absolute, so `aaren evaluate` finds them from any directory.
        if cfg.is_file_data and Path(cfg.data).expanduser().is_file():
            cfg = cfg.replace(data=str(Path(cfg.data).expanduser().resolve()))
        if cfg.test_data:
            cfg = cfg.replace(test_data=str(Path(cfg.test_data).expanduser().resolve()))
        data = run.load_task_data(cfg)
        result = run.train_task(cfg, data)
        run.write_task_report(result.metrics, result.model, data, result.out_dir)
    except (DataError, CheckpointError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(run.task_summary(result.metrics))
    typer.echo(f"checkpoint {result.out_dir / 'best'}; report {result.out_dir / 'report.md'}")


def _train_policy(flags: dict[str, object], set_items: list[str] | None) -> None:
    """``aaren train --task policy``: ``aaren_core.tasks.policy.train.train_policy`` (it writes the report)."""
    from aaren_core.checkpoint import CheckpointError
    from aaren_core.tasks.event.data import DataError
    from aaren_core.tasks.policy.train import PolicyTrainConfig, train_policy

    changes = _set_items(set_items)
    try:
        cfg = PolicyTrainConfig().replace(**{**flags, **changes})
        if Path(cfg.data).suffix and Path(cfg.data).expanduser().is_file():
            cfg = cfg.replace(data=str(Path(cfg.data).expanduser().resolve()))
        result = train_policy(cfg)
    except (DataError, CheckpointError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"checkpoint {result.out_dir / 'best'}; report {result.out_dir / 'report.md'}")


def _shown(value: object) -> str:
    return "none" if value is None else repr(value) if value == "" else str(value).lower()


def _data_path(data: str) -> str:
    """``--data`` as stored in the checkpoint: absolute, so evaluate works from any directory."""
    from aaren_core.tasks.event.flights import BUILTIN_DATASETS

    return data if data in BUILTIN_DATASETS else str(Path(data).expanduser().resolve())


#: The config keys ``aaren train`` takes as flags of their own, key -> (type, help): each is an
#: option ``--key`` of ``train`` (``_with_config_flags``), None when not given, which sets the config
#: key of that name (with --task series or class, ``backbone`` sets the config's ``model``).
CONFIG_FLAGS: dict[str, tuple[type, str]] = {
    "backbone": (str, "aaren, transformer or gru"),
    "d_model": (int, "model width"),
    "n_layers": (int, "backbone layers"),
    "n_heads": (int, "attention heads"),
    "data": (
        str,
        "`flights` or a .csv/.parquet of session_id,time,mark[,values]; with --task series or "
        "class a data set name (power-hourly, JapaneseVowels...)",
    ),
    "time_unit": (str, "unit of numeric times in --data: seconds, minutes, hours or days"),
    "epochs": (int, "most epochs (early stopping may end sooner)"),
    "batch_size": (int, "sessions per global batch"),
    "lr": (float, "peak learning rate"),
    "seed": (int, "seed of everything random"),
    "out_dir": (str, "run directory (best/ and last/ checkpoints)"),
    "name": (str, "model name in the checkpoint (the served name)"),
}


def _with_config_flags(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` (keyword-only parameters and ``**flags``) with the signature typer builds the
    command from: its own options, with one option per ``CONFIG_FLAGS`` key after ``config``."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.kind is p.KEYWORD_ONLY]
    flags = [
        inspect.Parameter(
            key,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[kind | None, typer.Option(help=text)],
        )
        for key, (kind, text) in CONFIG_FLAGS.items()
    ]
    at = [p.name for p in own].index("config") + 1
    command.__signature__ = inspect.Signature([*own[:at], *flags, *own[at:]], return_annotation=None)  # type: ignore[attr-defined]
    return command


@_with_config_flags
def train(
    *,
    task: Annotated[
        str,
        typer.Option(
            help="event (forecast the next event), series (the next H steps of every channel, mean and "
            "quantiles) or class (class probabilities after every step)"
        ),
    ] = "event",
    config: Annotated[Path | None, typer.Option(help="a .json or .toml train config (flags override it)")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="any other config key, KEY=VALUE (repeatable)", metavar="KEY=VALUE"),
    ] = None,
    resume: Annotated[bool, typer.Option(help="continue from <out_dir>/last")] = False,
    time_column: Annotated[
        str | None,
        typer.Option(help="series file: the column of the times (ISO datetimes or Unix seconds) [default: time]"),
    ] = None,
    channels: Annotated[
        str | None,
        typer.Option(help="series file: the channels, comma-separated [default: every numeric column but the time]"),
    ] = None,
    test_data: Annotated[
        str | None,
        typer.Option(help="class: a test file of the same format as --data [default: a stratified 20% of --data]"),
    ] = None,
    **flags: str | int | float | None,
) -> None:
    """Train a forecaster (also under `torchrun --nproc_per_node=N`, with DistributedDataParallel).

    --task series or --task class trains a series forecaster or a sequence classifier on a named
    data set instead and writes best/, metrics.json and report.md (with plots) into --out-dir.
    """
    # The CONFIG_FLAGS options; unset (None) keeps the config's value.
    given = {k: v for k, v in flags.items() if v is not None}
    task_flags = {"time_column": time_column, "channels": channels, "test_data": test_data}
    if task in ("series", "class"):
        given |= {k: v for k, v in task_flags.items() if v is not None}
        for flag, value in (
            ("--config", config),
            ("--time-unit", flags.get("time_unit")),
            ("--resume", resume or None),
        ):
            if value is not None:
                raise _fail(f"{flag} is for the event task; with --task {task} use --set KEY=VALUE")
        # The series and class configs call the backbone ``model`` (it may also be ``dlinear``).
        _train_task(task, {("model" if k == "backbone" else k): v for k, v in given.items()}, set_)
        return
    if task == "policy":
        for flag, value in (
            ("--config", config),
            ("--time-unit", flags.get("time_unit")),
            ("--resume", resume or None),
            *((f"--{k.replace('_', '-')}", v) for k, v in task_flags.items()),
        ):
            if value is not None:
                raise _fail(f"{flag} is not for --task policy; use --set KEY=VALUE")
        _train_policy(given, set_)
        return
    if task != "event":
        raise _fail(f"--task {task!r}: expected event, series, class or policy")
    for key, value in task_flags.items():
        if value is not None:
            raise _fail(f"--{key.replace('_', '-')} is for --task series or class")
    from aaren_core.tasks.event.config import TrainConfig
    from aaren_core.tasks.event.data import DataError
    from aaren_core.tasks.event.train import train as run_training

    changes = {**given, **_set_items(set_)}
    try:
        base = TrainConfig.from_file(config) if config else TrainConfig()
        cfg = base.replace(**changes)
        cfg = cfg.replace(data=_data_path(cfg.data))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        result = run_training(cfg, resume=resume)
    except DataError as exc:
        raise typer.BadParameter(str(exc), param_hint="--data") from None
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one line, not one per process
        typer.echo(f"best checkpoint: {result.best_dir} (val NLL {result.best_val:.4f}, epoch {result.best_epoch})")


def evaluate(
    checkpoint: Annotated[Path, typer.Argument(help="a checkpoint directory written by `aaren train`")],
    split: Annotated[str, typer.Option(help="train, val or test")] = "test",
    data: Annotated[
        str | None,
        typer.Option(help="the events file to split and score [default: the one the checkpoint was trained on]"),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="report directory [default: the checkpoint directory]")] = None,
    plots: Annotated[bool, typer.Option(help="draw PNG plots")] = True,
    episodes: Annotated[int, typer.Option(help="policy: rollout episodes")] = 10,
    target_return: Annotated[
        float | None, typer.Option(help="policy: target return R_0 [default: the checkpoint's]")
    ] = None,
    seed: Annotated[int, typer.Option(help="policy: episode i resets with seed + i")] = 0,
    max_steps: Annotated[int, typer.Option(help="policy: most steps per episode")] = 1000,
    parallel: Annotated[bool, typer.Option(help="policy: step the episodes together as one batch")] = False,
) -> None:
    """Score a checkpoint and the no-history/constant baselines; write report.md, metrics.json, plots.

    A series or class checkpoint (from `aaren train --task series|class`) is re-scored on its test
    split from its stored config, as training scored it, beside its baselines. A policy run (from
    `aaren train --task policy`; its directory or its best/) is rolled out for --episodes episodes in
    its environment: returns and D4RL normalised scores.
    """
    from aaren_core.checkpoint import CheckpointError
    from aaren_core.tasks import run
    from aaren_core.tasks.event.data import DataError

    task = run.checkpoint_task(checkpoint)
    if task == "event" and split not in ("train", "val", "test"):
        raise typer.BadParameter(f"{split!r}: expected train, val or test", param_hint="--split")
    try:
        evaluation = run.evaluate(
            checkpoint,
            split=split,
            out_dir=out or checkpoint,
            plots=plots,
            data_path=None if data is None or task == "policy" else _data_path(data),
            rollout={
                "episodes": episodes,
                "target_return": target_return,
                "seed": seed,
                "max_steps": max_steps,
                "parallel": parallel,
            },
        )
    except DataError as exc:
        if task == "event":
            raise typer.BadParameter(f"{exc} (give the events file with --data)", param_hint="--data") from None
        raise _fail(str(exc)) from None
    except (CheckpointError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(evaluation.summary)


split_app = typer.Typer(help="The train/val/test parts of a data set, as training splits it.", no_args_is_help=True)


@split_app.command("export")
def split_export(
    checkpoint: Annotated[
        Path | None, typer.Argument(help="a checkpoint from `aaren train`: its data and split [default: --data's]")
    ] = None,
    data: Annotated[
        str | None, typer.Option(help="`flights`, `flights-aircraft` or a .csv/.parquet [default: the checkpoint's]")
    ] = None,
    time_unit: Annotated[
        str | None, typer.Option(help="unit of numeric times in --data (without a checkpoint)")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="split keys without a checkpoint: split, split_at, val_fraction...", metavar="K=V"),
    ] = None,
    split: Annotated[str, typer.Option(help="train, val or test")] = "test",
    out: Annotated[Path, typer.Option(help="the events file to write (.csv or .csv.gz)")] = Path("test.csv"),
) -> None:
    """Write one part of the split as an events file for `aaren replay`: each session's history
    (context) rows first marked context=1, then its held-out rows (context=0).

    `aaren replay FILE` sends each session's history in one message, then the held-out events in
    time order, and writes forecasts only from the last history event on.
    """
    from aaren_core.checkpoint import load_checkpoint
    from aaren_core.tasks.event.config import TrainConfig
    from aaren_core.tasks.event.data import DataError
    from aaren_core.tasks.event.files import write_events
    from aaren_core.tasks.event.train import load_data

    if split not in ("train", "val", "test"):
        raise typer.BadParameter(f"{split!r}: expected train, val or test", param_hint="--split")
    changes: dict[str, object] = dict(_set_items(set_))
    try:
        if checkpoint is not None:
            meta = load_checkpoint(checkpoint).metadata
            if "train_config" not in meta:
                raise typer.BadParameter(f"{checkpoint}: no train_config; expected a checkpoint from `aaren train`")
            cfg = TrainConfig.from_record(meta["train_config"])
        elif data is None:
            raise typer.BadParameter("give a checkpoint or --data", param_hint="CHECKPOINT")
        else:
            cfg = TrainConfig()
        if data is not None:
            changes["data"] = _data_path(data)
        if time_unit is not None:
            changes["time_unit"] = time_unit
        cfg = cfg.replace(**changes)
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        parts = load_data(cfg)
        sequences = getattr(parts, split)
        if not sequences:
            raise DataError(f"the {split} part of {cfg.data} is empty")
        rows = write_events(out, sequences, parts.schema)
    except DataError as exc:
        raise typer.BadParameter(str(exc), param_hint="--data") from None
    context = sum(s.context for s in sequences)
    how = parts.split.describe(parts.schema.time_unit) if parts.split is not None else "as given"
    typer.echo(
        f"wrote {rows:,} events of {len(sequences):,} sessions to {out}: {context:,} history (context=1), "
        f"{rows - context:,} held out; times in {parts.schema.time_unit}; split {how}"
    )
