from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ForecastMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FORECAST_MODE_UNSPECIFIED: _ClassVar[ForecastMode]
    FORECAST_MODE_EVERY_EVENT: _ClassVar[ForecastMode]
    FORECAST_MODE_LAST_PER_SESSION: _ClassVar[ForecastMode]

class ResponseLayout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESPONSE_LAYOUT_UNSPECIFIED: _ClassVar[ResponseLayout]
    RESPONSE_LAYOUT_ROWS: _ClassVar[ResponseLayout]
    RESPONSE_LAYOUT_COLUMNS: _ClassVar[ResponseLayout]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_CANCELLED: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_DEADLINE_EXCEEDED: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_ALREADY_EXISTS: _ClassVar[ErrorCode]
    ERROR_CODE_PERMISSION_DENIED: _ClassVar[ErrorCode]
    ERROR_CODE_RESOURCE_EXHAUSTED: _ClassVar[ErrorCode]
    ERROR_CODE_FAILED_PRECONDITION: _ClassVar[ErrorCode]
    ERROR_CODE_ABORTED: _ClassVar[ErrorCode]
    ERROR_CODE_OUT_OF_RANGE: _ClassVar[ErrorCode]
    ERROR_CODE_UNIMPLEMENTED: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL: _ClassVar[ErrorCode]
    ERROR_CODE_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_DATA_LOSS: _ClassVar[ErrorCode]
    ERROR_CODE_UNAUTHENTICATED: _ClassVar[ErrorCode]
FORECAST_MODE_UNSPECIFIED: ForecastMode
FORECAST_MODE_EVERY_EVENT: ForecastMode
FORECAST_MODE_LAST_PER_SESSION: ForecastMode
RESPONSE_LAYOUT_UNSPECIFIED: ResponseLayout
RESPONSE_LAYOUT_ROWS: ResponseLayout
RESPONSE_LAYOUT_COLUMNS: ResponseLayout
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_CANCELLED: ErrorCode
ERROR_CODE_UNKNOWN: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_DEADLINE_EXCEEDED: ErrorCode
ERROR_CODE_NOT_FOUND: ErrorCode
ERROR_CODE_ALREADY_EXISTS: ErrorCode
ERROR_CODE_PERMISSION_DENIED: ErrorCode
ERROR_CODE_RESOURCE_EXHAUSTED: ErrorCode
ERROR_CODE_FAILED_PRECONDITION: ErrorCode
ERROR_CODE_ABORTED: ErrorCode
ERROR_CODE_OUT_OF_RANGE: ErrorCode
ERROR_CODE_UNIMPLEMENTED: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_UNAVAILABLE: ErrorCode
ERROR_CODE_DATA_LOSS: ErrorCode
ERROR_CODE_UNAUTHENTICATED: ErrorCode

class Event(_message.Message):
    __slots__ = ("session_id", "seq", "time", "mark", "values")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq: int
    time: float
    mark: int
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, session_id: _Optional[str] = ..., seq: _Optional[int] = ..., time: _Optional[float] = ..., mark: _Optional[int] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("request_id", "events", "forecast_mode", "top_k", "layout", "model")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    FORECAST_MODE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    events: _containers.RepeatedCompositeFieldContainer[Event]
    forecast_mode: ForecastMode
    top_k: int
    layout: ResponseLayout
    model: str
    def __init__(self, request_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., forecast_mode: _Optional[_Union[ForecastMode, str]] = ..., top_k: _Optional[int] = ..., layout: _Optional[_Union[ResponseLayout, str]] = ..., model: _Optional[str] = ...) -> None: ...

