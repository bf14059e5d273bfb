"""The bookkeeping of one open bidirectional call, shared by every front end's streaming method.

Replies leave in the order their requests arrived: a reply waits for the earlier ones, so a
session's results reach the client in the order its events were sent, also when a later request
is answered first. A stream may have ``limit`` requests unanswered; past that its reader waits
(``room``), so a fast sender is slowed by gRPC flow control.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["OrderedReplies"]

R = TypeVar("R")


class OrderedReplies(Generic[R]):
    """Unanswered requests of one stream, oldest first, and its outgoing queue ``out``."""

    __slots__ = ("idle", "limit", "out", "pause_s", "pending", "room")

    def __init__(self, limit: int) -> None:
        self.out: asyncio.Queue[object] = asyncio.Queue()
        self.pending: deque[list[R | None]] = deque()
        self.limit = limit
        self.room = asyncio.Event()  # set while fewer than `limit` requests are unanswered
        self.room.set()
        self.idle = asyncio.Event()  # set while none is
        self.idle.set()
        #: Seconds the reader waits before the next read (a refusal's retry hint).
        self.pause_s = 0.0

    def started(self) -> list[R | None]:
        """A slot for the next request's reply."""
        slot: list[R | None] = [None]
        self.pending.append(slot)
        self.idle.clear()
        if len(self.pending) >= self.limit:
            self.room.clear()
        return slot

    def finished(self, slot: list[R | None], reply: R) -> None:
        """``reply`` answers ``slot``: it and every reply ready behind it leave, in order."""
        slot[0] = reply
        while self.pending and self.pending[0][0] is not None:
            self.out.put_nowait(self.pending.popleft()[0])
        if len(self.pending) < self.limit:
            self.room.set()
        if not self.pending:
            self.idle.set()
