"""Redis session store: one string per session, compare-and-set writes in Lua, one round trip per batch.

Keys (``{...}`` is a Redis Cluster hash tag, so both keys of a session live in one slot)::

    <prefix>{<session_id>}     the session: a record (below)
    <prefix>{<session_id>}:t   tombstone "1" (or "2" once an eviction was reported), outlives the record

Record: ``seq`` as 20 ASCII digits (so Lua can compare it with GETRANGE), then little-endian
float64 ``last_time, created_at, updated_at``, one byte of model-version length, the model version,
the state row (the tensors' raw bytes, fields in layout order), and last the 16-byte write id of
the save call that wrote it (so Lua reads it with GETRANGE from the end). One string rather than a
hash: a hash with a 584-byte field leaves Redis's compact encoding and costs about 1.4 KB per
session. Records written before write ids existed (no id after the state) are still read.

The record expires ``idle_ttl_s`` after its last write (Redis expires it; ``sweep`` has nothing to
do). The tombstone lives ``tombstone_ttl_s`` longer, so a late event for a session that expired is
told it was evicted rather than that it never existed; the first reader of an expired session
reports the eviction (``on_evict("ttl")``) once for all replicas together.

A write is a Lua script per session, all of a batch's scripts in one pipeline: the script writes
only if the stored seq equals the seq the step started from (0: no session), so two replicas
stepping the same session can never both win. Every save call draws a random write id; redis-py
resends the same pipeline, id included, when a reply is lost, so a stored record with the seq and
the write id of this call is this call's own write landed already, and answers as written (a
retry never reports a false conflict). Equal bytes prove nothing: two replicas stepping the same
state with the same events at the same wall-clock time write identical records, and the second
must lose.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

import numpy as np
import torch
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from torch import Tensor

from aaren.server.stores.base import (
    LoadedBatch,
    Rows,
    SaveBatch,
    SessionMeta,
    SessionStore,
    StateLayout,
    StoreUnavailableError,
    as_tensors,
)

__all__ = ["RedisStore", "open_redis_store"]

T = TypeVar("T")
TOMBSTONES = 100_000
DEFAULT_PREFIX = "aaren:"
DEFAULT_TOMBSTONE_TTL_S = 7 * 24 * 3600.0
DEFAULT_TIMEOUT_S = 2.0
SEQ_DIGITS = 20
#: Bytes of random write id that end every record: 128 bits, so two save calls never share one.
WRITE_ID_BYTES = 16
#: Sessions per script call on a single Redis: large enough for one call per batch, small enough
#: that one call never blocks Redis for long (about 1 ms).
SESSIONS_PER_CALL = 512
_TIMES = struct.Struct("<ddd")

# Both scripts take any number of sessions: KEYS = session 1, tombstone 1, session 2, ... One call
# covers a whole batch on a single Redis; on a Cluster each session is its own call (its keys
# share a slot, another session's may not), all of them still in one pipeline.

# ARGV per session: expected seq (20 digits), record (ending in the call's write id), record expiry
# (unix ms), tombstone expiry (unix ms). Returns per session 1 if written (or already written by
# this same call: a resend after a lost reply), else 0. The 16 is WRITE_ID_BYTES.
SAVE_LUA = """
local out = {}
for i = 1, #KEYS / 2 do
  local key, tomb = KEYS[2 * i - 1], KEYS[2 * i]
  local expected, record = ARGV[4 * i - 3], ARGV[4 * i - 2]
  local cur = redis.call('GETRANGE', key, 0, 19)
  if cur == '' then cur = '00000000000000000000' end
  if cur == expected then
    redis.call('SET', key, record, 'PXAT', ARGV[4 * i - 1])
    redis.call('SET', tomb, '1', 'PXAT', ARGV[4 * i])
    out[i] = 1
  elseif cur == string.sub(record, 1, 20)
      and redis.call('GETRANGE', key, -16, -1) == string.sub(record, -16) then
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

# Returns per session {1, record}, or {0, tombstone} for an expired session (marking it reported),
# or {} for none.
LOAD_LUA = """
local out = {}
for i = 1, #KEYS / 2 do
  local key, tomb = KEYS[2 * i - 1], KEYS[2 * i]
  local v = redis.call('GET', key)
  if v then
    out[i] = {1, v}
  else
    local t = redis.call('GET', tomb)
    if t == '1' then redis.call('SET', tomb, '2', 'KEEPTTL') end
    if t then out[i] = {0, t} else out[i] = {} end
  end
end
return out
"""

# KEYS: session, tombstone. Deletes both (an ended session is not an evicted one); returns the
# record or nil.
DELETE_LUA = """
local v = redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
return v
"""

_UNAVAILABLE = (redis_errors.RedisError, redis_errors.RedisClusterException, OSError, TimeoutError)


