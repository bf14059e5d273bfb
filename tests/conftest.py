"""Fixtures for every suite: the tiny checkpoint, real servers on free ports (``start_server``, in both
process layouts for a test or module marked ``pytest.mark.layouts``), real Redis.

What the fixtures start lives in ``servers.py``; the data they use in ``generated.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from generated import tiny_checkpoint_at, tiny_event_model
from redis_process import RedisCluster, RedisProcess
from servers import LAYOUTS, ServerThread


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "layouts: run the test's servers (start_server) in both process layouts: one process, 2 front ends"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("layouts") and "layout" in metafunc.fixturenames:
        metafunc.parametrize("layout", list(LAYOUTS.values()), ids=list(LAYOUTS), indirect=True)


@pytest.fixture
def layout(request: pytest.FixtureRequest) -> int:
    """The front-end processes of this test's servers: 0 unless the test is marked ``layouts``."""
    return getattr(request, "param", 0)


@pytest.fixture(scope="session")
def tiny_model_factory() -> Callable[..., Any]:
    """``generated.tiny_event_model``: the same tiny model the servers run, or a variant."""
    return tiny_event_model


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint_at(tmp_path_factory.mktemp("tiny-ckpt"))


@pytest.fixture
def start_server(tiny_checkpoint: Path, layout: int) -> Iterator[Callable[..., ServerThread]]:
    """``start_server(**settings)`` -> a running server with the tiny checkpoint in this test's layout
    (stopped after the test); ``start_timeout_s`` (a keyword beside the settings) bounds its start."""
    servers: list[ServerThread] = []

    def start(**settings: Any) -> ServerThread:
        settings.setdefault("checkpoint", tiny_checkpoint)
        settings.setdefault("frontends", layout)
        server = ServerThread(**settings).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(params=list(LAYOUTS.values()), ids=list(LAYOUTS))
def frontends(request: pytest.FixtureRequest) -> int:
    """Both process layouts, for a test that names the layout itself (``pytest.mark.layouts`` runs a
    test's every server in both)."""
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
