"""Columns and the core's results as plain values for the IPC frames (``aaren.server.ipc.framing``).

Requests and outcomes travel packed: the requests a front end submitted during one turn of its
event loop go as one frame whose events are concatenated columns, and the outcomes a batch settled
for one front end go back as one frame of concatenated columns, so the per-event cost is a few
array slices, not an object per event.

An array travels as ``[dtype, shape, bytes]`` (numpy's dtype string, e.g. ``"<f8"``; object arrays
are refused) and comes back as a read-only view of the frame's bytes. An ``ErrorInfo`` travels as
``[code, reason, message, retry_after_s]``; a frozen dataclass of plain fields
(``ModelDescription``, ``SessionView``) as a map of its fields; a ``SampledFuture`` as a map with
its output columns as arrays. Output columns are a flat ``name -> [F, ...]`` map: packing needs no
knowledge of tasks.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from aaren.server.contract.columns import (
    CoreRequest,
    EventColumns,
    ModelDescription,
    Outcomes,
    OutputColumns,
    SampledFuture,
    SessionView,
    StepSummary,
)
from aaren.server.contract.errors import Code, ErrorInfo

__all__ = [
    "array_of",
    "error_of",
    "future_of",
    "group_by_signature",
    "pack_array",
    "pack_dataclass",
    "pack_error",
    "pack_future",
    "pack_outcomes",
    "pack_requests",
    "unpack_dataclass",
    "unpack_outcomes",
    "unpack_requests",
]

D = TypeVar("D")
PackedArray = list[Any]  # [dtype str, shape list[int], bytes]


# ---------------------------------------------------------------------- plain values


def pack_array(a: np.ndarray) -> PackedArray:
    if a.dtype.hasobject:
        raise TypeError(f"an array of dtype {a.dtype} cannot cross the IPC")
    return [a.dtype.str, list(a.shape), np.ascontiguousarray(a).tobytes()]


def array_of(packed: PackedArray) -> np.ndarray:
    """The array back, read-only (a view of the frame's bytes)."""
    dtype, shape, data = packed
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)


def pack_error(error: ErrorInfo | None) -> list[Any] | None:
    return None if error is None else [int(error.code), error.reason, error.message, error.retry_after_s]


def error_of(packed: list[Any] | None) -> ErrorInfo | None:
    return None if packed is None else ErrorInfo(Code(packed[0]), packed[1], packed[2], packed[3])


def _errors(packed: dict[int, list[Any]]) -> dict[int, ErrorInfo]:
    if not packed:  # most requests: a call less per request
        return {}
    return {int(i): ErrorInfo(Code(e[0]), e[1], e[2], e[3]) for i, e in packed.items()}


def _pack_errors(errors: dict[int, ErrorInfo]) -> dict[int, list[Any]]:
    if not errors:
        return {}
    return {i: [int(e.code), e.reason, e.message, e.retry_after_s] for i, e in errors.items()}


def pack_dataclass(value: Any) -> dict[str, Any]:
    """A dataclass of plain fields (str, numbers, bytes, None, tuples of those) as a map."""
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def unpack_dataclass(cls: type[D], packed: dict[str, Any]) -> D:
    """``pack_dataclass``'s map back as ``cls`` (lists back to tuples where ``cls`` says tuple)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in packed:
            continue  # an older peer's: the field's default
        value = packed[f.name]
        if isinstance(value, list) and typing.get_origin(hints[f.name]) is tuple:
            value = tuple(value)
        values[f.name] = value
    return cls(**values)


def pack_future(future: SampledFuture) -> dict[str, Any]:
    return {
        "session_id": future.session_id,
        "seq": future.seq,
        "last_time": future.last_time,
        "outputs": {name: pack_array(column) for name, column in future.outputs.to_columns().items()},
        "top_k": future.top_k,
        "steps": [[s.step, s.mean_time, s.time_quantiles, s.marks] for s in future.steps],
        "times": future.times,
        "marks": future.marks,
        "values": future.values,
    }


def future_of(packed: dict[str, Any], outputs: type[OutputColumns]) -> SampledFuture:
    """``pack_future``'s map back, its outputs as ``outputs`` (the output class of the model's task)."""
    steps = packed["steps"]
    return SampledFuture(
        packed["session_id"],
        packed["seq"],
        packed["last_time"],
        outputs.from_columns({name: array_of(column) for name, column in packed["outputs"].items()}),
        packed["top_k"],
        [StepSummary(step, mean, quantiles, [(m, p) for m, p in marks]) for step, mean, quantiles, marks in steps],
        packed["times"],
        packed["marks"],
        packed["values"],
    )


#: How the result of each unary call crosses: (pack, unpack); absent: as it is (int, None).
RESULTS: dict[str, tuple[Any, Any]] = {
    "forecast": (pack_future, None),  # unpacked with the model's output class: future_of
    "get_session": (pack_dataclass, lambda packed: unpack_dataclass(SessionView, packed)),
    "open_stream": (pack_error, error_of),
}


def pack_descriptions(descriptions: typing.Iterable[ModelDescription]) -> list[dict[str, Any]]:
    return [pack_dataclass(d) for d in descriptions]


def descriptions_of(packed: list[dict[str, Any]]) -> tuple[ModelDescription, ...]:
    return tuple(unpack_dataclass(ModelDescription, d) for d in packed)


# ---------------------------------------------------------------------- requests


def pack_requests(items: list[tuple[int, CoreRequest]]) -> dict[str, Any]:
    """Requests (with their ids) as one set of concatenated columns (all of one value width)."""
    requests = [r for _, r in items]
    events = [r.events for r in requests]
    return {
        "ids": [i for i, _ in items],
        "n": [r.n for r in requests],
        "m": [len(r.index) for r in requests],
        "meta": [[r.top_k, r.last_only, r.tenant, r.model] for r in requests],
        "errors": [_pack_errors(r.errors) for r in requests],
        "index": pack_array(np.concatenate([r.index for r in requests])),
        "session_ids": [s for e in events for s in e.session_ids],
        "seq": pack_array(np.concatenate([e.seq for e in events])),
        "time": pack_array(np.concatenate([e.time for e in events])),
        "mark": pack_array(np.concatenate([e.mark for e in events])),
        "values": pack_array(np.concatenate([e.values for e in events])),
    }


def unpack_requests(packed: dict[str, Any]) -> list[tuple[int, CoreRequest]]:
    out = []
    at = 0
    ids, sids = packed["ids"], packed["session_ids"]
    index, seq, time, mark, values = (array_of(packed[k]) for k in ("index", "seq", "time", "mark", "values"))
    for k, (n, m, (top_k, last_only, tenant, model), errors) in enumerate(
        zip(packed["n"], packed["m"], packed["meta"], packed["errors"], strict=True)
    ):
        end = at + m
        events = EventColumns(sids[at:end], seq[at:end], time[at:end], mark[at:end], values[at:end])
        out.append((ids[k], CoreRequest(n, index[at:end], events, _errors(errors), top_k, last_only, tenant, model)))
        at = end
    return out


# ---------------------------------------------------------------------- outcomes


def output_signature(outcomes: Outcomes) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The names and trailing shapes of ``outcomes``' output columns: outcomes of one signature (one
    model's, or none) concatenate into one set of columns."""
    if outcomes.outputs is None:
        return ()
    return tuple((name, column.shape[1:]) for name, column in outcomes.outputs.to_columns().items())


