"""NATS JetStream as a source of events and a sink of forecasts (nats-py asyncio).

Every URL is ``nats://[user:password@]host:port/SUBJECT?...`` with ``stream`` (default: the stream
that captures SUBJECT, else a new file-backed one named after it, ``events.in`` -> ``events_in``)
and ``connect_timeout_s`` (default 5: ``open`` gives up after it with ``LogUnavailableError``; once
connected the client reconnects forever, and a call made while it is disconnected raises
``LogUnavailableError`` at once).

Source: ``nats://host:port/SUBJECT?stream=S&durable=D&ack_wait_s=30&start=0&max_ack_pending=N``.
A durable pull consumer (``durable``, default ``aaren``; per member ``D-i-of-n``,
``addresses.Member``) on SUBJECT with explicit acks, created when missing to deliver from
``start`` (``0``: the whole stream, the default; ``$``: new messages only; an existing durable
keeps its start, and takes the URL's ``ack_wait_s`` and ``max_ack_pending``). ``max_ack_pending``:
how many messages may be handed out and not acknowledged (held ones too) before JetStream hands
out no more; default the server's (1000 on nats-server 2.9), -1 no limit. A message's id is its
stream sequence; its body the data; ``Content-Type`` and ``Aaren-Model`` headers say the encoding
and model (JSON and "" when absent). A message handed out and not acknowledged within
``ack_wait_s`` is handed out again (``deliveries`` counts), before new ones: JetStream has no
claim, so a dead predecessor's messages come back only after their ack wait. nats-server before
2.10.14 may hand one redelivery out twice, counting it 1 the second time (when a pull request
expires as it is delivered; nats-io/nats-server#5305): ``deliveries`` may under-count, and a
message may come again while it is pending. ``ack`` waits for the
server's answer to each ack (``ack_sync``): an ack that returned is recorded, and a clean restart
of the server keeps it; a crash of the server (SIGKILL) may lose the acks of its last moments, as
nats-server 2.9 writes consumer state lazily: those messages come again, and the consumer's seq
rule and the sink's dedup drop their repeats. ``hold`` sends "in progress" (``+WPI``) for each
message and waits for the answer: its ack wait starts again.

Sink: ``nats://host:port/SUBJECT?stream=S&dead_letter=SUBJ&duplicate_window_s=3600``. A forecast is
published to SUBJECT (the body; headers ``Nats-Msg-Id`` the dedup id, ``Content-Type``,
``Aaren-Source-Id``) and its PubAck awaited; JetStream drops a message whose ``Nats-Msg-Id`` it
stored within the stream's duplicate window, which is the sink's guard: a forecast published again
after a crash is dropped, provided it comes back within ``duplicate_window_s`` (default an hour).
A missing stream is created capturing SUBJECT and the dead-letter subject with that window; an
existing one is left as it is (a warning when its window is shorter). Dead letters go to
``dead_letter`` (default ``SUBJECT.dead``): the body, headers ``Content-Type``, ``Aaren-Model``,
``Aaren-Source-Id``, ``Aaren-Code``, ``Aaren-Reason``, ``Aaren-Error``, once per source message
(``Nats-Msg-Id: dead:<source id>``).

``read_all(url)``: every message on SUBJECT in its stream, in order (tools and tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from nats import errors as nats_errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, PubAck, StorageType, StreamConfig
from nats.js.errors import (
    APIError,
    BadRequestError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)

from aaren.server.contract.errors import ConfigError
from aaren.server.frontends.eventlog import base
from aaren.server.frontends.eventlog.addresses import EventWriter, LogAddress, Member

__all__ = [
    "SINK",
    "SOURCE",
    "WRITER",
    "NatsEventWriter",
    "NatsJetStreamSink",
    "NatsJetStreamSource",
    "read_all",
    "stream_name",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_PORT = 4222
SOLE = Member()
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_DUPLICATE_WINDOW_S = 3600.0
#: How long one JetStream request (a publish's PubAck, an ack's answer, an API call) may take.
REQUEST_TIMEOUT_S = 10.0
#: How often a call in flight looks whether the connection went down (then it fails at once).
_DOWN_POLL_S = 0.05
#: A header value is one line (NATS headers cannot hold CR or LF); an error text is cut to this.
MAX_HEADER_CHARS = 4096
# Errors of a server that is down, restarting or not yet ready: the caller waits and tries again.
# Any other error (a body over the server's max payload, a bad subject, a 4xx of the JetStream
# API) is raised as it is: trying again would not help.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,  # TimeoutError and the connection errors among them
    nats_errors.TimeoutError,
    nats_errors.NoRespondersError,
    nats_errors.StaleConnectionError,
    nats_errors.OutboundBufferLimitError,
    nats_errors.ConnectionClosedError,
    nats_errors.ConnectionReconnectingError,
    nats_errors.ConnectionDrainingError,
    nats_errors.NoServersError,
    NoStreamResponseError,  # no stream answers the subject: JetStream is still recovering it
    ServiceUnavailableError,  # 503: JetStream not ready (a 500 is not: 2.9 answers a bad update so)
)
_SOURCE_ONLY = ("durable", "ack_wait_s", "start", "max_ack_pending")
_SINK_ONLY = ("dead_letter", "duplicate_window_s")
_STREAM_NAME_IN_USE = 10058  # JetStream's err_code: a stream of that name exists, differently configured


def stream_name(subject: str) -> str:
    """The default stream of ``subject``: its dots, wildcards and other characters a stream name
    may not hold made ``_`` (``events.in`` -> ``events_in``)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", subject)


