"""Assembles and runs the server: model, store, runtime, gRPC (with health and reflection), metrics."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import signal
import threading
from pathlib import Path

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from prometheus_client import start_http_server

from aaren.server.auth import AuthError, TokenTable
from aaren.server.engine import load_engine, resolve_device
from aaren.server.errors import ConfigError
from aaren.server.interceptors import MalformedRequestInterceptor, TokenAuthInterceptor
from aaren.server.metrics import Metrics
from aaren.server.reflection import enable_server_reflection
from aaren.server.runtime import Runtime
from aaren.server.servicer import ForecastServicer
from aaren.server.settings import ServerSettings, bundled_checkpoint
from aaren.server.stores import StateLayout, open_store
from aaren.server.stores.factory import redact_url
from aaren.v1 import aaren_pb2, aaren_pb2_grpc

__all__ = ["AarenServer", "run"]

log = logging.getLogger("aaren.server")

SERVICE_NAME = aaren_pb2.DESCRIPTOR.services_by_name["ForecastService"].full_name


class AarenServer:
    """One server instance. ``await start()`` binds (``grpc_port`` / ``metrics_port`` tell the ports),
    ``await stop()`` drains and shuts down."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.health = health_aio.HealthServicer()
        self.grpc_port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._http: tuple[object, threading.Thread] | None = None
        self.runtime: Runtime | None = None
        self.servicer: ForecastServicer | None = None
        self._stopped = asyncio.Event()
        self._store_watch: asyncio.Task[None] | None = None
        self._serving = False

    def _checkpoint(self) -> str | None:
        if self.settings.checkpoint is not None:
            return str(self.settings.checkpoint)
        bundled = bundled_checkpoint()
        return str(bundled) if (bundled / "config.json").is_file() else None

    async def start(self) -> None:
        s = self.settings
        credentials = server_credentials(s)  # refuses a plaintext non-loopback address before anything starts
        interceptors: list[grpc.aio.ServerInterceptor] = [MalformedRequestInterceptor()]
        if s.auth_tokens_file is not None:
            try:
                table = TokenTable.load(s.auth_tokens_file)
            except (AuthError, OSError) as exc:
                raise ConfigError(f"auth_tokens_file: {exc}") from None
            refused = self.metrics.auth_refusals
            interceptors.append(TokenAuthInterceptor(table, on_refused=lambda reason: refused.labels(reason).inc()))
            log.info("authentication on: %d tokens of %d tenants", len(table.digests), len(table.tenants))
        self._server = grpc.aio.server(options=grpc_options(s), interceptors=interceptors)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name), self._server
        )
        self.servicer = ForecastServicer(s, self.metrics)
        aaren_pb2_grpc.add_ForecastServiceServicer_to_server(self.servicer, self._server)
        if credentials is None:
            self.grpc_port = self._server.add_insecure_port(s.address)
        else:
            self.grpc_port = self._server.add_secure_port(s.address, credentials)
        if self.grpc_port == 0:
            raise OSError(f"could not bind the gRPC address {s.address!r}")
        await self._server.start()  # health answers NOT_SERVING while the model loads

        if s.torch_threads:
            torch.set_num_threads(s.torch_threads)
        device = resolve_device(s.device)
        checkpoint = self._checkpoint()
        engine = await asyncio.to_thread(load_engine, checkpoint, device, s.quantiles, compile_model=s.compile_model)
        store = open_store(
            s.store_url, StateLayout(engine.layout_rows()), capacity=s.session_capacity, idle_ttl_s=s.idle_ttl_s
        )
        self.runtime = Runtime(engine, store, s, self.metrics)
        await self.runtime.start()
        self.servicer.attach(self.runtime)
        if s.metrics_port >= 0:
            self._http = start_http_server(s.metrics_port, addr=s.metrics_address, registry=self.metrics.registry)
            self.metrics_port = self._http[0].server_port  # type: ignore[attr-defined]
        # The model and everything loaded so far live as long as the server: keep them out of the
        # cyclic collector's scans, which otherwise walk them on every full collection.
        gc.collect()
        gc.freeze()
        if s.gc_threshold:
            gc.set_threshold(s.gc_threshold, *gc.get_threshold()[1:])
        await self._set_serving(await store.healthy())
        self._store_watch = asyncio.create_task(self._watch_store(), name="aaren-store-health")
        d = engine.description
        log.info(
            "serving %s (%s, %s backbone, %d parameters) on port %d, device %s, store %s, metrics port %s",
            d.name,
            d.version,
            d.backbone,
            d.parameters,
            self.grpc_port,
            d.device,
            redact_url(s.store_url),
            self.metrics_port if s.metrics_port >= 0 else "off",
        )

    async def _set_serving(self, store_ok: bool) -> None:
        self.metrics.store_up.set(1 if store_ok else 0)
        if store_ok == self._serving:
            return
        self._serving = store_ok
        status = health_pb2.HealthCheckResponse.SERVING if store_ok else health_pb2.HealthCheckResponse.NOT_SERVING
        if not store_ok:
            log.error(
                "session store %s is not answering: health NOT_SERVING until it does",
                redact_url(self.settings.store_url),
            )
        elif self.runtime is not None:
            log.info("session store answers: health SERVING")
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)  # ignored once draining: health stays NOT_SERVING

    async def _watch_store(self) -> None:
        """Health follows the store: NOT_SERVING while it does not answer, SERVING again when it does."""
        assert self.runtime is not None
        while True:
            await asyncio.sleep(self.settings.store_check_interval_s)
            await self._set_serving(await self.runtime.store.healthy())

    async def stop(self, grace: float | None = None) -> None:
        """Drain: health NOT_SERVING, refuse new events, answer accepted ones, close streams, stop."""
        if self._stopped.is_set():
            return
        grace = self.settings.drain_grace_s if grace is None else grace
        await self.health.enter_graceful_shutdown()
        if self._store_watch is not None:
            self._store_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._store_watch
        if self.runtime is not None:
            try:
                await asyncio.wait_for(self.runtime.drain(), timeout=grace)
            except TimeoutError:
                log.warning("drain did not finish within %.1f s", grace)
        if self.servicer is not None:
            self.servicer.close_streams()
        if self._server is not None:
            await self._server.stop(grace)
        if self.runtime is not None:
            await self.runtime.close()
        if self._http is not None:
            server, thread = self._http
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
            thread.join(timeout=5)
        self._stopped.set()

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()


