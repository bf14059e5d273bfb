"""Exactly once through faults, with real processes: ``aaren consume`` killed with SIGKILL at random
points (with the model in the consumer, and with ``--target``: the layered path), Redis and NATS
killed and restarted under it, two members with one killed.

Every run ends with the same history check: the sink holds one forecast per event, none twice, each
equal to a fault-free gRPC run of the same events; nothing of the source is pending; every
session's stored state equals the fault-free run's (an event applied twice, or skipped, would
change it).
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import torch
from nats_process import NatsProcess
from redis_process import RedisProcess
from server_helpers import get_session, state_tensors, stub_for
from servers import ServerProcess
from test_consume import Logs, assert_same, forecasts_of, interleaved, over_grpc

SESSIONS, PER_SESSION = 24, 40


@pytest.fixture
def durable_redis(tmp_path: Path):
    """A Redis of this test's own with an append-only file fsynced on every write: what it
    acknowledged survives a SIGKILL. It holds the states (and, for a Redis log, the log)."""
    server = RedisProcess(tmp_path / "redis", aof=True).start()
    yield server
    server.kill()


@pytest.fixture
def own_nats(tmp_path: Path):
    """A nats-server of this test's own (file-backed JetStream), so that the test can restart it."""
    server = NatsProcess(tmp_path / "nats").start()
    yield server
    server.kill()


class TargetConsumer:
    """``aaren consume --target``: the consumer alone, the model in the server it drives."""

    def __init__(self, log_path: Path, target: str, **settings: object) -> None:
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in settings.items()]
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from aaren.cli.app import app; app()", "consume", "--target", target,
             "--metrics-port", "-1", *flags],
            stdout=subprocess.PIPE, stderr=self._log,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        assert re.match(r"aaren: consuming .* through ", line), (line, log_path.read_text()[-2000:])

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self._log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        self._log.close()


