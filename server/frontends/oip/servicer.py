"""The Open Inference Protocol front end: Triton's ``inference.GRPCInferenceService`` with its
sequence extension, so that tritonclient (and other OIP clients) drive aaren sessions unchanged.

Every served model is reached by its name. A sequence is a session of that model (scoped by the
caller's tenant, as in aaren.v1); each request carries one event as named tensors and is answered
with the session's forecast as named tensors in ``raw_output_contents``: which tensors, a model's
task says (its OIP codec, ``aaren.server.tasks.registry``; the event task's ``TIME``, ``MARK``,
``VALUES`` in, ``SEQ``, ``MEAN_GAP``, ... out; see ``aaren.server.tasks.<task>.oip``). The
protocol has no seq: a request without START is sent to the engine core with ``NEXT_SEQ``, and the
core, which alone knows the stored last seq, numbers it. START ends an open session of that id
first (as Triton does) and sends seq 1; END ends the session once its event is applied. README
"OIP / Triton clients" has the whole contract.

Like every front end this only converts: proto <-> ``CoreRequest`` / ``Outcomes``. It never imports
torch (front-end processes run it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor

from aaren import __version__
from aaren.oip.v2 import grpc_service_pb2 as pb
from aaren.oip.v2 import model_config_pb2 as mc
from aaren.server.contract.columns import FORECAST, NEXT_SEQ, CoreRequest, ModelDescription, Outcomes
from aaren.server.contract.core_api import CoreAPI, OnDone
from aaren.server.contract.errors import ErrorInfo, Reasons, ServiceError
from aaren.server.frontends.handlers import add_service
from aaren.server.frontends.streams import Accepted, EventChecker, RefusedError, StreamLoop, abort
from aaren.server.observability.metrics import Metrics
from aaren.server.security.auth import current_tenant
from aaren.server.settings import ServerSettings
from aaren.server.tasks.oip import TensorCodec
from aaren.server.tasks.registry import spec_of

__all__ = ["OIP_SERVICE_NAME", "OipServicer", "add_oip_servicer_to_server"]

log = logging.getLogger(__name__)

#: The service's name on the wire (Triton's), whatever the package of our copy of its messages.
OIP_SERVICE_NAME = "inference.GRPCInferenceService"
EXTENSIONS = ("sequence", "sequence(string_id)", "model_configuration", "parameters", "statistics")
_CONFIG_TYPE = {"FP64": mc.TYPE_FP64, "FP32": mc.TYPE_FP32, "INT64": mc.TYPE_INT64, "INT32": mc.TYPE_INT32}
#: The stream loop's refusal of a whole request, and its way of ending a call (``frontends.streams``).
_RefusedError, _abort = RefusedError, abort


class _Event:
    """One decoded request: its sequence (as a session id), flags, the event and what to answer."""

    __slots__ = ("end", "k", "mark", "model", "names", "request_id", "session_id", "start", "time", "values")

    def __init__(self, model: _Model) -> None:
        self.model = model
        self.session_id = ""
        self.start = self.end = False
        self.time = 0.0
        self.mark = 0
        self.values: list[float] = []
        self.k = 0
        self.names: tuple[str, ...] = ()
        self.request_id = ""


class _Statistics:
    """ModelStatistics of one model in this front end (a front-end process counts what it served;
    ``summed`` adds up those of every front-end process)."""

    def __init__(self) -> None:
        self.success = self.fail = self.success_ns = self.fail_ns = 0
        self.last_ms = 0

    def plain(self) -> list[int]:
        """As plain values (they cross the IPC): ``[success, fail, success_ns, fail_ns, last_ms]``."""
        return [self.success, self.fail, self.success_ns, self.fail_ns, self.last_ms]

    @classmethod
    def summed(cls, plains: Iterable[list[int]]) -> _Statistics:
        """The counts and times of several front ends added up, the latest inference of any."""
        total = cls()
        for success, fail, success_ns, fail_ns, last_ms in plains:
            total.success += success
            total.fail += fail
            total.success_ns += success_ns
            total.fail_ns += fail_ns
            total.last_ms = max(total.last_ms, last_ms)
        return total

    def record(self, ok: bool, started: float) -> None:
        ns = int((time.perf_counter() - started) * 1e9)
        if ok:
            self.success += 1
            self.success_ns += ns
        else:
            self.fail += 1
            self.fail_ns += ns
        self.last_ms = int(time.time() * 1000)


class _Model:
    """One served model as this front end sees it: its description, the codec of its task, its
    stateless checks and its statistics."""

    def __init__(
        self,
        d: ModelDescription,
        codec: TensorCodec,
        checker: EventChecker,
        submit: Callable[[CoreRequest, OnDone], None],
    ) -> None:
        self.description, self.codec, self.checker = d, codec, checker
        #: The model's ``CoreAPI.submitter``.
        self.submit = submit
        self.stats = _Statistics()

    def matches(self, name: str, version: str) -> bool:
        return name == self.description.name and version in ("", self.description.version)


class OipServicer:
    """Registered before the server starts (``add_oip_servicer_to_server``); calls that need the
    model are refused with UNAVAILABLE until ``attach``."""

    def __init__(self, settings: ServerSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._core: CoreAPI | None = None
        self._models: dict[str, _Model] = {}
        self._latency = {m: metrics.request_latency.labels(m) for m in ("ModelInfer", "ModelStreamInfer")}
        self._loop = StreamLoop[pb.ModelInferRequest, pb.ModelStreamInferResponse](
            self, settings, metrics, "ModelStreamInfer", on_reply=self._count_reply
        )
        #: The streaming rpc: each request is answered as soon as its event is applied and stored, in
        #: request order (``StreamLoop``); a refused request is answered with ``error_message`` and the
        #: stream goes on.
        self.ModelStreamInfer = self._loop.serve
        self.draining = False
        #: What the health service says (the store answers): ServerReady follows it.
        self.serving = False

    def attach(self, core: CoreAPI) -> None:
        """Serve through ``core``: an ``EngineCore`` or the IPC client of one. Every model of the
        server is served by its name, with the tensors of its task's codec."""
        models = {}
        for d in core.descriptions:
            codec = spec_of(d.task).load("oip")(d, self.settings.default_top_k)
            checker = EventChecker.for_model(d, self.settings.max_session_id_bytes)
            models[d.name] = _Model(d, codec, checker, core.submitter(d.name))
        self._models = models
        self._core = core

    def _find(self, name: str, version: str) -> _Model | None:
        model = self._models.get(name)
        return model if model is not None and model.matches(name, version) else None

    def close_streams(self) -> None:
        """Ask every open stream to end with UNAVAILABLE once its answered requests are sent."""
        self._loop.close_all()

    # ------------------------------------------------------------------ helpers

    def _core_error(self) -> ErrorInfo | None:
        if self._core is None:
            return Reasons.loading()
        if self._core.lost:
            return Reasons.core_unavailable()
        return None

    async def ready(self, context: grpc.aio.ServicerContext) -> CoreAPI:
        info = self._core_error()
        if info is not None:
            await _abort(context, info)
        assert self._core is not None
        return self._core

    async def _model(self, context: grpc.aio.ServicerContext, name: str, version: str) -> _Model:
        """The served model of that name (and version), or NOT_FOUND."""
        await self.ready(context)
        model = self._find(name, version)
        if model is None:
            await _abort(context, Reasons.model_unknown(name, version))
        assert model is not None
        return model

    def _decode(self, request: pb.ModelInferRequest) -> _Event:
        """The request's model, sequence, flags and event; ``_RefusedError`` says what is wrong with it."""
        model = self._find(request.model_name, request.model_version)
        if model is None:
            raise _RefusedError(Reasons.model_unknown(request.model_name, request.model_version))
        t = model.codec
        event = _Event(model)
        event.request_id = request.id
        params = request.parameters
        sid = ""
        if "sequence_id" in params:
            p = params["sequence_id"]
            which = p.WhichOneof("parameter_choice")
            if which == "int64_param":
                sid = str(p.int64_param) if p.int64_param else ""
            elif which == "uint64_param":
                sid = str(p.uint64_param) if p.uint64_param else ""
            elif which == "string_param":
                sid = p.string_param
            else:
                raise _RefusedError(Reasons.parameter_type("sequence_id", "an int64, uint64 or string parameter"))
        if not sid:
            raise _RefusedError(Reasons.sequence_id_missing(t.model_name))
        error = model.checker.session_id_error(sid)
        if error is not None:
            raise _RefusedError(error)
        event.session_id = sid
        event.start = _flag(params, "sequence_start")
        event.end = _flag(params, "sequence_end")
        k = t.default_top_k
        if "top_k" in params:
            p = params["top_k"]
            which = p.WhichOneof("parameter_choice")
            if which not in ("int64_param", "uint64_param"):
                raise _RefusedError(Reasons.parameter_type("top_k", "an integer parameter"))
            k = min(max(int(getattr(p, which)), 1), t.ranked)
        event.k = k
        if request.outputs:
            wanted = set()
            for o in request.outputs:
                if o.name not in t.output_names:
                    raise _RefusedError(Reasons.output_unknown(o.name, t.model_name, t.output_names))
                wanted.add(o.name)
            event.names = tuple(n for n in t.output_names if n in wanted)
        else:
            event.names = tuple(t.output_names)
        self._inputs(request, event)
        return event

    def _record_refusal(self, request: pb.ModelInferRequest, started: float) -> None:
        """A request refused before it reached the core counts as a failure of its model (if served)."""
        model = self._find(request.model_name, request.model_version)
        if model is not None:
            model.stats.record(False, started)

    def _inputs(self, request: pb.ModelInferRequest, event: _Event) -> None:
        t = event.model.codec
        raw = request.raw_input_contents
        seen: dict[str, tuple[float, ...] | tuple[int, ...]] = {}
        for i, tensor in enumerate(request.inputs):
            name, datatype = tensor.name, tensor.datatype
            layout = t.layouts.get((name, datatype))
            if layout is None:
                if name not in t.input_names:
                    raise _RefusedError(Reasons.input_unknown(name, t.model_name, t.input_names))
                accepted = list(t.accepted[name])
                raise _RefusedError(Reasons.input_datatype(name, datatype, t.model_name, accepted))
            unpack, count, typed = layout
            shape = tensor.shape
            if len(shape) != 1 or shape[0] != count:
                raise _RefusedError(Reasons.input_shape(name, list(shape), t.model_name, [count]))
            if raw:
                data = raw[i] if i < len(raw) else b""
                if len(data) != unpack.size:
                    raise _RefusedError(Reasons.input_size(name, len(data), unpack.size))
                seen[name] = unpack.unpack(data)
            else:
                contents = getattr(tensor.contents, typed)
                if len(contents) != count:
                    size = len(contents) * unpack.size // max(count, 1)
                    raise _RefusedError(Reasons.input_size(name, size, unpack.size))
                seen[name] = tuple(contents)
        if len(seen) != len(t.input_names):
            missing = next(name for name in t.input_names if name not in seen)
            raise _RefusedError(Reasons.input_missing(missing, t.model_name, t.input_names))
        event.time, event.mark, event.values = t.event(seen)

    def _core_request(self, event: _Event, tenant: str) -> CoreRequest:
        return event.model.checker.request(
            [event.session_id],
            [1 if event.start else NEXT_SEQ],
            [event.time],
            [event.mark],
            [event.values],
            next_seq=True,
            tenant=tenant,
            model=event.model.description.name,
        )

    def _answer(
        self, event: _Event, outcomes: Outcomes, response: pb.ModelInferResponse
    ) -> pb.ModelInferResponse | ErrorInfo:
        """The answer of one event written into ``response`` (returned), or why it was refused."""
        t = event.model.codec
        if outcomes.request_error is not None:
            return outcomes.request_error
        if int(outcomes.kind[0]) != FORECAST:
            error = outcomes.errors.get(0) or Reasons.internal()
            if error.reason in ("session_not_found", "session_evicted"):
                error = Reasons.sequence_not_started(event.session_id, t.model_name, error.reason == "session_evicted")
            return error
        response.CopyFrom(t.template(event.k, event.names))
        response.id = event.request_id
        response.raw_output_contents.extend(
            t.requested(event.names, event.k, int(outcomes.last_seq[0]), event.time, outcomes.outputs)
        )
        return response

    async def _end_session(self, core: CoreAPI, event: _Event, tenant: str) -> None:
        with contextlib.suppress(ServiceError):
            await core.end_session(event.session_id, tenant, model=event.model.description.name)

    # ------------------------------------------------------------------ health and metadata

    async def ServerLive(  # noqa: N802
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(  # noqa: N802
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        core = self._core
        ready = self._core_error() is None and self.serving and not self.draining and not core.draining
        return pb.ServerReadyResponse(ready=ready)

    async def ModelReady(  # noqa: N802
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        if self._core_error() is not None:
            return pb.ModelReadyResponse(ready=False)
        known = self._find(request.name, request.version) is not None
        return pb.ModelReadyResponse(ready=known and self.serving and not self.draining)

    async def ServerMetadata(  # noqa: N802
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="aaren", version=__version__, extensions=list(EXTENSIONS))

    async def ModelMetadata(  # noqa: N802
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        model = await self._model(context, request.name, request.version)
        d, t = model.description, model.codec
        return pb.ModelMetadataResponse(
            name=d.name,
            versions=[d.version],
            platform=f"aaren_{d.task}",
            inputs=[pb.ModelMetadataResponse.TensorMetadata(name=n, datatype=dt, shape=s) for n, dt, s in t.inputs],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(name=n, datatype=dt, shape=s) for n, dt, s in t.outputs],
        )

    async def ModelConfig(  # noqa: N802
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        model = await self._model(context, request.name, request.version)
        d, t = model.description, model.codec
        parameters = {
            "task": d.task,
            "version": d.version,
            "backbone": d.backbone,
            "value_names": ",".join(d.value_names),
            "time_unit": d.time_unit,
            "state_bytes_per_session": str(d.state_bytes_per_session),
            **t.parameters(),
        }
        config = mc.ModelConfig(
            name=d.name,
            platform=f"aaren_{d.task}",
            backend="aaren",
            max_batch_size=0,
            input=[mc.ModelInput(name=n, data_type=_CONFIG_TYPE[dt], dims=s) for n, dt, s in t.inputs],
            output=[mc.ModelOutput(name=n, data_type=_CONFIG_TYPE[dt], dims=s) for n, dt, s in t.outputs],
            sequence_batching=mc.ModelSequenceBatching(
                max_sequence_idle_microseconds=int(self.settings.idle_ttl_s * 1e6),
                direct=mc.ModelSequenceBatching.StrategyDirect(
                    max_queue_delay_microseconds=int(self.settings.max_batch_wait_ms * 1000)
                ),
            ),
            parameters={k: mc.ModelParameter(string_value=v) for k, v in parameters.items()},
        )
        return pb.ModelConfigResponse(config=config)

    async def RepositoryIndex(  # noqa: N802
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        """The served models (read-only: loading and unloading are not served)."""
        await self.ready(context)
        state = "READY" if self.serving and not self.draining else "UNAVAILABLE"
        models = [
            pb.RepositoryIndexResponse.ModelIndex(name=m.description.name, version=m.description.version, state=state)
            for m in self._models.values()
        ]
        return pb.RepositoryIndexResponse(models=models)

    def statistics(self) -> dict[str, list[int]]:
        """This front end's ModelStatistics by model, as plain values (its ``oip_statistics`` report)."""
        return {m.description.name: m.stats.plain() for m in self._models.values()}

    async def ModelStatistics(  # noqa: N802
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        """Every front-end process's counts per model (all models when the request names none)."""
        core = await self.ready(context)
        if request.name:
            models = [await self._model(context, request.name, request.version)]
        else:
            models = list(self._models.values())
        # Every front-end process's counts (this one's included); in one process, this one's.
        reports = await core.front_end_reports("oip_statistics") or [self.statistics()]
        stats = []
        for model in models:
            d = model.description
            s = _Statistics.summed(r[d.name] for r in reports if d.name in r)
            stats.append(
                pb.ModelStatistics(
                    name=d.name,
                    version=d.version,
                    last_inference=s.last_ms,
                    inference_count=s.success,
                    execution_count=s.success,
                    inference_stats=pb.InferStatistics(
                        success=pb.StatisticDuration(count=s.success, ns=s.success_ns),
                        fail=pb.StatisticDuration(count=s.fail, ns=s.fail_ns),
                    ),
                )
            )
        return pb.ModelStatisticsResponse(model_stats=stats)

    # ------------------------------------------------------------------ inference

    async def ModelInfer(  # noqa: N802
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        core = await self.ready(context)
        started = time.perf_counter()
        tenant = current_tenant.get()
        try:
            event = self._decode(request)
        except _RefusedError as exc:
            self._record_refusal(request, started)
            await _abort(context, exc.info)
        if self.draining or core.draining:
            await _abort(context, Reasons.shutting_down())
        if event.start:
            await self._end_session(core, event, tenant)
        answered: asyncio.Future[Outcomes] = asyncio.get_running_loop().create_future()
        event.model.submit(self._core_request(event, tenant), answered.set_result)
        outcomes = await answered  # encoded on this call's task, not on the core's callback
        try:
            answer = self._answer(event, outcomes, pb.ModelInferResponse())
        except Exception:  # a bug must cost this request only
            log.exception("encoding the answer of request %r failed", event.request_id)
            answer = Reasons.internal()
        if event.end and not isinstance(answer, ErrorInfo):
            await asyncio.shield(self._end_session(core, event, tenant))
        event.model.stats.record(not isinstance(answer, ErrorInfo), started)
        self._latency["ModelInfer"].observe(time.perf_counter() - started)
        if isinstance(answer, ErrorInfo):
            await _abort(context, answer)
        return answer

    # ------------------------------------------------------------------ the stream (StreamCodec)

    def decode(self, request: pb.ModelInferRequest, tenant: str) -> Accepted[pb.ModelStreamInferResponse]:
        """The request's event as columns and its encoder. START first ends an open session of the
        id (after every earlier request of the stream is answered: perhaps the same id's previous
        sequence); END ends the session once its event is applied and answered."""
        event = self._decode(request)
        core = self._core
        assert core is not None
        return Accepted(
            self._core_request(event, tenant),
            lambda outcomes: self._stream_reply(event, outcomes),
            event.model.submit,
            before=(lambda: self._end_session(core, event, tenant)) if event.start else None,
            after=(lambda reply: self._ended(core, event, tenant, reply)) if event.end else None,
        )

    def refusal(self, request: pb.ModelInferRequest, info: ErrorInfo) -> pb.ModelStreamInferResponse:
        return self._refused(request.model_name, request.model_version, request.id, info)

    def _count_reply(self, reply: pb.ModelStreamInferResponse, started: float) -> None:
        """A stream's reply counts in its model's statistics (a model that is not served has none)."""
        model = self._find(reply.infer_response.model_name, reply.infer_response.model_version)
        if model is not None:
            model.stats.record(not reply.error_message, started)

    def _stream_reply(self, event: _Event, outcomes: Outcomes) -> pb.ModelStreamInferResponse:
        response = pb.ModelStreamInferResponse()
        answer = self._answer(event, outcomes, response.infer_response)  # in place: cheaper than a copy
        if isinstance(answer, ErrorInfo):
            d = event.model.description
            return self._refused(d.name, d.version, event.request_id, answer)
        return response

    def _refused(self, name: str, version: str, request_id: str, info: ErrorInfo) -> pb.ModelStreamInferResponse:
        return pb.ModelStreamInferResponse(
            error_message=info.message,
            infer_response=pb.ModelInferResponse(model_name=name, model_version=version, id=request_id),
        )

    async def _ended(self, core: CoreAPI, event: _Event, tenant: str, reply: pb.ModelStreamInferResponse) -> None:
        if not reply.error_message:
            await self._end_session(core, event, tenant)


def _flag(params: Any, name: str) -> bool:
    if name not in params:
        return False
    p = params[name]
    which = p.WhichOneof("parameter_choice")
    if which == "bool_param":
        return p.bool_param
    if which is None:
        return False
    raise _RefusedError(Reasons.parameter_type(name, "a bool parameter"))


def _unimplemented(method: str, served: list[str], streaming: bool) -> Callable[..., Any]:
    info = Reasons.rpc_unimplemented(method, served)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _abort(context, info)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await _abort(context, info)
        yield  # never reached: makes this an async generator, as grpc expects of a streaming handler

    return stream if streaming else unary


def add_oip_servicer_to_server(servicer: OipServicer, server: grpc.aio.Server) -> None:
    """Register every rpc of Triton's service under its Triton name: the ones ``OipServicer`` has,
    and the rest answering UNIMPLEMENTED with what is served instead."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    served = [m.name for m in service.methods if hasattr(servicer, m.name)]

    def behaviour(method: MethodDescriptor) -> Callable[..., Any]:
        return getattr(servicer, method.name, None) or _unimplemented(method.name, served, method.server_streaming)

    add_service(server, service, behaviour, name=OIP_SERVICE_NAME)
