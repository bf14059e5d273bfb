"""The aaren.v1 front end: converts ``aaren.v1`` messages to engine-core columns and back.

It runs the checks that need no state (``EventChecker``), hands each request to the engine core
as a ``CoreRequest`` and encodes the ``Outcomes`` it gets back: what every forecast has here, the
task's own part with the encoder of the model's task (``aaren.server.tasks.registry``; it never
branches on a task name). The core is an ``EngineCore`` in this process or its IPC client
(``aaren.server.ipc.client_side``): the same ``CoreAPI`` either way. The streaming method is the
shared ``StreamLoop``; this class is its ``StreamCodec``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp

from aaren.jit import compiled
from aaren.server.contract.columns import (
    ACK,
    DUPLICATE,
    FORECAST,
    MAX_SEQ,
    CoreRequest,
    EventColumns,
    ModelDescription,
    Outcomes,
    SampledFuture,
    SessionView,
)
from aaren.server.contract.core_api import CoreAPI, ForecastOptions, OnDone
from aaren.server.contract.errors import ErrorInfo, Reasons, ServiceError
from aaren.server.frontends.aaren_v1.gather import Gather, OneEvent
from aaren.server.frontends.handlers import add_service
from aaren.server.frontends.streams import Accepted, EventChecker, RefusedError, StreamLoop, abort
from aaren.server.observability.metrics import Metrics
from aaren.server.security.auth import current_tenant
from aaren.server.settings import ServerSettings
from aaren.server.tasks.aaren_v1 import Encoder, WireBlock, WireRows, wire_blocks, wire_rows
from aaren.server.tasks.registry import spec_of
from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc

__all__ = ["ForecastServicer", "add_forecast_servicer_to_server"]

log = logging.getLogger(__name__)

_LAYOUTS = frozenset(pb.ResponseLayout.values())
_FORECAST_MODES = frozenset(pb.ForecastMode.values())
#: DescribeModelResponse fields that ModelDescription holds under the same name (copied as they are);
#: ServiceLimits fields that ServerSettings holds under the same name.
_DESCRIBED = tuple(
    f.name
    for f in pb.DescribeModelResponse.DESCRIPTOR.fields
    if f.name in {d.name for d in dataclasses.fields(ModelDescription)}
)
_LIMITS = tuple(f.name for f in pb.ServiceLimits.DESCRIPTOR.fields if f.name in ServerSettings.model_fields)


@dataclasses.dataclass(frozen=True, eq=False)
class _ModelView:
    """What the front end keeps of one served model: its description, reference, checks and the
    encoder of its task (``aaren.server.tasks.aaren_v1.Encoder``)."""

    description: ModelDescription
    ref: pb.ModelRef
    levels: tuple[float, ...]
    checker: EventChecker
    encoder: Encoder
    #: How many entries a forecast ranks (``ModelDescription.ranked``): a request's top_k is cut to it.
    ranked: int
    #: The model's ``CoreAPI.submitter``.
    submit: Callable[[CoreRequest, OnDone], None]
    #: Each forecast's task part as wire bytes (``aaren.server.tasks.aaren_v1.wire_rows``).
    wire: WireRows
    #: ``ref`` as the wire bytes of ``Forecast.model`` (field 7).
    ref_wire: bytes
    #: what ``_read_request`` checks of an event: value width, marks, most session id bytes, NaN values pass
    checks: tuple[int, int, int, bool]
    #: Every forecast's task part as one ``uint8 [F, S]`` (``wire_blocks``; None: the task has no fixed layout).
    block: WireBlock | None
    #: ``ref_wire`` as an array (``_results_block``'s ``tail``).
    ref_array: np.ndarray
    #: ``_read_request``'s arrays for the common request, one event (``_room(1, width)``): the loop's thread reads
    #: one request at a time, and what a request keeps of them it copies.
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray]


_SMALL = [bytes((v,)) for v in range(0x80)]


def _varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf varint."""
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@compiled
def _varint_size(value: int) -> int:
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


@compiled
def _put_varint(out: np.ndarray, at: int, value: int) -> int:
    while value >= 0x80:
        out[at] = (value & 0x7F) | 0x80
        value >>= 7
        at += 1
    out[at] = value
    return at + 1