class Run:
    """One consumed log: its events written to ``source``, forecasts in ``sink``, states in Redis."""

    def __init__(
        self,
        logs: Logs,
        store: RedisProcess,
        tmp_path: Path,
        checkpoint: Path,
        per_session: int = PER_SESSION,
        **source: str,
    ) -> None:
        self.logs = logs
        self.source, self.sink = logs.url("events", **source), logs.url("forecasts")
        self.store_url = f"redis://127.0.0.1:{store.port}/0?prefix=st-{logs.tag}:"
        self.tmp_path = tmp_path
        self.checkpoint = checkpoint
        self.per_session = per_session
        self.events = interleaved(SESSIONS, per_session, seed=7)
        self.starts = 0
        logs.write(logs.url("events"), self.events)  # the writer takes none of the source's parameters

    def consumer(self, member: str = "0/1", target: str | None = None) -> ServerProcess | TargetConsumer:
        self.starts += 1
        log_path = self.tmp_path / f"consumer-{self.starts}.log"
        consume = {
            "consume_source": self.source, "consume_sink": self.sink, "consume_member": member,
            "consume_batch": 8, "consume_gap_wait_s": 60,
        }  # fmt: skip
        if target is not None:
            return TargetConsumer(log_path, target, **consume)
        return ServerProcess(
            log_path, command="consume", checkpoint=self.checkpoint, store_url=self.store_url, **consume
        )

    def server(self) -> ServerProcess:
        """A server on the run's store, for --target."""
        return ServerProcess(self.tmp_path / "server.log", checkpoint=self.checkpoint, store_url=self.store_url)

    def published(self) -> int:
        try:
            return len(self.logs.entries(self.sink, 0, timeout_s=0))
        except Exception:  # the log is down: nothing to count now
            return 0

    def wait_done(self, members: int = 1, timeout_s: float = 180) -> None:
        """Until every event has a forecast and nothing of the source is pending."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.published() >= len(self.events) and self.logs.pending(self.source, members) == 0:
                return
            time.sleep(0.2)
        pytest.fail(f"not done in {timeout_s} s: {self.published()} of {len(self.events)} forecasts")

    def check(self, state_address: str, reference_address: str) -> None:
        """The history check of the module docstring."""
        got = forecasts_of(self.logs.entries(self.sink, len(self.events)))  # fails on a forecast published twice
        assert set(got) == {(e.session_id, e.seq) for e in self.events}
        want = over_grpc(reference_address, self.events)
        for key, forecast in got.items():
            assert_same(forecast, want[key], tolerance=1e-5)  # runs by the scan here, one by one there
        with grpc.insecure_channel(state_address) as ours, grpc.insecure_channel(reference_address) as theirs:
            for i in range(SESSIONS):
                a = get_session(stub_for(ours), f"s{i}")
                b = get_session(stub_for(theirs), f"s{i}")
                assert a is not None and b is not None
                assert a.last_seq == b.last_seq == self.per_session
                for name, tensor in state_tensors(b).items():
                    torch.testing.assert_close(state_tensors(a)[name], tensor, rtol=1e-4, atol=1e-5)


@pytest.fixture(params=["redis", "nats"])
def logs(request: pytest.FixtureRequest, durable_redis: RedisProcess) -> Logs:
    if request.param == "redis":
        return Logs("redis", f"redis-stream://127.0.0.1:{durable_redis.port}")
    return Logs("nats", request.getfixturevalue("own_nats").url)


@pytest.mark.parametrize(
    ("logs", "mode"),
    [("redis", "target"), ("nats", "model-in-consumer")],
    indirect=["logs"],
)
# Two of the four pairs, for CI's time: the layers path (--target) killed over Redis, the model in the
# consumer killed over NATS. The model in the consumer over Redis is killed in test_two_members_one_killed
# (its member "1/2"), and NATS through --target takes the same layers as Redis's.
def test_consumer_killed_ten_times(logs, durable_redis, tmp_path, tiny_checkpoint, start_server, mode) -> None:
    # A log long enough that the ten runs do not finish it (one run gets through about a hundred events).
    nats = {"ack_wait_s": "1"} if logs.kind == "nats" else {}
    run = Run(logs, durable_redis, tmp_path, tiny_checkpoint, per_session=100, **nats)
    server = run.server() if mode == "target" else None
    target = server.address if server is not None else None
    rng = random.Random(1)
    seen = []
    for _ in range(10):
        consumer = run.consumer(target=target)
        time.sleep(rng.uniform(0.05, 0.3))
        consumer.kill()  # SIGKILL: mid-batch, mid-publish, mid-acknowledge, wherever it is
        seen.append(run.published())
    assert sum(n < len(run.events) for n in seen) >= 5, f"the kills did not land while it worked: {seen}"
    consumer = run.consumer(target=target)
    run.wait_done()
    state = server or consumer
    assert isinstance(state, ServerProcess)
    run.check(state.address, start_server(frontends=0).address)
    consumer.stop()
    if server is not None:
        server.stop()


@pytest.mark.parametrize("logs", ["redis", "nats"], indirect=True)
def test_log_restarted_under_the_consumer(request, logs, durable_redis, tmp_path, tiny_checkpoint, start_server):
    """The log's server killed and started again twice while the consumer works (for Redis, the same
    server holds the states: the store goes down with it)."""
    server = durable_redis if logs.kind == "redis" else request.getfixturevalue("own_nats")
    run = Run(logs, durable_redis, tmp_path, tiny_checkpoint, **({"ack_wait_s": "1"} if logs.kind == "nats" else {}))
    consumer = run.consumer()
    for _ in range(2):
        time.sleep(0.3)
        server.kill()
        time.sleep(0.5)
        server.start()
    run.wait_done()
    assert isinstance(consumer, ServerProcess)
    run.check(consumer.address, start_server(frontends=0).address)
    consumer.stop()


def test_two_members_one_killed(logs, durable_redis, tmp_path, tiny_checkpoint, start_server: Callable) -> None:
    run = Run(logs, durable_redis, tmp_path, tiny_checkpoint, **({"ack_wait_s": "1"} if logs.kind == "nats" else {}))
    first = run.consumer("0/2")
    second = run.consumer("1/2")
    time.sleep(0.4)
    second.kill()
    second = run.consumer("1/2")
    run.wait_done(members=2)
    assert isinstance(first, ServerProcess)
    run.check(first.address, start_server(frontends=0).address)  # one store: either member reads every session
    first.stop()
    second.stop()
