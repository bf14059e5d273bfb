"""What the event-log front end needs of a log: a source of event messages, a sink for forecasts.

A log (Redis Streams, NATS JetStream) is reached by URL (``aaren.server.frontends.eventlog.urls``).
A ``LogSource`` hands out messages and takes acknowledgements; a ``LogSink`` publishes forecasts and
dead letters, each at most once per ``dedup_id`` (docs/architecture.md section 3, "From an event
log": why that, with the seq rule and the one-unpublished-event-per-session order of the consumer,
is exactly once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

__all__ = [
    "JSON",
    "PROTOBUF",
    "DeadLetter",
    "LogMessage",
    "LogSink",
    "LogSource",
    "LogUnavailableError",
    "Publication",
    "SourceStats",
]

#: The two message encodings (a ``content-type`` field or header says which; JSON when absent).
JSON = "application/json"
PROTOBUF = "application/x-protobuf"


class LogUnavailableError(Exception):
    """The log does not answer (connection refused, timed out): the consumer waits and tries again."""


@dataclasses.dataclass(slots=True, eq=False)
class LogMessage:
    """One entry read from a source.

    ``id``: the source's id of it (a Redis entry id, a JetStream stream sequence), unique in its
    source; ``body``: the event (``content_type`` says how it is encoded); ``model``: the model named
    beside the body (a field or header; "" when none: JSON may name it inside); ``deliveries``: how
    many times the source handed it out (1 the first time); ``handle``: what the source needs to
    acknowledge it."""

    id: str
    body: bytes
    content_type: str = JSON
    model: str = ""
    deliveries: int = 1
    handle: object = None


@dataclasses.dataclass(frozen=True, slots=True)
class Publication:
    """One forecast to publish. ``dedup_id``: ``model/session_id/seq``, the same for every attempt;
    ``seq``: the event's seq (a sink may guard on a session's published seq: it only grows)."""

    dedup_id: str
    model: str
    session_id: str
    seq: int
    body: bytes
    content_type: str
    source_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message the consumer will not apply: the message as it came, and why (a catalogue reason)."""

    message: LogMessage
    code: int
    reason: str
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class SourceStats:
    """``lag``: entries not yet handed to this consumer; ``pending``: handed out, not acknowledged."""

    lag: int
    pending: int


class LogSource(Protocol):
    """Where events come from. ``label``: its name in metrics (no host, no password)."""

    label: str

    async def open(self) -> None:
        """Connect; create the consumer group / durable consumer when it is missing. Raises
        ``LogUnavailableError`` while the log does not answer."""
        ...

    async def read(self, max_messages: int, wait_s: float) -> list[LogMessage]:
        """Up to ``max_messages`` messages in log order, waiting at most ``wait_s`` for the first.
        After ``open``, what this consumer was handed before and did not acknowledge comes first."""
        ...

    async def ack(self, messages: Sequence[LogMessage]) -> None:
        """The messages are done with: the source never hands them out again."""
        ...

    async def hold(self, messages: Sequence[LogMessage]) -> None:
        """The messages stay with this consumer for a later try (a seq gap that may close, a busy
        server): the source must not hand them to anyone else meanwhile."""
        ...

    async def stats(self) -> SourceStats: ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...


class LogSink(Protocol):
    """Where forecasts go. ``label``: its name in metrics."""

    label: str

    async def open(self) -> None: ...

    async def publish(self, items: Sequence[Publication]) -> int:
        """Publish in order, each at most once per ``dedup_id`` over every attempt; returns how many
        were new (a repeat is dropped by the sink's guard). Raises ``LogUnavailableError``."""
        ...

    async def dead_letter(self, items: Sequence[DeadLetter]) -> None:
        """Write to the dead-letter stream, each at most once per source message id."""
        ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...
