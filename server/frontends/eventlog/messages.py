"""Log messages <-> aaren.v1 messages: an event in, a forecast out, in JSON or protobuf.

An event message holds the fields of an aaren.v1 ``Event`` and the model it is for:

- JSON (``application/json``, the default): ``{"session_id": "N123", "seq": 7, "time": 1.7e9,
  "mark": 2, "values": [0.5, -1.0], "model": "flights"}``; ``mark``, ``values`` and ``model`` may be
  left out (0, none, the default model); numbers may come as strings (as protobuf's JSON mapping
  writes 64-bit integers, and as Redis stream fields always are); a missing value is ``NaN`` or
  ``null`` (for a model that takes missing values: a series' gap cells);
- protobuf (``application/x-protobuf``): the ``Event`` message's bytes; the model beside it (a
  ``model`` field or header), as ``Event`` has no model field.

A forecast message is the ``Forecast`` (JSON: protobuf's JSON mapping with the proto's field names,
``seq`` a number) and the id of the event message it answers (``source_id``: a JSON field, a field
or header beside protobuf bytes).
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from aaren.server.contract.errors import ErrorInfo, Reasons
from aaren.server.frontends.eventlog.base import JSON, PROTOBUF, LogMessage
from aaren.v1 import aaren_pb2 as pb

__all__ = ["decode_event", "decode_forecast", "encode_event", "encode_forecast"]

_EVENT_KEYS = frozenset({"session_id", "seq", "time", "mark", "values", "model"})


def decode_event(message: LogMessage) -> tuple[pb.Event, str] | ErrorInfo:
    """The event and its model ("" the default), or why the message is not one (``malformed_message``)."""
    try:
        if message.content_type == PROTOBUF:
            event = pb.Event()
            event.ParseFromString(message.body)
            return event, message.model
        if message.content_type != JSON:
            raise ValueError(f"content type {message.content_type!r}: expected {JSON!r} or {PROTOBUF!r}")
        fields = json.loads(message.body)
        if not isinstance(fields, dict):
            raise ValueError(f"expected a JSON object, got {type(fields).__name__}")
        return _event_of(fields), str(fields.get("model") or message.model)
    except (ValueError, TypeError, DecodeError, OverflowError) as exc:
        return Reasons.malformed_message(message.id, str(exc))


def _event_of(fields: dict[str, Any]) -> pb.Event:
    unknown = fields.keys() - _EVENT_KEYS
    if unknown:
        known = ", ".join(sorted(_EVENT_KEYS))
        raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))}; an event has {known}")
    for key in ("session_id", "seq", "time"):
        if key not in fields:
            raise ValueError(f"field {key!r} is missing")
    session_id = fields["session_id"]
    if not isinstance(session_id, str):
        raise ValueError(f"session_id must be a string, got {session_id!r}")
    values = fields.get("values", [])
    if isinstance(values, str):  # a Redis field: "[0.5, 1]" or "0.5,1"
        values = json.loads(values) if values.lstrip().startswith("[") else [v for v in values.split(",") if v.strip()]
    if not isinstance(values, list):
        raise ValueError(f"values must be a list of numbers, got {values!r}")
    return pb.Event(
        session_id=session_id,
        seq=_integer("seq", fields["seq"]),
        time=_number("time", fields["time"]),
        mark=_integer("mark", fields.get("mark", 0)),
        values=[_value(v) for v in values],
    )


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
    number = int(value) if not isinstance(value, float) or value.is_integer() else None
    if number is None or number < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
    return number


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) and not isinstance(value, str):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


def _value(value: object) -> float:
    """A value: a number, or NaN / ``null`` for a missing one (the model's checks decide whether it
    takes missing values: ``ModelDescription.missing_values``); +-inf is refused there too."""
    if value is None:
        return math.nan
    if isinstance(value, float) and math.isnan(value):
        return value
    return _number("values", value)


def encode_event(event: pb.Event, content_type: str, model: str = "") -> bytes:
    """An event message's body (the producer's side of ``decode_event``)."""
    if content_type == PROTOBUF:
        return event.SerializeToString()
    fields: dict[str, Any] = {
        "session_id": event.session_id,
        "seq": event.seq,
        "time": event.time,
        "mark": event.mark,
        "values": list(event.values),
    }
    if model:
        fields["model"] = model
    return json.dumps(fields, separators=(",", ":")).encode()


def encode_forecast(forecast: pb.Forecast, content_type: str, source_id: str) -> bytes:
    """A forecast message's body; protobuf bytes carry ``source_id`` beside them, not inside.

    JSON: the fields ``json_format.MessageToDict`` writes (the set ones, by their proto names), built
    from ``ListFields`` and written by orjson: protobuf's own JSON printer took half of the
    consumer's time (a profile of ``aaren consume`` on the flights); a number that is not finite is
    ``null``."""
    if content_type == PROTOBUF:
        return forecast.SerializeToString()
    fields = _fields(forecast)
    fields["source_id"] = source_id
    return orjson.dumps(fields)


def _fields(message: Message) -> dict[str, Any]:
    """A message's set fields, by name: nested messages as dicts, repeated ones as lists."""
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.message_type is None:
            out[field.name] = list(value) if _repeated(field) else value
        elif _repeated(field):
            out[field.name] = [_fields(v) for v in value]
        else:
            out[field.name] = _fields(value)
    return out


def _repeated(field: FieldDescriptor) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 6.31; ``label`` before it
    return bool(repeated) if repeated is not None else field.label == FieldDescriptor.LABEL_REPEATED


def decode_forecast(body: bytes, content_type: str) -> tuple[pb.Forecast, str]:
    """A forecast message -> the ``Forecast`` and, for JSON, the source id it names ("" otherwise)."""
    if content_type == PROTOBUF:
        forecast = pb.Forecast()
        forecast.ParseFromString(body)
        return forecast, ""
    fields = orjson.loads(body)
    source_id = str(fields.pop("source_id", ""))
    return json_format.ParseDict(_finite(fields), pb.Forecast()), source_id


def _finite(value: Any) -> Any:
    """``null`` numbers (what orjson writes for NaN and infinities) back as NaN."""
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
