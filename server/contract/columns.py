"""What crosses between the front ends and the engine core: columnar batches (arrays, never one
object per event), the served model's description and the unary calls' results.

A front end turns one request (a stream message) into a ``CoreRequest``: the events that passed
the checks that need no state, as columns, plus the refusals of the others. The engine core
answers it with ``Outcomes``: one kind and seq per event, and the task's output columns for the
events that got a forecast. Both are plain data (numpy arrays, str lists, ``ErrorInfo``), so they
cross a process boundary as they are. Nothing here imports torch: front-end processes never do.

A task's outputs are typed (``OutputColumns``: one dataclass of arrays per task, e.g.
``aaren.server.tasks.event.outputs.EventOutputs``) from the task that makes them to the encoder
that reads them: ``Outcomes.outputs`` and ``SampledFuture.outputs`` hold them as they are. Only
the IPC turns them into plain columns (``Columns``, name -> ``[F, ...]``: ``to_columns()``, packed
without knowing any task) and back (``from_columns``, with the output class of the model's task);
no copy either way.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable
from typing import Self

import numpy as np

from aaren.formats.models import ModelFacts
from aaren.server.contract.errors import ErrorInfo

__all__ = [
    "ACK",
    "DUPLICATE",
    "ERROR",
    "FORECAST",
    "NEXT_SEQ",
    "Columns",
    "CoreRequest",
    "EventColumns",
    "ModelDescription",
    "Outcomes",
    "OutputColumns",
    "SampledFuture",
    "SessionView",
    "StepSummary",
]

#: Outcome kinds, one per event (``Outcomes.kind``).
FORECAST, ACK, DUPLICATE, ERROR = 0, 1, 2, 3
#: Seqs above this are clipped to it in the columns: no session gets there, so they stay gaps.
MAX_SEQ = 2**62
#: An event's seq meaning "the session's next one" (its last applied seq + 1, resolved by the engine
#: core, which alone knows it): for protocols without seqs (OIP). Such an event continues a session
#: and never starts one: for a session without state it is refused like any seq > 1.
NEXT_SEQ = 0


#: A task's outputs as they travel: column name -> ``[F, ...]`` over F forecasts.
Columns = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class OutputColumns:
    """The base of a task's typed outputs: a dataclass whose fields are all ``[F, ...]`` arrays over
    the same F forecasts (a subclass declares them, with their shapes in its docstring)."""

    def to_columns(self) -> Columns:
        """The fields as plain columns (the arrays themselves, not copies)."""
        return {name: getattr(self, name) for name in _field_names(type(self))}

    @classmethod
    def from_columns(cls, columns: Columns) -> Self:
        """The typed outputs of ``to_columns()``'s columns (say which one is missing or extra)."""
        names = _field_names(cls)
        if columns.keys() != set(names):
            raise ValueError(f"{cls.__name__} has the columns {list(names)}; got {sorted(columns)}")
        return cls(**columns)

    def take(self, index: np.ndarray | slice) -> Self:
        """The forecasts at ``index`` (rows of every field): a copy of the columns at those rows, or views
        of them for a slice. Built without the frozen ``__init__`` (a setattr a field): the core takes a
        request's rows from its batch's outputs once per request."""
        cls = type(self)
        columns = self.__dict__
        out = object.__new__(cls)
        out.__dict__.update({name: columns[name][index] for name in _field_names(cls)})
        return out

    @classmethod
    def concat(cls, parts: list[Self]) -> Self:
        """``parts``' forecasts one after another."""
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in _field_names(cls)))


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    """A typed outputs class's column names, in field order (read once per class: every reply reads them)."""
    return tuple(f.name for f in dataclasses.fields(cls))


@dataclasses.dataclass(slots=True)
class EventColumns:
    """``m`` events: ``session_ids [m]`` as sent, ``seq [m]`` int64, ``time [m]`` float64, ``mark [m]``
    int64, ``values [m, V]`` float32."""

    session_ids: list[str]
    seq: np.ndarray
    time: np.ndarray
    mark: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.session_ids)

    @classmethod
    def empty(cls, value_width: int) -> EventColumns:
        return cls(
            [], np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), np.zeros((0, value_width), np.float32)
        )


