"""Server settings from flags and ``AAREN_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ServerSettings", "bundled_checkpoint", "bundled_repository"]

PositiveInt = Annotated[int, Field(gt=0)]


def bundled_repository() -> Path:
    """The bundled model repository (the package ``aaren.models``: the default model and one per task).

    Found where the package is: ``models/`` of a checkout (editable install) or ``aaren/models`` in
    site-packages (the wheel ships it as package data). Located without importing it, so no
    ``__pycache__`` is written among the models.
    """
    spec = importlib.util.find_spec("aaren.models")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the bundled models (package aaren.models) are not installed; pass --models-dir")
    return Path(spec.origin).resolve().parent


def bundled_checkpoint() -> Path:
    """The bundled default model (``default`` of :func:`bundled_repository`: the flights event model)."""
    return bundled_repository() / "default"


class ServerSettings(BaseSettings):
    """Everything ``aaren serve`` can be told. Each field is also ``AAREN_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(
        env_prefix="AAREN_", extra="forbid", cli_kebab_case=True, cli_prog_name="aaren serve", cli_implicit_flags=True
    )

    address: str = Field("127.0.0.1:50051", description="gRPC bind address, host:port (port 0 picks a free one)")
    checkpoint: Path | None = Field(
        None,
        description="serve this one checkpoint directory alone, of any task, instead of models_dir",
    )
    models_dir: Path | None = Field(
        None,
        description="model repository: every sub-folder holding a checkpoint is served, by its model name (a folder "
        "holding none: a random tiny event model); default: the bundled models (the package aaren.models: in a "
        "checkout models/, in an installed wheel site-packages/aaren/models)",
    )
    default_model: str | None = Field(
        None,
        description="the model of requests that name none (a model name or its folder); default: the folder "
        "'default', else the first folder",
    )
    device: str = Field("auto", description="torch device: auto (CUDA when present), cpu, cuda, cuda:N")
    store_url: str = Field(
        "memory://",
        description="session store URL: memory:// (?capacity=N), redis://, rediss:// (TLS), redis+cluster://, "
        "rediss+cluster:// (?prefix=, timeout_s=, tombstone_ttl_s=, and redis-py options)",
    )
    on_model_mismatch: Literal["refuse", "reset"] = Field(
        "refuse",
        description="a stored state written by another model version: refuse its events (FAILED_PRECONDITION), "
        "or reset it to a fresh state and go on from its last seq",
    )
    store_check_interval_s: float = Field(
        1.0, gt=0, description="how often the store's health is checked (health service and aaren_store_up)"
    )
    session_capacity: PositiveInt = Field(
        100_000,
        description="sessions the memory store holds per served model before LRU eviction (Redis: bounded by "
        "its maxmemory)",
    )
    idle_ttl_s: float = Field(3600.0, gt=0, description="a session idle this long is evicted")
    frontends: int = Field(
        -1,
        ge=-1,
        description="gRPC front-end processes beside the engine core's process, sharing the port (SO_REUSEPORT); "
        "0: one process does everything (embedded use); -1: by the CPUs this process may use (its affinity cut to "
        "its cgroup's quota): one process below 4, else one front end per CPU beyond the first, at most 8",
    )
    max_batch_size: PositiveInt = Field(256, description="most sessions stepped in one batched model call")
    max_batch_events: PositiveInt = Field(
        2048,
        description="most events in one batch (a longer request is split over batches, in order; a session "
        "split so resumes from its stored state): bounds a batch's time, so gRPC is served between batches",
    )
    max_batch_wait_ms: float = Field(
        0.0,
        ge=0,
        description="how long the batcher waits for a batch to fill; 0: never wait, batches form while "
        "the previous one computes (lowest latency when idle, full batches under load)",
    )
    io_pause_ms: float = Field(
        0.5,
        ge=0,
        description="pause between batches while a full batch of events waits, for gRPC's reads and writes: "
        "at 64 streams x "
        "64 sessions, 0 served streams unevenly (p99 0.9-1.2 s, p50 0.11 s); 0.5 ms: p99 0.29-0.30 s, same "
        "throughput",
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto",
        description="the event loop the server's processes run on: uvloop where it is installed (auto), uvloop "
        "(an error where it is not), or asyncio's own (aaren.event_loop)",
    )
    model_thread: bool = Field(
        False,
        description="run batched model calls on a worker thread (keeps gRPC responsive during long batches); "
        "off: on the event loop, which avoids GIL hand-offs and is faster on small CPUs",
    )
    torch_threads: int = Field(
        1,
        ge=0,
        description="torch intra-op threads (0: torch's default). Batched steps are small ops that gain "
        "little from threads, and spinning OpenMP workers steal the core gRPC needs",
    )
    kernel_threads: int = Field(
        -1,
        ge=-1,
        description="threads one call of the compiled event kernel may split a large batch across, 128 rows or "
        "more a thread (aaren_core.tasks.event.row_parts; the same numbers bit for bit); -1: the CPUs this process "
        "may use beyond its front ends' (--frontends), at most 4; 1: one thread. On 2 CPUs a 256-event batch's "
        "kernel took 0.73 of its one-thread time (bench/results/round_row_parts.md)",
    )
    compile_model: bool = Field(
        False,
        description="torch.compile the batched step and the forecast while the server loads, tens of seconds "
        "(inductor; needs a C++ compiler on CPU, else the server warns and serves the eager torch path), in place "
        "of the default: on CPU an Aaren event model's batches of single events run in one compiled numba kernel "
        "(about 25x the eager torch path at one session, 1.5x at 256: bench/results/kernel.md), so this pays only "
        "where the kernel does not serve (a GPU, other backbones)",
    )
    gc_threshold: int = Field(
        20_000,
        ge=0,
        description="allocations between collections of Python's youngest GC generation (0: Python's "
        "default, 700). Requests make no reference cycles, so a rare collection loses nothing; the default "
        "collections cut the runtime's own throughput from 39k to 24k events/s (in-process, 64 x 64 sessions)",
    )
    max_inflight_requests_per_stream: PositiveInt = Field(
        256, description="requests one stream may have unanswered before the server stops reading it"
    )
    max_events_per_request: PositiveInt = Field(10_000, description="most events in one stream message")
    max_message_bytes: PositiveInt = Field(4 * 1024 * 1024, description="largest gRPC message accepted")
    max_session_id_bytes: PositiveInt = Field(256, description="longest session id, UTF-8 bytes")
    max_horizon: PositiveInt = Field(64, description="most steps ahead a Forecast call may sample")
    max_num_samples: PositiveInt = Field(1000, description="most sampled paths per Forecast call")
    default_num_samples: PositiveInt = Field(100, description="sampled paths when a Forecast call names none")
    default_top_k: PositiveInt = Field(3, description="most likely marks in a forecast when a request names none")
    quantiles: tuple[float, ...] = Field((0.1, 0.5, 0.9), description="gap quantile levels in every forecast")
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain of the gRPC port (TLS)")
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file")
    tls_client_ca_file: Path | None = Field(
        None, description="PEM CA bundle: clients must present a certificate it signed (mutual TLS)"
    )
    plaintext: bool = Field(
        False,
        description="serve gRPC without TLS on a non-loopback address (e.g. behind a TLS-terminating mesh); "
        "without TLS files, only a loopback address may be plaintext",
    )
    auth_tokens_file: Path | None = Field(
        None,
        description="bearer tokens, one '<tenant> sha256:<hex>' per line (`aaren token TENANT` makes one); "
        "sessions are then scoped per tenant. Unset: no authentication, one tenant",
    )
    max_streams_per_connection: PositiveInt = Field(
        100, description="concurrent streams on one connection (HTTP/2 flow control: the client waits)"
    )
    max_streams_per_tenant: PositiveInt = Field(
        1000, description="concurrent Stream calls of one tenant (past it: RESOURCE_EXHAUSTED)"
    )
    max_sessions_per_tenant: PositiveInt = Field(
        1_000_000,
        description="sessions one tenant may hold, of all served models together (new sessions past it: "
        "RESOURCE_EXHAUSTED)",
    )
    tenant_events_per_s: float = Field(
        0.0, ge=0, description="events/s one tenant may send, token bucket (0: unlimited)"
    )
    tenant_burst_events: PositiveInt = Field(
        50_000, description="token bucket size of tenant_events_per_s: the largest burst"
    )
    max_pending_events: PositiveInt = Field(
        200_000, description="events accepted and not yet answered, all streams together (past it: RESOURCE_EXHAUSTED)"
    )
    keepalive_time_s: float = Field(
        60.0, gt=0, description="server pings an idle connection this often to find dead peers"
    )
    keepalive_timeout_s: float = Field(20.0, gt=0, description="a ping unanswered this long closes the connection")
    min_client_ping_interval_s: float = Field(
        10.0, gt=0, description="clients may ping this often (also without calls) before the server sends GOAWAY"
    )
    max_connection_age_s: float = Field(
        0.0,
        ge=0,
        description="close connections after this age (GOAWAY, then max_connection_age_grace_s), so that clients "
        "re-resolve and spread over new replicas; 0: never",
    )
    max_connection_age_grace_s: float = Field(30.0, ge=0, description="how long a closing connection may finish")
    metrics_address: str = Field("127.0.0.1", description="Prometheus /metrics bind host")
    metrics_port: int = Field(9464, ge=-1, description="Prometheus /metrics port; 0 picks a free one, -1 disables")
    drain_grace_s: float = Field(10.0, ge=0, description="on SIGTERM, how long in-flight work may finish")
    consume_source: str | None = Field(
        None,
        description="also forecast the events of this log: redis-stream://host:port/STREAM (?group=, consumer=, "
        "start=0|$, db=) or nats://host:port/SUBJECT (?stream=, durable=, ack_wait_s=, start=); needs consume_sink",
    )
    consume_sink: str | None = Field(
        None,
        description="the log the consumed events' forecasts go to, each once: redis-stream://host:port/STREAM "
        "(?dead_letter=, maxlen=, dedup_ttl_s=, db=) or nats://host:port/SUBJECT (?stream=, dead_letter=, "
        "duplicate_window_s=)",
    )
    consume_member: str = Field(
        "0/1", description="this consumer is member i of n (i/n): it applies the sessions whose id hashes to i"
    )
    consume_batch: int = Field(256, ge=1, le=8192, description="log messages read and applied at once")
    consume_gap_wait_s: float = Field(
        30.0, ge=0, description="how long an event after a seq gap waits for the gap to fill before it is a dead letter"
    )
    consume_format: Literal["same", "json", "protobuf"] = Field(
        "same", description="the forecasts' encoding: that of their event (same), JSON or protobuf"
    )
    consume_target: str | None = Field(
        None,
        description="aaren consume only: send the events to the aaren server at this host:port (aaren.v1) instead "
        "of loading a model in the consumer",
    )
    log_level: str = Field("INFO", description="logging level")

    @field_validator("kernel_threads")
    @classmethod
    def _threads_or_auto(cls, v: int) -> int:
        if v == 0:
            raise ValueError("kernel_threads: expected -1 (by the CPUs) or a count of 1 or more, got 0")
        return v

    @field_validator("quantiles")
    @classmethod
    def _levels_in_unit_interval(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or any(not 0 < q < 1 for q in value) or list(value) != sorted(set(value)):
            raise ValueError(f"quantiles must be increasing levels in (0, 1); got {value}")
        return value