@compiled
def _results_block(
    task: np.ndarray,
    task_ends: np.ndarray,
    sids: np.ndarray,
    sid_sizes: np.ndarray,
    seqs: np.ndarray,
    times: np.ndarray,
    tail: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``results`` fields of ``F`` events that each have a forecast, in one pass: event ``f``'s (``StreamResponse
    .results`` = 2: ``EventResult`` {session_id = 1, seq = 2, forecast = 4 {session_id = 1, seq = 2, last_time = 3,
    the task's part, ``tail``: the model = 7}}) from its session id (``sids``: the ids' UTF-8 bytes one after
    another, ``sid_sizes [F]`` their lengths), ``seqs [F]``, ``times [F]`` and its task part (``task``: the parts'
    bytes one after another, ``task_ends [F]`` where each ends). Returns the bytes and where each event's ends
    ``[F]``."""
    n = seqs.shape[0]
    total = 0
    start = 0
    for f in range(n):
        head = 2 + _varint_size(sid_sizes[f]) + sid_sizes[f] + _varint_size(seqs[f])
        forecast = head + 9 + (task_ends[f] - start) + tail.shape[0]
        start = task_ends[f]
        result = head + 1 + _varint_size(forecast) + forecast
        total += 1 + _varint_size(result) + result
    out = np.empty(total, np.uint8)
    ends = np.empty(n, np.int64)
    double = np.empty(1, np.float64)
    raw = double.view(np.uint8)
    at = 0
    start = 0
    first = 0
    for f in range(n):
        sid = sids[start : start + sid_sizes[f]]
        start += sid_sizes[f]
        part = task[first : task_ends[f]]
        first = task_ends[f]
        head = 2 + _varint_size(sid.shape[0]) + sid.shape[0] + _varint_size(seqs[f])
        forecast = head + 9 + part.shape[0] + tail.shape[0]
        result = head + 1 + _varint_size(forecast) + forecast
        out[at] = 0x12
        at = _put_varint(out, at + 1, result)
        for copy in range(2):  # the head: the result's own, then the forecast's (session_id, seq)
            out[at] = 0x0A
            at = _put_varint(out, at + 1, sid.shape[0])
            out[at : at + sid.shape[0]] = sid
            at += sid.shape[0]
            out[at] = 0x10
            at = _put_varint(out, at + 1, seqs[f])
            if copy == 0:
                out[at] = 0x22
                at = _put_varint(out, at + 1, forecast)
        out[at] = 0x19
        double[0] = times[f]
        out[at + 1 : at + 9] = raw
        at += 9
        out[at : at + part.shape[0]] = part
        at += part.shape[0]
        out[at : at + tail.shape[0]] = tail
        at += tail.shape[0]
        ends[f] = at
    return out, ends


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


# ------------------------------------------------------------------ a request's wire bytes, compiled
# The stream takes its requests as wire bytes (gRPC does not parse them) and reads them here in one
# compiled pass (numba) into columns, running the checks that need no state on the way: the common
# request, well-formed with every event valid, becomes a ``CoreRequest`` with no Python object per
# event but its session id. Anything else (a field this reader does not expect, a field given twice,
# an event that fails a check, bytes that do not parse) is read by protobuf instead and checked by
# ``EventChecker`` event by event, which says what is wrong: the same request, the same errors.

#: what ``_read_request`` answers: ``_READ`` (columns, every event valid), ``_PROTOBUF`` (read it so) or
#: ``_ROOM`` (more events than the arrays it was given hold)
_PROTOBUF, _READ, _ROOM = 0, 1, 2
_MAX_VARINT_BYTES = 9  # up to 2^63 - 1: a longer one (a negative enum, a seq past MAX_SEQ) goes to protobuf
_MAX_SEQ = MAX_SEQ


@compiled(error_model="numpy")
def _read_varint(buf: np.ndarray, at: int, end: int) -> tuple[int, int]:
    """The varint at ``buf[at]`` and where it ends; ``(-1, at)`` where it is cut off or too long."""
    value = 0
    for k in range(_MAX_VARINT_BYTES):
        if at >= end:
            return -1, at
        byte = np.int64(buf[at])
        at += 1
        value |= (byte & 0x7F) << (7 * k)
        if byte < 0x80:
            return value, at
    return -1, at


@compiled(error_model="numpy")
def _read_event(buf: np.ndarray, at: int, end: int, e: int, cols: tuple, checks: tuple) -> bool:
    """Event ``e`` from ``buf[at:end]`` into the columns ``cols``; False where it is not as the common
    event is (every field once at most, values packed) or fails a check (``checks``: value width, marks,
    most id bytes, whether NaN values pass)."""
    id_at, id_len, seqs, times, marks, values = cols
    width, num_marks, max_id_bytes, missing_ok = checks
    seen = 0
    seqs[e], times[e], marks[e], id_len[e] = 0, 0.0, 0, 0
    n_values = 0
    while at < end:
        key, at = _read_varint(buf, at, end)
        if key < 0:
            return False
        field, wire_type = key >> 3, key & 7
        if field < 1 or field > 5 or seen & (1 << field):
            return False
        seen |= 1 << field
        if wire_type == 2 and (field == 1 or field == 5):
            n, at = _read_varint(buf, at, end)
            if n < 0 or at + n > end:
                return False
            if field == 1:
                id_at[e], id_len[e] = at, n
            else:
                if n != 4 * width:
                    return False
                row = buf[at : at + n].view(np.float32)
                for j in range(width):
                    v = row[j]
                    if not (np.isfinite(v) or (missing_ok and np.isnan(v))):
                        return False
                    values[e, j] = v
                n_values = width
            at += n
        elif wire_type == 0 and (field == 2 or field == 4):
            v, at = _read_varint(buf, at, end)
            if v < 0:
                return False
            if field == 2:
                seqs[e] = v
            else:
                marks[e] = v
        elif wire_type == 1 and field == 3:
            if at + 8 > end:
                return False
            times[e] = buf[at : at + 8].view(np.float64)[0]
            at += 8
        else:
            return False
    return (
        n_values == width
        and 0 < id_len[e] <= max_id_bytes
        and 1 <= seqs[e] <= _MAX_SEQ
        and marks[e] < num_marks
        and np.isfinite(times[e])
    )


#: where ``_read_request``'s ``ints`` hold the request's own fields: request_id's offset and length, model's,
#: forecast_mode, top_k, layout; the events' columns follow (``_HEAD`` values, then ``[n]`` each)
_HEAD = 7


def _room(n: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for a request's fields and ``n`` events, as ``_read_request`` fills it: ``ints [_HEAD + 4 n]`` (the
    fields, then the session id offsets and lengths, seqs and marks ``[n]`` each), ``times [n]``,
    ``values [n, width]``."""
    return np.zeros(_HEAD + 4 * n, np.int64), np.zeros(n, np.float64), np.zeros((n, width), np.float32)


def _read_columns(buf: np.ndarray, view: _ModelView) -> tuple[int, int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``_read_request`` of ``buf`` for ``view``'s model into its one-event arrays, or into arrays of their own
    where the request has more events: ``(how, n, (ints, times, values))``."""
    arrays = view.scratch
    how, n = _read_request(buf, view.checks, *arrays)
    if how == _ROOM:
        arrays = _room(n, view.description.value_width)
        how, n = _read_request(buf, view.checks, *arrays)
    return how, n, arrays


@compiled(error_model="numpy")
def _read_request(
    buf: np.ndarray, checks: tuple, ints: np.ndarray, times: np.ndarray, values: np.ndarray
) -> tuple[int, int]:
    """A ``StreamRequest``'s wire bytes into ``ints``, ``times`` and ``values`` (``_room``'s arrays, for as many
    events as they have room for): ``(how, n)``. ``how`` is ``_READ`` where it is the common request (its
    fields once at most; its ``n`` events read and valid), ``_ROOM`` where it has more events than the arrays
    hold (nothing read: call again with ``_room(n, width)``), else ``_PROTOBUF``. ``ints`` then holds the
    offsets and lengths of ``request_id`` and ``model``, ``forecast_mode``, ``top_k``, ``layout`` (``_HEAD``
    values), then the events' session id offsets, their lengths, seqs and marks ``[n]`` each; ``times [n]``,
    ``values [n, width]``. The caller's arrays, not new ones: an array a compiled call returns costs its
    boxing, some 3,700 instructions each."""
    end = buf.shape[0]
    head = ints
    head[:_HEAD] = 0
    seen = 0
    n = 0
    at = 0
    while at < end:  # the request's own fields, and how many events
        key, at = _read_varint(buf, at, end)
        field, wire_type = key >> 3, key & 7
        if key < 0 or field < 1 or field > 6 or (field != 2 and seen & (1 << field)):
            return _PROTOBUF, 0
        seen |= 1 << field
        if wire_type == 2 and (field == 1 or field == 2 or field == 6):
            size, at = _read_varint(buf, at, end)
            if size < 0 or at + size > end:
                return _PROTOBUF, 0
            if field == 2:
                n += 1
            else:
                k = 0 if field == 1 else 2
                head[k], head[k + 1] = at, size
            at += size
        elif wire_type == 0 and field >= 3 and field <= 5:
            v, at = _read_varint(buf, at, end)
            if v < 0 or v > 0xFFFFFFFF:
                return _PROTOBUF, 0
            head[field + 1] = v
        else:
            return _PROTOBUF, 0
    if times.shape[0] < n or ints.shape[0] < _HEAD + 4 * n or values.shape[0] < n:
        return _ROOM, n
    h = _HEAD
    cols = (ints[h : h + n], ints[h + n : h + 2 * n], ints[h + 2 * n : h + 3 * n], times, ints[h + 3 * n :], values)
    e = 0
    at = 0
    while at < end:  # the events, in order (the bytes were read above: no check needed on the way)
        key, at = _read_varint(buf, at, end)
        if key >> 3 == 2:
            size, at = _read_varint(buf, at, end)
            if not _read_event(buf, at, at + size, e, cols, checks):
                return _PROTOBUF, 0
            e += 1
            at += size
        elif key & 7 == 2:
            size, at = _read_varint(buf, at, end)
            at += size
        else:
            _, at = _read_varint(buf, at, end)
    return _READ, n


@dataclasses.dataclass(frozen=True, slots=True)
class _Header:
    """What the stream keeps of a request it read as columns (the fields of ``pb.StreamRequest`` but
    its events, which are in its ``CoreRequest``)."""

    request_id: str
    model: str
    forecast_mode: int
    top_k: int
    layout: int


#: A request as the stream keeps it: read as columns (its header), or by protobuf (the message).
_Request = _Header | pb.StreamRequest
#: The header a gathered group's replies are written with (their events' keys come from the group's columns).
_GROUP = _Header("", "", 0, 0, 0)
#: The index of a one-event request (shared: never written).
_ONE = np.zeros(1, np.int64)
_ONE.flags.writeable = False


def _key_of(request: _Request, core: CoreRequest | None, i: int) -> tuple[str, int]:
    """Event ``i``'s session id and seq: from the message, or (a request read as columns, whose every
    event is valid, positions ``0..n-1``) from its core request's columns."""
    if isinstance(request, pb.StreamRequest):
        event = request.events[i]
        return event.session_id, event.seq
    assert core is not None
    return core.events.session_ids[i], int(core.events.seq[i])


class ForecastServicer(pb_grpc.ForecastServiceServicer):
    """Registered before the server starts; calls are refused with UNAVAILABLE until ``attach``."""

    def __init__(self, settings: ServerSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._core: CoreAPI | None = None
        self._loop = StreamLoop[bytes, bytes](self, settings, metrics, "Stream")
        #: The streaming rpc: each request is answered as soon as its events are applied and stored,
        #: in request order, at most ``max_inflight_requests_per_stream`` unanswered (``StreamLoop``).
        self.Stream = self._loop.serve
        self._views: dict[str, _ModelView] = {}
        self._default: _ModelView | None = None
        self.draining = False
        #: The stream's one-event requests of a loop turn, submitted as one (``gather.py``).
        self._gather = Gather(self._group_parts, min(settings.max_events_per_request, settings.max_batch_events))

    def attach(self, core: CoreAPI) -> None:
        """Serve through ``core``: an ``EngineCore`` or the IPC client of one."""
        views = {}
        for d in core.descriptions:
            checker = EventChecker.for_model(d, self.settings.max_session_id_bytes)
            encoder = spec_of(d.task).load("aaren_v1")(d, self.settings.default_top_k)
            ref = pb.ModelRef(name=d.name, version=d.version)
            ref_wire = pb.Forecast(model=ref).SerializeToString()
            submit, wire = core.submitter(d.name), wire_rows(encoder)
            checks = (d.value_width, d.num_marks, self.settings.max_session_id_bytes, d.missing_values)
            block, ref_array = wire_blocks(encoder), np.frombuffer(ref_wire, np.uint8)
            views[d.name] = _ModelView(
                d,
                ref,
                tuple(d.quantiles),
                checker,
                encoder,
                d.ranked,
                submit,
                wire,
                ref_wire,
                checks,
                block,
                ref_array,
                _room(1, d.value_width),
            )
        for alias, name in core.aliases.items():
            views.setdefault(alias, views[name])
        default = views[core.descriptions[0].name]
        self._views, self._default = views, default
        self._core = core
        # the compiled request reader and reply writer, ready (compiled, or loaded from numba's cache) before
        # the first request (a task's own compiled writer is made ready by its encoder)
        one = pb.StreamRequest(events=[pb.Event()]).SerializeToString()
        _read_request(np.frombuffer(one, np.uint8), default.checks, *default.scratch)
        # numba compiles a version per argument type, read-only arrays apart: the task's block is writable, the
        # session ids' bytes and the reference reply are read-only (np.frombuffer of bytes)
        ones, byte = np.ones(1, np.int64), np.frombuffer(b"\0", np.uint8)
        _results_block(np.zeros(1, np.uint8), ones, byte, ones, ones, np.zeros(1), default.ref_array)

    def _view(self, model: str) -> _ModelView | None:
        """The model a request names ("" the default), None when this server does not serve it."""
        return self._default if not model else self._views.get(model)

    def _view_or_abort(self, model: str) -> _ModelView:
        view = self._view(model)
        if view is None:
            raise Reasons.served_model_unknown(model, self._served_names()).exception()
        return view

    def _served_names(self) -> list[str]:
        return [d.name for d in self._core.descriptions] if self._core is not None else []

    async def ready(self, context: grpc.aio.ServicerContext) -> CoreAPI:
        """The core, or UNAVAILABLE while the model loads and once the core is gone."""
        if self._core is None:
            await abort(context, Reasons.loading())
        assert self._core is not None
        if self._core.lost:
            await abort(context, Reasons.core_unavailable())
        return self._core

    def _error(self, info: ErrorInfo) -> pb.EventError:
        error = pb.EventError(code=int(info.code), reason=info.reason, message=info.message)
        if info.retry_after_s:
            error.retry_after_ms = math.ceil(info.retry_after_s * 1000)
        return error

    def _forecast_message(self, future: SampledFuture, view: _ModelView) -> pb.Forecast:
        out = pb.Forecast()
        out.session_id, out.seq, out.last_time = future.session_id, future.seq, future.last_time
        view.encoder.rows(future.outputs, self._top_k(future.top_k, view))(out, 0, future.last_time)
        out.model.CopyFrom(view.ref)
        return out

    def _top_k(self, request_top_k: int, view: _ModelView) -> int:
        k = request_top_k or self.settings.default_top_k
        return min(k, view.ranked)

    def _response(
        self, request: _Request, outcomes: Outcomes, view: _ModelView, core: CoreRequest | None = None
    ) -> pb.StreamResponse:
        """The reply to ``request`` as a message (its ``core`` request, as checked, if at hand)."""
        return pb.StreamResponse.FromString(self._reply(request, outcomes, view, core))

    def _reply(self, request: _Request, outcomes: Outcomes, view: _ModelView, core: CoreRequest | None = None) -> bytes:
        """The reply to ``request`` as the ``StreamResponse``'s wire bytes, which the stream hands gRPC as
        they are: a rows reply written as such (``request_id`` = 1, then the results, ``_results_wire``:
        what serializing the message would give), a refusal or a columns reply serialized."""
        if outcomes.request_error is None and request.layout != pb.RESPONSE_LAYOUT_COLUMNS:
            results = self._results_wire(request, outcomes, view, core)
            rid = request.request_id.encode()
            return b"\x0a%b%b%b" % (_varint(len(rid)), rid, results) if rid else results
        if outcomes.request_error is not None:
            return self.refusal(request, outcomes.request_error)
        response = pb.StreamResponse(request_id=request.request_id)
        return self._columns_response(request, outcomes, response, view, core).SerializeToString()

    def _forecast_keys(
        self, request: _Request, outcomes: Outcomes, core: CoreRequest | None
    ) -> tuple[list[str], list[int], list[float]]:
        """The session ids, seqs and times of the events with a forecast, in order: from ``core``'s
        columns (the request as checked) when given, else from the request's messages."""
        positions = outcomes.forecast_index
        if not len(positions):
            return [], [], []
        if core is not None:
            columns = core.events
            if len(positions) == len(columns.session_ids):  # every valid event has a forecast: the columns
                return columns.session_ids, columns.seq.tolist(), columns.time.tolist()
            rows = np.searchsorted(core.index, positions)  # where each sits among the valid (index increases)
            sids = [columns.session_ids[j] for j in rows.tolist()]
            return sids, columns.seq[rows].tolist(), columns.time[rows].tolist()
        assert isinstance(request, pb.StreamRequest)  # a request read as columns always has its core request
        chosen = [request.events[i] for i in positions.tolist()]
        return [e.session_id for e in chosen], [e.seq for e in chosen], [e.time for e in chosen]

    def _results_wire(
        self, request: _Request, outcomes: Outcomes, view: _ModelView, core: CoreRequest | None = None
    ) -> bytes:
        """The reply's ``results`` (field 2 of ``StreamResponse``) as wire bytes, one ``EventResult``
        per event in request order: a forecast's from the task's wire bytes of its row (``wire``) and
        what every forecast has (session id, seq, last time, model); an ack's or error's from its
        message. Parsed once into the reply, they cost no message object per event (``_forecast_keys``
        gives the forecasts' session ids, seqs and times)."""
        return b"".join(self._results_parts(request, outcomes, view, self._top_k(request.top_k, view), core))

    def _group_parts(self, view: _ModelView, k: int, group: CoreRequest, outcomes: Outcomes) -> list[bytes]:
        """A gathered group's replies but their ``request_id``: each event's ``results`` field, from the
        group's core request and outcomes (``Gather``)."""
        return self._results_parts(_GROUP, outcomes, view, k, group)

    def _results_parts(
        self, request: _Request, outcomes: Outcomes, view: _ModelView, k: int, core: CoreRequest | None
    ) -> list[bytes]:
        """``_results_wire``'s bytes, one item per event: its ``results`` field (``k``: the top marks). Every
        forecast's in one compiled pass (``_forecast_parts``), an ack's or error's from its message."""
        kinds = outcomes.kind
        index = outcomes.forecast_index
        n = len(kinds)
        parts: list[bytes] = []
        if len(index):
            if core is not None and len(index) == n == core.n:  # every event read as columns has a forecast
                events = core.events
                parts = self._forecast_parts(view, outcomes, k, events.session_ids, events.seq, events.time)
            else:
                sids, seqs, times = self._forecast_keys(request, outcomes, core)
                parts = self._forecast_parts(
                    view, outcomes, k, sids, np.array(seqs, np.int64), np.array(times, np.float64)
                )
            if len(index) == n:
                return parts
        out = []
        f = 0
        for i, kind in enumerate(kinds.tolist()):
            if kind == FORECAST:
                out.append(parts[f])
                f += 1
            else:
                other = pb.StreamResponse()
                self._add_result(other.results, *_key_of(request, core, i), outcomes, i, kind)
                out.append(other.SerializeToString())
        return out

    @staticmethod
    def _forecast_parts(
        view: _ModelView, outcomes: Outcomes, k: int, sids: list[str], seqs: np.ndarray, times: np.ndarray
    ) -> list[bytes]:
        """The ``results`` fields of the forecasts, one item each (``_results_block``): the task's parts as one
        block where it writes one (``wire_block``), else its ``wire`` bytes joined."""
        if view.block is not None:
            block = view.block(outcomes.outputs, k, times)
            task = block.reshape(-1)
            task_ends = np.arange(1, len(block) + 1, dtype=np.int64) * block.shape[1]
        else:
            wires = view.wire(outcomes.outputs, k, times.tolist())
            task = np.frombuffer(b"".join(wires), np.uint8).copy()  # writable, as the block's
            task_ends = np.cumsum(np.array([len(w) for w in wires], np.int64))
        encoded = [sid.encode() for sid in sids]
        sizes = np.array([len(sid) for sid in encoded], dtype=np.int64)
        sid_bytes = np.frombuffer(b"".join(encoded), np.uint8)
        out, ends = _results_block(task, task_ends, sid_bytes, sizes, seqs, times, view.ref_array)
        data, stops = out.tobytes(), ends.tolist()
        return [data[a:b] for a, b in zip([0, *stops[:-1]], stops, strict=True)]

    def _add_result(self, results: Any, sid: str, seq: int, outcomes: Outcomes, i: int, kind: int) -> None:
        """Append the row of event ``i`` (``sid``, ``seq``) answered without a forecast: an ack (maybe a
        duplicate) or an error."""
        result = results.add(session_id=sid, seq=seq)
        if kind in (ACK, DUPLICATE):
            result.duplicate = kind == DUPLICATE
            result.ack.SetInParent()
            result.ack.last_seq = int(outcomes.last_seq[i])
        else:
            result.error.CopyFrom(self._error(outcomes.errors.get(i) or Reasons.internal()))

    def _columns_response(
        self,
        request: _Request,
        outcomes: Outcomes,
        response: pb.StreamResponse,
        view: _ModelView,
        core: CoreRequest | None = None,
    ) -> pb.StreamResponse:
        """RESPONSE_LAYOUT_COLUMNS: one packed-field ``extend`` per column; the events without a
        forecast as ``results``."""
        index = outcomes.forecast_index
        kinds = outcomes.kind
        if len(index) != len(kinds):
            for i in np.flatnonzero(kinds != FORECAST).tolist():
                self._add_result(response.results, *_key_of(request, core, i), outcomes, i, int(kinds[i]))
        if not len(index):
            return response
        sids, seqs, last_times = self._forecast_keys(request, outcomes, core)
        block = response.forecast_columns
        block.event_index.extend(index.tolist())
        block.session_id.extend(sids)
        block.seq.extend(seqs)
        block.last_time.extend(last_times)
        block.model.CopyFrom(view.ref)
        view.encoder.columns(block, outcomes.outputs, self._top_k(request.top_k, view), last_times)
        return response

    def core_request(self, request: pb.StreamRequest, tenant: str, view: _ModelView | None = None) -> CoreRequest:
        """The request's events as columns, the stateless checks done (by the model's own checks)."""
        view = view or self._default
        assert view is not None
        events = request.events
        if len(events) == 1:  # the most common message: one pass, one element object, no comprehensions
            e = events[0]
            columns: tuple[list[Any], ...] = ([e.session_id], [e.seq], [e.time], [e.mark], [e.values])
        else:  # one pass: each event's element object is made once, not once per field
            columns = ([], [], [], [], [])
            sids, seqs, times, marks, values = (c.append for c in columns)
            for e in events:
                sids(e.session_id)
                seqs(e.seq)
                times(e.time)
                marks(e.mark)
                values(e.values)
        return view.checker.request(
            *columns,
            top_k=request.top_k,
            last_only=request.forecast_mode == pb.FORECAST_MODE_LAST_PER_SESSION,
            tenant=tenant,
            model=view.description.name,
        )

    # ------------------------------------------------------------------ the stream (StreamCodec)

    def decode(self, request: bytes | pb.StreamRequest, tenant: str) -> Accepted[bytes]:
        """The request (its wire bytes, or a message) as columns and its encoder; an unknown model or
        enum is refused (and counted); bytes that do not parse raise ``DecodeError``."""
        assert self._core is not None
        if isinstance(request, bytes):
            read = self._read(request, tenant, gather=True)
            if read is not None:
                return read
            request = pb.StreamRequest.FromString(request)  # protobuf says what is wrong
        view = self._view(request.model)
        if view is None:
            info = Reasons.served_model_unknown(request.model, self._served_names())
            self._core.count_rejection(info, len(request.events), request.model)
            raise RefusedError(info)
        if request.layout not in _LAYOUTS or request.forecast_mode not in _FORECAST_MODES:
            name, value, known = (
                ("layout", request.layout, _LAYOUTS)
                if request.layout not in _LAYOUTS
                else ("forecast_mode", request.forecast_mode, _FORECAST_MODES)
            )
            info = Reasons.unknown_enum(name, value, sorted(known))
            self._core.count_rejection(info, len(request.events), view.description.name)
            raise RefusedError(info)
        core = self.core_request(request, tenant, view)
        submit = functools.partial(self._gather.submit_now, view.submit)
        return Accepted(core, lambda o: self._reply(request, o, view, core), submit)

    def _read(self, raw: bytes, tenant: str, gather: bool = False) -> Accepted[bytes] | None:
        """The common request read from its wire bytes in one compiled pass (``_read_request``): a
        request of a served model, known enums, every event valid; None for any other, which
        ``decode`` reads with protobuf and checks event by event. ``gather``: a one-event request of
        the rows layout goes to the loop turn's group (``Gather``), as its numbers, no arrays of its own;
        its answer is its reply itself."""
        view = self._default
        assert view is not None
        buf = np.frombuffer(raw, np.uint8)
        how, n, (ints, times, values) = _read_columns(buf, view)
        if how != _READ:
            return None
        numbers = ints.tolist()
        rid_at, rid_len, model_at, model_len, mode, top_k, layout = numbers[:_HEAD]
        try:
            model = raw[model_at : model_at + model_len].decode() if model_len else ""
            if model:
                named = self._view(model)
                if named is None:
                    return None
                if named is not view:
                    view = named
                    how, n, (ints, times, values) = _read_columns(buf, view)
                    if how != _READ:
                        return None
                    numbers = ints.tolist()
            if layout not in _LAYOUTS or mode not in _FORECAST_MODES:
                return None
            rid = raw[rid_at : rid_at + rid_len]
            request_id = rid.decode() if rid_len else ""
            if n == 1:
                at, size = numbers[_HEAD], numbers[_HEAD + 1]
                ids = [raw[at : at + size].decode()]
            else:
                starts, sizes = numbers[_HEAD : _HEAD + n], numbers[_HEAD + n : _HEAD + 2 * n]
                ids = [raw[a : a + size].decode() for a, size in zip(starts, sizes, strict=True)]
        except UnicodeDecodeError:
            return None  # protobuf refuses it
        if gather and n == 1 and layout != pb.RESPONSE_LAYOUT_COLUMNS:
            prefix = b"\x0a%b%b" % (_varint(rid_len), rid) if rid_len else b""
            # seq and mark follow the id's offset and length (``_read_request``'s ``ints``)
            event = OneEvent(prefix, ids[0], numbers[_HEAD + 2], times.item(0), numbers[_HEAD + 3], values.copy())
            submit = functools.partial(self._gather.add, (view, tenant, self._top_k(top_k, view)))
            return Accepted(event, functools.partial(self._gathered_reply, request_id), submit)
        h = _HEAD
        if values is view.scratch[2]:  # the view's arrays: the request keeps its own copies
            ints, times, values = ints[: h + 4 * n].copy(), times[:n].copy(), values[:n].copy()
        core = CoreRequest(
            n,
            _ONE if n == 1 else np.arange(n),
            EventColumns(ids, ints[h + 2 * n : h + 3 * n], times, ints[h + 3 * n : h + 4 * n], values),
            {},
            top_k=top_k,
            last_only=mode == pb.FORECAST_MODE_LAST_PER_SESSION,
            tenant=tenant,
            model=view.description.name,
        )
        header = _Header(request_id, model, mode, top_k, layout)
        if not gather:
            return Accepted(core, lambda o: self._reply(header, o, view, core), view.submit)
        submit = functools.partial(self._gather.submit_now, view.submit)
        return Accepted(core, lambda o: self._reply(header, o, view, core), submit)

    def _gathered_reply(self, request_id: str, answer: bytes | Outcomes) -> bytes:
        """A gathered request's reply: its answer, or the refusal its outcomes hold (``Gather``)."""
        if isinstance(answer, bytes):
            return answer
        info = answer.request_error or Reasons.internal()
        return pb.StreamResponse(request_id=request_id, request_error=self._error(info)).SerializeToString()

    def refusal(self, request: bytes | _Request, info: ErrorInfo) -> bytes:
        """The reply that refuses ``request`` whole, as the stream sends it (wire bytes)."""
        return self._refused(request, info).SerializeToString()

    def _refused(self, request: bytes | _Request, info: ErrorInfo) -> pb.StreamResponse:
        if isinstance(request, bytes):  # its request id, if it has one that parses
            try:
                request = pb.StreamRequest.FromString(request)
            except DecodeError:
                request = pb.StreamRequest()
        return pb.StreamResponse(request_id=request.request_id, request_error=self._error(info))

    # ------------------------------------------------------------------ outside a gRPC call

    async def answer(
        self,
        request: pb.StreamRequest,
        tenant: str = "",
        before_store: Callable[[list[int], pb.StreamResponse], Awaitable[None]] | None = None,
    ) -> pb.StreamResponse:
        """One stream request answered without a call (the event-log consumer): decoded and checked,
        applied by the core, encoded, as ``Stream`` answers it. ``before_store(positions, response)``:
        awaited before the states of those events (positions in ``request.events``) are stored, with
        their results as they will be (``CoreRequest.before_store``; the core must be in this process)."""
        if self._core is None or self._core.lost:
            return self._refused(request, Reasons.loading() if self._core is None else Reasons.core_unavailable())
        if self._core.draining:
            return self._refused(request, Reasons.shutting_down())
        try:  # the compiled read of its wire bytes where it applies, as the stream reads it; else the message
            accepted = self._read(request.SerializeToString(), tenant) or self.decode(request, tenant)
        except RefusedError as exc:
            return self._refused(request, exc.info)
        if before_store is not None:
            view = self._view(request.model)
            assert view is not None  # decode refused an unknown model

            async def hook(positions: np.ndarray, outcomes: Outcomes) -> None:
                chosen = positions.tolist()
                part = pb.StreamRequest(events=[request.events[i] for i in chosen], top_k=request.top_k)
                await before_store(chosen, self._response(part, outcomes, view))

            accepted.request.before_store = hook
        answer: asyncio.Future[Outcomes] = asyncio.get_running_loop().create_future()
        accepted.submit(accepted.request, answer.set_result)
        return pb.StreamResponse.FromString(accepted.encode(await answer))

    async def latest(self, session_id: str, model: str = "", top_k: int = 0, tenant: str = "") -> pb.Forecast:
        """The forecast of the session's stored state, as ``Stream`` answered its last applied event;
        raises ``ServiceError`` (an unknown session or model)."""
        if self._core is None:
            raise Reasons.loading().exception()
        view = self._view_or_abort(model)
        future = await self._core.forecast(session_id, ForecastOptions(top_k=top_k), tenant, view.description.name)
        return self._forecast_message(future, view)

    def close_streams(self) -> None:
        """Ask every open stream to end with UNAVAILABLE once its answered requests are sent."""
        self._loop.close_all()

    async def _unary(self, method: str, context: grpc.aio.ServicerContext, call):  # noqa: ANN001, ANN202
        started = time.perf_counter()
        try:
            return await call
        except ServiceError as exc:
            await abort(context, exc.info)
        finally:
            self.metrics.request_latency.labels(method).observe(time.perf_counter() - started)

    async def Forecast(self, request: pb.ForecastRequest, context: grpc.aio.ServicerContext) -> pb.ForecastResponse:  # noqa: N802
        core = await self.ready(context)

        async def call() -> tuple[_ModelView, SampledFuture]:
            view = self._view_or_abort(request.model)
            options = ForecastOptions(
                request.horizon,
                request.num_samples,
                request.seed if request.HasField("seed") else None,
                request.top_k,
                request.include_paths,
            )
            future = await core.forecast(request.session_id, options, current_tenant.get(), view.description.name)
            return view, future

        view, future = await self._unary("Forecast", context, call())
        levels = view.levels
        return pb.ForecastResponse(
            forecast=self._forecast_message(future, view),
            steps=[
                pb.StepSummary(
                    step=s.step,
                    mean_time=s.mean_time,
                    time_quantiles=[pb.Quantile(q=q, value=v) for q, v in zip(levels, s.time_quantiles, strict=True)],
                    marks=[pb.MarkProbability(mark=m, probability=p) for m, p in s.marks],
                )
                for s in future.steps
            ],
            paths=[
                pb.SampledPath(
                    events=[
                        pb.SampledEvent(time=t, mark=m, values=v) for t, m, v in zip(times, marks, values, strict=True)
                    ]
                )
                for times, marks, values in zip(future.times, future.marks, future.values, strict=True)
            ],
        )

    async def GetSession(  # noqa: N802
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSessionResponse:
        core = await self.ready(context)

        async def call() -> tuple[_ModelView, SessionView]:
            model = self._view_or_abort(request.model)
            found = await core.get_session(
                request.session_id, request.include_state, current_tenant.get(), model=model.description.name
            )
            return model, found

        model, view = await self._unary("GetSession", context, call())
        m = view
        return pb.GetSessionResponse(
            session_id=view.session_id,
            last_seq=m.last_seq,
            last_time=m.last_time,
            n_events=m.last_seq,
            state_bytes=view.state_bytes,
            state=view.state or b"",
            model=model.ref,
            created_at=_timestamp(m.created_at),
            updated_at=_timestamp(m.updated_at),
            expires_at=_timestamp(view.expires_at),
        )

    async def EndSession(  # noqa: N802
        self, request: pb.EndSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndSessionResponse:
        core = await self.ready(context)

        async def call() -> int | None:
            view = self._view_or_abort(request.model)
            return await core.end_session(request.session_id, current_tenant.get(), model=view.description.name)

        last_seq = await self._unary("EndSession", context, call())
        return pb.EndSessionResponse(existed=last_seq is not None, last_seq=last_seq or 0)

    async def DescribeModel(  # noqa: N802
        self, request: pb.DescribeModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeModelResponse:
        await self.ready(context)

        async def call() -> _ModelView:
            return self._view_or_abort(request.model)

        view = await self._unary("DescribeModel", context, call())
        d, s = view.description, self.settings
        return pb.DescribeModelResponse(
            **{name: getattr(d, name) for name in _DESCRIBED},
            quantile_levels=view.levels,
            served_models=self._served_names(),
            limits=pb.ServiceLimits(**{name: getattr(s, name) for name in _LIMITS}, idle_ttl_seconds=s.idle_ttl_s),
        )


def add_forecast_servicer_to_server(servicer: ForecastServicer, server: grpc.aio.Server) -> None:
    """Register ``aaren.v1.ForecastService``: every rpc as ``servicer`` has it, the stream's replies
    handed to gRPC as the wire bytes they are (``ForecastServicer._reply``, ``refusal``)."""
    add_service(
        server,
        pb.DESCRIPTOR.services_by_name["ForecastService"],
        lambda m: getattr(servicer, m.name),
        passthrough=("Stream",),
    )