@dataclasses.dataclass(slots=True)
class CoreRequest:
    """One request of ``n`` events for the engine core.

    ``index [m]`` (increasing) says where the valid ``events`` sit among the request's ``n``;
    ``errors`` holds the refusals of the others by position. ``last_only``: forecast only the last
    applied event of each session in the request (ack the others). ``tenant`` scopes the session ids.
    """

    n: int
    index: np.ndarray
    events: EventColumns
    errors: dict[int, ErrorInfo]
    top_k: int = 0
    last_only: bool = False
    tenant: str = ""
    #: The model the request is for ("": the default model).
    model: str = ""
    #: Awaited before the states of the request's events are stored, once per batch that holds some
    #: of them, with their positions in the request ``[m']`` and their outcomes as they will be once
    #: stored (``Outcomes`` of those ``m'`` events). Raising stores none of those sessions: their events
    #: are answered ``publish_failed``. The event-log consumer publishes its forecasts here, so a
    #: stored state's forecasts are always out (docs/architecture.md section 3); in the engine
    #: core's process only (it never crosses the IPC).
    before_store: Callable[[np.ndarray, Outcomes], Awaitable[None]] | None = None


@dataclasses.dataclass(slots=True)
class Outcomes:
    """The answer to a ``CoreRequest`` of ``n`` events.

    ``kind [n]`` (``FORECAST``, ``ACK``, ``DUPLICATE``, ``ERROR``); ``last_seq [n]`` the session's last
    applied seq for an ack or duplicate (else 0); ``errors`` by position for ``ERROR``;
    ``forecast_index [F]`` the positions with a forecast, increasing, and ``outputs`` the task's
    typed outputs for them (None when F is 0). ``request_error``: the whole request was refused
    before any event was considered (then ``kind`` is empty).
    """

    kind: np.ndarray
    last_seq: np.ndarray
    errors: dict[int, ErrorInfo]
    forecast_index: np.ndarray
    outputs: OutputColumns | None
    request_error: ErrorInfo | None = None

    @classmethod
    def refused(cls, error: ErrorInfo) -> Outcomes:
        return cls(np.zeros(0, np.int8), np.zeros(0, np.int64), {}, np.zeros(0, np.int64), None, error)

    @classmethod
    def all_errors(cls, n: int, errors: dict[int, ErrorInfo]) -> Outcomes:
        return cls(np.full(n, ERROR, np.int8), np.zeros(n, np.int64), errors, np.zeros(0, np.int64), None)


@dataclasses.dataclass(frozen=True)
class ModelDescription(ModelFacts):
    """What a front end needs to know of a served model (it crosses the IPC as plain data): the
    ``ModelFacts`` (among them what the checks of its events need: whether it takes missing values,
    how long a gap it fills) and the quantile levels its forecasts carry."""

    quantiles: tuple[float, ...] = ()

    @property
    def ranked(self) -> int:
        """How many entries a forecast ranks (its classes where it names any, else its marks): front
        ends cut a request's top_k."""
        return len(self.class_names) or self.num_marks


@dataclasses.dataclass(frozen=True)
class SessionView:
    """A session's stored state, described (times: unix seconds, but ``last_time``: the data's own)."""

    session_id: str
    last_seq: int
    last_time: float
    created_at: float
    updated_at: float
    model_version: str
    state: bytes | None
    state_bytes: int
    expires_at: float


@dataclasses.dataclass(frozen=True, slots=True)
class StepSummary:
    """What sampled futures say about future event ``step`` (1 = next): absolute times, mark frequencies."""

    step: int
    mean_time: float
    time_quantiles: list[float]
    marks: list[tuple[int, float]]


@dataclasses.dataclass(frozen=True)
class SampledFuture:
    """The exact next-event forecast (``outputs``: the task's typed outputs, one row), plus (horizon > 1)
    per-step summaries and sampled paths (absolute times ``[S][H]``, marks ``[S][H]``, values
    ``[S][H][V]``)."""

    session_id: str
    seq: int
    last_time: float
    outputs: OutputColumns
    top_k: int
    steps: list[StepSummary]
    times: list[list[float]]
    marks: list[list[int]]
    values: list[list[list[float]]]
