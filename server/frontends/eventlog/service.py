"""A consumer from the server's settings, and ``aaren consume --target``: a consumer with no model.

``consumer_of(settings, answerer, metrics)`` builds the ``LogConsumer`` of ``consume_source`` and
``consume_sink``; ``aaren serve`` runs it beside its gRPC front ends, through the aaren.v1 codec over
its engine core (``aaren.server.app``). ``run_remote(settings)`` is the consumer alone in this
process, answered by the server at ``consume_target``: it serves its metrics and drains on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from prometheus_client import start_http_server

from aaren import event_loop
from aaren.server.contract.errors import ConfigError
from aaren.server.frontends.eventlog.addresses import Member, open_sink, open_source, redact
from aaren.server.frontends.eventlog.answerers import RemoteAnswerer
from aaren.server.frontends.eventlog.base import JSON, PROTOBUF
from aaren.server.frontends.eventlog.consumer import Answerer, ConsumerOptions, LogConsumer
from aaren.server.observability.metrics import Metrics
from aaren.server.settings import ServerSettings

__all__ = ["consumer_of", "run_remote"]

log = logging.getLogger("aaren.consume")

_FORMATS = {"same": None, "json": JSON, "protobuf": PROTOBUF}


def consumer_of(settings: ServerSettings, answerer: Answerer, metrics: Metrics) -> LogConsumer:
    """The consumer the settings describe; ``ConfigError`` for a setting that cannot work."""
    s = settings
    if not s.consume_source or not s.consume_sink:
        raise ConfigError("consuming a log needs both consume_source and consume_sink (--source and --sink)")
    member = Member.parse(s.consume_member)
    options = ConsumerOptions(
        batch=s.consume_batch, gap_wait_s=s.consume_gap_wait_s, content_type=_FORMATS[s.consume_format]
    )
    source, sink = open_source(s.consume_source, member), open_sink(s.consume_sink)
    return LogConsumer(source, sink, answerer, metrics, member, options)


def describe(settings: ServerSettings) -> str:
    """What the consumer does, for the log (no passwords)."""
    s = settings
    return (
        f"consuming {redact(s.consume_source or '')} into {redact(s.consume_sink or '')} "
        f"as member {s.consume_member}, batches of {s.consume_batch}"
    )


async def _run_remote(settings: ServerSettings) -> None:
    assert settings.consume_target is not None
    metrics = Metrics()
    answerer = RemoteAnswerer(settings.consume_target)
    try:
        consumer = consumer_of(settings, answerer, metrics)
    except ConfigError as exc:
        raise SystemExit(f"aaren consume: {exc}") from None
    http = None
    if settings.metrics_port >= 0:
        http = start_http_server(settings.metrics_port, addr=settings.metrics_address, registry=metrics.registry)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, consumer.stop)
    port = http[0].server_port if http is not None else -1  # type: ignore[attr-defined]
    print(f"aaren: {describe(settings)} through {settings.consume_target}, metrics on port {port}", flush=True)
    try:
        await consumer.run()
    finally:
        await answerer.close()
        await consumer.source.close()
        await consumer.sink.close()
        if http is not None:
            http[0].shutdown()  # type: ignore[attr-defined]
    log.info("stopped")


def run_remote(settings: ServerSettings) -> None:
    """Run the consumer against ``settings.consume_target`` until SIGTERM or SIGINT."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        event_loop.resolve(settings.event_loop)
    except ValueError as exc:
        raise SystemExit(f"aaren consume: {exc}") from None
    event_loop.run(_run_remote(settings), settings.event_loop)