class _Script:
    """A Lua script run by EVALSHA, loaded on first use and again after a Redis restart."""

    def __init__(self, body: str) -> None:
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()


class RedisStore(SessionStore):
    """Sessions in Redis (standalone, TLS or Cluster). Construct with ``open_redis_store``."""

    cheap_count = False
    expires_by_itself = True
    bounded_by_capacity = False  # Redis bounds memory with maxmemory; use noeviction (README)

    def __init__(
        self,
        client: Redis | RedisCluster,
        layout: StateLayout,
        *,
        idle_ttl_s: float,
        prefix: str = DEFAULT_PREFIX,
        tombstone_ttl_s: float = DEFAULT_TOMBSTONE_TTL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(layout)
        self.client = client
        self.cluster = isinstance(client, RedisCluster)
        self.idle_ttl_s = idle_ttl_s
        self.prefix = prefix
        self.tombstone_ttl_s = tombstone_ttl_s
        self.timeout_s = timeout_s
        self._fields = [
            (name, row.dtype, tuple(row.shape), row.numel() * row.element_size()) for name, row in layout.rows.items()
        ]
        self._row_nbytes = sum(n for *_, n in self._fields)
        self._fresh = self._encode({k: v.unsqueeze(0) for k, v in layout.rows.items()})[0]
        self._save = _Script(SAVE_LUA)
        self._load = _Script(LOAD_LUA)
        self._delete = _Script(DELETE_LUA)
        self._evicted: OrderedDict[str, None] = OrderedDict()

    # -- keys and rows ---------------------------------------------------------------------------

    def _keys(self, session_id: str) -> tuple[bytes, bytes]:
        key = self.prefix.encode() + b"{" + session_id.encode("utf-8", "surrogatepass") + b"}"
        return key, key + b":t"

    def _encode(self, rows: Rows) -> list[bytes]:
        """Rows ``rows[name] [B, ...]`` -> B byte strings of ``row_nbytes`` each."""
        tensors = as_tensors(rows)
        parts = []
        for name, dtype, _, _ in self._fields:
            t = tensors[name].detach().to("cpu", dtype).contiguous()
            parts.append(t.reshape(t.shape[0], -1).view(torch.uint8))
        flat = torch.cat(parts, dim=1).numpy()  # [B, row_nbytes]
        return [row.tobytes() for row in flat]

    def _decode(self, blobs: Sequence[bytes]) -> dict[str, Tensor]:
        """B byte strings -> ``name -> [B, *row_shape]`` on the layout's device."""
        flat = torch.from_numpy(
            np.frombuffer(b"".join(blobs), dtype=np.uint8).reshape(len(blobs), self._row_nbytes).copy()
        )
        out, offset = {}, 0
        device = self.layout.device
        for name, dtype, shape, nbytes in self._fields:
            part = flat[:, offset : offset + nbytes].contiguous().view(dtype).reshape(len(blobs), *shape)
            out[name] = part.to(device)
            offset += nbytes
        return out

    @staticmethod
    def _records(
        last_seq: np.ndarray,
        last_time: np.ndarray,
        created_at: np.ndarray,
        updated_at: np.ndarray,
        model_version: str,
        states: Sequence[bytes],
        write_id: bytes,
    ) -> list[bytes]:
        """The records (module docstring) of sessions with metadata columns ``[B]``, one model
        version and state bytes ``states[i]``."""
        model = model_version.encode()
        if len(model) > 255:
            raise ValueError(f"model version {model_version!r} is longer than 255 bytes")
        model = bytes([len(model)]) + model
        times = np.stack([last_time, created_at, updated_at], axis=1).astype("<f8").tobytes()  # [B, 3] float64
        width = _TIMES.size
        return [
            b"".join([b"%0*d" % (SEQ_DIGITS, seq), times[i * width : (i + 1) * width], model, state, write_id])
            for i, (seq, state) in enumerate(zip(last_seq.tolist(), states, strict=True))
        ]

    @staticmethod
    def _record(meta: SessionMeta, state: bytes, write_id: bytes) -> bytes:
        """One session's record (``_records``)."""
        one = SaveBatch.of([""], {}, [meta], [0])
        return RedisStore._records(
            one.last_seq, one.last_time, one.created_at, one.updated_at, one.model_version, [state], write_id
        )[0]

    def _parse(self, record: bytes) -> tuple[SessionMeta, bytes | None]:
        """A record -> its meta and state bytes; state None when they do not fit this layout (the
        meta's model version then says so, and the engine core refuses or resets the session)."""
        head = SEQ_DIGITS + _TIMES.size
        try:
            last_time, created, updated = _TIMES.unpack_from(record, SEQ_DIGITS)
            n = record[head]
            model = record[head + 1 : head + 1 + n].decode(errors="replace")
            meta = SessionMeta(int(record[:SEQ_DIGITS]), last_time, created, updated, model)
        except (struct.error, IndexError, ValueError):
            return SessionMeta(-1, 0.0, 0.0, 0.0, f"(unreadable record of {len(record)} bytes)"), None
        state = record[head + 1 + n :]
        if len(state) == self._row_nbytes + WRITE_ID_BYTES:
            return meta, state[: self._row_nbytes]
        if len(state) == self._row_nbytes:  # written before records ended in a write id
            return meta, state
        meta.model_version = (
            f"{model} (unreadable here: {len(state)} state bytes, expected {self._row_nbytes} "
            f"and a {WRITE_ID_BYTES}-byte write id)"
        )
        return meta, None

    # -- calls to Redis --------------------------------------------------------------------------

    async def _guard(self, operation: str, call: Awaitable[T]) -> T:
        """Bound a call by the timeout and turn any Redis or network failure into ``StoreUnavailableError``."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await call
        except StoreUnavailableError:
            raise
        except (TimeoutError, redis_errors.TimeoutError) as exc:
            raise StoreUnavailableError(f"redis {operation} timed out: no answer within {self.timeout_s:g} s") from exc
        except _UNAVAILABLE as exc:
            raise StoreUnavailableError(f"redis {operation} failed: {type(exc).__name__}: {exc}") from exc

    async def _run_scripts(self, script: _Script, calls: Sequence[tuple[Sequence[bytes], Sequence[Any]]]) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` in one pipelined round trip; load it if Redis lost it."""
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            for i in todo:
                keys, args = calls[i]
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            answers = await pipe.execute(raise_on_error=False)
            missing = []
            for i, answer in zip(todo, answers, strict=True):
                if isinstance(answer, redis_errors.NoScriptError) and attempt == 0:
                    missing.append(i)  # the script never ran for this call: safe to run again
                elif isinstance(answer, Exception):
                    raise answer
                else:
                    results[i] = answer
            if not missing:
                break
            await self.client.script_load(script.body)
            todo = missing
        return results

    async def _run_per_session(
        self, script: _Script, keys: Sequence[Sequence[bytes]], args: Sequence[Sequence[Any]]
    ) -> list[Any]:
        """Run a many-session script (SAVE_LUA, LOAD_LUA) for every session, in one round trip:
        chunks of up to ``SESSIONS_PER_CALL`` sessions per call on a single Redis, one call per
        session on a Cluster. Returns the script's answer for each session."""
        step = 1 if self.cluster else SESSIONS_PER_CALL
        calls = []
        for lo in range(0, len(keys), step):
            calls.append(
                (
                    [k for pair in keys[lo : lo + step] for k in pair],
                    [a for group in args[lo : lo + step] for a in group],
                )
            )
        return [answer for call in await self._run_scripts(script, calls) for answer in call]

    # -- the interface ---------------------------------------------------------------------------

    async def load(self, session_ids: Sequence[str]) -> LoadedBatch:
        keys = [self._keys(sid) for sid in session_ids]
        answers = await self._guard("load", self._run_per_session(self._load, keys, [()] * len(keys)))
        metas: list[SessionMeta | None] = []
        blobs = []
        for sid, answer in zip(session_ids, answers, strict=True):
            if answer and answer[0] == 1:
                meta, state = self._parse(answer[1])
                metas.append(meta)
                blobs.append(self._fresh if state is None else state)
                continue
            if answer:
                self._tombstone(sid, first_report=answer[1] == b"1")
            metas.append(None)
            blobs.append(self._fresh)
        # The records are parsed one by one anyway: their metadata become columns at the end.
        return LoadedBatch.of(metas, self._decode(blobs))

    async def save(self, batch: SaveBatch) -> list[bool]:
        session_ids = batch.session_ids
        # One id per call is enough: its sessions have different keys, and only a resend of this
        # very pipeline may carry it again.
        write_id = os.urandom(WRITE_ID_BYTES)
        records = self._records(
            batch.last_seq,
            batch.last_time,
            batch.created_at,
            batch.updated_at,
            batch.model_version,
            self._encode(batch.tensors),
            write_id,
        )
        tomb_extra_ms = math.ceil(self.tombstone_ttl_s * 1000)
        # ceil((updated_at + idle_ttl_s) * 1000) in float64, as math.ceil of the same float sum.
        expires = np.ceil((np.asarray(batch.updated_at, dtype=np.float64) + self.idle_ttl_s) * 1000).astype(np.int64)
        keys = [self._keys(sid) for sid in session_ids]
        args = [
            (b"%0*d" % (SEQ_DIGITS, expected), record, expires_ms, expires_ms + tomb_extra_ms)
            for expected, record, expires_ms in zip(
                np.asarray(batch.expected_seqs).tolist(), records, expires.tolist(), strict=True
            )
        ]
        answers = await self._guard("save", self._run_per_session(self._save, keys, args))
        written = [int(a) == 1 for a in answers]
        for sid, ok in zip(session_ids, written, strict=True):
            if ok:
                self._evicted.pop(sid, None)
        return written

    async def get(self, session_id: str) -> tuple[SessionMeta, dict[str, Tensor]] | None:
        loaded = await self.load([session_id])
        meta = loaded.metas[0]
        return None if meta is None else (meta, loaded.tensors)

    async def delete(self, session_id: str) -> SessionMeta | None:
        (answer,) = await self._guard("delete", self._run_scripts(self._delete, [(self._keys(session_id), ())]))
        self._evicted.pop(session_id, None)
        return self._parse(answer)[0] if answer else None

    def was_evicted(self, session_id: str) -> bool:
        return session_id in self._evicted

    def _tombstone(self, session_id: str, *, first_report: bool) -> None:
        self._evicted[session_id] = None
        self._evicted.move_to_end(session_id)
        if len(self._evicted) > TOMBSTONES:
            self._evicted.popitem(last=False)
        if first_report:
            self.on_evict("ttl")

    async def count(self) -> int:
        """Sessions under this store's prefix (a SCAN: call it now and then, not per batch)."""
        return await self._count(_glob_escape(self.prefix) + "{*}")

    async def count_group(self, group: str) -> int:
        """Sessions of ``group`` (a SCAN of the store's keys: the engine core caches it)."""
        return await self._count(_glob_escape(self.prefix) + "{" + _glob_escape(group) + "/*}")

    async def _count(self, pattern: str) -> int:
        async def scan() -> int:
            n = 0
            async for _ in self.client.scan_iter(match=pattern, count=1000):
                n += 1
            return n

        try:
            return await asyncio.wait_for(scan(), timeout=max(self.timeout_s, 30.0))
        except _UNAVAILABLE as exc:
            raise StoreUnavailableError(f"redis count failed: {type(exc).__name__}: {exc}") from exc

    async def sweep(self, now: float | None = None) -> int:
        return 0  # Redis expires idle sessions itself (PEXPIREAT on every write)

    async def healthy(self) -> bool:
        try:
            await self._guard("ping", self.client.ping())
        except StoreUnavailableError:
            return False
        return True

    async def close(self) -> None:
        await self.client.aclose()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


OUR_OPTIONS = {"prefix", "tombstone_ttl_s", "timeout_s"}


def open_redis_store(url: str, layout: StateLayout, *, idle_ttl_s: float) -> RedisStore:
    """``redis://``, ``rediss://`` (TLS), ``redis+cluster://`` or ``rediss+cluster://`` -> a store.

    Query options of ours: ``prefix`` (key prefix, default ``aaren:``), ``timeout_s`` (bound on every
    call, default 2), ``tombstone_ttl_s`` (how long an expired session is remembered as evicted,
    default 7 days). Every other option goes to redis-py (e.g. ``ssl_ca_certs``, ``socket_timeout``).
    """
    parsed = urlparse(url)
    cluster = parsed.scheme.endswith("+cluster")
    scheme = parsed.scheme.removesuffix("+cluster")
    ours: dict[str, str] = {}
    theirs = []
    for key, value in parse_qsl(parsed.query, keep_blank_values=True):
        if key in OUR_OPTIONS:
            ours[key] = value
        else:
            theirs.append((key, value))
    try:
        timeout_s = float(ours.get("timeout_s", DEFAULT_TIMEOUT_S))
        tombstone_ttl_s = float(ours.get("tombstone_ttl_s", DEFAULT_TOMBSTONE_TTL_S))
    except ValueError as exc:
        raise ValueError(f"store URL {url!r}: timeout_s and tombstone_ttl_s must be numbers ({exc})") from None
    if not timeout_s > 0 or not tombstone_ttl_s >= 0:
        raise ValueError(f"store URL {url!r}: timeout_s must be > 0 and tombstone_ttl_s >= 0")
    plain_url = urlunparse(parsed._replace(scheme=scheme, query=urlencode(theirs)))
    options: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        # One quick retry replaces a pooled connection that died with a restarted Redis; no long
        # backoff, so an outage turns into UNAVAILABLE answers quickly instead of stalled batches.
        "retry": Retry(ExponentialBackoff(cap=0.05, base=0.01), retries=1),
        "health_check_interval": 10,
    }
    client: Redis | RedisCluster
    if cluster:
        options.pop("health_check_interval")
        client = RedisCluster.from_url(plain_url, **options)
    else:
        client = Redis.from_url(plain_url, **options)
    return RedisStore(
        client,
        layout,
        idle_ttl_s=idle_ttl_s,
        prefix=ours.get("prefix", DEFAULT_PREFIX),
        tombstone_ttl_s=tombstone_ttl_s,
        timeout_s=timeout_s,
    )
