"""Assembles and runs the server: model, store, engine core, gRPC front ends, metrics.

Two process layouts (docs/architecture.md section 2, "Process layout"), the same promises in each:

- ``frontends = 0``: one process; the gRPC front end calls the engine core directly (embedded
  use, most tests);
- ``frontends = N``: this process is the engine core (model, store, batcher) and starts N
  front-end processes on the same port, which parse, check and encode, and reach the core over
  IPC. A front end that dies is started again; when the core dies, the front ends answer
  NOT_SERVING and UNAVAILABLE, then stop. Metrics are served here, summed over the processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry, start_http_server

from aaren import event_loop
from aaren.server.contract.errors import ConfigError
from aaren.server.core.engine_core import EngineCore
from aaren.server.frontends.aaren_v1.servicer import ForecastServicer
from aaren.server.frontends.eventlog.answerers import CoreAnswerer
from aaren.server.frontends.eventlog.consumer import LogConsumer
from aaren.server.frontends.eventlog.service import consumer_of, describe
from aaren.server.frontends.grpc_server import READY_PREFIX, GrpcFrontEnd, server_credentials, spec_environment
from aaren.server.ipc.core_side import CoreServer
from aaren.server.observability.metrics import AggregatedCollector, Metrics
from aaren.server.settings import ServerSettings, bundled_repository
from aaren.server.stores import StateLayout, model_store_url, open_store
from aaren.server.stores.factory import redact_url
from aaren.server.tasks.event.task import resolve_device
from aaren.server.tasks.repository import load_models
from aaren_core.tasks.event import row_parts

__all__ = ["AarenServer", "apply_threads", "resolve_frontends", "resolve_kernel_threads", "run"]

log = logging.getLogger("aaren.server")

FRONTEND_START_TIMEOUT_S = 60.0
#: How long start-up waits for the consumed log to answer before the first health check.
CONSUMER_OPEN_WAIT_S = 5.0
RESTART_BACKOFF_S = 0.5


#: ``--frontends -1`` runs in one process below this many usable CPUs: on 2 CPUs one process served
#: more events per second than a core with one front end in every cell measured (1, 16 and 64 sessions,
#: bench/results/path_and_kernel_layouts.md): a front end's parsing gains nothing without a CPU of its own.
MIN_CPUS_FOR_FRONTENDS = 4


def resolve_frontends(setting: int, cpus: int | None = None) -> int:
    """``-1`` (auto): in one process (0) below ``MIN_CPUS_FOR_FRONTENDS`` usable CPUs, else one front
    end per usable CPU beside the engine core's, at most 8; ``cpus`` defaults to ``usable_cpus()``."""
    if setting >= 0:
        return setting
    cpus = usable_cpus() if cpus is None else cpus
    return 0 if cpus < MIN_CPUS_FOR_FRONTENDS else min(8, cpus - 1)


#: ``--kernel-threads -1`` splits a large batch over at most this many threads: unmeasured beyond 2 CPUs; with parts
#: of 128 rows or more (row_parts.MIN_PART_ROWS) the default 256 sessions a batch fill 2, a --max-batch-size of 512, 4
MAX_KERNEL_THREADS = 4


def resolve_kernel_threads(setting: int, frontends: int, cpus: int | None = None) -> int:
    """``-1`` (auto): the usable CPUs beyond one for each of ``frontends`` front-end processes, at least 1 and at
    most ``MAX_KERNEL_THREADS``; ``cpus`` defaults to ``usable_cpus()``. A count stands."""
    if setting >= 1:
        return setting
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, min(MAX_KERNEL_THREADS, cpus - frontends))


def apply_threads(settings: ServerSettings, frontends: int) -> None:
    """The process's compute threads as ``settings`` ask, for a process with ``frontends`` front ends beside it:
    torch's intra-op threads (``torch_threads``) and the event kernel's (``kernel_threads``, ``row_parts``)."""
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    row_parts.set_threads(resolve_kernel_threads(settings.kernel_threads, frontends))


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity, cut to its cgroup's CPU quota where one is set (a
    container limited to 2 CPUs on a 64-core host counts 2)."""
    return cpus_within(len(os.sched_getaffinity(0)), cgroup_cpu_quota())


def cpus_within(affinity: int, quota: float | None) -> int:
    """``affinity`` CPUs, at most ``ceil(quota)`` of them (a quota of 1.5 CPUs keeps 2 busy), at least 1."""
    return max(1, affinity if quota is None else min(affinity, math.ceil(quota)))


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """This process's CPU quota in CPUs (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``), None where there is none or it cannot be read."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    own = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "/")
    for folder in (root / own.lstrip("/"), root):
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if quota == "max" else int(quota) / int(period)
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


