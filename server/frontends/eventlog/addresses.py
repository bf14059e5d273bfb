"""Logs by URL, and which sessions a consumer owns.

    redis-stream://[user:password@]host:port/STREAM?group=G&consumer=C&db=N   (Redis Streams)
    nats://[user:password@]host:port/SUBJECT?stream=S&durable=D               (NATS JetStream)

``open_source``, ``open_sink``, ``open_writer`` and ``read_all`` pick the log's module by the URL's scheme; each
module reads its own parameters with ``LogAddress.take`` and refuses any it does not know
(``LogAddress.done``), so a misspelt parameter is an error, not a silent default.

``Member``: consumer ``index`` of ``count`` owns the sessions whose id hashes to it (CRC-32 of the
UTF-8 id, modulo ``count``); every member reads the whole log in a group of its own and
acknowledges the others' events unread, so one session's events are only ever applied by one
consumer, in log order (docs/architecture.md section 3, "From an event log").
"""

from __future__ import annotations

import dataclasses
import inspect
import zlib
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from aaren.server.contract.errors import ConfigError
from aaren.server.frontends.eventlog.base import LogSink, LogSource

__all__ = ["EventWriter", "LogAddress", "Member", "open_sink", "open_source", "open_writer", "read_all", "redact"]

T = TypeVar("T")

SCHEMES = {"redis-stream": "redis_streams", "nats": "nats_jetstream"}


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """Consumer ``index`` of ``count`` (``"i/n"`` on the command line)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not (self.count >= 1 and 0 <= self.index < self.count):
            raise ConfigError(f"consumer member {self.index}/{self.count}: expected i/n with 0 <= i < n")

    @classmethod
    def parse(cls, text: str) -> Member:
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise ConfigError(f"consumer member {text!r}: expected i/n, e.g. 0/1 or 1/3") from None
        return cls(index, count)

    def owns(self, session_id: str) -> bool:
        return self.count == 1 or zlib.crc32(session_id.encode()) % self.count == self.index

    def name(self, base: str) -> str:
        """A group or durable name of this member: ``base`` alone for a single consumer."""
        return base if self.count == 1 else f"{base}-{self.index}-of-{self.count}"


@dataclasses.dataclass(slots=True)
class LogAddress:
    """A parsed log URL: ``name`` the stream or subject; ``params`` its query, taken one by one."""

    url: str
    scheme: str
    host: str
    port: int
    name: str
    username: str | None
    password: str | None
    params: dict[str, str]

    @classmethod
    def parse(cls, url: str, default_port: int) -> LogAddress:
        parts = urlsplit(url)
        name = unquote(parts.path.lstrip("/"))
        if not parts.hostname or not name or "/" in name:
            raise ConfigError(
                f"log URL {redact(url)!r}: expected {parts.scheme or 'scheme'}://host:port/NAME[?parameters] "
                "with one stream or subject name"
            )
        try:
            port = parts.port or default_port
        except ValueError:
            raise ConfigError(f"log URL {redact(url)!r}: the port is not a number") from None
        params: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in params:
                raise ConfigError(f"log URL {redact(url)!r}: parameter {key!r} given twice")
            params[key] = value
        return cls(
            url,
            parts.scheme,
            parts.hostname,
            port,
            name,
            unquote(parts.username) if parts.username else None,
            unquote(parts.password) if parts.password else None,
            params,
        )

    def take(self, key: str, default: T, cast: Callable[[str], T] = str) -> T:  # type: ignore[assignment]
        """Parameter ``key`` (removed from ``params``), cast; ``default`` when absent."""
        if key not in self.params:
            return default
        raw = self.params.pop(key)
        try:
            return cast(raw)
        except ValueError:
            raise ConfigError(f"log URL {redact(self.url)!r}: parameter {key}={raw!r} is not valid") from None

    def done(self, known: str) -> None:
        """Refuse the parameters nobody took; ``known`` lists the ones this log reads."""
        if self.params:
            raise ConfigError(
                f"log URL {redact(self.url)!r}: unknown parameter(s) {', '.join(sorted(self.params))}; "
                f"{self.scheme} takes {known}"
            )

    @property
    def label(self) -> str:
        """The log's name in metrics and logs: scheme and name, never a host or a password."""
        return f"{self.scheme}:{self.name}"


class EventWriter:
    """Appends event messages to a log (``aaren produce``, tests, benchmarks); see the log modules."""

    async def write(self, bodies: list[bytes], content_type: str, model: str = "") -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


def _module(url: str):  # noqa: ANN202
    import importlib

    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise ConfigError(
            f"log URL {redact(url)!r}: unknown scheme {scheme!r}; expected one of "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    return importlib.import_module(f"aaren.server.frontends.eventlog.{SCHEMES[scheme]}")


def open_source(url: str, member: Member | None = None) -> LogSource:
    """The source at ``url`` (not connected yet: ``await source.open()``)."""
    return _module(url).SOURCE(url, member or Member())


def open_sink(url: str) -> LogSink:
    """The sink at ``url`` (not connected yet: ``await sink.open()``)."""
    return _module(url).SINK(url)


def open_writer(url: str) -> EventWriter:
    """An event writer for the log at ``url`` (connected lazily, on the first write)."""
    return _module(url).WRITER(url)


async def read_all(url: str) -> list[tuple[str, bytes, dict[str, str]]]:
    """Every entry of the log at ``url`` (a sink's forecasts, for ``aaren replay --from-sink``), in log
    order: ``(entry id, data, the other fields or headers)``. Raises ``LogUnavailableError``."""
    entries = _module(url).read_all(url)
    return await entries if inspect.isawaitable(entries) else entries  # a log module may read synchronously


def redact(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)
