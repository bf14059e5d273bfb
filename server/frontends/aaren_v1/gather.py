"""One-event requests of one loop turn, across streams, as one core request.

At 64 sessions of one event per message, a request's own work (its admission, queueing and
settling in the core, its reply's encoding) cost more than its event's model step. ``Gather`` takes
the one-event requests that the stream readers decode in the same turn of the event loop, groups
them by model, tenant and ``top_k``, and hands each group to the core as one ``CoreRequest`` (its
events in arrival order, so each stream's requests keep their order: the core applies a request's
events in order). A gathered request is read as its numbers (``OneEvent``), not arrays of its own:
the group's columns are made once. The group's answer is split back into one reply per request in
one pass (one ``results_parts`` call: the task's wire bytes of every forecast at once), and each
stream's answer is its reply itself, made before the stream's writer wakes.

What a request sees is what it saw alone: its event's result, in its own reply, with its own
``request_id``. Two things are the group's: a refusal by a limit (the server's or the tenant's
pending events, the tenant's rate) refuses the group's requests together, and the core's latency
histogram observes the group once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from aaren.server.contract.columns import CoreRequest, EventColumns, Outcomes
from aaren.server.contract.core_api import OnDone
from aaren.server.contract.errors import Reasons

__all__ = ["Answer", "Gather", "GroupKey", "OneEvent"]

log = logging.getLogger(__name__)

#: What a group shares: the model's view (with its ``submit``), the tenant and the forecasts' ``top_k``.
GroupKey = tuple[Any, str, int]
#: How a gathered request is answered: its reply's wire bytes, or ``Outcomes`` its stream encodes itself.
Answer = Callable[[Any], None]
#: ``results_parts(view, k, core, outcomes)``: one reply body per event of ``core`` (the group's request).
ResultsParts = Callable[[Any, int, CoreRequest, Outcomes], list[bytes]]


@dataclasses.dataclass(slots=True)
class OneEvent:
    """A one-event request as the stream read it, checked: its reply's ``request_id`` field as wire
    bytes (``prefix``, empty for none) and its event's numbers; ``values [1, V]``."""

    prefix: bytes
    session_id: str
    seq: int
    time: float
    mark: int
    values: np.ndarray


class Gather:
    """The one-event requests of the current loop turn, submitted together at the turn's end.

    One group is open at a time: a request of another group (another model, tenant or ``top_k``)
    submits the open one first, and so does a request that is not gathered (``submit_now``), so that
    requests reach the core in the order they were read."""

    __slots__ = ("_items", "_key", "_max_events", "_parts", "_scheduled")

    def __init__(self, results_parts: ResultsParts, max_events: int) -> None:
        self._parts = results_parts
        self._max_events = max_events
        self._key: GroupKey | None = None
        #: the open group's requests and how each is answered
        self._items: list[tuple[OneEvent, Answer]] = []
        self._scheduled = False

    def add(self, key: GroupKey, event: OneEvent, on_done: Answer) -> None:
        """Queue a one-event request of group ``key``; ``on_done`` gets its reply's wire bytes, or the
        group's ``Outcomes`` where they refuse it whole (a limit)."""
        if self._items and (key != self._key or len(self._items) >= self._max_events):
            self.flush()
        self._key = key
        self._items.append((event, on_done))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._at_turn_end)

    def submit_now(self, submit: Callable[[CoreRequest, OnDone], None], request: CoreRequest, on_done: OnDone) -> None:
        """Submit a request that is not gathered, after the open group (the order they were read in)."""
        if self._items:
            self.flush()
        submit(request, on_done)

    def _at_turn_end(self) -> None:
        self._scheduled = False
        if self._items:
            self.flush()

    def flush(self) -> None:
        """Submit the open group as one core request, its events in the order they were read."""
        key, items = self._key, self._items
        assert key is not None
        self._items = []
        view, tenant, k = key
        group = [event for event, _ in items]
        n = len(group)
        events = EventColumns(
            [e.session_id for e in group],
            np.array([e.seq for e in group], dtype=np.int64),
            np.array([e.time for e in group], dtype=np.float64),
            np.array([e.mark for e in group], dtype=np.int64),
            group[0].values if n == 1 else np.concatenate([e.values for e in group]),
        )
        request = CoreRequest(n, np.arange(n), events, {}, top_k=k, tenant=tenant, model=view.description.name)
        # the core answers with a future's set_result (a C call: the core never calls into a front end); the
        # group's replies are made in the future's callback, on a turn of the loop of their own
        answer: asyncio.Future[Outcomes] = asyncio.get_running_loop().create_future()
        answer.add_done_callback(lambda done: self._answer(view, k, request, items, done.result()))
        try:
            view.submit(request, answer.set_result)
        except Exception:  # a bug must cost these requests, not the streams
            log.exception("submitting a group of requests failed")
            answer.set_result(Outcomes.refused(Reasons.internal()))

    def _answer(
        self,
        view: Any,
        k: int,
        group: CoreRequest,
        items: list[tuple[OneEvent, Answer]],
        outcomes: Outcomes,
    ) -> None:
        """Each request's reply from the group's ``outcomes``: its event's result after its own
        ``request_id`` (a refusal of the whole group goes to each request as its outcomes)."""
        if outcomes.request_error is not None:
            replies: list[Any] = [Outcomes.refused(outcomes.request_error)] * len(items)
        else:
            try:
                parts = self._parts(view, k, group, outcomes)
                replies = [e.prefix + part if e.prefix else part for (e, _), part in zip(items, parts, strict=True)]
            except Exception:  # a bug must cost these requests, not the streams
                log.exception("encoding the answers of a group of requests failed")
                replies = [Outcomes.refused(Reasons.internal())] * len(items)
        for (_, on_done), reply in zip(items, replies, strict=True):
            on_done(reply)  # the request's place in its stream: it keeps the reply (a gone stream's too)