class AarenServer:
    """One server. ``await start()`` binds (``grpc_port`` / ``metrics_port`` tell the ports),
    ``await stop()`` drains and shuts down."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.frontends = resolve_frontends(settings.frontends)
        self.metrics = Metrics()
        self.grpc_port = 0
        self.metrics_port = 0
        self.front: GrpcFrontEnd | None = None
        self.core: EngineCore | None = None
        self.core_server: CoreServer | None = None
        self.processes: list[subprocess.Popen[bytes] | None] = []
        self._http: tuple[object, threading.Thread] | None = None
        self._stopped = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._socket_dir: str | None = None
        self._key = secrets.token_hex(32)
        self._serving: bool | None = None  # None until the first store check: that one is always said
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The event-log consumer (``consume_source``), run beside the gRPC front ends.
        self.consumer: LogConsumer | None = None
        self._consuming: asyncio.Task[None] | None = None

    @property
    def servicer(self) -> ForecastServicer | None:
        return self.front.servicer if self.front is not None else None

    async def _stores_healthy(self) -> bool:
        """Every served model's store answers (one Redis usually holds them all)."""
        assert self.core is not None
        for m in self.core.models.values():
            if not await m.store.healthy():
                return False
        return True

    async def start(self) -> None:
        s = self.settings
        self._loop = asyncio.get_running_loop()
        server_credentials(s)  # refuses a plaintext non-loopback address (or missing TLS files) before anything starts
        if not self.frontends:
            self.front = await GrpcFrontEnd.start(s, self.metrics)  # NOT_SERVING while the model loads
            self.grpc_port = self.front.port

        apply_threads(s, self.frontends)
        device = resolve_device(s.device)
        served = await asyncio.to_thread(
            load_models,
            checkpoint=s.checkpoint,
            models_dir=s.models_dir or bundled_repository(),
            default_model=s.default_model,
            device=device,
            quantiles=s.quantiles,
            compile_model=s.compile_model,
        )
        task = served.default
        stores = [
            open_store(
                model_store_url(
                    s.store_url, task.description.name, default=task.description.name == served.legacy_keys
                ),
                StateLayout(task.layout_rows()),
                capacity=s.session_capacity,
                idle_ttl_s=s.idle_ttl_s,
            )
            for task in served.tasks
            for name in [task.description.name]
        ]
        store = stores[0]
        self.core = EngineCore(
            task, store, s, self.metrics, more=list(zip(served.tasks[1:], stores[1:], strict=True)),
            aliases=served.aliases,
        )  # fmt: skip
        await self.core.start()
        registry = self.metrics.registry
        if self.front is not None:
            self.front.attach(self.core)
        else:
            await self._start_frontends()
            registry = CollectorRegistry()
            registry.register(AggregatedCollector(self.metrics.registry, self._remote_metrics))
        if s.metrics_port >= 0:
            self._http = start_http_server(s.metrics_port, addr=s.metrics_address, registry=registry)
            self.metrics_port = self._http[0].server_port  # type: ignore[attr-defined]
        # The model and everything loaded so far live as long as the server: keep them out of the
        # cyclic collector's scans, which otherwise walk them on every full collection.
        gc.collect()
        gc.freeze()
        if s.gc_threshold:
            gc.set_threshold(s.gc_threshold, *gc.get_threshold()[1:])
        if s.consume_source or s.consume_sink:
            codec = ForecastServicer(s, self.metrics)
            codec.attach(self.core)
            self.consumer = consumer_of(s, CoreAnswerer(codec), self.metrics)
            self._consuming = asyncio.create_task(self.consumer.run(), name="aaren-log-consumer")
            log.info("%s", describe(s))
            # The first health check after the log is reached (a source that is down stays NOT_SERVING).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.consumer.opened.wait(), CONSUMER_OPEN_WAIT_S)
        await self._set_serving(await self._healthy())
        self._tasks.append(asyncio.create_task(self._watch_store(), name="aaren-store-health"))
        d = task.description
        log.info(
            "serving %s (%s, %s backbone, %d parameters) on port %d, device %s, store %s, metrics %s, %s%s",
            d.name,
            d.version,
            d.backbone,
            d.parameters,
            self.grpc_port,
            d.device,
            redact_url(s.store_url),
            f"on port {self.metrics_port}" if s.metrics_port >= 0 else "off",
            f"{self.frontends} front-end processes" if self.frontends else "front end in process",
            "".join(f"; also model {t.description.name} ({t.description.task})" for t in served.tasks[1:]),
        )

    # ------------------------------------------------------------------ front-end processes

    async def _start_frontends(self) -> None:
        assert self.core is not None
        self._socket_dir = tempfile.mkdtemp(prefix="aaren-core-")  # mode 0700: only this user enters
        self.core_server = CoreServer(self.core, os.path.join(self._socket_dir, "core.sock"), self._key)
        await self.core_server.start()
        self.processes = [None] * self.frontends
        host, port = self.settings.address.rsplit(":", 1)
        # Hold the port (SO_REUSEPORT, bound but not listening: the kernel hands connections only to
        # listening sockets) so that every front end can start at once on a port known in advance.
        with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as holder:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            holder.bind((host.strip("[]"), int(port)))
            self.grpc_port = holder.getsockname()[1]
            await asyncio.gather(*(self._spawn(index, self.grpc_port) for index in range(self.frontends)))
        for index in range(self.frontends):
            self._tasks.append(asyncio.create_task(self._supervise(index), name=f"aaren-frontend-{index}"))

    async def _spawn(self, index: int, port: int) -> int:
        assert self.core_server is not None
        env = spec_environment(self.settings, self.core_server.path, self._key, index, port)
        process = subprocess.Popen(
            [sys.executable, "-m", "aaren.server.frontends.grpc_server"],
            env=env,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        self.processes[index] = process
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), FRONTEND_START_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            raise RuntimeError(f"front end {index} did not start within {FRONTEND_START_TIMEOUT_S:.0f} s") from None
        text = line.decode(errors="replace").strip()
        if not text.startswith(READY_PREFIX):
            process.wait(10)
            raise ConfigError(f"front end {index} did not start (exit code {process.returncode}): {text!r}")
        return int(text[len(READY_PREFIX) :])

    async def _supervise(self, index: int) -> None:
        """Start front end ``index`` again whenever it dies, until the server stops."""
        while not self._stopping:
            process = self.processes[index]
            assert process is not None
            code = await asyncio.to_thread(process.wait)
            if self._stopping:
                return
            log.error("front end %d (pid %d) exited with code %s: starting it again", index, process.pid, code)
            self.metrics.frontend_restarts.inc()
            await asyncio.sleep(RESTART_BACKOFF_S)
            try:
                await self._spawn(index, self.grpc_port)
            except Exception:
                log.exception("front end %d did not start again", index)

    def _remote_metrics(self) -> list:
        """The front ends' metric families, fetched on the core's loop (called by the HTTP thread)."""
        if self.core_server is None or self._loop is None:
            return []
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is self._loop:
                return []  # called on the loop itself: waiting for it would only time out
        future = asyncio.run_coroutine_threadsafe(self.core_server.collect_metrics(), self._loop)
        try:
            return future.result(timeout=5)
        except Exception:
            log.warning("front ends did not report their metrics in time")
            return []

    # ------------------------------------------------------------------ health

    async def _set_serving(self, checks: tuple[bool, bool]) -> None:
        """Health (and ``aaren_store_up``) after a check of the store and of the consumed log's source
        (True where none is consumed); a change, and the first check, are logged.

        The first check is logged even when it fails: a server started while its store is down
        would otherwise stay NOT_SERVING without a word."""
        store_ok, source_ok = checks
        self.metrics.store_up.set(1 if store_ok else 0)
        serving = store_ok and source_ok
        if serving == self._serving:
            return
        self._serving = serving
        if not store_ok:
            log.error(
                "session store %s is not answering: health NOT_SERVING until it does",
                redact_url(self.settings.store_url),
            )
        elif not source_ok:
            log.error("the consumed log's source is not answering: health NOT_SERVING until it does")
        else:
            log.info("session store answers: health SERVING")
        if self.front is not None:
            await self.front.set_serving(serving)
        if self.core_server is not None:
            self.core_server.set_serving(serving)

    async def _watch_store(self) -> None:
        """Health follows the store (and a consumed log): NOT_SERVING while it does not answer,
        SERVING again when it does."""
        assert self.core is not None
        while True:
            await asyncio.sleep(self.settings.store_check_interval_s)
            await self._set_serving(await self._healthy())

    async def _healthy(self) -> tuple[bool, bool]:
        """Whether every store answers, and whether the consumed log's source does (True: none)."""
        return await self._stores_healthy(), self.consumer is None or await self.consumer.source.healthy()

    # ------------------------------------------------------------------ stopping

    async def stop(self, grace: float | None = None) -> None:
        """Drain: health NOT_SERVING, refuse new events, answer accepted ones, close streams, stop."""
        if self._stopped.is_set() or self._stopping:
            return
        self._stopping = True
        grace = self.settings.drain_grace_s if grace is None else grace
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.consumer is not None and self._consuming is not None:
            self.consumer.stop()  # the batch in hand is published and acknowledged first
            try:
                await asyncio.wait_for(asyncio.shield(self._consuming), timeout=grace + 5)
            except (TimeoutError, Exception):
                log.warning("the log consumer did not finish its batch: what it did not acknowledge comes again")
                self._consuming.cancel()
            for log_end in (self.consumer.source, self.consumer.sink):
                with contextlib.suppress(Exception):
                    await log_end.close()
        if self.front is not None:
            await self.front.health.enter_graceful_shutdown()
            self.front.draining = True
        if self.core is not None:
            self.core.draining = True
        if self.core_server is not None:
            self.core_server.broadcast(("drain",))
            await asyncio.to_thread(self._wait_frontends, grace + 10)
        if self.core is not None:
            try:
                await asyncio.wait_for(self.core.drain(), timeout=grace)
            except TimeoutError:
                log.warning("drain did not finish within %.1f s", grace)
        if self.front is not None:
            await self.front.stop(grace)
        if self.core_server is not None:
            await self.core_server.close()
            with contextlib.suppress(OSError):
                os.rmdir(self._socket_dir or "")
        if self.core is not None:
            await self.core.close()
        if self._http is not None:
            server, thread = self._http
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
            thread.join(timeout=5)
        self._stopped.set()

    def _wait_frontends(self, timeout: float) -> None:
        for index, process in enumerate(self.processes):
            if process is None:
                continue
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("front end %d did not stop within %.0f s: killing it", index, timeout)
                process.kill()
                process.wait(10)

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()


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
    log.info("event loop: %s", event_loop.resolve(settings.event_loop))
    try:
        await server.start()
    except ConfigError as exc:
        raise SystemExit(f"aaren serve: {exc}") from None
    metrics = f"metrics on port {server.metrics_port}" if settings.metrics_port >= 0 else "metrics off"
    if server.consumer is not None:
        metrics += f"; {describe(settings)}"
    # Scripts wait for this line (tests/server/server_helpers.py, bench/): keep its shape.
    print(f"aaren: listening on port {server.grpc_port}, {metrics}", flush=True)
    await server.wait_for_termination()
    log.info("stopped")


def run(settings: ServerSettings) -> None:
    """Run the server until SIGTERM or SIGINT."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.checkpoint is not None and not Path(settings.checkpoint).exists():
        raise SystemExit(f"checkpoint {settings.checkpoint} does not exist")
    if settings.models_dir is not None and not Path(settings.models_dir).is_dir():
        raise SystemExit(f"models_dir {settings.models_dir} is not a directory")
    try:
        event_loop.resolve(settings.event_loop)
    except ValueError as exc:
        raise SystemExit(f"aaren serve: {exc}") from None
    event_loop.run(_serve(settings), settings.event_loop)