def grpc_options(s: ServerSettings) -> list[tuple[str, int]]:
    """Channel arguments of the server: message sizes, streams per connection, keepalive.

    The keepalive policy accepts pings from clients every ``min_client_ping_interval_s`` (also
    between calls), so clients whose keepalive is at least that long never get GOAWAY
    ``too_many_pings``; the grpc default client sends no keepalive pings at all.
    """
    ms = lambda seconds: int(seconds * 1000)  # noqa: E731
    options = [
        ("grpc.max_receive_message_length", s.max_message_bytes),
        ("grpc.max_send_message_length", max(s.max_message_bytes, 64 * 1024 * 1024)),
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", s.max_streams_per_connection),
        ("grpc.keepalive_time_ms", ms(s.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", ms(s.keepalive_timeout_s)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", ms(s.min_client_ping_interval_s)),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", ms(s.min_client_ping_interval_s)),
        ("grpc.http2.max_ping_strikes", 2),
    ]
    if s.max_connection_age_s > 0:
        options += [
            ("grpc.max_connection_age_ms", ms(s.max_connection_age_s)),
            ("grpc.max_connection_age_grace_ms", ms(s.max_connection_age_grace_s)),
        ]
    return options


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_credentials(s: ServerSettings) -> grpc.ServerCredentials | None:
    """TLS (and, with a client CA, mutual TLS) credentials from files; None for plaintext, which is
    allowed on a loopback address or when ``plaintext`` is set, and said loudly."""
    if s.tls_cert_file is None and s.tls_key_file is None:
        if s.tls_client_ca_file is not None:
            raise ConfigError("tls_client_ca_file needs tls_cert_file and tls_key_file (mutual TLS is TLS first)")
        if not s.plaintext and not _is_loopback(s.address):
            raise ConfigError(
                f"refusing to serve plaintext gRPC on {s.address}: set tls_cert_file and tls_key_file, or "
                "plaintext=true when a proxy or mesh terminates TLS in front of this server"
            )
        log.warning(
            "PLAINTEXT gRPC on %s: events, session ids%s travel unencrypted",
            s.address,
            " and bearer tokens" if s.auth_tokens_file else "",
        )
        return None
    if s.tls_cert_file is None or s.tls_key_file is None:
        raise ConfigError("TLS needs both tls_cert_file and tls_key_file")
    for path in (s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"TLS file {path} does not exist")
    client_ca = Path(s.tls_client_ca_file).read_bytes() if s.tls_client_ca_file else None
    log.info("TLS on %s%s", s.address, " with client certificates required (mutual TLS)" if client_ca else "")
    return grpc.ssl_server_credentials(
        [(Path(s.tls_key_file).read_bytes(), Path(s.tls_cert_file).read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


async def _serve(settings: ServerSettings) -> None:
    server = AarenServer(settings)
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def on_signal(sig: signal.Signals) -> None:
        log.info("received %s: draining for up to %.1f s", sig.name, settings.drain_grace_s)
        if not stopping:
            stopping.append(asyncio.create_task(server.stop()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await server.start()
    except ConfigError as exc:
        raise SystemExit(f"aaren serve: {exc}") from None
    print(f"aaren: listening on port {server.grpc_port}, metrics on port {server.metrics_port}", flush=True)
    await server.wait_for_termination()
    log.info("stopped")


def run(settings: ServerSettings) -> None:
    """Run the server until SIGTERM or SIGINT."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.checkpoint is not None and not Path(settings.checkpoint).exists():
        raise SystemExit(f"checkpoint {settings.checkpoint} does not exist")
    asyncio.run(_serve(settings))
