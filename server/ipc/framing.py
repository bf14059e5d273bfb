"""The frames of the IPC between the engine core and its front-end processes, on a unix socket.

A frame is a 4-byte little-endian length and a MessagePack array ``[kind, ...]`` of plain values
(str, int, float, bool, None, bytes, lists, maps): nothing on the socket names a Python class or
runs code when decoded, so a peer can send wrong data, never an object. Arrays and dataclasses
travel as plain values (``aaren.server.ipc.packing``).

A connection opens with the key the core gave its front ends: a 4-byte length and the key's bytes,
compared in constant time (``check_key``) before anything else the peer sends is read as a frame.

Frames, front end -> core: ``["hello", index]``, ``["submit", packed requests]``, ``["count", code,
reason, n, model]``, ``["call", id, method, kwargs]``, ``["report_reply", id, value]``.
Core -> front end: ``["welcome", [descriptions, aliases], serving]``, ``["serving", bool]``,
``["results", packed outcomes]``, ``["reply", id, value, error]``, ``["report", id, what]`` (e.g.
``"metrics"``: the front end's metric families), ``["drain"]``.
"""

from __future__ import annotations

import asyncio
import hmac
import struct
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgpack

__all__ = [
    "KEY_ENV",
    "MAX_FRAME_BYTES",
    "Outbox",
    "check_key",
    "dumps",
    "loads",
    "read_frame",
    "send_key",
    "write_frame",
]

T = TypeVar("T")

_LENGTH = struct.Struct("<I")
MAX_FRAME_BYTES = 1 << 31
#: The longest key a connection may present.
MAX_KEY_BYTES = 256
#: The environment variable that hands the core's key to a front-end process.
KEY_ENV = "AAREN_CORE_KEY"


def dumps(frame: list[Any] | tuple[Any, ...]) -> bytes:
    """One frame's body (MessagePack; maps may have int keys, e.g. errors by event position)."""
    return msgpack.packb(frame, use_bin_type=True)


def loads(data: bytes) -> list[Any]:
    """The frame back: arrays as lists, maps as dicts, ``bytes`` as bytes."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


async def read_frame(reader: asyncio.StreamReader) -> list[Any]:
    (n,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return loads(await reader.readexactly(n))


def write_frame(writer: asyncio.StreamWriter, frame: list[Any] | tuple[Any, ...]) -> None:
    data = dumps(frame)
    if len(data) >= MAX_FRAME_BYTES:
        raise ValueError(f"IPC frame of {len(data)} bytes is too large")
    writer.write(_LENGTH.pack(len(data)) + data)


def send_key(writer: asyncio.StreamWriter, key: bytes) -> None:
    """Open a connection with the core's key (the first thing on it)."""
    writer.write(_LENGTH.pack(len(key)) + key)


async def check_key(reader: asyncio.StreamReader, key: bytes) -> bool:
    """Whether the peer opened with ``key`` (read raw, compared in constant time, never decoded)."""
    (n,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    presented = await reader.readexactly(min(n, MAX_KEY_BYTES))
    return n <= MAX_KEY_BYTES and hmac.compare_digest(presented, key)


class Outbox(Generic[T]):
    """What one end gathers during a turn of its event loop, handed to ``send`` together on the
    next turn: one frame for many requests (or outcomes), not one each."""

    __slots__ = ("items", "scheduled", "send")

    def __init__(self, send: Callable[[list[T]], None]) -> None:
        self.items: list[T] = []
        self.scheduled = False
        self.send = send

    def __len__(self) -> int:
        return len(self.items)

    def put(self, item: T) -> None:
        self.items.append(item)
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def take(self) -> list[T]:
        """Everything not yet sent (and no longer to be)."""
        items, self.items = self.items, []
        return items

    def _flush(self) -> None:
        self.scheduled = False
        items = self.take()
        if items:
            self.send(items)
