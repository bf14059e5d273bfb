"""What the client commands of ``aaren`` do: call the server, render for people (rich) or as JSON.

``aaren.client.cli`` parses the arguments and calls these; each returns the process exit code.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ParamSpec

import grpc
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

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
    SessionOut,
    StreamResult,
    to_jsonable,
)
from aaren.client.events_file import EventsFileError, ModelSchema, load_source
from aaren.client.replay import ForecastWriter, ReplayError, ReplayStats, replay, schedule
from aaren.client.task_scores import TaskScorer

__all__ = [
    "end_command",
    "forecast_command",
    "health_command",
    "model_command",
    "replay_command",
    "session_command",
]

P = ParamSpec("P")
CONNECT_TIMEOUT_S = 10.0
#: Events per history message when the server names no limit.
HISTORY_BATCH = 1000


def _console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False)


def _print_json(obj: Any) -> None:
    print(json.dumps(to_jsonable(obj), indent=2))


def _command(run: Callable[P, Coroutine[Any, Any, int]]) -> Callable[P, int]:
    """A command from its coroutine: it runs to its exit code; service and data errors become a
    one-line message and exit code 1 (2 for data)."""

    @functools.wraps(run)
    def command(*args: P.args, **kwargs: P.kwargs) -> int:
        err = _console(stderr=True)
        try:
            return asyncio.run(run(*args, **kwargs))
        except AarenError as exc:
            _print_error(err, _describe(exc))
            return 1
        except EventsFileError as exc:
            _print_error(err, str(exc))
            return 2

    return command


def _describe(exc: AarenError) -> str:
    return f"{exc.code}" + (f" ({exc.reason})" if exc.reason else "") + f": {exc.message}"


def _print_error(console: Console, text: str, prefix: str = "error:") -> None:
    console.print(f"[red]{prefix}[/red] {escape(text)}", soft_wrap=True)


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


def _num(x: float, digits: int = 4) -> str:
    if not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}" if abs(x) < 1e6 else f"{x:,.2f}"


def _forecast_table(f: ForecastOut, model: ModelInfoOut) -> Table:
    unit = model.time_unit or "time units"
    title = f"Next event of {escape(repr(f.session_id))}"
    table = Table(box=box.SIMPLE_HEAVY, show_header=False, title=title, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("after seq", f"{f.seq} (at {_num(f.last_time, 10)} {unit})")
    table.add_row("expected at", f"{_num(f.expected_time, 10)} {unit}")
    table.add_row("expected gap", f"{_num(f.mean_gap)} {unit}")
    if f.quantiles:
        table.add_row("gap quantiles", "   ".join(f"q{q:g}: {_num(v)}" for q, v in sorted(f.quantiles.items())))
    for i, (mark, p) in enumerate(f.marks):
        table.add_row("likely marks" if i == 0 else "", f"{escape(model.mark_name(mark)):<12} {p:6.1%}")
    for i, (mean, std) in enumerate(f.values):
        name = model.value_names[i] if i < len(model.value_names) else f"value {i}"
        table.add_row("values" if i == 0 else "", f"{escape(name)}: {_num(mean)} ± {_num(std)}")
    table.add_row("model", escape(f"{f.model_name} ({f.model_version})"))
    return table


def _steps_table(result: ForecastResult, model: ModelInfoOut) -> Table:
    table = Table(box=box.SIMPLE_HEAVY, title="Sampled futures", title_justify="left")
    table.add_column("step", justify="right")
    table.add_column("mean time", justify="right")
    for q in model.quantile_levels:
        table.add_column(f"q{q:g}", justify="right")
    table.add_column("most frequent marks")
    for s in result.steps:
        table.add_row(
            str(s.step),
            _num(s.mean_time, 8),
            *(_num(s.time_quantiles.get(q, math.nan), 8) for q in model.quantile_levels),
            escape(", ".join(f"{model.mark_name(m)} {p:.0%}" for m, p in s.marks)),
        )
    return table


def _task_forecast_table(f: SeriesForecastOut | ClassForecastOut, model: ModelInfoOut) -> Table:
    """A series model's next steps (means and the outermost quantiles), or a class model's classes."""
    title = f"Forecast of {escape(repr(f.session_id))} after seq {f.seq} ({escape(model.name)})"
    table = Table(box=box.SIMPLE_HEAVY, title=title, title_justify="left")
    if isinstance(f, ClassForecastOut):
        table.add_column("class")
        table.add_column("probability", justify="right")
        for name, p in f.classes:
            table.add_row(escape(name), f"{p:.1%}")
        return table
    low, high = min(f.quantiles), max(f.quantiles)
    table.add_column("step")
    for name in model.value_names:
        table.add_column(escape(f"{name} mean (q{low:g}-q{high:g})"), justify="right")
    for h, means in enumerate(f.means):
        cells = [
            f"{_num(m, 6)} ({_num(f.quantiles[low][h][c], 4)}-{_num(f.quantiles[high][h][c], 4)})"
            for c, m in enumerate(means)
        ]
        table.add_row(f"+{(h + 1) * model.step_seconds:g} s" if model.step_seconds else str(h + 1), *cells)
    return table


@_command
async def forecast_command(
    target: str,
    session_id: str,
    *,
    horizon: int = 1,
    samples: int = 0,
    seed: int | None = None,
    top_k: int = 0,
    paths: bool = False,
    as_json: bool = False,
    model: str = "",
) -> int:
    async with await _connect(target) as client:
        result = await client.forecast(
            session_id, horizon=horizon, num_samples=samples, seed=seed, top_k=top_k, include_paths=paths,
            model=model,
        )  # fmt: skip
        if as_json:
            _print_json(result)
            return 0
        served = await client.describe_model(model)
    out = _console()
    if isinstance(result.forecast, SeriesForecastOut | ClassForecastOut):
        out.print(_task_forecast_table(result.forecast, served))
        return 0
    out.print(_forecast_table(result.forecast, served))
    if result.steps:
        out.print(_steps_table(result, served))
    if result.paths:
        out.print(f"{len(result.paths)} sampled paths (use --json to see them)")
    return 0


def _session_table(s: SessionOut) -> Table:
    title = f"Session {escape(repr(s.session_id))}"
    table = Table(box=box.SIMPLE_HEAVY, show_header=False, title=title, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("last seq", str(s.last_seq))
    table.add_row("last time", _num(s.last_time, 10))
    table.add_row("events", str(s.n_events))
    table.add_row("state", f"{s.state_bytes:,} bytes")
    table.add_row("model", escape(f"{s.model_name} ({s.model_version})"))
    for name in ("created_at", "updated_at", "expires_at"):
        stamp = getattr(s, name)
        table.add_row(name.replace("_", " "), stamp.isoformat(timespec="seconds") if stamp else "-")
    return table


@_command
async def session_command(
    target: str, session_id: str, *, state_out: Path | None = None, as_json: bool = False, model: str = ""
) -> int:
    async with await _connect(target) as client:
        s = await client.get_session(session_id, include_state=state_out is not None, model=model)
    if state_out is not None:
        state_out.write_bytes(s.state)
    if as_json:
        _print_json(s)
        return 0
    out = _console()
    out.print(_session_table(s))
    if state_out is not None:
        out.print(f"state ({len(s.state):,} bytes, safetensors) written to {state_out}")
    return 0


@_command
async def end_command(target: str, session_id: str, *, as_json: bool = False, model: str = "") -> int:
    async with await _connect(target) as client:
        r = await client.end_session(session_id, model=model)
    if as_json:
        _print_json(r)
    elif r.existed:
        _console().print(f"ended session {session_id!r} (last seq {r.last_seq})", markup=False)
    else:
        _console().print(f"session {session_id!r} did not exist; nothing to end", markup=False)
    return 0


def _model_table(m: ModelInfoOut) -> Table:
    table = Table(box=box.SIMPLE_HEAVY, show_header=False, title=f"Model {escape(repr(m.name))}", title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    marks = ", ".join(m.mark_names[:20]) + (", ..." if len(m.mark_names) > 20 else "")
    rows = [
        ("task", m.task),
        ("version", m.version),
        ("backbone", f"{m.backbone}, d_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads"),
        ("parameters", f"{m.parameters:,}"),
        ("state per session", f"{m.state_bytes_per_session:,} bytes"),
        *([("marks", f"{m.num_marks}" + (f": {marks}" if marks else ""))] if m.task == "event" else []),
        (
            "channels" if m.task != "event" else "values",
            f"{m.value_width}" + (f": {', '.join(m.value_names)}" if m.value_names else ""),
        ),
        *([("horizon", f"{m.horizon} steps of {m.step_seconds:g} s")] if m.task == "series" else []),
        *([("classes", f"{len(m.class_names)}: {', '.join(m.class_names)}")] if m.task == "class" else []),
        ("time unit", m.time_unit or "-"),
        ("quantiles", ", ".join(f"{q:g}" for q in m.quantile_levels)),
        ("device", m.device),
    ]
    lim = m.limits
    rows += [
        ("max events / message", f"{lim.max_events_per_request:,}"),
        ("max message", f"{lim.max_message_bytes:,} bytes"),
        ("max session id", f"{lim.max_session_id_bytes} bytes"),
        ("horizon / samples", f"max {lim.max_horizon} / max {lim.max_num_samples} (default {lim.default_num_samples})"),
        ("default top-k", str(lim.default_top_k)),
        ("idle TTL", f"{lim.idle_ttl_seconds:g} s" if lim.idle_ttl_seconds else "none"),
    ]
    if len(m.served_models) > 1:
        rows.append(("served models", ", ".join(m.served_models)))
    for key, value in rows:
        table.add_row(key, escape(value))
    return table


@_command
async def model_command(target: str, *, as_json: bool = False, model: str = "") -> int:
    async with await _connect(target) as client:
        m = await client.describe_model(model)
    if as_json:
        _print_json(m)
    else:
        _console().print(_model_table(m))
    return 0


def _summary_table(stats: ReplayStats) -> Table:
    s = stats.summary()
    table = Table(box=box.SIMPLE_HEAVY, show_header=False, title="Replay summary", title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("events sent", f"{s['events']:,}")
    table.add_row("forecasts", f"{s['forecasts']:,}")
    table.add_row("acks", f"{s['acks']:,}")
    table.add_row("duplicates", f"{s['duplicates']:,}")
    table.add_row("errors", f"[red]{s['errors']:,}[/red]" if s["errors"] else "0")
    for reason, n in s["errors_by_reason"].items():
        table.add_row(f"  {escape(reason)}", f"{n:,}")
    table.add_row("messages", f"{s['messages']:,}")
    table.add_row("elapsed", f"{s['elapsed_s']:.2f} s")
    table.add_row("events/s", f"{s['events_per_s']:,.0f}")
    for name, ms in s["latency_ms"].items():
        table.add_row(f"latency {name} (per message)", f"{ms:.2f} ms")
    return table


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


@_command
async def replay_command(
    target: str,
    source: str,
    *,
    rate: float | None = None,
    sessions: int = 0,
    streams: int = 4,
    batch: int = 1,
    window: int = 64,
    limit: int | None = None,
    out: Path | None = None,
    split: str = "test",
    time_unit: str | None = None,
    top_k: int = 0,
    progress: bool = True,
    as_json: bool = False,
    model: str = "",
) -> int:
    err = _console(stderr=True)
    async with await _connect(target) as client:
        served = await client.describe_model(model)
        model_name = served.name
        data = load_source(source, ModelSchema.from_model(served, time_unit=time_unit), split=split)
        scorer = TaskScorer(data, served) if served.task != "event" else None
        if source == "flights" and not Path(source).exists():
            warning = _check_flights_fit(data.mark_names, data.value_names, served)
            if warning:
                err.print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True)
        most = served.limits.max_events_per_request
        if most and batch > most:
            err.print(f"[yellow]warning:[/yellow] --batch {batch} is over the server's limit; sending {most} a message")
            batch = most
        events = list(schedule(data.events, sessions))
        if limit is not None:
            events = events[:limit]
        writer = ForecastWriter(out, served, top_k) if out is not None else None
        history_stats = ReplayStats() if data.history else None
        last_history = {e.session_id: e.seq for e in data.history}
        if data.history:
            # The past first, as a server in use would have it: each session's history in as few
            # messages as the server's limit allows (ingested in one parallel call), answered before
            # any held-out event goes out. Kept: the forecast after a session's last history event
            # (it forecasts the first held-out one) and any error.

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

            try:
                await replay(
                    client,
                    data.history,
                    streams=streams,
                    batch=most or HISTORY_BATCH,
                    window=window,
                    top_k=top_k,
                    on_result=on_history,
                    stats=history_stats,
                    last_only=True,
                    model=model_name,
                )
            except ReplayError as exc:
                if writer is not None:
                    writer.close()
                _print_error(err, f"a stream failed while sending the history: {_describe(exc.error)}")
                return 1
        stats = ReplayStats()
        bar = Progress(
            SpinnerColumn(),
            TextColumn("[bold]replay"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=err,
            disable=not progress,
            transient=False,
        )
        task = bar.add_task("replay", total=len(events), info="")

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

        title = (
            f"Replayed {data.name} ({data.n_sessions:,} sessions) to {target}: "
            f"{streams} streams, {batch} events/message" + (f", {rate:g} events/s" if rate else "")
        )
        failure: ReplayError | None = None
        with bar:
            refresher = asyncio.create_task(refresh())
            try:
                await replay(
                    client,
                    events,
                    streams=streams,
                    batch=batch,
                    rate=rate,
                    window=window,
                    top_k=top_k,
                    on_result=_both(writer.write if writer is not None else None, scorer.see if scorer else None),
                    stats=stats,
                    model=model_name,
                )
            except ReplayError as exc:
                failure = exc
            finally:
                refresher.cancel()
                if writer is not None:
                    writer.close()
                bar.update(task, completed=stats.events_answered)
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
        out_console = _console()
        out_console.print(title, markup=False, soft_wrap=True)
        if history_stats is not None:
            h = history_stats.summary()
            out_console.print(
                f"history first: {h['events']:,} events of {len(last_history):,} sessions in {h['messages']:,} "
                f"messages ({h['errors']:,} errors); then the held-out events:",
                markup=False,
                soft_wrap=True,
            )
        out_console.print(_summary_table(stats))
        if scores:
            out_console.print(_scores_table(served, scores))
        if out is not None:
            written = writer.rows if writer else 0
            out_console.print(f"{written:,} results written to {out}", markup=False, soft_wrap=True)
    if failure is not None:
        _print_error(err, f"a stream failed: {_describe(failure.error)}")
        return 1
    return 0


def _both(*calls: Callable[[StreamResult], None] | None) -> Callable[[StreamResult], None] | None:
    """One callback that calls each of ``calls`` that is given (None when none is)."""
    given = [c for c in calls if c is not None]
    if not given:
        return None

    def call(result: StreamResult) -> None:
        for c in given:
            c(result)

    return call


def _scores_table(model: ModelInfoOut, scores: dict[str, Any]) -> Table:
    """The replay scored against the file's own truth (``TaskScorer``)."""
    table = Table(box=box.SIMPLE_HEAVY, show_header=False, title="Scored against the file", title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    if model.task == "series":
        table.add_row("forecast origins", f"{scores['origins']:,} (every step of the next {model.horizon} in the file)")
        table.add_row("MSE / MAE (raw units)", f"{scores['mse']:.4g} / {scores['mae']:.4g}")
        table.add_row("last value MSE / MAE", f"{scores['last_value_mse']:.4g} / {scores['last_value_mae']:.4g}")
        for key, value in scores.items():
            if key.startswith("coverage_"):
                table.add_row(key.replace("_", " "), f"{value:.3f}")
    else:
        table.add_row("labelled sequences", f"{scores['sequences']:,}")
        for fraction, accuracy in scores["accuracy_by_fraction"].items():
            table.add_row(f"accuracy after {float(fraction):.0%} seen", f"{accuracy:.3f}")
    return table


def health_command(target: str, service: str = "", timeout: float = 3.0) -> int:
    """The gRPC health status of ``service`` at ``target``: prints it; 0 when SERVING, else 1."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    console = _console()
    credentials, _ = connection_settings()
    channel = grpc.insecure_channel(target) if credentials is None else grpc.secure_channel(target, credentials)
    with channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            _print_error(_console(stderr=True), f"{target}: {exc.code().name}: {exc.details()}")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    console.print(f"{target} {service or '(server)'}: {status}")
    return 0 if answer.status == health_pb2.HealthCheckResponse.SERVING else 1
