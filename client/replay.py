"""Replay events through a server: many sessions over several streams, paced or as fast as possible.

``replay`` sends ``EventIn``s (already numbered and ordered, e.g. from ``aaren.client.events_file``) over
``streams`` concurrent ``Stream`` calls. Each session is pinned to one stream by a hash of its id,
so its events go out, and are applied, in order. Events are packed ``batch`` per message; at most
``window`` messages per stream wait for their answers. ``ForecastWriter`` writes every result as a
CSV or JSONL row; ``ReplayStats`` counts outcomes and message latencies as they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import heapq
import itertools
import json
import math
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from aaren.client.client import (
    AarenClient,
    AarenError,
    AckOut,
    ClassForecastOut,
    EventErrorOut,
    EventIn,
    EventStream,
    ForecastOut,
    ModelInfoOut,
    Outcome,
    SeriesForecastOut,
    StreamResult,
    to_jsonable,
)

__all__ = ["ForecastWriter", "ReplayError", "ReplayStats", "percentile", "replay", "schedule", "stream_index"]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of already sorted values, linearly interpolated; NaN when empty."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    pos = q * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclasses.dataclass
class ReplayStats:
    """Counts by outcome, errors by reason and per-message latencies (seconds) of a replay so far."""

    events_sent: int = 0
    events_answered: int = 0
    forecasts: int = 0
    acks: int = 0
    duplicates: int = 0
    errors: Counter[str] = dataclasses.field(default_factory=Counter)
    messages: int = 0
    latencies: list[float] = dataclasses.field(default_factory=list)
    recent: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=2000))
    started: float = dataclasses.field(default_factory=time.perf_counter)
    finished: float | None = None

    @property
    def elapsed_s(self) -> float:
        return (self.finished if self.finished is not None else time.perf_counter()) - self.started

    @property
    def events_per_s(self) -> float:
        elapsed = self.elapsed_s
        return self.events_answered / elapsed if elapsed > 0 else 0.0

    @property
    def n_errors(self) -> int:
        return sum(self.errors.values())

    def latency_ms(self, q: float, *, recent: bool = False) -> float:
        """Message latency quantile ``q`` in ms, over the whole replay or the last 2,000 messages."""
        return percentile(sorted(self.recent if recent else self.latencies), q) * 1000

    def count(self, result: StreamResult, n_events: int) -> None:
        self.messages += 1
        self.latencies.append(result.latency_s)
        self.recent.append(result.latency_s)
        if result.request_error is not None:
            self.errors[result.request_error.reason] += n_events
            self.events_answered += n_events
            return
        # Counted from the proto, no conversion: forecasts arrive as columns, the rest as rows.
        forecasts = len(result.raw.forecast_columns.event_index)
        self.forecasts += forecasts
        results = result.raw.results
        self.events_answered += forecasts + len(results)
        for r in results:
            kind = r.WhichOneof("outcome")
            if kind == "forecast":
                self.forecasts += 1
            elif kind == "ack":
                if r.duplicate:
                    self.duplicates += 1
                else:
                    self.acks += 1
            else:
                self.errors[r.error.reason if kind == "error" else "no_outcome"] += 1

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        return {
            "events": self.events_sent,
            "answered": self.events_answered,
            "forecasts": self.forecasts,
            "acks": self.acks,
            "duplicates": self.duplicates,
            "errors": self.n_errors,
            "errors_by_reason": dict(self.errors.most_common()),
            "messages": self.messages,
            "elapsed_s": self.elapsed_s,
            "events_per_s": self.events_per_s,
            "latency_ms": {f"p{int(q * 100)}": percentile(ordered, q) * 1000 for q in (0.5, 0.95, 0.99)},
        }


class ReplayError(Exception):
    """A stream failed mid-replay; ``stats`` holds what was answered before."""

    def __init__(self, error: AarenError, stats: ReplayStats) -> None:
        super().__init__(str(error))
        self.error = error
        self.stats = stats


def stream_index(session_id: str, streams: int) -> int:
    """The stream a session is pinned to (stable across runs and processes)."""
    return zlib.crc32(session_id.encode("utf-8", "surrogatepass")) % streams


def schedule(events: Sequence[EventIn], max_sessions: int = 0) -> Iterator[EventIn]:
    """``events`` in their order, but with at most ``max_sessions`` sessions under way at once
    (0: no limit): a session starts when a slot is free and holds it until its last event is out.
    A session's events keep their order."""
    if max_sessions <= 0:
        yield from events
        return
    positions: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        positions.setdefault(e.session_id, []).append(i)
    waiting = iter(positions.values())  # sessions in order of their first event
    heap: list[tuple[int, int, list[int]]] = []  # (index of the session's next event, its place, all)
    for _ in range(max_sessions):
        rows = next(waiting, None)
        if rows is None:
            break
        heap.append((rows[0], 0, rows))
    heapq.heapify(heap)
    while heap:
        i, k, rows = heapq.heappop(heap)
        yield events[i]
        if k + 1 < len(rows):
            heapq.heappush(heap, (rows[k + 1], k + 1, rows))
        else:
            nxt = next(waiting, None)
            if nxt is not None:
                heapq.heappush(heap, (nxt[0], 0, nxt))