def _unavailable(label: str, exc: BaseException) -> BaseException:
    """``exc`` as ``LogUnavailableError`` when it says the server is unavailable; else ``exc`` itself."""
    if isinstance(exc, _UNAVAILABLE):
        return base.LogUnavailableError(f"{label}: {type(exc).__name__}: {exc}")
    return exc


def _header(value: object) -> str:
    return " ".join(str(value).splitlines())[:MAX_HEADER_CHARS]


def _headers(msg: Msg) -> dict[str, str]:
    """``msg``'s headers by lower-case name (a producer may spell ``content-type`` any way)."""
    return {key.lower(): value for key, value in (msg.headers or {}).items()}


class _Link:
    """One connection to the NATS server of an address, and the stream a module uses on it."""

    def __init__(self, address: LogAddress) -> None:
        self.address = address
        self.subject = address.name
        self.stream_param: str | None = address.take("stream", None)
        self.connect_timeout_s = address.take("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S, float)
        if self.connect_timeout_s <= 0:
            raise ConfigError(f"nats: connect_timeout_s={self.connect_timeout_s:g}; expected a positive number")
        self.label = address.label
        self.stream = self.stream_param or stream_name(self.subject)
        self.nc: NatsClient | None = None
        self.js: JetStreamContext | None = None

    async def connect(self) -> JetStreamContext:
        """Connected (a no-op when already): within ``connect_timeout_s`` or ``LogUnavailableError``;
        an authorization failure is a ``ConfigError`` (trying again will not help)."""
        if self.nc is not None and not self.nc.is_closed:
            assert self.js is not None
            return self.js
        label, host, port = self.label, self.address.host, self.address.port
        last_error: list[BaseException] = []
        refused: list[BaseException] = []  # an attempt the server answered "Authorization Violation"

        async def error_cb(exc: Exception) -> None:
            last_error[:] = [exc]
            if isinstance(exc, nats_errors.AuthorizationError) or "authorization violation" in str(exc).lower():
                refused[:] = [exc]
            log.warning("%s: NATS connection at %s:%d: %s: %s", label, host, port, type(exc).__name__, exc)

        async def reconnected_cb() -> None:
            log.warning("%s: reconnected to NATS at %s:%d", label, host, port)

        nc = NatsClient()
        try:
            # The client tries again forever (max_reconnect_attempts=-1), at open too: wait_for bounds it.
            await asyncio.wait_for(
                nc.connect(
                    servers=[f"nats://{host}:{port}"],
                    user=self.address.username,
                    password=self.address.password,
                    connect_timeout=self.connect_timeout_s,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    error_cb=error_cb,
                    reconnected_cb=reconnected_cb,
                ),
                self.connect_timeout_s,
            )
        except _UNAVAILABLE as exc:
            await nc.close()
            cause = last_error[0] if last_error else exc
            if refused:  # later attempts may only see the server close the connection
                raise ConfigError(f"{label}: NATS at {host}:{port} refused the credentials: {refused[0]}") from None
            raise base.LogUnavailableError(
                f"{label}: no NATS server answered at {host}:{port} within {self.connect_timeout_s:g} s "
                f"({type(cause).__name__}: {cause})"
            ) from exc
        self.nc, self.js = nc, nc.jetstream(timeout=REQUEST_TIMEOUT_S)
        return self.js

    def check(self) -> JetStreamContext:
        """The JetStream context, or ``LogUnavailableError`` while the connection is down."""
        if self.nc is None or self.js is None:
            raise base.LogUnavailableError(f"{self.label}: not connected to NATS (open() first)")
        if not self.nc.is_connected:
            raise base.LogUnavailableError(f"{self.label}: the connection to NATS is down (reconnecting)")
        return self.js

    async def bounded(self, call: Awaitable[T], timeout_s: float = REQUEST_TIMEOUT_S) -> T:
        """``await call``, but ``LogUnavailableError`` as soon as the connection goes down or after
        ``timeout_s`` (nats-py leaves a request in flight at a disconnect waiting its whole timeout)."""
        task = asyncio.ensure_future(call)
        watch = asyncio.ensure_future(self._until_down())
        try:
            done, _ = await asyncio.wait({task, watch}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            watch.cancel()
        if task in done:
            return task.result()
        task.cancel()
        if watch in done:
            raise base.LogUnavailableError(f"{self.label}: the connection to NATS went down (reconnecting)")
        raise base.LogUnavailableError(f"{self.label}: NATS did not answer within {timeout_s:g} s")

    async def _until_down(self) -> None:
        while self.nc is not None and self.nc.is_connected:
            await asyncio.sleep(_DOWN_POLL_S)

    async def capturing(self, subject: str) -> str | None:
        """The stream that captures ``subject``, if any."""
        try:
            return await self.bounded(self.check().find_stream_name_by_subject(subject))
        except NotFoundError:
            return None

    async def ensure_stream(self, subjects: list[str], duplicate_window_s: float | None = None) -> str:
        """The stream that captures ``subjects[0]`` (now ``self.stream``), created as ``self.stream``
        capturing ``subjects`` when none does; a ``ConfigError`` when ``stream=`` names another.
        Raises ``LogUnavailableError``."""
        js = self.check()
        try:
            owner = await self.capturing(subjects[0])
            if owner is None:
                config = StreamConfig(name=self.stream, subjects=subjects, storage=StorageType.FILE)
                if duplicate_window_s is not None:
                    config.duplicate_window = duplicate_window_s
                try:
                    await self.bounded(js.add_stream(config))
                    log.info("%s: created JetStream stream %s capturing %s", self.label, self.stream, subjects)
                except BadRequestError as exc:
                    if exc.err_code != _STREAM_NAME_IN_USE:
                        raise ConfigError(
                            f"{self.label}: cannot create stream {self.stream!r} capturing {subjects}: "
                            f"{exc.description}"
                        ) from None
                owner = await self.capturing(subjects[0])  # another process may have created it meanwhile
            if owner is None or (self.stream_param is not None and owner != self.stream_param):
                raise ConfigError(
                    f"{self.label}: stream {self.stream!r} does not capture subject {subjects[0]!r} "
                    + (f"(stream {owner!r} does); " if owner else "(no stream does); ")
                    + "expected stream= to name the stream that captures it, or no stream= parameter"
                )
        except _UNAVAILABLE as exc:
            raise _unavailable(self.label, exc) from exc
        self.stream = owner
        return owner

    async def gather(self, calls: Sequence[Awaitable[object]]) -> list[object]:
        """The calls' results, every call run to its end; then the first failure raised
        (``LogUnavailableError`` for an unavailable server)."""
        results = await self.bounded(asyncio.gather(*calls, return_exceptions=True))
        for result in results:
            if isinstance(result, BaseException):
                raise _unavailable(self.label, result) from result
        return results

    async def publish_all(self, messages: Sequence[tuple[str, bytes, dict[str, str]]]) -> list[PubAck]:
        """Publish (subject, body, headers) in this order and wait for every PubAck: the messages are
        sent one after another on the connection, so the stream stores them in this order; their
        acks are awaited together."""
        js = self.check()
        futures: list[asyncio.Future[PubAck]] = []
        try:
            for subject, body, headers in messages:
                futures.append(await js.publish_async(subject, body, headers=headers))
        except BaseException as exc:
            for future in futures:
                future.cancel()
            raise _unavailable(self.label, exc) from exc
        return await self.gather(futures)  # type: ignore[return-value]

    async def healthy(self) -> bool:
        """Connected, and JetStream answers (account info: the cheapest JetStream call)."""
        if self.nc is None or self.js is None or not self.nc.is_connected:
            return False
        try:
            await self.bounded(self.js.account_info())
        except (base.LogUnavailableError, *_UNAVAILABLE):
            return False
        return True

    async def close(self) -> None:
        if self.nc is None:
            return
        nc, self.nc, self.js = self.nc, None, None
        if nc.is_connected:
            with contextlib.suppress(*_UNAVAILABLE):  # what was sent reaches the server before the socket closes
                await nc.flush(timeout=1)
        await nc.close()


class NatsJetStreamSource:
    """One member's durable pull consumer on a subject (see the module docstring)."""

    def __init__(self, url: str, member: Member = SOLE) -> None:
        address = LogAddress.parse(url, DEFAULT_PORT)
        self.subject = address.name
        self.durable = member.name(address.take("durable", "aaren"))
        if not re.fullmatch(r"[A-Za-z0-9_-]+", self.durable):
            raise ConfigError(f"nats source: durable={self.durable!r}; expected letters, digits, _ and - only")
        self.ack_wait_s = address.take("ack_wait_s", 30.0, float)
        if self.ack_wait_s <= 0:
            raise ConfigError(f"nats source: ack_wait_s={self.ack_wait_s:g}; expected a positive number of seconds")
        self.start = address.take("start", "0")
        if self.start not in ("0", "$"):
            raise ConfigError(f"nats source: start={self.start!r}; expected 0 (the whole stream) or $")
        self.max_ack_pending: int | None = address.take("max_ack_pending", None, int)
        if self.max_ack_pending is not None and self.max_ack_pending == 0:
            raise ConfigError("nats source: max_ack_pending=0; expected a positive number, or -1 for no limit")
        self._link = _Link(address)
        self.label = self._link.label
        address.done("stream, durable, ack_wait_s, start, max_ack_pending, connect_timeout_s")
        self._sub: JetStreamContext.PullSubscription | None = None

    @property
    def stream(self) -> str:
        return self._link.stream

    async def open(self) -> None:
        js = await self._link.connect()
        stream = await self._link.ensure_stream([self.subject])
        try:
            try:
                info = await self._link.bounded(js.consumer_info(stream, self.durable))
            except NotFoundError:
                info = None
            if info is not None and info.config.filter_subject != self.subject:
                raise ConfigError(
                    f"{self.label}: durable consumer {self.durable!r} of stream {stream!r} reads subject "
                    f"{info.config.filter_subject!r}; expected {self.subject!r} (another durable= for this subject)"
                )
            if info is None:
                wanted = ConsumerConfig(
                    name=self.durable,
                    durable_name=self.durable,
                    deliver_policy=DeliverPolicy.ALL if self.start == "0" else DeliverPolicy.NEW,
                    ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=self.ack_wait_s,
                    max_ack_pending=self.max_ack_pending,
                    filter_subject=self.subject,
                )
            else:  # the rest of an existing durable's configuration (its start) is fixed at its creation
                wanted = info.config.evolve(
                    ack_wait=self.ack_wait_s, max_ack_pending=self.max_ack_pending or info.config.max_ack_pending
                )
            if info is None or self._changed(info.config):
                try:  # creates, or updates an existing durable's ack wait and max ack pending
                    await self._link.bounded(js.add_consumer(stream, wanted))
                except APIError as exc:
                    if isinstance(exc, _UNAVAILABLE):
                        raise
                    raise ConfigError(
                        f"{self.label}: cannot create or update durable consumer {self.durable!r} of stream "
                        f"{stream!r}: {exc.description}"
                    ) from None
            if self._sub is None:
                self._sub = await js.pull_subscribe_bind(durable=self.durable, stream=stream)
        except _UNAVAILABLE as exc:
            raise _unavailable(self.label, exc) from exc

    def _changed(self, config: ConsumerConfig) -> bool:
        """Whether the durable's ack wait or max ack pending differs from the URL's."""
        if abs((config.ack_wait or 0) - self.ack_wait_s) > 1e-6:
            return True
        return self.max_ack_pending is not None and config.max_ack_pending != self.max_ack_pending

    async def read(self, max_messages: int, wait_s: float) -> list[base.LogMessage]:
        self._link.check()
        if self._sub is None:
            raise base.LogUnavailableError(f"{self.label}: not subscribed (open() first)")
        try:
            wait_s = max(wait_s, 0.01)
            msgs = await self._link.bounded(self._sub.fetch(max(1, max_messages), timeout=wait_s), wait_s + 5)
        except TimeoutError:  # nothing came: no message, or the connection went down
            self._link.check()
            return []
        except _UNAVAILABLE as exc:
            raise _unavailable(self.label, exc) from exc
        return [self._message(msg) for msg in msgs]

    @staticmethod
    def _message(msg: Msg) -> base.LogMessage:
        headers = _headers(msg)
        meta = msg.metadata
        return base.LogMessage(
            str(meta.sequence.stream),
            msg.data,
            headers.get("content-type", base.JSON),
            headers.get("aaren-model", ""),
            meta.num_delivered,
            msg,
        )

    async def ack(self, messages: Sequence[base.LogMessage]) -> None:
        """Ack each message and wait for the server's answer (``ack_sync``, all at once): when this
        returns, the server has recorded every ack, so none is handed out again (but after a crash
        of the server: module docstring). A message acked before is skipped."""
        todo = [m.handle for m in messages if isinstance(m.handle, Msg) and not m.handle.is_acked]
        if todo:
            self._link.check()
            await self._link.gather([msg.ack_sync(timeout=REQUEST_TIMEOUT_S) for msg in todo])

    async def hold(self, messages: Sequence[base.LogMessage]) -> None:
        """Tell the server each message is in progress (``+WPI``, waiting for its answer): its ack
        wait starts again, so it stays this consumer's for another ``ack_wait_s``."""
        todo = [m.handle for m in messages if isinstance(m.handle, Msg) and not m.handle.is_acked]
        if todo:
            self._link.check()
            nc = self._link.nc
            assert nc is not None
            await self._link.gather([nc.request(msg.reply, b"+WPI", timeout=REQUEST_TIMEOUT_S) for msg in todo])

    async def stats(self) -> base.SourceStats:
        """``lag``: the consumer's messages not yet delivered; ``pending``: delivered, not acked."""
        js = self._link.check()
        try:
            info = await self._link.bounded(js.consumer_info(self.stream, self.durable))
        except _UNAVAILABLE as exc:
            raise _unavailable(self.label, exc) from exc
        return base.SourceStats(int(info.num_pending or 0), int(info.num_ack_pending or 0))

    async def healthy(self) -> bool:
        return await self._link.healthy()

    async def close(self) -> None:
        self._sub = None
        await self._link.close()


class NatsJetStreamSink:
    """Forecasts published to a subject, at most once per dedup id in the duplicate window (module docstring)."""

    def __init__(self, url: str) -> None:
        address = LogAddress.parse(url, DEFAULT_PORT)
        self.subject = address.name
        self.dead = address.take("dead_letter", f"{self.subject}.dead")
        self.duplicate_window_s = address.take("duplicate_window_s", DEFAULT_DUPLICATE_WINDOW_S, float)
        if self.duplicate_window_s <= 0:
            raise ConfigError(f"nats sink: duplicate_window_s={self.duplicate_window_s:g}; expected a positive number")
        self._link = _Link(address)
        self.label = self._link.label
        address.done("stream, dead_letter, duplicate_window_s, connect_timeout_s")

    @property
    def stream(self) -> str:
        return self._link.stream

    async def open(self) -> None:
        await self._link.connect()
        stream = await self._link.ensure_stream([self.subject, self.dead], self.duplicate_window_s)
        js = self._link.check()
        try:
            dead_stream = await self._link.capturing(self.dead)
            if dead_stream is None:
                raise ConfigError(
                    f"{self.label}: no stream captures the dead-letter subject {self.dead!r}; expected stream "
                    f"{stream!r} or another to capture it (or dead_letter= a subject one captures)"
                )
            for name in dict.fromkeys([stream, dead_stream]):
                window = (await self._link.bounded(js.stream_info(name))).config.duplicate_window or 0
                if window < self.duplicate_window_s:
                    log.warning(
                        "%s: stream %s keeps message ids for duplicate detection %g s, less than "
                        "duplicate_window_s=%g: a forecast published again later than that is stored twice",
                        self.label, name, window, self.duplicate_window_s,
                    )  # fmt: skip
        except _UNAVAILABLE as exc:
            raise _unavailable(self.label, exc) from exc

    async def publish(self, items: Sequence[base.Publication]) -> int:
        """Publish in order (sent one after another; their PubAcks awaited together) and return how
        many the stream stored (a repeat of a ``dedup_id`` within its duplicate window is dropped:
        PubAck.duplicate). After a ``LogUnavailableError`` some may be stored: publishing them again
        is safe, and counts only the others as new."""
        if not items:
            return 0
        acks = await self._link.publish_all(
            [
                (
                    self.subject,
                    item.body,
                    {
                        "Nats-Msg-Id": item.dedup_id,
                        "Content-Type": item.content_type,
                        "Aaren-Source-Id": item.source_id,
                    },
                )
                for item in items
            ]
        )
        return sum(1 for ack in acks if not ack.duplicate)

    async def dead_letter(self, items: Sequence[base.DeadLetter]) -> None:
        if not items:
            return
        letters = []
        for item in items:
            m = item.message
            headers = {
                "Nats-Msg-Id": f"dead:{m.id}",
                "Content-Type": _header(m.content_type),
                "Aaren-Source-Id": _header(m.id),
                "Aaren-Code": str(item.code),
                "Aaren-Reason": _header(item.reason),
                "Aaren-Error": _header(item.error),
            }
            if m.model:
                headers["Aaren-Model"] = _header(m.model)
            letters.append((self.dead, m.body, headers))
        await self._link.publish_all(letters)

    async def healthy(self) -> bool:
        return await self._link.healthy()

    async def close(self) -> None:
        await self._link.close()


class NatsEventWriter(EventWriter):
    """Publishes event messages to a subject (headers ``Content-Type``, ``Aaren-Model``), awaiting
    their PubAcks; connects, and creates the stream when missing, on the first write."""

    def __init__(self, url: str) -> None:
        address = LogAddress.parse(url, DEFAULT_PORT)
        self.subject = address.name
        self._link = _Link(address)
        address.done("stream, connect_timeout_s")
        self._ready = False

    async def write(self, bodies: list[bytes], content_type: str, model: str = "") -> None:
        if not self._ready:
            await self._link.connect()
            await self._link.ensure_stream([self.subject])
            self._ready = True
        headers = {"Content-Type": content_type}
        if model:
            headers["Aaren-Model"] = model
        await self._link.publish_all([(self.subject, body, dict(headers)) for body in bodies])

    async def close(self) -> None:
        self._ready = False
        await self._link.close()


async def read_all(url: str, limit: int | None = None) -> list[tuple[str, bytes, dict[str, str]]]:
    """Every message on SUBJECT in its stream (the first ``limit``), in order: (stream sequence,
    data, headers). ``url``: a source's or a sink's (their own parameters are accepted and not
    used), or a plain ``nats://host:port/SUBJECT``. Reads through an ephemeral consumer without
    acks, deleted after; what is published meanwhile is not read. Raises ``LogUnavailableError``;
    a ``ConfigError`` when no stream captures SUBJECT."""
    address = LogAddress.parse(url, DEFAULT_PORT)
    link = _Link(address)
    for unused in _SOURCE_ONLY + _SINK_ONLY:
        address.take(unused, "")
    address.done(", ".join(("stream", "connect_timeout_s", *_SOURCE_ONLY, *_SINK_ONLY)))
    js = await link.connect()
    try:
        stream = link.stream_param or await link.capturing(link.subject)
        if stream is None:
            raise ConfigError(f"{link.label}: no stream captures subject {link.subject!r}; expected one to")
        try:
            sub = await js.pull_subscribe(
                link.subject,
                stream=stream,
                config=ConsumerConfig(
                    ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=60.0
                ),
            )
            info = await sub.consumer_info()
            total = int(info.num_pending or 0) if limit is None else min(limit, int(info.num_pending or 0))
            out: list[tuple[str, bytes, dict[str, str]]] = []
            while len(out) < total:
                for msg in await sub.fetch(min(total - len(out), 256), timeout=REQUEST_TIMEOUT_S):
                    out.append((str(msg.metadata.sequence.stream), msg.data, dict(msg.headers or {})))
            await sub.unsubscribe()
            await js.delete_consumer(stream, info.name)
            return out
        except _UNAVAILABLE as exc:
            raise _unavailable(link.label, exc) from exc
    finally:
        await link.close()


#: What ``addresses`` opens for a URL of this log: ``SOURCE(url, member)``, ``SINK(url)``, ``WRITER(url)``.
SOURCE, SINK, WRITER = NatsJetStreamSource, NatsJetStreamSink, NatsEventWriter
