"""Redis Streams as a source of events and a sink of forecasts (redis-py asyncio).

Source: ``redis-stream://host:port/STREAM?group=G&consumer=C&start=0&db=N``. A consumer group
(``group``, default ``aaren``; per member ``G-i-of-n``, ``addresses.Member``) created at ``start``
(``0``: the whole stream, the default; ``$``: new entries only) when missing. At ``open`` the
consumer takes over every entry pending in its group (``XAUTOCLAIM`` from idle 0: a member's
group has one live consumer, so another's pending entries are a dead predecessor's), then reads its
pending entries (id ``0``) before new ones (``>``), so a restarted consumer goes on where it stopped.
An entry is ``data`` (the body), ``content-type`` and ``model`` fields; an entry without ``data``
is read as the event's fields themselves (``session_id``, ``seq``, ``time``, ``mark``, ``values``).
Held entries simply stay pending: a group's pending entries are only handed out again by a claim.

Sink: ``redis-stream://host:port/STREAM?dead_letter=NAME&maxlen=N&dedup_ttl_s=S&db=N``. A forecast is
an entry ``data``, ``content-type``, ``source-id``, ``dedup-id``; one Lua script per batch appends
it only when its seq is above the session's published seq (a key per model and session, kept
``dedup_ttl_s``, default a week), so a forecast published again after a crash is dropped, atomically
with the append. Dead letters go to ``dead_letter`` (default ``STREAM.dead``), once per source entry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from aaren.server.contract.errors import ConfigError
from aaren.server.frontends.eventlog import base
from aaren.server.frontends.eventlog.addresses import EventWriter, LogAddress, Member

__all__ = ["SINK", "SOURCE", "WRITER", "RedisEventWriter", "RedisStreamSink", "RedisStreamSource"]

DEFAULT_PORT = 6379
SOLE = Member()
DEFAULT_DEDUP_TTL_S = 7 * 24 * 3600
_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)

# KEYS[1] the stream; ARGV[1] the guard keys' ttl, ARGV[2] maxlen (0: none), then 6 per forecast:
# guard key, seq, body, content type, source id, dedup id. Appends those above their session's seq.
_PUBLISH = """
local ttl, maxlen, new = tonumber(ARGV[1]), tonumber(ARGV[2]), 0
for i = 3, #ARGV, 6 do
  local seq = tonumber(ARGV[i + 1])
  local last = tonumber(redis.call('GET', ARGV[i]) or '0')
  if seq > last then
    redis.call('SET', ARGV[i], ARGV[i + 1], 'EX', ttl)
    if maxlen > 0 then
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'data', ARGV[i + 2], 'content-type', ARGV[i + 3],
        'source-id', ARGV[i + 4], 'dedup-id', ARGV[i + 5])
    else
      redis.call('XADD', KEYS[1], '*', 'data', ARGV[i + 2], 'content-type', ARGV[i + 3],
        'source-id', ARGV[i + 4], 'dedup-id', ARGV[i + 5])
    end
    new = new + 1
  end
end
return new
"""

# KEYS[1] the dead-letter stream; ARGV[1] ttl, then 8 per letter: seen key, data, content type,
# model, source id, code, reason, error.
_DEAD_LETTER = """
for i = 2, #ARGV, 8 do
  if redis.call('SET', ARGV[i], '1', 'NX', 'EX', tonumber(ARGV[1])) then
    redis.call('XADD', KEYS[1], '*', 'data', ARGV[i + 1], 'content-type', ARGV[i + 2], 'model', ARGV[i + 3],
      'source-id', ARGV[i + 4], 'code', ARGV[i + 5], 'reason', ARGV[i + 6], 'error', ARGV[i + 7])
  end
