"""Prometheus metrics of one server (its own registry, so several servers can live in one process).

Names follow Prometheus conventions (``promtool check metrics`` passes on a scrape): ``aaren_``
prefix, base units, ``_total`` for counters and only for counters. No label ever carries a session
id. The registry also holds prometheus_client's process, platform and garbage-collector collectors
(``process_*``: memory, CPU, open files; ``python_info``; ``python_gc_*``), which only its default
registry would have otherwise.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

__all__ = ["AggregatedCollector", "DeferredHistogram", "Metrics", "families_of", "observe_many"]

LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


#: a ``DeferredHistogram`` counts its amounts into its buckets at a scrape, and at the latest every this many
FOLD_EVERY = 4096


class DeferredHistogram(Histogram):
    """A prometheus_client ``Histogram`` whose ``observe`` appends the amount to a list, counted into the buckets
    and the sum when the histogram is collected (a scrape) or once ``FOLD_EVERY`` are waiting (``fold``: one
    ``searchsorted`` for them all, ``observe_many``'s rule, the counts ``observe`` would give).

    ``observe`` was about 1.5 us (two locks and a scan of the bounds) and a batch of one event observed eight
    histograms; an append is some 0.1 us. Thread-safe without a lock on the observing side: an append is atomic,
    and ``fold`` (one at a time) counts a prefix of the list and deletes just that prefix. An observation with an
    exemplar goes through ``Histogram.observe`` at once."""

    def _metric_init(self) -> None:
        super()._metric_init()
        self._pending: list[float] = []
        self._fold_lock = threading.Lock()

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        try:
            pending = self._pending
        except AttributeError:  # a parent with labels: prometheus_client's own error
            self._raise_if_not_observable()
            raise
        if exemplar is not None:
            super().observe(amount, exemplar)
            return
        pending.append(amount)
        if len(pending) >= FOLD_EVERY:
            self.fold()

    def observe_many(self, amounts: Iterable[float]) -> None:
        """``observe(a)`` for each of ``amounts``."""
        pending = self._pending
        pending.extend(amounts)
        if len(pending) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Count the waiting amounts into the buckets and the sum."""
        with self._fold_lock:
            pending = self._pending
            n = len(pending)
            if not n:
                return
            amounts = pending[:n]
            del pending[:n]  # only those: appends made meanwhile stay for the next fold
            _count(self, np.asarray(amounts, dtype=np.float64))

    def _child_samples(self) -> Iterable[Sample]:
        self.fold()
        return super()._child_samples()


def observe_many(histogram: Any, amounts: Iterable[float]) -> None:
    """``histogram.observe(a)`` for every ``a`` of ``amounts`` (an unlabelled or labelled ``Histogram`` child):
    a ``DeferredHistogram`` appends them; another Histogram child (``_upper_bounds``, ``_buckets``, ``_sum``:
    prometheus_client's since 0.4) gets the same bucket counts and sum as ``observe`` would give, the buckets
    found by one ``searchsorted``; anything else is observed value by value."""
    if isinstance(histogram, DeferredHistogram):
        histogram.observe_many(amounts)
        return
    if all(hasattr(histogram, name) for name in ("_upper_bounds", "_buckets", "_sum")):
        histogram._raise_if_not_observable()
        _count(histogram, np.asarray(list(amounts), dtype=np.float64))
        return
    for amount in amounts:
        histogram.observe(float(amount))


def _count(histogram: Histogram, values: np.ndarray) -> None:
    """Add ``values [n]`` to a Histogram child's sum and buckets, by ``observe``'s rule (the first bound at or
    above the value; NaN in none, as there)."""
    if not len(values):
        return
    histogram._sum.inc(float(values.sum()))
    bounds = np.asarray(histogram._upper_bounds, dtype=np.float64)
    counts = np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds) + 1)
    buckets = histogram._buckets
    for i in np.flatnonzero(counts[: len(buckets)]).tolist():
        buckets[i].inc(int(counts[i]))


