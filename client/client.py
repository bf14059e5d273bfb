"""A typed asyncio client of the ``aaren.v1.ForecastService``.

``AarenClient`` owns one ``grpc.aio`` channel. ``client.stream()`` opens the bidirectional stream as
an ``EventStream``: ``send`` events (any sessions), then ``async for`` the ``StreamResult`` of each
request, or ``apply`` one request and wait for its own result. The unary helpers (``forecast``,
``get_session``, ``end_session``, ``describe_model``) return dataclasses and raise ``AarenError``.

Inputs and outputs are plain dataclasses. The stream's results are converted straight from the proto
fields (no reflection), so the conversion stays cheap next to the transport; the unary answers, whose
fields are named as in the proto, are filled by name (``_by_name``).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import itertools
import time
from collections.abc import AsyncIterator, MutableSequence, Sequence
from typing import Any, TypedDict, TypeVar, Unpack

import grpc
import grpc.aio
from google.protobuf.message import Message

from aaren.formats.models import ModelFacts
from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc

__all__ = [
    "REASON_METADATA_KEY",
    "AarenClient",
    "AarenError",
    "AckOut",
    "AnyForecast",
    "ChannelOptions",
    "ClassForecastOut",
    "EndSessionOut",
    "EventErrorOut",
    "EventIn",
    "EventStream",
    "ForecastOut",
    "ForecastResult",
    "LimitsOut",
    "ModelInfoOut",
    "Outcome",
    "PolicyForecastOut",
    "RequestOptions",
    "SampledEventOut",
    "SeriesForecastOut",
    "SessionOut",
    "StepSummaryOut",
    "StreamClosedError",
    "StreamResult",
    "forecasts_from_columns",
    "to_jsonable",
]

REASON_METADATA_KEY = "aaren-error-reason"

#: Client channel defaults: forecasts with sampled paths can exceed gRPC's 4 MiB receive default.
DEFAULT_OPTIONS: tuple[tuple[str, Any], ...] = (("grpc.max_receive_message_length", 64 * 1024 * 1024),)

# ErrorCode number -> "INVALID_ARGUMENT" etc.; the numbers equal gRPC's status codes.
_CODE_NAMES = {v.number: v.name.removeprefix("ERROR_CODE_") for v in pb.ErrorCode.DESCRIPTOR.values}
_STATUS_BY_NAME = {s.name: s for s in grpc.StatusCode}
_LAST_PER_SESSION = pb.FORECAST_MODE_LAST_PER_SESSION
_EVERY_EVENT = pb.FORECAST_MODE_EVERY_EVENT
#: A dataclass of the answers (``_by_name``).
_Out = TypeVar("_Out")


class AarenError(Exception):
    """A failed call: ``code`` is the status name (``"NOT_FOUND"``), ``reason`` the service's
    snake_case reason (``"session_not_found"``; empty for transport errors), ``message`` for people."""

    def __init__(self, code: str, reason: str, message: str) -> None:
        super().__init__(f"{code}" + (f" ({reason})" if reason else "") + f": {message}")
        self.code = code
        self.reason = reason
        self.message = message

    @property
    def status(self) -> grpc.StatusCode | None:
        """The gRPC status code of the same name."""
        return _STATUS_BY_NAME.get(self.code)

    @classmethod
    def from_rpc_error(cls, error: grpc.aio.AioRpcError) -> AarenError:
        reason = ""
        for key, value in error.trailing_metadata() or ():
            if key == REASON_METADATA_KEY:
                reason = value.decode() if isinstance(value, bytes) else str(value)
                break
        return cls(error.code().name, reason, error.details() or "")


class StreamClosedError(AarenError):
    """The stream ended (or was closed) before the awaited response arrived."""

    def __init__(self, message: str = "the stream is closed") -> None:
        super().__init__("CANCELLED", "stream_closed", message)


@dataclasses.dataclass(frozen=True, slots=True)
class EventIn:
    """One event to send: ``seq`` counts the session's events from 1; ``time`` is in the model's
    time unit; ``mark`` in ``[0, num_marks)``; ``values`` one per model value column."""

    session_id: str
    seq: int
    time: float
    mark: int = 0
    values: Sequence[float] = ()

    def to_proto(self) -> pb.Event:
        return pb.Event(session_id=self.session_id, seq=self.seq, time=self.time, mark=self.mark, values=self.values)


@dataclasses.dataclass(frozen=True, slots=True)
class ForecastOut:
    """The forecast of a session's next event after its event ``seq`` (see ``aaren.v1.Forecast``).

    ``mean_gap`` is the expected time to the next event and ``quantiles`` maps each level to that
    gap's quantile, both in the model's time unit; ``expected_time = last_time + mean_gap``.
    ``marks`` are the top ``(mark, probability)`` pairs, most likely first; ``values`` one
    ``(mean, std)`` per value column.
    """

    session_id: str
    seq: int
    last_time: float
    mean_gap: float
    expected_time: float
    quantiles: dict[float, float]
    marks: list[tuple[int, float]]
    values: list[tuple[float, float]]
    model_name: str
    model_version: str

    @classmethod
    def from_proto(cls, f: pb.Forecast) -> ForecastOut:
        nt = f.next_time
        return cls(
            f.session_id,
            f.seq,
            f.last_time,
            nt.mean,
            nt.expected_time,
            {q.q: q.value for q in nt.quantiles},
            [(m.mark, m.probability) for m in f.marks],
            [(v.mean, v.std) for v in f.values],
            f.model.name,
            f.model.version,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SeriesForecastOut:
    """A series model's forecast after observation ``seq`` (see ``aaren.v1.SeriesForecast``): the next
    H steps of every channel in the data's units. ``means[h][c]`` is step ``h + 1`` of channel ``c``
    (at ``last_time + (h + 1) * step_seconds``); ``quantiles`` maps each level to such an ``[H][C]``.
    ``filled_steps``: the missing steps the server filled before observation ``seq`` (it came
    ``filled_steps + 1`` steps after the session's previous one; 0: the next step)."""

    session_id: str
    seq: int
    last_time: float
    means: list[list[float]]
    quantiles: dict[float, list[list[float]]]
    model_name: str
    model_version: str
    filled_steps: int = 0

    @classmethod
    def from_values(
        cls, session_id: str, seq: int, last_time: float, h: int, c: int, levels: Sequence[float],
        means: Sequence[float], quantiles: Sequence[float], model: pb.ModelRef, filled_steps: int = 0,
    ) -> SeriesForecastOut:  # fmt: skip
        """From flat step-major ``means [H * C]`` and ``quantiles [H * C * Q]``."""
        q = len(levels)
        grid = [list(means[i * c : (i + 1) * c]) for i in range(h)]
        by_level = {
            level: [[quantiles[(i * c + j) * q + k] for j in range(c)] for i in range(h)]
            for k, level in enumerate(levels)
        }
        return cls(session_id, seq, last_time, grid, by_level, model.name, model.version, filled_steps)

    @classmethod
    def from_proto(cls, f: pb.Forecast) -> SeriesForecastOut:
        s = f.series
        return cls.from_values(
            f.session_id, f.seq, f.last_time, s.horizon, s.channels, list(s.quantile_levels), list(s.means),
            list(s.quantiles), f.model, s.filled_steps,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class ClassForecastOut:
    """A class model's probabilities after step ``seq`` of a sequence (the one after its last step is
    its prediction): ``classes`` the top ``(class name, probability)`` pairs, most likely first, and
    ``class_indices`` their indices (``ModelInfoOut.class_names``)."""

    session_id: str
    seq: int
    last_time: float
    classes: list[tuple[str, float]]
    class_indices: list[int]
    model_name: str
    model_version: str

    @classmethod
    def from_proto(cls, f: pb.Forecast) -> ClassForecastOut:
        items = f.classes.classes
        return cls(
            f.session_id, f.seq, f.last_time, [(c.class_name, c.probability) for c in items],
            [c.class_index for c in items], f.model.name, f.model.version,
        )  # fmt: skip

    @property
    def predicted(self) -> str:
        """The most likely class."""
        return self.classes[0][0]


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyForecastOut:
    """A policy model's answer after step ``seq`` of an episode (see ``aaren.v1.PolicyForecast``):
    the next ``action`` (``ModelInfoOut.action_width`` entries, in the environment's action space) and
    the model's ``return_to_go`` (the target return less the rewards sent so far)."""

    session_id: str
    seq: int
    last_time: float
    action: list[float]
    return_to_go: float
    model_name: str
    model_version: str

    @classmethod
    def from_proto(cls, f: pb.Forecast) -> PolicyForecastOut:
        p = f.policy
        return cls(f.session_id, f.seq, f.last_time, list(p.action), p.return_to_go, f.model.name, f.model.version)


@dataclasses.dataclass(frozen=True, slots=True)
class AckOut:
    """An event applied without a forecast, or a duplicate (``seq <= last_seq``) that was ignored."""

    session_id: str
    seq: int
    last_seq: int
    duplicate: bool


@dataclasses.dataclass(frozen=True, slots=True)
class EventErrorOut:
    """A rejected event (or request): ``code`` like ``"FAILED_PRECONDITION"``, ``reason`` like
    ``"seq_gap"``. The event changed nothing. ``session_id``/``seq`` are empty/0 for a request error."""

    session_id: str
    seq: int
    code: str
    reason: str
    message: str

    @classmethod
    def from_proto(cls, e: pb.EventError, session_id: str = "", seq: int = 0) -> EventErrorOut:
        return cls(session_id, seq, _CODE_NAMES.get(e.code, str(e.code)), e.reason, e.message)


AnyForecast = ForecastOut | SeriesForecastOut | ClassForecastOut | PolicyForecastOut
Outcome = ForecastOut | SeriesForecastOut | ClassForecastOut | PolicyForecastOut | AckOut | EventErrorOut


def _task_forecasts_from_columns(block: pb.ForecastColumns) -> list[AnyForecast]:
    n = len(block.event_index)
    if block.action_width:
        a, actions, rtg = block.action_width, list(block.actions), list(block.returns_to_go)
        return [
            PolicyForecastOut(
                block.session_id[i],
                block.seq[i],
                block.last_time[i],
                actions[i * a : (i + 1) * a],
                rtg[i],
                block.model.name,
                block.model.version,
            )
            for i in range(n)
        ]
    if block.horizon:
        h, c, levels = block.horizon, block.channels, list(block.quantile_levels)
        size, qsize = h * c, h * c * len(levels)
        means, quantiles = list(block.series_means), list(block.series_quantiles)
        filled = list(block.series_filled_steps) or [0] * n  # an older server sends none
        return [
            SeriesForecastOut.from_values(
                block.session_id[i],
                block.seq[i],
                block.last_time[i],
                h,
                c,
                levels,
                means[i * size : (i + 1) * size],
                quantiles[i * qsize : (i + 1) * qsize],
                block.model,
                filled[i],
            )
            for i in range(n)
        ]
    k, names = block.class_top_k, list(block.class_names)
    classes, probs = list(block.classes), list(block.class_probabilities)
    return [
        ClassForecastOut(
            block.session_id[i],
            block.seq[i],
            block.last_time[i],
            [(names[j], p) for j, p in zip(classes[i * k : (i + 1) * k], probs[i * k : (i + 1) * k], strict=True)],
            classes[i * k : (i + 1) * k],
            block.model.name,
            block.model.version,
        )
        for i in range(n)
    ]


def forecasts_from_columns(block: pb.ForecastColumns) -> list[AnyForecast]:
    """The forecasts of a ``RESPONSE_LAYOUT_COLUMNS`` response, as rows (``ForecastOut`` for event
    models, ``SeriesForecastOut`` / ``ClassForecastOut`` for series and class models)."""
    if block.horizon or block.class_top_k or block.action_width:
        return _task_forecasts_from_columns(block)
    q, k = len(block.quantile_levels), block.top_k
    n = len(block.event_index)
    v = len(block.value_means) // n if n else 0
    levels = list(block.quantile_levels)
    quantiles, marks, probs = list(block.gap_quantiles), list(block.marks), list(block.mark_probabilities)
    means, stds = list(block.value_means), list(block.value_stds)
    name, version = block.model.name, block.model.version
    return [
        ForecastOut(
            block.session_id[i],
            block.seq[i],
            block.last_time[i],
            block.mean_gap[i],
            block.expected_time[i],
            dict(zip(levels, quantiles[i * q : (i + 1) * q], strict=True)),
            list(zip(marks[i * k : (i + 1) * k], probs[i * k : (i + 1) * k], strict=True)),
            list(zip(means[i * v : (i + 1) * v], stds[i * v : (i + 1) * v], strict=True)),
            name,
            version,
        )
        for i in range(n)
    ]


def _outcome(r: pb.EventResult) -> Outcome:
    kind = r.WhichOneof("outcome")
    if kind == "forecast":
        if r.forecast.HasField("series"):
            return SeriesForecastOut.from_proto(r.forecast)
        if r.forecast.HasField("classes"):
            return ClassForecastOut.from_proto(r.forecast)
        if r.forecast.HasField("policy"):
            return PolicyForecastOut.from_proto(r.forecast)
        return ForecastOut.from_proto(r.forecast)
    if kind == "ack":
        return AckOut(r.session_id, r.seq, r.ack.last_seq, r.duplicate)
    if kind == "error":
        return EventErrorOut.from_proto(r.error, r.session_id, r.seq)
    return EventErrorOut(r.session_id, r.seq, "UNKNOWN", "no_outcome", "the server sent a result with no outcome")


class StreamResult:
    """The answer to one ``send``: one outcome per event in the request's order, or a
    ``request_error`` (then ``results`` is empty and nothing was applied). ``latency_s`` is the time
    from the send to this answer, measured by the client. The outcomes are converted from ``raw``
    (the ``aaren.v1.StreamResponse``) on first use, so a caller that only counts pays nothing."""

    __slots__ = ("_request_error", "_results", "latency_s", "raw", "request_id")

    def __init__(self, raw: pb.StreamResponse, latency_s: float) -> None:
        self.raw = raw
        self.request_id = raw.request_id
        self.latency_s = latency_s
        self._results: list[Outcome] | None = None
        self._request_error: EventErrorOut | None = (
            EventErrorOut.from_proto(raw.request_error) if raw.HasField("request_error") else None
        )

    @property
    def results(self) -> list[Outcome]:
        if self._results is None:
            others = [_outcome(r) for r in self.raw.results]
            if self.raw.HasField("forecast_columns"):  # columns: put the forecasts back in event order
                block = self.raw.forecast_columns
                merged: list[Outcome | None] = [None] * (len(block.event_index) + len(others))
                for i, forecast in zip(block.event_index, forecasts_from_columns(block), strict=True):
                    merged[i] = forecast
                rest = iter(others)
                results = [next(rest, None) if r is None else r for r in merged]
                if any(r is None for r in results) or next(rest, None) is not None:
                    raise ValueError(
                        f"malformed columns response {self.request_id!r}: {len(block.event_index)} forecasts "
                        f"(event_index {list(block.event_index)}) and {len(others)} other results do not fill "
                        "the request's events"
                    )
                self._results = results  # type: ignore[assignment]
            else:
                self._results = others
        return self._results

    @property
    def request_error(self) -> EventErrorOut | None:
        return self._request_error

    @property
    def forecasts(self) -> list[AnyForecast]:
        """The forecasts, in event order (``ForecastOut``, or for series and class models
        ``SeriesForecastOut`` / ``ClassForecastOut``)."""
        return [r for r in self.results if isinstance(r, AnyForecast)]

    @property
    def errors(self) -> list[EventErrorOut]:
        errors = [r for r in self.results if isinstance(r, EventErrorOut)]
        return [self._request_error, *errors] if self._request_error is not None else errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "results": to_jsonable(self.results),
            "request_error": to_jsonable(self._request_error),
            "latency_s": self.latency_s,
        }

    def __repr__(self) -> str:
        return (
            f"StreamResult(request_id={self.request_id!r}, results={self.results!r}, "
            f"request_error={self._request_error!r}, latency_s={self.latency_s!r})"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class StepSummaryOut:
    """Sampled futures' view of future event ``step`` (1 = next): absolute times and mark frequencies."""

    step: int
    mean_time: float
    time_quantiles: dict[float, float]
    marks: list[tuple[int, float]]


@dataclasses.dataclass(frozen=True, slots=True)
class SampledEventOut:
    time: float
    mark: int
    values: list[float]


@dataclasses.dataclass(frozen=True, slots=True)
class ForecastResult:
    """``forecast``: the exact next-event forecast; for horizon > 1 also per-step ``steps`` and,
    when asked, the sampled ``paths`` (each a list of ``horizon`` events)."""

    forecast: ForecastOut | SeriesForecastOut | ClassForecastOut | PolicyForecastOut
    steps: list[StepSummaryOut]
    paths: list[list[SampledEventOut]]


@dataclasses.dataclass(frozen=True, slots=True)
class SessionOut:
    session_id: str
    last_seq: int
    last_time: float
    n_events: int
    state_bytes: int
    state: bytes
    model_name: str
    model_version: str
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    expires_at: dt.datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class EndSessionOut:
    existed: bool
    last_seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class LimitsOut:
    max_events_per_request: int
    max_session_id_bytes: int
    max_message_bytes: int
    max_horizon: int
    max_num_samples: int
    default_num_samples: int
    default_top_k: int
    idle_ttl_seconds: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelInfoOut(ModelFacts):
    """The ``ModelFacts`` the server describes, its forecasts' quantile levels and limits."""

    quantile_levels: tuple[float, ...]
    limits: LimitsOut
    #: Every model the server serves, the default first.
    served_models: tuple[str, ...] = ()

    def mark_name(self, mark: int) -> str:
        """The mark's name, or its number when the model has no names."""
        return self.mark_names[mark] if 0 <= mark < len(self.mark_names) else str(mark)


def _by_name(cls: type[_Out], message: Message, **given: Any) -> _Out:
    """The dataclass ``cls`` from ``message``: each field not ``given`` is the message's field of the
    same name, a repeated one as a tuple."""
    values = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.name not in given:
            value = getattr(message, field.name)
            values[field.name] = tuple(value) if isinstance(value, MutableSequence) else value
    return cls(**values, **given)


def _datetime(msg: pb.GetSessionResponse, field: str) -> dt.datetime | None:
    if not msg.HasField(field):
        return None
    return getattr(msg, field).ToDatetime(tzinfo=dt.UTC)


def to_jsonable(obj: Any) -> Any:
    """Dataclasses (and what they hold) as JSON-ready values: float dict keys become strings,
    datetimes ISO strings, bytes base64."""
    if isinstance(obj, StreamResult):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dt.datetime):
        return obj.isoformat()
    if isinstance(obj, bytes):
        return base64.b64encode(obj).decode("ascii")
    return obj


_END = object()


class RequestOptions(TypedDict, total=False):
    """The keyword options of one stream request (``EventStream.request`` documents them)."""

    request_id: str | None
    last_only: bool
    top_k: int
    columns: bool
    model: str | None


class EventStream:
    """One bidirectional ``Stream`` call. Use as ``async with client.stream() as stream``.

    ``send`` writes a request and returns its request_id; each request gets exactly one
    ``StreamResult``. Results arrive as the server finishes them (a session's results in the order
    its events were sent; different requests possibly out of order): read them with ``recv`` or
    ``async for``, or use ``apply`` to send and wait for one request's own result (results awaited
    by ``apply`` are not also yielded by ``recv``). Leaving the block half-closes the stream and
    waits for the outstanding results (still readable afterwards); an exception cancels the call.
    """

    def __init__(
        self, stub: pb_grpc.ForecastServiceStub, *, metadata: Sequence[tuple[str, str]] | None = None, model: str = ""
    ) -> None:
        self._stub = stub
        self.model = model
        self._metadata = tuple(metadata) if metadata else None
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._waiters: dict[str, asyncio.Future[StreamResult]] = {}
        self._sent_at: dict[str, float] = {}
        self._write_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._error: AarenError | None = None
        self._finished = False
        self._writing_done = False

    async def __aenter__(self) -> EventStream:
        self.open()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            await self.close()
        else:
            self.cancel()

    def open(self) -> None:
        if self._call is not None:
            raise RuntimeError("the stream is already open")
        self._call = self._stub.Stream(metadata=self._metadata)
        self._reader = asyncio.create_task(self._read_loop(), name="aaren-stream-reader")

    @property
    def pending(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._sent_at)

    @property
    def error(self) -> AarenError | None:
        """Why the stream ended, if it ended with a non-OK status."""
        return self._error

    @property
    def finished(self) -> bool:
        """No more sends: the stream has ended, was half-closed or was cancelled."""
        return self._finished or self._writing_done

    def request(
        self,
        events: Sequence[EventIn],
        *,
        request_id: str | None = None,
        last_only: bool = False,
        top_k: int = 0,
        columns: bool = False,
        model: str | None = None,
    ) -> pb.StreamRequest:
        """The ``aaren.v1.StreamRequest`` holding ``events`` (any sessions, in order), numbered by the
        stream unless ``request_id`` is given.

        ``last_only``: only each session's last applied event in the request gets a forecast (the
        others an ``AckOut``), for ingesting a history in one message. ``top_k``: marks listed per
        forecast (0: server default). ``columns``: the server sends the forecasts as packed columns
        (``StreamResult.raw.forecast_columns``; ``results`` reads the same either way), cheaper for
        many events per request. ``model``: this request's model (None: the stream's).
        """
        return pb.StreamRequest(
            request_id=str(next(self._ids)) if request_id is None else request_id,
            events=[e.to_proto() for e in events],
            forecast_mode=_LAST_PER_SESSION if last_only else _EVERY_EVENT,
            top_k=top_k,
            layout=pb.RESPONSE_LAYOUT_COLUMNS if columns else pb.RESPONSE_LAYOUT_ROWS,
            model=self.model if model is None else model,
        )

    async def send(self, events: Sequence[EventIn], **options: Unpack[RequestOptions]) -> str:
        """Send one request holding ``events`` (any sessions, in order; ``options`` as ``request``
        takes them); returns its request_id. Raises ``AarenError`` if the stream has failed."""
        request = self.request(events, **options)
        await self.send_request(request)
        return request.request_id

    async def send_request(self, request: pb.StreamRequest) -> None:
        """Send a prepared ``aaren.v1.StreamRequest`` as is (give it a unique request_id)."""
        if self._call is None:
            raise RuntimeError("the stream is not open; use `async with client.stream() as stream`")
        if self._error is not None:
            raise self._error
        if self._writing_done:
            raise StreamClosedError("the stream is half-closed; no more sends")
        # Recorded before the write: the answer can arrive before write() returns.
        self._sent_at[request.request_id] = time.perf_counter()
        try:
            async with self._write_lock:
                await self._call.write(request)
        except grpc.aio.AioRpcError as exc:
            self._sent_at.pop(request.request_id, None)
            raise AarenError.from_rpc_error(exc) from None
        except asyncio.InvalidStateError:
            self._sent_at.pop(request.request_id, None)
            raise self._error or StreamClosedError() from None

    async def apply(self, events: Sequence[EventIn], **options: Unpack[RequestOptions]) -> StreamResult:
        """Send one request (``options`` as ``request`` takes them) and wait for its result (other
        requests' results stay queued for ``recv``)."""
        request = self.request(events, **options)
        rid = request.request_id
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[rid] = waiter
        try:
            await self.send_request(request)
            return await waiter
        finally:
            self._waiters.pop(rid, None)
            if waiter.done() and not waiter.cancelled():
                waiter.exception()  # retrieved: the send's own error is what the caller sees

    async def recv(self) -> StreamResult | None:
        """The next result, or ``None`` once the stream has ended and every result was read.
        Raises ``AarenError`` if the stream ended with a non-OK status."""
        if self._call is None:
            raise RuntimeError("the stream is not open")
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # later calls see the end too
            if self._error is not None:
                raise self._error
            return None
        return item

    def __aiter__(self) -> AsyncIterator[StreamResult]:
        return self

    async def __anext__(self) -> StreamResult:
        result = await self.recv()
        if result is None:
            raise StopAsyncIteration
        return result

    async def done_writing(self) -> None:
        """Half-close: no more sends; the server answers what it has, then ends the stream."""
        if self._call is None or self._writing_done or self._finished:
            self._writing_done = True
            return
        self._writing_done = True
        try:
            async with self._write_lock:
                await self._call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the stream already ended; the reader has its status

    async def close(self) -> None:
        """Half-close and wait until the server has answered everything and ended the stream."""
        await self.done_writing()
        if self._reader is not None:
            await asyncio.shield(self._reader)

    def cancel(self) -> None:
        """Abandon the stream now (unanswered events may or may not have been applied)."""
        self._writing_done = True
        if self._call is not None and not self._finished:
            self._call.cancel()

    async def _read_loop(self) -> None:
        call = self._call
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    code = await call.code()
                    if code != grpc.StatusCode.OK:
                        self._error = AarenError(code.name, "", await call.details() or "")
                    break
                rid = response.request_id
                started = self._sent_at.pop(rid, None)
                latency = time.perf_counter() - started if started is not None else float("nan")
                result = StreamResult(response, latency)
                waiter = self._waiters.pop(rid, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(result)
                else:
                    self._queue.put_nowait(result)
        except grpc.aio.AioRpcError as exc:
            self._error = AarenError.from_rpc_error(exc)
        except asyncio.CancelledError:
            self._error = StreamClosedError("the stream was cancelled")
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
        finally:
            self._finished = True
            self._writing_done = True
            failure = self._error or StreamClosedError("the server ended the stream before answering this request")
            for waiter in self._waiters.values():
                if not waiter.done():
                    waiter.set_exception(failure)
            self._waiters.clear()
            self._queue.put_nowait(_END)


class ChannelOptions(TypedDict, total=False):
    """The keyword options of a client's channel (``AarenClient`` documents them)."""

    options: Sequence[tuple[str, Any]] | None
    credentials: grpc.ChannelCredentials | None
    timeout: float | None
    metadata: Sequence[tuple[str, str]] | None


class AarenClient:
    """Async client of one aaren server. Use as ``async with AarenClient("host:port") as client``.

    ``options`` are extra gRPC channel options (added to ``DEFAULT_OPTIONS``); ``credentials`` make
    a TLS channel; ``timeout`` is the deadline of each unary call in seconds (None: none).
    """

    def __init__(
        self,
        target: str,
        *,
        options: Sequence[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float | None = 30.0,
        metadata: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._metadata = tuple(metadata) if metadata else None
        opts = dict(DEFAULT_OPTIONS)
        opts.update(dict(options or ()))
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(target, options=list(opts.items()))
        else:
            self._channel = grpc.aio.secure_channel(target, credentials, options=list(opts.items()))
        self._stub = pb_grpc.ForecastServiceStub(self._channel)

    async def __aenter__(self) -> AarenClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, grace: float | None = None) -> None:
        await self._channel.close(grace)

    async def wait_ready(self, timeout: float) -> None:
        """Wait until the channel connects; ``AarenError`` UNAVAILABLE after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            raise AarenError(
                "UNAVAILABLE", "", f"could not connect to {self.target} within {timeout:g} s; is the server running?"
            ) from None

    def stream(self, model: str = "") -> EventStream:
        """A new bidirectional stream (open it with ``async with``); its requests are for ``model``
        (by name, ``describe_model().served_models``; "" the server's default)."""
        return EventStream(self._stub, metadata=self._metadata, model=model)

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise AarenError.from_rpc_error(exc) from None

    async def forecast(
        self,
        session_id: str,
        horizon: int = 1,
        num_samples: int = 0,
        seed: int | None = None,
        top_k: int = 0,
        include_paths: bool = False,
        model: str = "",
    ) -> ForecastResult:
        """The session's forecast from its current state (read-only); for ``horizon > 1`` also
        ``num_samples`` sampled futures (0: server default), summarized per step (event models).
        ``model``: the session's model ("" the default); ``forecast`` is then a ``SeriesForecastOut``
        or ``ClassForecastOut`` for series and class models."""
        request = pb.ForecastRequest(
            session_id=session_id, horizon=horizon, num_samples=num_samples, top_k=top_k, include_paths=include_paths,
            model=model,
        )  # fmt: skip
        if seed is not None:
            request.seed = seed
        r: pb.ForecastResponse = await self._unary(self._stub.Forecast, request)
        return ForecastResult(
            _outcome(pb.EventResult(forecast=r.forecast)),  # type: ignore[arg-type]
            [
                StepSummaryOut(
                    s.step,
                    s.mean_time,
                    {q.q: q.value for q in s.time_quantiles},
                    [(m.mark, m.probability) for m in s.marks],
                )
                for s in r.steps
            ],
            [[SampledEventOut(e.time, e.mark, list(e.values)) for e in p.events] for p in r.paths],
        )

    async def get_session(self, session_id: str, include_state: bool = False, model: str = "") -> SessionOut:
        """The session's stored state, described (``state`` holds safetensors bytes with ``include_state``)."""
        r: pb.GetSessionResponse = await self._unary(
            self._stub.GetSession, pb.GetSessionRequest(session_id=session_id, include_state=include_state, model=model)
        )
        return _by_name(
            SessionOut,
            r,
            model_name=r.model.name,
            model_version=r.model.version,
            **{stamp: _datetime(r, stamp) for stamp in ("created_at", "updated_at", "expires_at")},
        )

    async def end_session(self, session_id: str, model: str = "") -> EndSessionOut:
        """End the session (of ``model``; "" the default) and delete its state (ending an unknown
        session is not an error)."""
        r: pb.EndSessionResponse = await self._unary(
            self._stub.EndSession, pb.EndSessionRequest(session_id=session_id, model=model)
        )
        return EndSessionOut(r.existed, r.last_seq)

    async def describe_model(self, model: str = "") -> ModelInfoOut:
        """The served model ``model`` (by name; "" the default)."""
        r: pb.DescribeModelResponse = await self._unary(self._stub.DescribeModel, pb.DescribeModelRequest(model=model))
        return _by_name(ModelInfoOut, r, limits=_by_name(LimitsOut, r.limits), task=r.task or "event")
