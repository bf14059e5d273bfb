"""Prometheus metrics of one server (its own registry, so several servers can live in one process).

Names follow Prometheus conventions (``promtool check metrics`` passes on a scrape): ``aaren_``
prefix, base units, ``_total`` for counters and only for counters. No label ever carries a session
id. The registry also holds prometheus_client's process, platform and garbage-collector collectors
(``process_*``: memory, CPU, open files; ``python_info``; ``python_gc_*``), which only its default
registry would have otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

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

__all__ = ["AggregatedCollector", "Metrics", "families_of"]

LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


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
        r = self.registry
        self.event_latency = Histogram(
            "aaren_event_latency_seconds",
            "Time events spend in each phase, observed once per request (queue: arrival to batch start; "
            "total: arrival to answer) or once per batch (model: batched step; store: state write).",
            ["phase"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_latency = Histogram(
            "aaren_request_latency_seconds",
            "Time from receiving a request (a stream message or a unary call) to its response.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "aaren_batch_size", "Sessions stepped in one batched model call.", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_events = Histogram(
            "aaren_batch_events", "Events applied by one batch.", buckets=BATCH_BUCKETS, registry=r
        )
        self.events = Counter(
            "aaren_events_total", "Events by outcome: applied, duplicate or rejected.", ["outcome"], registry=r
        )
        self.model_events = Counter(
            "aaren_model_events_total",
            "Events by served model and outcome (applied, duplicate or rejected); aaren_events_total is their sum.",
            ["model", "outcome"],
            registry=r,
        )
        self.model_sessions = Gauge("aaren_model_sessions", "Sessions held per served model.", ["model"], registry=r)
        self.model_state_bytes_per_session = Gauge(
            "aaren_model_state_bytes_per_session",
            "Bytes of one session's stored state, per served model (constant whatever the history).",
            ["model"],
            registry=r,
        )
        self.rejections = Counter("aaren_events_rejected_total", "Rejected events by reason.", ["reason"], registry=r)
        self.sessions_started = Counter("aaren_sessions_started_total", "Sessions created.", registry=r)
        self.sessions_ended = Counter("aaren_sessions_ended_total", "Sessions ended by EndSession.", registry=r)
        self.sessions_evicted = Counter(
            "aaren_sessions_evicted_total", "Sessions evicted, by cause: ttl or capacity.", ["cause"], registry=r
        )
        self.active_sessions = Gauge("aaren_active_sessions", "Sessions held by the store.", registry=r)
        self.state_bytes_per_session = Gauge(
            "aaren_state_bytes_per_session", "Bytes of model state kept per session.", registry=r
        )
        self.state_bytes = Gauge("aaren_state_bytes", "Bytes of model state kept for all active sessions.", registry=r)
        self.open_streams = Gauge("aaren_open_streams", "Stream calls now open.", registry=r)
        self.pending_events = Gauge("aaren_pending_events", "Events accepted and waiting for a batch.", registry=r)
        self.store_errors = Counter(
            "aaren_store_errors_total", "Store operations that failed, by operation.", ["operation"], registry=r
        )
        self.state_conflicts = Counter(
            "aaren_state_conflicts_total",
            "State writes refused because the stored seq changed since it was read (compare-and-set).",
            registry=r,
        )
        self.store_latency = Histogram(
            "aaren_store_latency_seconds",
            "Time of store operations, by operation (load and save: once per batch).",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.store_up = Gauge(
            "aaren_store_up", "1 while the session store answers its health check, else 0.", registry=r
        )
        self.state_resets = Counter(
            "aaren_state_resets_total",
            "Sessions whose stored state came from another model version and was reset (on_model_mismatch=reset).",
            registry=r,
        )
        self.auth_refusals = Counter(
            "aaren_auth_refusals_total",
            "Calls refused before reaching the service: token_missing or token_invalid.",
            ["reason"],
            registry=r,
        )
        self.limit_refusals = Counter(
            "aaren_limit_refusals_total",
            "Streams, requests and events refused by a limit, by limit (events also count in "
            "aaren_events_rejected_total).",
            ["limit"],
            registry=r,
        )
        self.frontend_restarts = Counter(
            "aaren_frontend_restarts_total",
            "Front-end processes started again after they died (multi-process layout).",
            registry=r,
        )
        # The event-log consumer (aaren consume): "source" is a log's scheme and name, never its host.
        self.log_messages = Counter(
            "aaren_log_messages_total",
            "Log messages done with, by source and outcome: forecast (published), duplicate (nothing new), "
            "dead_letter, or skipped (another consumer member's session).",
            ["source", "outcome"],
            registry=r,
        )
        self.log_redeliveries = Counter(
            "aaren_log_redeliveries_total",
            "Log messages handed to the consumer more than once (after a crash, a restart or a hold).",
            ["source"],
            registry=r,
        )
        self.log_dead_letters = Counter(
            "aaren_log_dead_letters_total", "Log messages sent to the dead-letter stream, by reason.",
            ["source", "reason"], registry=r,
        )  # fmt: skip
        self.log_published = Counter(
            "aaren_log_published_total",
            "Forecasts offered to a sink, by result: new (appended) or repeat (dropped by the sink's guard).",
            ["sink", "result"],
            registry=r,
        )
        self.log_lag = Gauge("aaren_log_lag", "Log entries not yet read by this consumer.", ["source"], registry=r)
        self.log_pending = Gauge(
            "aaren_log_pending", "Log entries read and not yet acknowledged.", ["source"], registry=r
        )
        self.log_source_up = Gauge(
            "aaren_log_source_up", "1 while the log source answers, else 0.", ["source"], registry=r
        )
        self.log_batch_messages = Histogram(
            "aaren_log_batch_messages", "Messages the consumer read and handled in one batch.",
            buckets=BATCH_BUCKETS, registry=r,
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
