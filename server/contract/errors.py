"""Errors of the service, and the one catalogue of reasons: one constructor per reason.

Every refusal the service sends (for an event, a request, a stream or a unary call) is built
here, so a reason's code and wording live in one place. The codes are gRPC's status numbers,
but this module does not import gRPC: the engine core returns these, and each front end maps
them onto its protocol (``grpc.StatusCode`` and ``aaren.v1.ErrorCode`` use the same numbers).
"""

from __future__ import annotations

import dataclasses
from enum import IntEnum

__all__ = ["Code", "ConfigError", "ErrorInfo", "Reasons", "ServiceError"]


class ConfigError(ValueError):
    """The settings cannot work (a missing TLS file, plaintext on a public address...): the server
    does not start, and the message says what to set."""


class Code(IntEnum):
    """gRPC status codes used by this service (same numbers as ``grpc.StatusCode``)."""

    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


@dataclasses.dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why one event or request was refused. ``reason`` is one of the snake_case reasons in the proto."""

    code: Code
    reason: str
    message: str
    #: For RESOURCE_EXHAUSTED: seconds after which a retry may pass (0: no hint).
    retry_after_s: float = 0.0

    def exception(self) -> ServiceError:
        return ServiceError(self.code, self.reason, self.message, retry_after_s=self.retry_after_s)


class ServiceError(Exception):
    """An error of a unary call or a whole request; ``info`` says which (its code, reason, message)."""

    def __init__(self, code: Code, reason: str, message: str, *, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.info = ErrorInfo(code, reason, message, retry_after_s)


class Reasons:
    """One constructor per reason. Messages say what was wrong and what was expected."""

    # Stateless checks of one event (the front ends run them; docs/architecture.md section 3, "Validation").

    @staticmethod
    def session_id_empty() -> ErrorInfo:
        return ErrorInfo(Code.INVALID_ARGUMENT, "session_id_empty", "session_id is empty; expected 1 or more bytes")

    @staticmethod
    def session_id_too_long(n_bytes: int, limit: int) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT, "session_id_too_long", f"session_id is {n_bytes} bytes; expected at most {limit}"
        )

    @staticmethod
    def seq_zero(sid: str, seq: int) -> ErrorInfo:
        return ErrorInfo(Code.INVALID_ARGUMENT, "seq_zero", f"seq of session {sid!r} is {seq}; seqs start at 1")

    @staticmethod
    def time_not_finite(sid: str, seq: int, time: float) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "time_not_finite",
            f"time of session {sid!r} seq {seq} is {time}; expected a finite number",
        )

    @staticmethod
    def mark_out_of_range(sid: str, seq: int, mark: int, num_marks: int) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "mark_out_of_range",
            f"mark {mark} of session {sid!r} seq {seq} is out of range; expected 0..{num_marks - 1}",
        )

    @staticmethod
    def values_wrong_width(sid: str, seq: int, width: int, names: tuple[str, ...]) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "values_wrong_width",
            f"session {sid!r} seq {seq} has {width} values; expected {len(names)} ({', '.join(names)})",
        )

    @staticmethod
    def values_not_finite(sid: str, seq: int, index: int, name: str, value: float) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "values_not_finite",
            f"value {index} ({name}) of session {sid!r} seq {seq} is {value}; expected a finite number",
        )

    # Whole requests.

    @staticmethod
    def too_many_events(n: int, limit: int) -> ErrorInfo:
        return ErrorInfo(
            Code.RESOURCE_EXHAUSTED,
            "too_many_events",
            f"request has {n} events; expected at most {limit} (split it into several messages)",
        )

    @staticmethod
    def unknown_enum(field: str, value: int, known: list[int]) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            f"{field}_unknown",
            f"{field} {value} is not one this server knows; expected one of {known}. Nothing of this request "
            "was applied",
        )

    @staticmethod
    def over_limit(limit: str, message: str, retry_after_s: float) -> ErrorInfo:
        """A request refused by a limit (server_busy, tenant_pending_limit, tenant_rate_limited)."""
        return ErrorInfo(
            Code.RESOURCE_EXHAUSTED,
            limit,
            f"{message}; nothing of this request was accepted: retry in {retry_after_s:.3f} s",
            retry_after_s=retry_after_s,
        )

    @staticmethod
    def shutting_down() -> ErrorInfo:
        return ErrorInfo(Code.UNAVAILABLE, "shutting_down", "the server is shutting down; reconnect and resend")

    @staticmethod
    def core_unavailable() -> ErrorInfo:
        return ErrorInfo(
            Code.UNAVAILABLE,
            "core_unavailable",
            "the server's engine core is not running; whether unanswered events were applied is unknown: "
            "reconnect (to another replica) and resend from your last acknowledged seq",
        )

    @staticmethod
    def loading() -> ErrorInfo:
        return ErrorInfo(Code.UNAVAILABLE, "loading", "the model is still loading; retry shortly")

    @staticmethod
    def malformed_request(error: Exception) -> ErrorInfo:
        return ErrorInfo(Code.INVALID_ARGUMENT, "malformed_request", f"malformed request message: {error}")

    @staticmethod
    def malformed_message(message_id: str, detail: str) -> ErrorInfo:
        """A log message (``aaren consume``) that is not an event."""
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "malformed_message",
            f"log message {message_id} is not an event: {detail}; expected the fields of an aaren.v1 Event "
            "(session_id, seq, time, mark, values) as JSON, or the Event's protobuf bytes",
        )

    @staticmethod
    def publish_failed(sid: str, detail: str) -> ErrorInfo:
        """The event-log consumer could not publish a batch's forecasts: nothing was stored."""
        return ErrorInfo(
            Code.UNAVAILABLE,
            "publish_failed",
            f"the forecasts of session {sid!r} could not be published ({detail}); nothing was applied: resend",
        )

    @staticmethod
    def seq_gap_unfilled(gap: ErrorInfo, waited_s: float) -> ErrorInfo:
        """A log's seq gap that no later message filled within the consumer's wait."""
        return ErrorInfo(gap.code, gap.reason, f"{gap.message}; no message filled the gap within {waited_s:g} s")

    @staticmethod
    def internal() -> ErrorInfo:
        return ErrorInfo(Code.INTERNAL, "internal", "internal error; resend")

    @staticmethod
    def tenant_stream_limit(open_streams: int, limit: int) -> ErrorInfo:
        return ErrorInfo(
            Code.RESOURCE_EXHAUSTED,
            "tenant_stream_limit",
            f"your tenant has {open_streams} streams open, the most it may ({limit}); send more sessions per "
            "stream, or retry in 1 s",
            retry_after_s=1.0,
        )

    # Checks against the session's stored state (the engine core).

    @staticmethod
    def model_mismatch(sid: str, stored: str, served: str, *, event: bool = True) -> ErrorInfo:
        advice = ": end the session to start it again (or run the server with on_model_mismatch=reset)" if event else ""
        return ErrorInfo(
            Code.FAILED_PRECONDITION,
            "model_mismatch",
            f"session {sid!r} was built by model {stored!r}; this server runs {served!r}{advice}",
        )

    @staticmethod
    def session_missing(sid: str, seq: int, evicted: bool) -> ErrorInfo:
        """An event other than seq 1 for a session without state."""
        why = "evicted after being idle or for capacity" if evicted else "never started, or ended"
        return ErrorInfo(
            Code.NOT_FOUND,
            "session_evicted" if evicted else "session_not_found",
            f"session {sid!r} has no state ({why}), so seq {seq} cannot apply; start it again with seq 1",
        )

    @staticmethod
    def session_lookup_missing(sid: str, evicted: bool) -> ErrorInfo:
        """A unary call on a session without state."""
        why = "was evicted (idle past the TTL or for capacity)" if evicted else "does not exist"
        return ErrorInfo(
            Code.NOT_FOUND, "session_evicted" if evicted else "session_not_found", f"session {sid!r} {why}"
        )

    @staticmethod
    def tenant_session_limit(sid: str, limit: int) -> ErrorInfo:
        return ErrorInfo(
            Code.RESOURCE_EXHAUSTED,
            "tenant_session_limit",
            f"session {sid!r} cannot start: your tenant holds {limit} sessions, the most it may; end sessions you "
            "no longer need",
        )

    @staticmethod
    def seq_gap(sid: str, seq: int, last_seq: int) -> ErrorInfo:
        return ErrorInfo(
            Code.FAILED_PRECONDITION,
            "seq_gap",
            f"seq {seq} of session {sid!r} skips ahead: expected seq {last_seq + 1} (last applied seq is {last_seq})",
        )

    @staticmethod
    def time_before_last(sid: str, seq: int, time: float, last_time: float) -> ErrorInfo:
        return ErrorInfo(
            Code.FAILED_PRECONDITION,
            "time_before_last",
            f"time {time} of session {sid!r} seq {seq} is earlier than its previous event's time {last_time}; "
            f"expected a time >= {last_time}",
        )

    @staticmethod
    def time_off_step_grid(sid: str, seq: int, time: float, last_time: float, step: float) -> ErrorInfo:
        """A model of regular steps: ``time - last_time`` is not within 1 ms of a whole number >= 1 of steps."""
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "time_off_step_grid",
            f"time {time} of session {sid!r} seq {seq} is off the model's step grid: {time - last_time:g} s after "
            f"its previous event's time {last_time}; expected a whole number (at least 1) of steps of {step:g} s "
            f"after it, e.g. {last_time + step}",
        )

    @staticmethod
    def gap_too_long(sid: str, seq: int, time: float, last_time: float, missing: int, limit: int) -> ErrorInfo:
        """A model of regular steps: the event leaves ``missing`` steps empty, more than it fills."""
        return ErrorInfo(
            Code.FAILED_PRECONDITION,
            "gap_too_long",
            f"time {time} of session {sid!r} seq {seq} leaves a gap of {missing} missing steps after its previous "
            f"event's time {last_time}; the model fills at most {limit} (max_gap_steps): send the missing steps "
            "(NaN values are filled), or end the session and start it afresh",
        )

    @staticmethod
    def numeric_overflow(sid: str) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "numeric_overflow",
            f"the events of session {sid!r} overflow the model's float32 arithmetic (a time gap or a value too "
            "large, e.g. above 3.4e38); expected ordinary magnitudes. Nothing was applied",
        )

    @staticmethod
    def state_conflict(sid: str) -> ErrorInfo:
        return ErrorInfo(
            Code.ABORTED,
            "state_conflict",
            f"session {sid!r} changed while its events were applied (ended, evicted or written elsewhere); "
            "nothing was applied: resend from your last acknowledged seq",
        )

    @staticmethod
    def batch_aborted() -> ErrorInfo:
        return ErrorInfo(Code.ABORTED, "batch_aborted", "the batch holding this event failed; resend it")

    @staticmethod
    def store_unavailable(exc: BaseException, *, saving: bool = False) -> ErrorInfo:
        what = "session store unavailable, state not saved" if saving else "session store unavailable"
        return ErrorInfo(Code.UNAVAILABLE, "store_unavailable", f"{what}: {exc}")

    # Unary calls.

    @staticmethod
    def horizon_too_large(horizon: int, limit: int) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT, "horizon_too_large", f"horizon {horizon} is too large; expected at most {limit}"
        )

    @staticmethod
    def served_model_unknown(model: str, served: list[str]) -> ErrorInfo:
        """A request (aaren.v1) naming a model this server does not serve."""
        return ErrorInfo(
            Code.NOT_FOUND,
            "model_unknown",
            f"unknown model {model!r}; this server serves {', '.join(repr(m) for m in served)} "
            "(empty: the default model, the first)",
        )

    @staticmethod
    def sampling_unsupported(model: str, task: str) -> ErrorInfo:
        """A Forecast call asking a series or class model for sampled futures (horizon > 1)."""
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "sampling_unsupported",
            f"model {model!r} is a {task} model: its forecast already covers its horizon; sampled futures "
            "(horizon > 1) exist for event models only; expected horizon 0 or 1",
        )

    @staticmethod
    def num_samples_too_large(n: int, limit: int) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "num_samples_too_large",
            f"num_samples {n} is too large; expected at most {limit}",
        )

    # The Open Inference Protocol front end (frontends/oip); Triton's wording where Triton has one.

    @staticmethod
    def sequence_id_missing(model: str) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "sequence_id_missing",
            f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID (the "
            "sequence_id parameter, an int64 or a string): every request of this model belongs to a sequence",
        )

    @staticmethod
    def sequence_not_started(sequence_id: str, model: str, evicted: bool) -> ErrorInfo:
        """A request without START for a sequence without state (never started, ended, or evicted)."""
        why = " (it was evicted after being idle or for capacity)" if evicted else ""
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "session_evicted" if evicted else "session_not_found",
            f"inference request for sequence {sequence_id} to model '{model}' must specify the START flag on the "
            f"first request of the sequence{why}",
        )

    @staticmethod
    def model_unknown(model: str, version: str) -> ErrorInfo:
        shown = f"'{model}' version {version}" if version else f"'{model}'"
        return ErrorInfo(Code.NOT_FOUND, "model_unknown", f"Request for unknown model: {shown} is not found")

    @staticmethod
    def input_missing(name: str, model: str, expected: list[str]) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "input_missing",
            f"expected inputs {expected} for model '{model}'; input '{name}' is missing",
        )

    @staticmethod
    def input_unknown(name: str, model: str, expected: list[str]) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "input_unknown",
            f"unexpected inference input '{name}' for model '{model}'; expected inputs {expected}",
        )

    @staticmethod
    def input_datatype(name: str, datatype: str, model: str, expected: list[str]) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "input_datatype",
            f"inference input '{name}' data-type is '{datatype}', but model '{model}' expects "
            + " or ".join(f"'{d}'" for d in expected),
        )

    @staticmethod
    def input_shape(name: str, shape: list[int], model: str, expected: list[int]) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "input_shape",
            f"unexpected shape for input '{name}' for model '{model}'. Expected {expected}, got {shape}",
        )

    @staticmethod
    def input_size(name: str, got: int, expected: int) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "input_size",
            f"input '{name}' has {got} bytes of data (raw_input_contents or typed contents); its datatype and "
            f"shape need {expected}",
        )

    @staticmethod
    def output_unknown(name: str, model: str, known: list[str]) -> ErrorInfo:
        return ErrorInfo(
            Code.INVALID_ARGUMENT,
            "output_unknown",
            f"unexpected inference output '{name}' for model '{model}'; it has outputs {known}",
        )

    @staticmethod
    def parameter_type(name: str, expected: str) -> ErrorInfo:
        return ErrorInfo(Code.INVALID_ARGUMENT, "parameter_type", f"parameter '{name}' must be {expected}")

    @staticmethod
    def rpc_unimplemented(method: str, served: list[str]) -> ErrorInfo:
        return ErrorInfo(
            Code.UNIMPLEMENTED,
            "rpc_unimplemented",
            f"aaren does not implement {method} of inference.GRPCInferenceService (it loads no models at run time, "
            f"has no shared memory, tracing or log settings); it serves {', '.join(served)}",
        )
