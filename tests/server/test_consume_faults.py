"""Exactly once through faults, with real processes: ``aaren consume`` killed with SIGKILL at random
points, Redis killed and restarted under it, two members of one group with one killed.

Every run ends with the same history check: the sink holds one forecast per event, none twice, each
equal to a fault-free gRPC run of the same events; every event is acknowledged; every session's
stored state equals the fault-free run's (an event applied twice, or skipped, would change it).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import redis
import torch
from redis_process import RedisProcess
from server_helpers import get_session, state_tensors, stub_for
from servers import ServerProcess
from test_consume import assert_same, forecasts_of, interleaved, over_grpc, write

SESSIONS, PER_SESSION = 32, 50


@pytest.fixture
def durable_redis(tmp_path: Path):
    """A Redis of this test's own with an append-only file fsynced on every write: what it
    acknowledged survives a SIGKILL."""
    server = RedisProcess(tmp_path / "redis", aof=True).start()
    yield server
    server.kill()


class Run:
    """One consumed log: its events written to ``events``, forecasts in ``forecasts``."""

    def __init__(self, redis_server: RedisProcess, tmp_path: Path, checkpoint: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.redis_server = redis_server
        self.base = f"redis-stream://127.0.0.1:{redis_server.port}"
        self.events_stream, self.forecasts_stream = f"ev-{tag}", f"fc-{tag}"
        self.store_url = f"redis://127.0.0.1:{redis_server.port}/0?prefix=st-{tag}:"
        self.tmp_path = tmp_path
        self.checkpoint = checkpoint
        self.events = interleaved(SESSIONS, PER_SESSION, seed=7)
        self.starts = 0
        write(f"{self.base}/{self.events_stream}", self.events)

    def consumer(self, member: str = "0/1", **settings: object) -> ServerProcess:
        self.starts += 1
        return ServerProcess(
            self.tmp_path / f"consumer-{self.starts}.log",
            command="consume",
            checkpoint=self.checkpoint,
            store_url=self.store_url,
            consume_source=f"{self.base}/{self.events_stream}",
            consume_sink=f"{self.base}/{self.forecasts_stream}",
            consume_member=member,
            consume_batch=8,
            consume_gap_wait_s=30,
            **settings,
        )

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.redis_server.port)

    def published(self) -> int:
        try:
            with self.client() as client:
                return int(client.xlen(self.forecasts_stream))
        except redis.ConnectionError:
            return 0

    def wait_done(self, groups: list[str], timeout_s: float = 120) -> None:
        """Until every event has a forecast and no group has an entry pending."""
        deadline = time.monotonic() + timeout_s
        with self.client() as client:
            while time.monotonic() < deadline:
                pending = sum(client.xpending(self.events_stream, g)["pending"] for g in groups)
                if client.xlen(self.forecasts_stream) >= len(self.events) and pending == 0:
                    return
                time.sleep(0.1)
        pytest.fail(f"not done in {timeout_s} s: {self.published()} of {len(self.events)} forecasts")

    def check(self, server: ServerProcess, reference_address: str) -> None:
        """The history check of the module docstring."""
        with self.client() as client:
            entries = [fields for _, fields in client.xrange(self.forecasts_stream)]
            dead = client.xlen(f"{self.forecasts_stream}.dead") if client.exists(f"{self.forecasts_stream}.dead") else 0
        assert dead == 0
        got = forecasts_of(entries)  # fails on a forecast published twice
        assert set(got) == {(e.session_id, e.seq) for e in self.events}
        want = over_grpc(reference_address, self.events)
        for key, forecast in got.items():
            assert_same(forecast, want[key])
        with grpc.insecure_channel(server.address) as ours, grpc.insecure_channel(reference_address) as theirs:
            for i in range(SESSIONS):
                a = get_session(stub_for(ours), f"s{i}")
                b = get_session(stub_for(theirs), f"s{i}")
                assert a is not None and b is not None
                assert a.last_seq == b.last_seq == PER_SESSION
                for name, tensor in state_tensors(b).items():
                    torch.testing.assert_close(state_tensors(a)[name], tensor, rtol=1e-5, atol=1e-6)


def test_consumer_killed_ten_times(durable_redis, tmp_path, tiny_checkpoint, start_server: Callable) -> None:
    run = Run(durable_redis, tmp_path, tiny_checkpoint)
    rng = random.Random(1)
    seen = []
    for _ in range(10):
        consumer = run.consumer()
        time.sleep(rng.uniform(0.05, 0.35))
        consumer.kill()  # SIGKILL: mid-batch, mid-publish, mid-acknowledge, wherever it is
        seen.append(run.published())
    assert 0 < seen[-1] < len(run.events), f"the kills did not land while it worked: {seen}"
    consumer = run.consumer()
    run.wait_done(["aaren"])
    run.check(consumer, start_server(frontends=0).address)
    consumer.stop()


def test_redis_restarted_under_the_consumer(durable_redis, tmp_path, tiny_checkpoint, start_server) -> None:
    run = Run(durable_redis, tmp_path, tiny_checkpoint)
    consumer = run.consumer()
    for _ in range(2):
        time.sleep(0.3)
        durable_redis.kill()
        time.sleep(0.5)
        durable_redis.start()
    run.wait_done(["aaren"])
    run.check(consumer, start_server(frontends=0).address)
    consumer.stop()


def test_two_members_one_killed(durable_redis, tmp_path, tiny_checkpoint, start_server) -> None:
    run = Run(durable_redis, tmp_path, tiny_checkpoint)
    first = run.consumer("0/2")
    second = run.consumer("1/2")
    time.sleep(0.4)
    second.kill()
    second = run.consumer("1/2")
    run.wait_done(["aaren-0-of-2", "aaren-1-of-2"])
    run.check(first, start_server(frontends=0).address)  # one store: either member reads every session
    first.stop()
    second.stop()
