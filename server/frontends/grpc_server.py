"""gRPC front ends: the server every layout runs, and the front-end process of the multi-process layout.

``GrpcFrontEnd`` is one grpc.aio server with everything a client reaches: aaren.v1's
``ForecastService`` (``ForecastServicer``), the health service, reflection, token authentication
and the malformed-request interceptor. With ``--frontends 0`` the server process runs one in
process beside the engine core; with ``--frontends N`` it starts N front-end processes
(``python -m aaren.server.frontends.grpc_server``), each a ``GrpcFrontEnd`` on the same port (SO_REUSEPORT:
the kernel spreads connections over them) talking to the core over IPC (``aaren.server.ipc.client_side``).
A front-end process never imports torch: it parses, checks, and encodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import ipaddress
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from aaren import event_loop
from aaren.server.contract.core_api import CoreAPI
from aaren.server.contract.errors import ConfigError
from aaren.server.frontends.aaren_v1.servicer import ForecastServicer, add_forecast_servicer_to_server
from aaren.server.frontends.oip.servicer import OipServicer, add_oip_servicer_to_server
from aaren.server.frontends.reflection import enable_server_reflection
from aaren.server.ipc.client_side import CoreClient
from aaren.server.ipc.framing import KEY_ENV
from aaren.server.observability.metrics import Metrics, families_of
from aaren.server.security.auth import AuthError, TokenTable
from aaren.server.security.interceptors import MalformedRequestInterceptor, TokenAuthInterceptor
from aaren.server.settings import ServerSettings
from aaren.v1 import aaren_pb2

__all__ = ["SERVICE_NAME", "GrpcFrontEnd", "grpc_options", "server_credentials"]

log = logging.getLogger(__name__)

SERVICE_NAME = aaren_pb2.DESCRIPTOR.services_by_name["ForecastService"].full_name
SPEC_ENV = "AAREN_FRONTEND_SPEC"
#: The line a front-end process prints once it listens (its parent reads the port from it).
READY_PREFIX = "aaren-frontend: listening on port "
#: How long front ends answer NOT_SERVING / UNAVAILABLE after their core died, before they stop.
LOST_CORE_LINGER_S = 5.0


@dataclasses.dataclass
class GrpcFrontEnd:
    server: grpc.aio.Server
    health: health_aio.HealthServicer
    servicer: ForecastServicer
    port: int
    #: The Open Inference Protocol (Triton's GRPCInferenceService) on the same port.
    oip: OipServicer

    @classmethod
    async def start(
        cls, settings: ServerSettings, metrics: Metrics, *, reuse_port: bool = False, serve_now: bool = True
    ) -> GrpcFrontEnd:
        """Build, bind and start the server; health answers NOT_SERVING until ``set_serving``. ``serve_now``
        False: bound (its port known, connections queue in the socket's backlog) but not serving until
        ``serve`` (a front-end process serves once it has attached to the core)."""
        s = settings
        credentials = server_credentials(s)
        interceptors: list[grpc.aio.ServerInterceptor] = [MalformedRequestInterceptor()]
        if s.auth_tokens_file is not None:
            try:
                table = TokenTable.load(s.auth_tokens_file)
            except (AuthError, OSError) as exc:
                raise ConfigError(f"auth_tokens_file: {exc}") from None
            refused = metrics.auth_refusals
            interceptors.append(TokenAuthInterceptor(table, on_refused=lambda reason: refused.labels(reason).inc()))
            log.info("authentication on: %d tokens of %d tenants", len(table.digests), len(table.tenants))
        server = grpc.aio.server(options=grpc_options(s, reuse_port=reuse_port), interceptors=interceptors)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        for name in ("", SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        enable_server_reflection((SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name), server)
        servicer = ForecastServicer(s, metrics)
        add_forecast_servicer_to_server(servicer, server)
        oip = OipServicer(s, metrics)
        add_oip_servicer_to_server(oip, server)
        if credentials is None:
            port = server.add_insecure_port(s.address)
        else:
            port = server.add_secure_port(s.address, credentials)
        if port == 0:
            raise OSError(f"could not bind the gRPC address {s.address!r}")
        front = cls(server, health, servicer, port, oip)
        if serve_now:
            await front.serve()
        return front

    async def serve(self) -> None:
        """Start answering on the bound port."""
        await self.server.start()

    def attach(self, core: CoreAPI) -> None:
        """Serve every protocol through ``core`` (an ``EngineCore`` or the IPC client of one)."""
        self.servicer.attach(core)
        self.oip.attach(core)

    @property
    def draining(self) -> bool:
        return self.servicer.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.servicer.draining = self.oip.draining = value

    async def set_serving(self, serving: bool) -> None:
        self.oip.serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)  # ignored once draining: health stays NOT_SERVING

    async def stop(self, grace: float) -> None:
        self.servicer.close_streams()
        self.oip.close_streams()
        await self.server.stop(grace)


def grpc_options(s: ServerSettings, *, reuse_port: bool = False) -> list[tuple[str, int]]:
    """Channel arguments of the server: message sizes, streams per connection, keepalive.

    ``reuse_port``: the front-end processes of one server share its port (SO_REUSEPORT); otherwise
    off, so that a second server on a taken port fails instead of silently sharing it. The keepalive
    policy accepts pings from clients every ``min_client_ping_interval_s`` (also between calls), so
    clients whose keepalive is at least that long never get GOAWAY ``too_many_pings``.
    """
    ms = lambda seconds: int(seconds * 1000)  # noqa: E731
    options = [
        ("grpc.max_receive_message_length", s.max_message_bytes),
        ("grpc.max_send_message_length", max(s.max_message_bytes, 64 * 1024 * 1024)),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
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


def server_credentials(s: ServerSettings, *, quiet: bool = False) -> grpc.ServerCredentials | None:
    """TLS (and, with a client CA, mutual TLS) credentials from files; None for plaintext, which is
    allowed on a loopback address or when ``plaintext`` is set, and said loudly (unless ``quiet``)."""
    if s.tls_cert_file is None and s.tls_key_file is None:
        if s.tls_client_ca_file is not None:
            raise ConfigError("tls_client_ca_file needs tls_cert_file and tls_key_file (mutual TLS is TLS first)")
        if not s.plaintext and not _is_loopback(s.address):
            raise ConfigError(
                f"refusing to serve plaintext gRPC on {s.address}: set tls_cert_file and tls_key_file, or "
                "plaintext=true when a proxy or mesh terminates TLS in front of this server"
            )
        if not quiet:
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
    if not quiet:
        log.info("TLS on %s%s", s.address, " with client certificates required (mutual TLS)" if client_ca else "")
    return grpc.ssl_server_credentials(
        [(Path(s.tls_key_file).read_bytes(), Path(s.tls_cert_file).read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


# ---------------------------------------------------------------------- the front-end process


def spec_environment(settings: ServerSettings, socket_path: str, key: str, index: int, port: int) -> dict[str, str]:
    """The environment of front-end process ``index`` (its settings, the core's socket and key)."""
    host = settings.address.rsplit(":", 1)[0]
    spec = {
        "settings": json.loads(settings.model_dump_json()),
        "address": f"{host}:{port}",
        "socket": socket_path,
        "index": index,
    }
    return {**os.environ, SPEC_ENV: json.dumps(spec), KEY_ENV: key}


async def _serve_front_end(settings: ServerSettings, socket_path: str, key: str, index: int) -> int:
    metrics = Metrics()
    # Bound now, served once attached: the port is shared (SO_REUSEPORT) with the other front ends, and a front end
    # started again beside them would otherwise answer "loading" to the connections the kernel hands it between
    # its bind and its attach (the core's handshake); they wait in its backlog instead.
    front = await GrpcFrontEnd.start(settings, metrics, reuse_port=True, serve_now=False)
    stopped = asyncio.Event()
    exit_code = 0

    async def on_serving(serving: bool) -> None:
        await front.set_serving(serving)

    async def drain() -> None:
        """Finish what was accepted, then end every stream (UNAVAILABLE) and stop."""
        if stopped.is_set():
            return
        await front.health.enter_graceful_shutdown()
        front.draining = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(settings.drain_grace_s):
                while client.pending:
                    await asyncio.sleep(0.005)
        await front.stop(settings.drain_grace_s)
        stopped.set()

    async def on_lost() -> None:
        """The core is gone: NOT_SERVING, every unanswered request UNAVAILABLE, then stop (a while
        later, so that health checkers see NOT_SERVING rather than a refused connection)."""
        nonlocal exit_code
        if front.servicer.draining:
            return
        exit_code = 1
        log.error("the engine core is gone: health NOT_SERVING, requests UNAVAILABLE; front end %d stops", index)
        await front.health.enter_graceful_shutdown()
        front.draining = True
        front.servicer.close_streams()
        front.oip.close_streams()
        await asyncio.sleep(LOST_CORE_LINGER_S)
        await front.stop(0)
        stopped.set()

    reports = {"metrics": lambda: families_of(metrics.registry), "oip_statistics": front.oip.statistics}
    client = CoreClient(socket_path, key, index, on_serving, on_lost, drain, reports)
    await client.connect()
    front.attach(client)
    await front.serve()
    await front.set_serving(client.serving)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(drain()))
    gc.collect()
    gc.freeze()
    if settings.gc_threshold:
        gc.set_threshold(settings.gc_threshold, *gc.get_threshold()[1:])
    print(f"{READY_PREFIX}{front.port}", flush=True)
    await stopped.wait()
    await client.close()
    return exit_code


def main() -> None:
    spec: dict[str, Any] = json.loads(os.environ[SPEC_ENV])
    settings = ServerSettings.model_validate({**spec["settings"], "address": spec["address"]})
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s[frontend {spec['index']}]: %(message)s",
    )
    try:
        code = event_loop.run(
            _serve_front_end(settings, spec["socket"], os.environ[KEY_ENV], int(spec["index"])), settings.event_loop
        )
    except ConfigError as exc:
        raise SystemExit(f"aaren front end: {exc}") from None
    sys.exit(code)


if __name__ == "__main__":
    main()