def group_by_signature(items: list[tuple[int, Outcomes]]) -> list[list[tuple[int, Outcomes]]]:
    """``items`` in groups that ``pack_outcomes`` can pack together (outcomes without outputs go with
    the first group), each in the order given."""
    groups: dict[tuple[Any, ...], list[tuple[int, Outcomes]]] = {}
    bare: list[tuple[int, Outcomes]] = []
    for item in items:
        if item[1].outputs is not None:
            groups.setdefault(output_signature(item[1]), []).append(item)
        else:
            bare.append(item)
    out = list(groups.values())
    if not out:
        return [bare] if bare else []
    out[0] = bare + out[0]
    return out


def pack_outcomes(items: list[tuple[int, Outcomes]]) -> dict[str, Any]:
    """Outcomes (with their request ids) as one set of concatenated columns; every outcome with
    outputs must have the same ``output_signature`` (``group_by_signature``)."""
    outcomes = [o for _, o in items]
    with_outputs = [o.outputs.to_columns() for o in outcomes if o.outputs is not None]
    names = list(with_outputs[0]) if with_outputs else []
    return {
        "ids": [i for i, _ in items],
        "n": [len(o.kind) for o in outcomes],
        "f": [len(o.forecast_index) for o in outcomes],
        "errors": [_pack_errors(o.errors) for o in outcomes],
        "request_errors": [pack_error(o.request_error) for o in outcomes],
        "kind": pack_array(np.concatenate([o.kind for o in outcomes])),
        "last_seq": pack_array(np.concatenate([o.last_seq for o in outcomes])),
        "forecast_index": pack_array(np.concatenate([o.forecast_index for o in outcomes])),
        "outputs": {k: pack_array(np.concatenate([o[k] for o in with_outputs])) for k in names},
    }


def unpack_outcomes(
    packed: dict[str, Any], outputs_of: Callable[[int], type[OutputColumns] | None]
) -> list[tuple[int, Outcomes]]:
    """``pack_outcomes``' map back; the outputs of request id ``i`` as ``outputs_of(i)`` (the output
    class of its model's task)."""
    out = []
    at = fat = 0
    outputs = {name: array_of(raw) for name, raw in packed["outputs"].items()}
    kind, last_seq, forecast_index = (array_of(packed[k]) for k in ("kind", "last_seq", "forecast_index"))
    for k, (n, f, errors, request_error) in enumerate(
        zip(packed["n"], packed["f"], packed["errors"], packed["request_errors"], strict=True)
    ):
        end, fend = at + n, fat + f
        typed = None
        if f:
            cls = outputs_of(packed["ids"][k])
            if cls is None:
                raise ValueError(f"forecasts came back for request {packed['ids'][k]}, whose model has no outputs")
            typed = cls.from_columns({name: v[fat:fend] for name, v in outputs.items()})
        outcome = Outcomes(
            kind[at:end], last_seq[at:end], _errors(errors), forecast_index[fat:fend], typed, error_of(request_error)
        )
        out.append((packed["ids"][k], outcome))
        at, fat = end, fend
    return out