class Metrics:
    """Every metric the service exports, registered in ``self.registry``.

    Without ``registry``, a new one that also has the process, platform and GC collectors; a registry
    passed in is the caller's, which decides what else it holds (prometheus_client's default registry
    has those collectors already, and a second registration of a name fails).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry()
            # Each collector reads this process when scraped and keeps no state, so one per registry
            # is right even with several servers in one process (tests, embedded use).
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        self.registry = registry
        # Every metric of this server registers in its own registry.
        counter = functools.partial(Counter, registry=self.registry)
        gauge = functools.partial(Gauge, registry=self.registry)
        histogram = functools.partial(DeferredHistogram, registry=self.registry)
        self.event_latency = histogram(
            "aaren_event_latency_seconds",
            "Time events spend in each phase, observed once per request (queue: arrival to batch start; "
            "total: arrival to answer) or once per batch (model: batched step; store: state write).",
            ["phase"],
            buckets=LATENCY_BUCKETS,
        )
        self.request_latency = histogram(
            "aaren_request_latency_seconds",
            "Time from receiving a request (a stream message or a unary call) to its response.",
            ["method"],
            buckets=LATENCY_BUCKETS,
        )
        self.batch_size = histogram(
            "aaren_batch_size", "Sessions stepped in one batched model call.", buckets=BATCH_BUCKETS
        )
        self.batch_events = histogram("aaren_batch_events", "Events applied by one batch.", buckets=BATCH_BUCKETS)
        self.events = counter("aaren_events_total", "Events by outcome: applied, duplicate or rejected.", ["outcome"])
        self.model_events = counter(
            "aaren_model_events_total",
            "Events by served model and outcome (applied, duplicate or rejected); aaren_events_total is their sum.",
            ["model", "outcome"],
        )
        self.model_sessions = gauge("aaren_model_sessions", "Sessions held per served model.", ["model"])
        self.model_state_bytes_per_session = gauge(
            "aaren_model_state_bytes_per_session",
            "Bytes of one session's stored state, per served model (constant whatever the history).",
            ["model"],
        )
        self.rejections = counter("aaren_events_rejected_total", "Rejected events by reason.", ["reason"])
        self.sessions_started = counter("aaren_sessions_started_total", "Sessions created.")
        self.sessions_ended = counter("aaren_sessions_ended_total", "Sessions ended by EndSession.")
        self.sessions_evicted = counter(
            "aaren_sessions_evicted_total", "Sessions evicted, by cause: ttl or capacity.", ["cause"]
        )
        self.active_sessions = gauge("aaren_active_sessions", "Sessions held by the store.")
        self.state_bytes_per_session = gauge("aaren_state_bytes_per_session", "Bytes of model state kept per session.")
        self.state_bytes = gauge("aaren_state_bytes", "Bytes of model state kept for all active sessions.")
        self.open_streams = gauge("aaren_open_streams", "Stream calls now open.")
        self.pending_events = gauge("aaren_pending_events", "Events accepted and waiting for a batch.")
        self.store_errors = counter(
            "aaren_store_errors_total", "Store operations that failed, by operation.", ["operation"]
        )
        self.state_conflicts = counter(
            "aaren_state_conflicts_total",
            "State writes refused because the stored seq changed since it was read (compare-and-set).",
        )
        self.store_latency = histogram(
            "aaren_store_latency_seconds",
            "Time of store operations, by operation (load and save: once per batch).",
            ["operation"],
            buckets=LATENCY_BUCKETS,
        )
        self.store_up = gauge("aaren_store_up", "1 while the session store answers its health check, else 0.")
        self.state_resets = counter(
            "aaren_state_resets_total",
            "Sessions whose stored state came from another model version and was reset (on_model_mismatch=reset).",
        )
        self.auth_refusals = counter(
            "aaren_auth_refusals_total",
            "Calls refused before reaching the service: token_missing or token_invalid.",
            ["reason"],
        )
        self.limit_refusals = counter(
            "aaren_limit_refusals_total",
            "Streams, requests and events refused by a limit, by limit (events also count in "
            "aaren_events_rejected_total).",
            ["limit"],
        )
        self.frontend_restarts = counter(
            "aaren_frontend_restarts_total",
            "Front-end processes started again after they died (multi-process layout).",
        )
        # The event-log consumer (aaren consume): "source" is a log's scheme and name, never its host.
        self.log_messages = counter(
            "aaren_log_messages_total",
            "Log messages done with, by source and outcome: forecast (published), duplicate (nothing new), "
            "dead_letter, or skipped (another consumer member's session).",
            ["source", "outcome"],
        )
        self.log_redeliveries = counter(
            "aaren_log_redeliveries_total",
            "Log messages handed to the consumer more than once (after a crash, a restart or a hold).",
            ["source"],
        )
        self.log_dead_letters = counter(
            "aaren_log_dead_letters_total", "Log messages sent to the dead-letter stream, by reason.",
            ["source", "reason"],
        )  # fmt: skip
        self.log_published = counter(
            "aaren_log_published_total",
            "Forecasts offered to a sink, by result: new (appended) or repeat (dropped by the sink's guard).",
            ["sink", "result"],
        )
        self.log_lag = gauge("aaren_log_lag", "Log entries not yet read by this consumer.", ["source"])
        self.log_pending = gauge("aaren_log_pending", "Log entries read and not yet acknowledged.", ["source"])
        self.log_source_up = gauge("aaren_log_source_up", "1 while the log source answers, else 0.", ["source"])
        self.log_batch_messages = histogram(
            "aaren_log_batch_messages", "Messages the consumer read and handled in one batch.",
            buckets=BATCH_BUCKETS,
        )  # fmt: skip
        for outcome in ("applied", "duplicate", "rejected"):
            self.events.labels(outcome)
        for phase in ("queue", "model", "store", "total"):
            self.event_latency.labels(phase)
        for cause in ("ttl", "capacity"):
            self.sessions_evicted.labels(cause)
        for reason in ("token_missing", "token_invalid"):
            self.auth_refusals.labels(reason)
        for limit in ("server_busy", "tenant_pending_limit", "tenant_rate_limited", "tenant_stream_limit"):
            self.limit_refusals.labels(limit)
        for operation in ("load", "save", "get", "delete"):
            self.store_latency.labels(operation)
            self.store_errors.labels(operation)


#: A registry's families as plain data: ``(name, type, documentation, unit, [(sample, labels, value)])``.
Families = list[tuple[str, str, str, str, list[tuple[str, dict[str, str], float]]]]
#: Families that describe one process's interpreter (version, collector): the core process's own.
PER_PROCESS_PREFIXES = ("python_",)
#: Process samples that do not add up over processes: the service started when its first process
#: did; a file-descriptor limit is each process's own (the core's is shown).
EARLIEST_SAMPLES = frozenset({"process_start_time_seconds"})
OWN_SAMPLES = frozenset({"process_max_fds"})


def families_of(registry: CollectorRegistry) -> Families:
    """What ``registry`` would export now, as plain values (a front end's answer to its core)."""
    return [
        (f.name, f.type, f.documentation, f.unit, [(s.name, dict(s.labels), s.value) for s in f.samples])
        for f in registry.collect()
        if not f.name.startswith(PER_PROCESS_PREFIXES)
    ]


class AggregatedCollector(Collector):
    """One consistent view of several processes: the core's own registry plus its front ends'
    families (fetched at scrape time), samples with equal names and labels summed. Counters,
    histograms, the gauges the front ends hold (open streams) and the processes' own memory, CPU
    and open files (``process_*``) all add up; ``_created`` timestamps and
    ``process_start_time_seconds`` take the earliest; ``process_max_fds`` and ``python_*`` are the
    core process's own."""

    def __init__(self, own: CollectorRegistry, remote: Callable[[], Iterable[Families]]) -> None:
        self.own = own
        self.remote = remote

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: a registry would otherwise collect (ask the front ends) when this
        collector is registered."""
        return []

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, tuple[str, str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
        order: list[str] = []

        def add(name: str, kind: str, doc: str, unit: str, samples: Iterable[tuple[str, Any, float]]) -> None:
            if name not in merged:
                merged[name] = (kind, doc, unit, {})
                order.append(name)
            values = merged[name][3]
            for sample, labels, value in samples:
                key = (sample, tuple(sorted(labels.items())))
                if key not in values:
                    values[key] = value
                elif sample.endswith("_created") or sample in EARLIEST_SAMPLES:
                    values[key] = min(values[key], value)
                elif sample in OWN_SAMPLES:
                    continue  # the core's, collected first
                else:
                    values[key] += value

        for family in self.own.collect():
            add(
                family.name,
                family.type,
                family.documentation,
                family.unit,
                ((s.name, s.labels, s.value) for s in family.samples),
            )
        for families in self.remote():
            for name, kind, doc, unit, samples in families:
                add(name, kind, doc, unit, samples)
        for name in order:
            kind, doc, unit, values = merged[name]
            metric = Metric(name, doc, kind, unit)
            for (sample, labels), value in values.items():
                metric.add_sample(sample, dict(labels), value)
            yield metric