async def replay(
    client: AarenClient,
    events: Iterable[EventIn],
    *,
    streams: int = 4,
    batch: int = 1,
    rate: float | None = None,
    window: int = 64,
    top_k: int = 0,
    on_result: Callable[[StreamResult], None] | None = None,
    stats: ReplayStats | None = None,
    last_only: bool = False,
    model: str = "",
) -> ReplayStats:
    """Send ``events`` in order over ``streams`` streams and wait for every answer.

    ``batch``: events per message (a message holds one stream's events, possibly of several
    sessions). ``rate``: events per second over all streams (None: as fast as the server takes
    them); while pacing, partial batches go out rather than wait. ``window``: unanswered messages
    per stream. ``on_result`` sees each ``StreamResult`` as it arrives. ``last_only``: only each
    session's last event in a message gets a forecast (the others an ack): for sending histories,
    which the server ingests in one parallel call. ``model``: the served model by name ("" the
    default). Raises ``ReplayError`` if a stream fails.
    """
    if streams < 1 or batch < 1 or window < 1:
        raise ValueError(f"streams ({streams}), batch ({batch}) and window ({window}) must be >= 1")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate is {rate}; expected events per second > 0")
    stats = stats if stats is not None else ReplayStats()
    stats.started = time.perf_counter()
    queues: list[asyncio.Queue[list[EventIn] | None]] = [asyncio.Queue(maxsize=window) for _ in range(streams)]
    lanes: dict[str, int] = {}

    async def dispatch() -> None:
        pending: list[list[EventIn]] = [[] for _ in range(streams)]

        async def flush() -> None:
            for s, events_ in enumerate(pending):
                if events_:
                    pending[s] = []
                    await queues[s].put(events_)

        start = time.perf_counter()
        for n, event in enumerate(events):
            if rate is not None:
                delay = start + n / rate - time.perf_counter()
                if delay > 0:
                    await flush()
                    await asyncio.sleep(delay)
            lane = lanes.get(event.session_id)
            if lane is None:
                lane = lanes[event.session_id] = stream_index(event.session_id, streams)
            pending[lane].append(event)
            if len(pending[lane]) >= batch:
                await queues[lane].put(pending[lane])
                pending[lane] = []
        await flush()
        for q in queues:
            await q.put(None)

    async def send(
        stream: EventStream, queue: asyncio.Queue[list[EventIn] | None], slots: asyncio.Semaphore, sizes: dict[str, int]
    ) -> None:
        ids = itertools.count(1)
        while (events_ := await queue.get()) is not None:
            await slots.acquire()
            rid = str(next(ids))
            sizes[rid] = len(events_)
            stats.events_sent += len(events_)
            # Columns: the server builds (and we read) the forecasts several times faster than rows.
            await stream.send(events_, request_id=rid, top_k=top_k, columns=True, last_only=last_only)
        await stream.done_writing()

    async def receive(stream: EventStream, slots: asyncio.Semaphore, sizes: dict[str, int]) -> None:
        async for result in stream:
            slots.release()
            stats.count(result, sizes.pop(result.request_id, 0))
            if on_result is not None:
                on_result(result)
        if sizes:
            raise AarenError("UNKNOWN", "", f"the server ended a stream with {len(sizes)} messages unanswered")

    try:
        async with contextlib.AsyncExitStack() as stack:
            tasks = [asyncio.create_task(dispatch(), name="replay-dispatch")]
            for queue in queues:
                stream = await stack.enter_async_context(client.stream(model))
                slots = asyncio.Semaphore(window)
                sizes: dict[str, int] = {}
                tasks.append(asyncio.create_task(send(stream, queue, slots, sizes)))
                tasks.append(asyncio.create_task(receive(stream, slots, sizes)))
            try:
                await _gather_or_cancel(tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                raise
    except AarenError as exc:
        stats.finished = time.perf_counter()
        raise ReplayError(exc, stats) from None
    stats.finished = time.perf_counter()
    return stats


async def _gather_or_cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Wait for all tasks; on the first failure cancel the rest and raise it."""
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        if task.exception() is not None:
            for other in pending:
                other.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            raise task.exception()  # type: ignore[misc]


class ForecastWriter:
    """Writes one row per event result to ``.csv`` or ``.jsonl`` (``.json`` too).

    CSV columns: ``session_id, seq, status`` (forecast, ack, duplicate or error), ``last_time,
    mean_gap, expected_time``, one ``q<level>`` per quantile level, ``mark_i, p_i`` for the top
    marks (by name), ``<value>_mean, <value>_std`` per value column, ``error_code, error_reason,
    error_message, latency_ms``. JSONL rows hold the same, with marks as ``[id, name, p]``.

    Series models: one CSV row per forecast step ``step`` (1..H) at ``step_time`` (last_time + step
    x step_seconds), with ``<channel>_mean`` and ``<channel>_q<level>`` per channel. Class models:
    ``class_i, p_i`` for the top classes. JSONL rows hold the forecast as the client reads it.
    """

    def __init__(self, path: Path | str, model: ModelInfoOut, top_k: int = 0) -> None:
        self.path = Path(path)
        suffix = self.path.suffix.lower()
        if suffix not in (".csv", ".jsonl", ".json"):
            raise ValueError(f"{self.path}: unsupported output type; expected .csv or .jsonl")
        self.jsonl = suffix != ".csv"
        self.model = model
        self.task = model.task
        self.levels = model.quantile_levels
        ranked = len(model.class_names) if self.task == "class" else model.num_marks
        self.k = min(top_k or model.limits.default_top_k or ranked, ranked or 1)
        self.rows = 0
        self._file: IO[str] = self.path.open("w", newline="", encoding="utf-8")
        self._csv: Any = None
        if not self.jsonl:
            self._csv = csv.writer(self._file)
            self._csv.writerow(self.columns())

    def columns(self) -> list[str]:
        if self.task == "series":
            cols = ["session_id", "seq", "status", "last_time", "step", "step_time"]
            cols += [f"{c}_mean" for c in self.model.value_names]
            cols += [f"{c}_q{level:g}" for c in self.model.value_names for level in self.levels]
            return [*cols, "error_code", "error_reason", "error_message", "latency_ms"]
        if self.task == "class":
            cols = ["session_id", "seq", "status", "last_time"]
            for i in range(1, self.k + 1):
                cols += [f"class_{i}", f"p_{i}"]
            return [*cols, "error_code", "error_reason", "error_message", "latency_ms"]
        cols = ["session_id", "seq", "status", "last_time", "mean_gap", "expected_time"]
        cols += [f"q{level:g}" for level in self.levels]
        for i in range(1, self.k + 1):
            cols += [f"mark_{i}", f"p_{i}"]
        for name in self.model.value_names:
            cols += [f"{name}_mean", f"{name}_std"]
        return [*cols, "error_code", "error_reason", "error_message", "latency_ms"]

    def write(self, result: StreamResult, keep: Callable[[Outcome], bool] | None = None) -> None:
        """Write a row per outcome of ``result`` (only those ``keep`` accepts, when given)."""
        latency_ms = result.latency_s * 1000
        if result.request_error is not None:
            self._row(result.request_error, latency_ms)
            return
        for outcome in result.results:
            if keep is None or keep(outcome):
                self._row(outcome, latency_ms)

    def _row(self, r: Outcome, latency_ms: float) -> None:
        self.rows += 1
        if isinstance(r, SeriesForecastOut | ClassForecastOut):
            self._task_row(r, latency_ms)
            return
        status = (
            "forecast"
            if isinstance(r, ForecastOut)
            else "error"
            if isinstance(r, EventErrorOut)
            else "duplicate"
            if r.duplicate
            else "ack"
        )
        if self.jsonl:
            row: dict[str, Any] = {"session_id": r.session_id, "seq": r.seq, "status": status}
            if isinstance(r, ForecastOut):
                d = to_jsonable(r)
                d["marks"] = [[m, self.model.mark_name(m), p] for m, p in r.marks]
                row.update(d)
            elif isinstance(r, AckOut):
                row["last_seq"] = r.last_seq
            else:
                row.update(error_code=r.code, error_reason=r.reason, error_message=r.message)
            row["latency_ms"] = latency_ms
            self._file.write(json.dumps(row) + "\n")
            return
        cells: list[Any] = [r.session_id, r.seq, status]
        n_blank = len(self.columns()) - 7
        if isinstance(r, ForecastOut):
            cells += [r.last_time, r.mean_gap, r.expected_time]
            cells += [r.quantiles.get(level, "") for level in self.levels]
            for i in range(self.k):
                cells += [self.model.mark_name(r.marks[i][0]), r.marks[i][1]] if i < len(r.marks) else ["", ""]
            for i in range(len(self.model.value_names)):
                cells += list(r.values[i]) if i < len(r.values) else ["", ""]
            cells += ["", "", ""]
        elif isinstance(r, AckOut):
            cells += [""] * n_blank + ["", "", ""]
        else:
            cells += [""] * n_blank + [r.code, r.reason, r.message]
        cells.append(f"{latency_ms:.3f}")
        self._csv.writerow(cells)

    def _task_row(self, r: SeriesForecastOut | ClassForecastOut, latency_ms: float) -> None:
        if self.jsonl:
            row = {"session_id": r.session_id, "seq": r.seq, "status": "forecast", **to_jsonable(r)}
            row["latency_ms"] = latency_ms
            self._file.write(json.dumps(row) + "\n")
            return
        tail = ["", "", "", f"{latency_ms:.3f}"]
        if isinstance(r, ClassForecastOut):
            cells: list[Any] = [r.session_id, r.seq, "forecast", r.last_time]
            for i in range(self.k):
                cells += list(r.classes[i]) if i < len(r.classes) else ["", ""]
            self._csv.writerow(cells + tail)
            return
        step_s = self.model.step_seconds
        for h, means in enumerate(r.means):
            cells = [r.session_id, r.seq, "forecast", r.last_time, h + 1, r.last_time + (h + 1) * step_s, *means]
            cells += [r.quantiles[level][h][c] for c in range(len(means)) for level in self.levels]
            self._csv.writerow(cells + tail)
        self.rows += len(r.means) - 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ForecastWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