class ForecastColumns(_message.Message):
    __slots__ = ("event_index", "session_id", "seq", "last_time", "mean_gap", "expected_time", "quantile_levels", "gap_quantiles", "top_k", "marks", "mark_probabilities", "value_means", "value_stds", "model", "horizon", "channels", "series_means", "series_quantiles", "series_filled_steps", "class_top_k", "classes", "class_probabilities", "class_names", "action_width", "actions", "returns_to_go")
    EVENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_FIELD_NUMBER: _ClassVar[int]
    MEAN_GAP_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_TIME_FIELD_NUMBER: _ClassVar[int]
    QUANTILE_LEVELS_FIELD_NUMBER: _ClassVar[int]
    GAP_QUANTILES_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MARKS_FIELD_NUMBER: _ClassVar[int]
    MARK_PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    VALUE_MEANS_FIELD_NUMBER: _ClassVar[int]
    VALUE_STDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    SERIES_MEANS_FIELD_NUMBER: _ClassVar[int]
    SERIES_QUANTILES_FIELD_NUMBER: _ClassVar[int]
    SERIES_FILLED_STEPS_FIELD_NUMBER: _ClassVar[int]
    CLASS_TOP_K_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    CLASS_PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAMES_FIELD_NUMBER: _ClassVar[int]
    ACTION_WIDTH_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    RETURNS_TO_GO_FIELD_NUMBER: _ClassVar[int]
    event_index: _containers.RepeatedScalarFieldContainer[int]
    session_id: _containers.RepeatedScalarFieldContainer[str]
    seq: _containers.RepeatedScalarFieldContainer[int]
    last_time: _containers.RepeatedScalarFieldContainer[float]
    mean_gap: _containers.RepeatedScalarFieldContainer[float]
    expected_time: _containers.RepeatedScalarFieldContainer[float]
    quantile_levels: _containers.RepeatedScalarFieldContainer[float]
    gap_quantiles: _containers.RepeatedScalarFieldContainer[float]
    top_k: int
    marks: _containers.RepeatedScalarFieldContainer[int]
    mark_probabilities: _containers.RepeatedScalarFieldContainer[float]
    value_means: _containers.RepeatedScalarFieldContainer[float]
    value_stds: _containers.RepeatedScalarFieldContainer[float]
    model: ModelRef
    horizon: int
    channels: int
    series_means: _containers.RepeatedScalarFieldContainer[float]
    series_quantiles: _containers.RepeatedScalarFieldContainer[float]
    series_filled_steps: _containers.RepeatedScalarFieldContainer[int]
    class_top_k: int
    classes: _containers.RepeatedScalarFieldContainer[int]
    class_probabilities: _containers.RepeatedScalarFieldContainer[float]
    class_names: _containers.RepeatedScalarFieldContainer[str]
    action_width: int
    actions: _containers.RepeatedScalarFieldContainer[float]
    returns_to_go: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, event_index: _Optional[_Iterable[int]] = ..., session_id: _Optional[_Iterable[str]] = ..., seq: _Optional[_Iterable[int]] = ..., last_time: _Optional[_Iterable[float]] = ..., mean_gap: _Optional[_Iterable[float]] = ..., expected_time: _Optional[_Iterable[float]] = ..., quantile_levels: _Optional[_Iterable[float]] = ..., gap_quantiles: _Optional[_Iterable[float]] = ..., top_k: _Optional[int] = ..., marks: _Optional[_Iterable[int]] = ..., mark_probabilities: _Optional[_Iterable[float]] = ..., value_means: _Optional[_Iterable[float]] = ..., value_stds: _Optional[_Iterable[float]] = ..., model: _Optional[_Union[ModelRef, _Mapping]] = ..., horizon: _Optional[int] = ..., channels: _Optional[int] = ..., series_means: _Optional[_Iterable[float]] = ..., series_quantiles: _Optional[_Iterable[float]] = ..., series_filled_steps: _Optional[_Iterable[int]] = ..., class_top_k: _Optional[int] = ..., classes: _Optional[_Iterable[int]] = ..., class_probabilities: _Optional[_Iterable[float]] = ..., class_names: _Optional[_Iterable[str]] = ..., action_width: _Optional[int] = ..., actions: _Optional[_Iterable[float]] = ..., returns_to_go: _Optional[_Iterable[float]] = ...) -> None: ...

