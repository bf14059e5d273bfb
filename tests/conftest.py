"""Shared fixtures: a tiny event-model checkpoint and real servers on free ports."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from redis_process import RedisCluster, RedisProcess

from aaren_core.checkpoint import save_checkpoint
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.event.model import EventModel, EventModelConfig

TINY_SCHEMA = {
    "mark_names": [f"m{i}" for i in range(5)],
    "value_names": ["a", "b"],
    "time_unit": "minutes",
}


def make_tiny_model(seed: int = 0, num_marks: int = 5, value_width: int = 2) -> EventModel:
    torch.manual_seed(seed)
    config = EventModelConfig(
        backbone=BackboneConfig(kind="aaren", d_model=16, n_layers=2, n_heads=2),
        num_marks=num_marks,
        value_width=value_width,
        n_components=3,
    )
    model = EventModel(config).eval()
    model.set_normalization(1.0, 1.2, torch.tensor([1.0, -2.0][:value_width]), torch.tensor([3.0, 0.5][:value_width]))
    return model


@pytest.fixture(scope="session")
def tiny_model_factory() -> Callable[..., EventModel]:
    """``make_tiny_model`` for tests that need the same tiny model the servers run, or a variant."""
    return make_tiny_model


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-ckpt")
    save_checkpoint(path, make_tiny_model(), metadata={"name": "tiny", "schema": TINY_SCHEMA})
    return path


class ServerThread:
    """A real ``AarenServer`` running on its own event loop in a background thread."""

    def __init__(self, start_timeout_s: float = 30, **settings: Any) -> None:
        """``start_timeout_s`` bounds ``start()`` so that a broken server fails the test instead of
        hanging it (a server that compiles its model with a cold inductor cache needs minutes)."""
        from aaren.server.app import AarenServer
        from aaren.server.settings import ServerSettings

        defaults = {"address": "127.0.0.1:0", "metrics_port": 0, "device": "cpu", "torch_threads": 0, "frontends": 0}
        self.settings = ServerSettings(**{**defaults, **settings})  # torch_threads 0: leave the process as is
        self.server = AarenServer(self.settings)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-server", daemon=True)
        self.start_timeout_s = start_timeout_s

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self.call(self.server.start(), timeout=self.start_timeout_s)
        return self

    def call(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.metrics_port}/metrics"

    def stop(self, grace: float = 1.0) -> None:
        if self.loop.is_running():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                self.call(self.server.stop(grace))
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def start_server(tiny_checkpoint: Path) -> Iterator[Callable[..., ServerThread]]:
    """``start_server(**settings)`` -> a running server with the tiny checkpoint (stopped after the
    test); ``start_timeout_s`` (a keyword beside the settings) bounds its start."""
    servers: list[ServerThread] = []

    def start(**settings: Any) -> ServerThread:
        settings.setdefault("checkpoint", tiny_checkpoint)
        server = ServerThread(**settings).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(params=[0, 2], ids=["one-process", "2-frontends"])
def frontends(request: pytest.FixtureRequest) -> int:
    """Both process layouts: everything in one process, and the engine core with two front-end
    processes. A module runs all its servers in both by overriding ``start_server`` with
    ``server_helpers.layouts_of(start_server, frontends)``."""
    return request.param


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """One real redis-server for the whole run; tests keep apart by key prefix (``redis_url``)."""
    server = RedisProcess(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisProcess, request: pytest.FixtureRequest) -> str:
    """A store URL on the shared test Redis with a key prefix of this test's own."""
    return f"{redis_server.url}?prefix=t{abs(hash(request.node.nodeid)):x}-{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real three-primary Redis Cluster for the whole run (started on first use)."""
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    yield cluster
    cluster.stop()