end
return 0
"""


def _client(address: LogAddress, *, retry: bool = True) -> aioredis.Redis:
    """``retry=False``: a command whose connection broke fails instead of being sent again on a new
    one (redis-py's default): an ``XREADGROUP`` sent again hands out the next entries, and the ones
    its lost reply held would stay pending unseen, their sessions stuck behind a seq gap."""
    return aioredis.Redis(
        host=address.host,
        port=address.port,
        db=address.take("db", 0, int),
        username=address.username,
        password=address.password,
        socket_connect_timeout=5,
        socket_timeout=30,
        **({} if retry else {"retry": Retry(NoBackoff(), 0)}),
    )


class _RedisLog:
    """What a source and a sink of one stream share: the client, its health, closing it."""

    label: str
    _redis: aioredis.Redis

    async def healthy(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except _UNAVAILABLE:
            return False

    async def close(self) -> None:
        await self._redis.aclose()


class RedisStreamSource(_RedisLog):
    """One member's consumer of a stream's group (see the module docstring)."""

    def __init__(self, url: str, member: Member = SOLE) -> None:
        address = LogAddress.parse(url, DEFAULT_PORT)
        self.stream = address.name
        self.group = member.name(address.take("group", "aaren"))
        self.consumer = address.take("consumer", f"consumer-{member.index}")
        self.start = address.take("start", "0")
        if self.start not in ("0", "$"):
            raise ConfigError(f"redis-stream source: start={self.start!r}; expected 0 (the whole stream) or $")
        self.label = address.label
        self._redis = _client(address, retry=False)  # a lost reply must surface: open() reads the pending again
        address.done("group, consumer, start, db")
        self._backlog_after: bytes | None = b"0"  # reading own pending entries after this id; None: new ones

    async def open(self) -> None:
        try:
            try:
                await self._redis.xgroup_create(self.stream, self.group, id=self.start, mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            cursor = b"0-0"
            while True:  # a dead predecessor's pending entries become ours
                reply = await self._redis.xautoclaim(
                    self.stream, self.group, self.consumer, min_idle_time=0, start_id=cursor, count=1000
                )
                cursor = reply[0]  # (redis-py's justid=True drops the cursor: the entries are read whole)
                if cursor in (b"0-0", "0-0"):
                    break
        except _UNAVAILABLE as exc:
            raise base.LogUnavailableError(f"{self.label}: {exc}") from exc
        self._backlog_after = b"0"

    async def read(self, max_messages: int, wait_s: float) -> list[base.LogMessage]:
        try:
            if self._backlog_after is not None:
                reply = await self._redis.xreadgroup(
                    self.group, self.consumer, {self.stream: self._backlog_after}, count=max_messages
                )
                entries = reply[0][1] if reply else []
                if entries:
                    self._backlog_after = entries[-1][0]
                    return [self._message(entry_id, fields, redelivered=True) for entry_id, fields in entries]
                self._backlog_after = None
            reply = await self._redis.xreadgroup(
                self.group, self.consumer, {self.stream: ">"}, count=max_messages, block=max(1, int(wait_s * 1000))
            )
        except _UNAVAILABLE as exc:
            raise base.LogUnavailableError(f"{self.label}: {exc}") from exc
        entries = reply[0][1] if reply else []
        return [self._message(entry_id, fields, redelivered=False) for entry_id, fields in entries]

    def _message(self, entry_id: bytes, fields: dict[bytes, bytes] | None, *, redelivered: bool) -> base.LogMessage:
        fields = fields or {}  # an entry deleted (XDEL, trimmed) while pending: nothing to read
        model = fields.pop(b"model", b"").decode()
        content_type = fields.pop(b"content-type", base.JSON.encode()).decode()
        body = fields.get(b"data")
        if body is None:  # the event's own fields
            body = json.dumps({k.decode(): v.decode() for k, v in fields.items()}).encode()
        return base.LogMessage(entry_id.decode(), body, content_type, model, 2 if redelivered else 1, entry_id)

    async def ack(self, messages: Sequence[base.LogMessage]) -> None:
        if not messages:
            return
        try:
            await self._redis.xack(self.stream, self.group, *[m.handle for m in messages])
        except _UNAVAILABLE as exc:
            raise base.LogUnavailableError(f"{self.label}: {exc}") from exc

    async def hold(self, messages: Sequence[base.LogMessage]) -> None:
        """Nothing to do: an unacknowledged entry stays this consumer's until it is claimed."""

    async def stats(self) -> base.SourceStats:
        try:
            groups = await self._redis.xinfo_groups(self.stream)
        except _UNAVAILABLE as exc:
            raise base.LogUnavailableError(f"{self.label}: {exc}") from exc
        for group in groups:
            name = group.get("name", group.get(b"name"))
            if name in (self.group, self.group.encode()):
                lag = group.get("lag", group.get(b"lag"))
                return base.SourceStats(int(lag or 0), int(group.get("pending", group.get(b"pending")) or 0))
        return base.SourceStats(0, 0)


class RedisStreamSink(_RedisLog):
    """Forecasts appended to a stream, at most once per (model, session, seq) (module docstring)."""

    def __init__(self, url: str) -> None:
        address = LogAddress.parse(url, DEFAULT_PORT)
        self.stream = address.name
        self.dead = address.take("dead_letter", f"{self.stream}.dead")
        self.maxlen = address.take("maxlen", 0, int)
        self.ttl = address.take("dedup_ttl_s", DEFAULT_DEDUP_TTL_S, int)
        self.label = address.label
        self._redis = _client(address)
        address.done("dead_letter, maxlen, dedup_ttl_s, db")
        self._publish = self._redis.register_script(_PUBLISH)
        self._dead_letter = self._redis.register_script(_DEAD_LETTER)

    async def open(self) -> None:
        if not await self.healthy():
            raise base.LogUnavailableError(f"{self.label}: Redis does not answer")

    async def publish(self, items: Sequence[base.Publication]) -> int:
        if not items:
            return 0
        args: list[object] = [self.ttl, self.maxlen]
        for item in items:
            guard = f"{self.stream}:published:{item.model}:{item.session_id}"
            args += [guard, item.seq, item.body, item.content_type, item.source_id, item.dedup_id]
        try:
            return int(await self._publish(keys=[self.stream], args=args))
        except _UNAVAILABLE as exc:
            raise base.LogUnavailableError(f"{self.label}: {exc}") from exc

    async def dead_letter(self, items: Sequence[base.DeadLetter]) -> None:
        if not items:
            return
        args: list[object] = [self.ttl]
        for item in items:
            m = item.message
            args += [
                f"{self.dead}:seen:{m.id}", m.body, m.content_type, m.model, m.id, item.code, item.reason, item.error
            ]  # fmt: skip
        try:
            await self._dead_letter(keys=[self.dead], args=args)
        except _UNAVAILABLE as exc:
            raise base.LogUnavailableError(f"{self.label}: {exc}") from exc


class RedisEventWriter(EventWriter):
    """Appends event messages to a stream (``data``, ``content-type``, ``model`` fields)."""

    def __init__(self, url: str) -> None:
        address = LogAddress.parse(url, DEFAULT_PORT)
        self.stream = address.name
        self._redis = _client(address)
        address.done("db")

    async def write(self, bodies: list[bytes], content_type: str, model: str = "") -> None:
        pipe = self._redis.pipeline(transaction=False)
        for body in bodies:
            fields: dict[str, bytes | str] = {"data": body, "content-type": content_type}
            if model:
                fields["model"] = model
            pipe.xadd(self.stream, fields)
        try:
            await pipe.execute()
        except _UNAVAILABLE as exc:
            raise base.LogUnavailableError(f"redis-stream:{self.stream}: {exc}") from exc

    async def close(self) -> None:
        await self._redis.aclose()


#: What ``addresses`` opens for a URL of this log: ``SOURCE(url, member)``, ``SINK(url)``, ``WRITER(url)``.
SOURCE, SINK, WRITER = RedisStreamSource, RedisStreamSink, RedisEventWriter


#: Entries per XRANGE call of ``read_all``.
READ_PAGE = 1000


async def read_all(url: str) -> list[tuple[str, bytes, dict[str, str]]]:
    """Every entry of the stream at ``url`` in log order, read in pages of ``READ_PAGE`` (XRANGE):
    ``(entry id, its data field, its other fields)`` (b"" when it has no data; a sink's fields are
    content-type, source-id, dedup-id). Raises ``LogUnavailableError`` when Redis does not answer."""
    address = LogAddress.parse(url, DEFAULT_PORT)
    stream = address.name
    client = _client(address)
    for key in ("dead_letter", "maxlen", "dedup_ttl_s"):  # a sink's URL reads as it is: its writing parameters
        address.take(key, "")
    address.done("db, dead_letter, maxlen, dedup_ttl_s")
    out: list[tuple[str, bytes, dict[str, str]]] = []
    start = "-"
    try:
        while True:
            page = await client.xrange(stream, min=start, max="+", count=READ_PAGE)
            for entry_id, fields in page:
                data = fields.pop(b"data", b"")
                out.append((entry_id.decode(), data, {k.decode(): v.decode() for k, v in fields.items()}))
            if len(page) < READ_PAGE:
                return out
            start = "(" + page[-1][0].decode()  # exclusive: after the last entry read
    except _UNAVAILABLE as exc:
        raise base.LogUnavailableError(f"{address.label}: {exc}") from exc
    finally:
        await client.aclose()