class StreamResponse(_message.Message):
    __slots__ = ("request_id", "results", "request_error", "forecast_columns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ERROR_FIELD_NUMBER: _ClassVar[int]
    FORECAST_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    results: _containers.RepeatedCompositeFieldContainer[EventResult]
    request_error: EventError
    forecast_columns: ForecastColumns
    def __init__(self, request_id: _Optional[str] = ..., results: _Optional[_Iterable[_Union[EventResult, _Mapping]]] = ..., request_error: _Optional[_Union[EventError, _Mapping]] = ..., forecast_columns: _Optional[_Union[ForecastColumns, _Mapping]] = ...) -> None: ...

class EventResult(_message.Message):
    __slots__ = ("session_id", "seq", "duplicate", "forecast", "ack", "error")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq: int
    duplicate: bool
    forecast: Forecast
    ack: Ack
    error: EventError
    def __init__(self, session_id: _Optional[str] = ..., seq: _Optional[int] = ..., duplicate: bool = ..., forecast: _Optional[_Union[Forecast, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., error: _Optional[_Union[EventError, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("last_seq",)
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    last_seq: int
    def __init__(self, last_seq: _Optional[int] = ...) -> None: ...

class EventError(_message.Message):
    __slots__ = ("code", "reason", "message", "retry_after_ms")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    reason: str
    message: str
    retry_after_ms: int
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class ModelRef(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class Quantile(_message.Message):
    __slots__ = ("q", "value")
    Q_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    q: float
    value: float
    def __init__(self, q: _Optional[float] = ..., value: _Optional[float] = ...) -> None: ...

class TimeForecast(_message.Message):
    __slots__ = ("mean", "quantiles", "expected_time")
    MEAN_FIELD_NUMBER: _ClassVar[int]
    QUANTILES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_TIME_FIELD_NUMBER: _ClassVar[int]
    mean: float
    quantiles: _containers.RepeatedCompositeFieldContainer[Quantile]
    expected_time: float
    def __init__(self, mean: _Optional[float] = ..., quantiles: _Optional[_Iterable[_Union[Quantile, _Mapping]]] = ..., expected_time: _Optional[float] = ...) -> None: ...

class MarkProbability(_message.Message):
    __slots__ = ("mark", "probability")
    MARK_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    mark: int
    probability: float
    def __init__(self, mark: _Optional[int] = ..., probability: _Optional[float] = ...) -> None: ...

class ValueForecast(_message.Message):
    __slots__ = ("mean", "std")
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    mean: float
    std: float
    def __init__(self, mean: _Optional[float] = ..., std: _Optional[float] = ...) -> None: ...

class SeriesForecast(_message.Message):
    __slots__ = ("horizon", "channels", "means", "quantiles", "quantile_levels", "filled_steps")
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MEANS_FIELD_NUMBER: _ClassVar[int]
    QUANTILES_FIELD_NUMBER: _ClassVar[int]
    QUANTILE_LEVELS_FIELD_NUMBER: _ClassVar[int]
    FILLED_STEPS_FIELD_NUMBER: _ClassVar[int]
    horizon: int
    channels: int
    means: _containers.RepeatedScalarFieldContainer[float]
    quantiles: _containers.RepeatedScalarFieldContainer[float]
    quantile_levels: _containers.RepeatedScalarFieldContainer[float]
    filled_steps: int
    def __init__(self, horizon: _Optional[int] = ..., channels: _Optional[int] = ..., means: _Optional[_Iterable[float]] = ..., quantiles: _Optional[_Iterable[float]] = ..., quantile_levels: _Optional[_Iterable[float]] = ..., filled_steps: _Optional[int] = ...) -> None: ...

class ClassProbability(_message.Message):
    __slots__ = ("class_index", "class_name", "probability")
    CLASS_INDEX_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    class_index: int
    class_name: str
    probability: float
    def __init__(self, class_index: _Optional[int] = ..., class_name: _Optional[str] = ..., probability: _Optional[float] = ...) -> None: ...

class ClassForecast(_message.Message):
    __slots__ = ("classes",)
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedCompositeFieldContainer[ClassProbability]
    def __init__(self, classes: _Optional[_Iterable[_Union[ClassProbability, _Mapping]]] = ...) -> None: ...

class PolicyForecast(_message.Message):
    __slots__ = ("action", "return_to_go")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RETURN_TO_GO_FIELD_NUMBER: _ClassVar[int]
    action: _containers.RepeatedScalarFieldContainer[float]
    return_to_go: float
    def __init__(self, action: _Optional[_Iterable[float]] = ..., return_to_go: _Optional[float] = ...) -> None: ...

class Forecast(_message.Message):
    __slots__ = ("session_id", "seq", "last_time", "next_time", "marks", "values", "model", "series", "classes", "policy")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_FIELD_NUMBER: _ClassVar[int]
    NEXT_TIME_FIELD_NUMBER: _ClassVar[int]
    MARKS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq: int
    last_time: float
    next_time: TimeForecast
    marks: _containers.RepeatedCompositeFieldContainer[MarkProbability]
    values: _containers.RepeatedCompositeFieldContainer[ValueForecast]
    model: ModelRef
    series: SeriesForecast
    classes: ClassForecast
    policy: PolicyForecast
    def __init__(self, session_id: _Optional[str] = ..., seq: _Optional[int] = ..., last_time: _Optional[float] = ..., next_time: _Optional[_Union[TimeForecast, _Mapping]] = ..., marks: _Optional[_Iterable[_Union[MarkProbability, _Mapping]]] = ..., values: _Optional[_Iterable[_Union[ValueForecast, _Mapping]]] = ..., model: _Optional[_Union[ModelRef, _Mapping]] = ..., series: _Optional[_Union[SeriesForecast, _Mapping]] = ..., classes: _Optional[_Union[ClassForecast, _Mapping]] = ..., policy: _Optional[_Union[PolicyForecast, _Mapping]] = ...) -> None: ...

class ForecastRequest(_message.Message):
    __slots__ = ("session_id", "horizon", "num_samples", "seed", "top_k", "include_paths", "model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PATHS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    horizon: int
    num_samples: int
    seed: int
    top_k: int
    include_paths: bool
    model: str
    def __init__(self, session_id: _Optional[str] = ..., horizon: _Optional[int] = ..., num_samples: _Optional[int] = ..., seed: _Optional[int] = ..., top_k: _Optional[int] = ..., include_paths: bool = ..., model: _Optional[str] = ...) -> None: ...

class SampledEvent(_message.Message):
    __slots__ = ("time", "mark", "values")
    TIME_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    time: float
    mark: int
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, time: _Optional[float] = ..., mark: _Optional[int] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class SampledPath(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[SampledEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[SampledEvent, _Mapping]]] = ...) -> None: ...

class StepSummary(_message.Message):
    __slots__ = ("step", "mean_time", "time_quantiles", "marks")
    STEP_FIELD_NUMBER: _ClassVar[int]
    MEAN_TIME_FIELD_NUMBER: _ClassVar[int]
    TIME_QUANTILES_FIELD_NUMBER: _ClassVar[int]
    MARKS_FIELD_NUMBER: _ClassVar[int]
    step: int
    mean_time: float
    time_quantiles: _containers.RepeatedCompositeFieldContainer[Quantile]
    marks: _containers.RepeatedCompositeFieldContainer[MarkProbability]
    def __init__(self, step: _Optional[int] = ..., mean_time: _Optional[float] = ..., time_quantiles: _Optional[_Iterable[_Union[Quantile, _Mapping]]] = ..., marks: _Optional[_Iterable[_Union[MarkProbability, _Mapping]]] = ...) -> None: ...

class ForecastResponse(_message.Message):
    __slots__ = ("forecast", "steps", "paths")
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    forecast: Forecast
    steps: _containers.RepeatedCompositeFieldContainer[StepSummary]
    paths: _containers.RepeatedCompositeFieldContainer[SampledPath]
    def __init__(self, forecast: _Optional[_Union[Forecast, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[StepSummary, _Mapping]]] = ..., paths: _Optional[_Iterable[_Union[SampledPath, _Mapping]]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id", "include_state", "model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    include_state: bool
    model: str
    def __init__(self, session_id: _Optional[str] = ..., include_state: bool = ..., model: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session_id", "last_seq", "last_time", "n_events", "state_bytes", "state", "model", "created_at", "updated_at", "expires_at")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_FIELD_NUMBER: _ClassVar[int]
    N_EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    last_seq: int
    last_time: float
    n_events: int
    state_bytes: int
    state: bytes
    model: ModelRef
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    def __init__(self, session_id: _Optional[str] = ..., last_seq: _Optional[int] = ..., last_time: _Optional[float] = ..., n_events: _Optional[int] = ..., state_bytes: _Optional[int] = ..., state: _Optional[bytes] = ..., model: _Optional[_Union[ModelRef, _Mapping]] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class EndSessionRequest(_message.Message):
    __slots__ = ("session_id", "model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class EndSessionResponse(_message.Message):
    __slots__ = ("existed", "last_seq")
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    last_seq: int
    def __init__(self, existed: bool = ..., last_seq: _Optional[int] = ...) -> None: ...

class DescribeModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ServiceLimits(_message.Message):
    __slots__ = ("max_events_per_request", "max_session_id_bytes", "max_message_bytes", "max_horizon", "max_num_samples", "default_num_samples", "default_top_k", "idle_ttl_seconds")
    MAX_EVENTS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSION_ID_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_HORIZON_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TOP_K_FIELD_NUMBER: _ClassVar[int]
    IDLE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_events_per_request: int
    max_session_id_bytes: int
    max_message_bytes: int
    max_horizon: int
    max_num_samples: int
    default_num_samples: int
    default_top_k: int
    idle_ttl_seconds: float
    def __init__(self, max_events_per_request: _Optional[int] = ..., max_session_id_bytes: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_horizon: _Optional[int] = ..., max_num_samples: _Optional[int] = ..., default_num_samples: _Optional[int] = ..., default_top_k: _Optional[int] = ..., idle_ttl_seconds: _Optional[float] = ...) -> None: ...

class DescribeModelResponse(_message.Message):
    __slots__ = ("name", "version", "backbone", "d_model", "n_layers", "n_heads", "num_marks", "value_width", "state_bytes_per_session", "parameters", "mark_names", "value_names", "time_unit", "quantile_levels", "device", "limits", "task", "horizon", "step_seconds", "class_names", "served_models", "max_gap_steps", "missing_values", "action_width", "env", "target_return")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKBONE_FIELD_NUMBER: _ClassVar[int]
    D_MODEL_FIELD_NUMBER: _ClassVar[int]
    N_LAYERS_FIELD_NUMBER: _ClassVar[int]
    N_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_MARKS_FIELD_NUMBER: _ClassVar[int]
    VALUE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    MARK_NAMES_FIELD_NUMBER: _ClassVar[int]
    VALUE_NAMES_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIT_FIELD_NUMBER: _ClassVar[int]
    QUANTILE_LEVELS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAMES_FIELD_NUMBER: _ClassVar[int]
    SERVED_MODELS_FIELD_NUMBER: _ClassVar[int]
    MAX_GAP_STEPS_FIELD_NUMBER: _ClassVar[int]
    MISSING_VALUES_FIELD_NUMBER: _ClassVar[int]
    ACTION_WIDTH_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TARGET_RETURN_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    backbone: str
    d_model: int
    n_layers: int
    n_heads: int
    num_marks: int
    value_width: int
    state_bytes_per_session: int
    parameters: int
    mark_names: _containers.RepeatedScalarFieldContainer[str]
    value_names: _containers.RepeatedScalarFieldContainer[str]
    time_unit: str
    quantile_levels: _containers.RepeatedScalarFieldContainer[float]
    device: str
    limits: ServiceLimits
    task: str
    horizon: int
    step_seconds: float
    class_names: _containers.RepeatedScalarFieldContainer[str]
    served_models: _containers.RepeatedScalarFieldContainer[str]
    max_gap_steps: int
    missing_values: bool
    action_width: int
    env: str
    target_return: float
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., backbone: _Optional[str] = ..., d_model: _Optional[int] = ..., n_layers: _Optional[int] = ..., n_heads: _Optional[int] = ..., num_marks: _Optional[int] = ..., value_width: _Optional[int] = ..., state_bytes_per_session: _Optional[int] = ..., parameters: _Optional[int] = ..., mark_names: _Optional[_Iterable[str]] = ..., value_names: _Optional[_Iterable[str]] = ..., time_unit: _Optional[str] = ..., quantile_levels: _Optional[_Iterable[float]] = ..., device: _Optional[str] = ..., limits: _Optional[_Union[ServiceLimits, _Mapping]] = ..., task: _Optional[str] = ..., horizon: _Optional[int] = ..., step_seconds: _Optional[float] = ..., class_names: _Optional[_Iterable[str]] = ..., served_models: _Optional[_Iterable[str]] = ..., max_gap_steps: _Optional[int] = ..., missing_values: bool = ..., action_width: _Optional[int] = ..., env: _Optional[str] = ..., target_return: _Optional[float] = ...) -> None: ...
