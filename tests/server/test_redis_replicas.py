"""Several server replicas sharing sessions through a real Redis: failover, races, outages, TTL.

Replicas that must be SIGKILLed run as processes (``aaren serve``); the others run in-process
(``start_server``) where the test needs to hold a model step. Every forecast is compared with a
single in-memory server fed the same events.
"""

from __future__ import annotations

import threading

import grpc
import pytest
from generated import random_events
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis_process import RedisProcess, free_port
from server_helpers import (
    CALL_TIMEOUT_S,
    OpenStream,
    ServerProcess,
    assert_event_error,
    assert_forecast,
    assert_forecasts_close,
    assert_states_close,
    ev,
    frozen_clock_env,
    get_session,
    hold_model_steps,
    metric,
    outcome,
    scrape,
    stub_for,
    wait_until,
)

from aaren.v1 import aaren_pb2 as pb
from aaren_core.checkpoint import save_checkpoint

pytestmark = pytest.mark.layouts  # every server of this module runs in both process layouts


def reference(start_server, evs: list[pb.Event]) -> tuple[dict[int, pb.Forecast], pb.GetSessionResponse]:
    """Forecasts by seq and the final session, from one in-memory server, one event per message."""
    srv = start_server()
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        forecasts = {e.seq: assert_forecast(stream.send([e]).results[0], e.session_id, e.seq) for e in evs}
        stream.close()
        return forecasts, get_session(stub, evs[0].session_id)


def health(channel: grpc.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=CALL_TIMEOUT_S).status


@pytest.fixture
def replicas(tmp_path, tiny_checkpoint, redis_url, layout):
    """``aaren serve`` processes on one Redis, in the layout of the test (``layout``)."""
    started: list[ServerProcess] = []

    def start(n: int = 2, **settings) -> list[ServerProcess]:
        settings.setdefault("frontends", layout)
        for _ in range(n):
            i = len(started)
            started.append(
                ServerProcess(tmp_path / f"server{i}.log", checkpoint=tiny_checkpoint, store_url=redis_url, **settings)
            )
        return started[-n:]

    yield start
    for server in started:
        server.stop()


def test_two_replicas_alternating_equal_one_process(replicas, start_server):
    evs = random_events("alt", 12, seed=1)
    expected, expected_session = reference(start_server, evs)
    servers = replicas(2)
    channels = [grpc.insecure_channel(s.address) for s in servers]
    try:
        streams = [OpenStream(stub_for(c)) for c in channels]
        for e in evs:
            result = streams[e.seq % 2].send([e]).results[0]
            assert_forecasts_close(assert_forecast(result, "alt", e.seq), expected[e.seq])
        for s in streams:
            s.close()
        for c in channels:  # both replicas read the same, final state
            session = get_session(stub_for(c), "alt")
            assert session.last_seq == 12
            assert_states_close(session, expected_session)
    finally:
        for c in channels:
            c.close()


def test_kill_9_mid_stream_then_resume_on_the_other_replica(replicas, start_server):
    evs = random_events("k9", 30, seed=2)
    expected, expected_session = reference(start_server, evs)
    first, second = replicas(2)
    acked = 0
    with grpc.insecure_channel(first.address) as channel:
        stream = OpenStream(stub_for(channel))
        for e in evs[:10]:
            assert_forecast(stream.send([e]).results[0], "k9", e.seq)
            acked = e.seq
        for e in evs[10:20]:  # in flight when the process dies
            stream.put([e])
        for _ in range(2):
            result = stream.next().results[0]
            assert_forecasts_close(assert_forecast(result, "k9", result.seq), expected[result.seq])
            acked = result.seq
        first.kill()
        stream.end_requests()
    with grpc.insecure_channel(second.address) as channel:
        stub = stub_for(channel)
        stored = get_session(stub, "k9").last_seq
        assert acked <= stored <= 20, "an acknowledged event was lost, or an unsent one applied"
        stream = OpenStream(stub)
        for e in evs[acked:]:  # resend everything after the last acknowledgement
            result = stream.send([e]).results[0]
            if e.seq <= stored:
                assert result.duplicate and result.ack.last_seq >= e.seq, result
            else:
                assert_forecasts_close(assert_forecast(result, "k9", e.seq), expected[e.seq])
        stream.close()
        session = get_session(stub, "k9")
    assert session.last_seq == 30
    assert_states_close(session, expected_session)


def test_concurrent_writers_one_wins_each_seq_and_conflicts_are_counted(start_server, redis_url):
    a = start_server(store_url=redis_url, model_thread=True)
    b = start_server(store_url=redis_url, model_thread=True)
    via_a = random_events("race", 8, seed=3)
    # Same times (so either writer's event may follow the other's), different marks and values.
    via_b = [ev("race", e.seq, e.time, (e.mark + 1) % 5, [v + 1.0 for v in e.values]) for e in via_a]
    with grpc.insecure_channel(a.address) as ca, grpc.insecure_channel(b.address) as cb:
        stream_a, stream_b = OpenStream(stub_for(ca)), OpenStream(stub_for(cb))

        # A reads the session (none yet) and is held in its step; B writes seq 1; A's write must lose.
        entered, release = hold_model_steps(a)
        pending = stream_a.put([via_a[0]])
        assert entered.wait(CALL_TIMEOUT_S)
        assert_forecast(stream_b.send([via_b[0]]).results[0], "race", 1)
        release.set()
        lost = stream_a.next().results[0]
        assert_event_error(lost, pb.ERROR_CODE_ABORTED, "state_conflict", ["resend from your last"])
        assert pending

        # Then both race for every later seq: exactly one event wins each.
        accepted = [via_b[0]]
        conflicts = 1
        for k in range(1, 8):
            answers: dict[str, pb.EventResult] = {}

            def send(name, stream, e, answers=answers):
                answers[name] = stream.send([e]).results[0]

            threads = [
                threading.Thread(target=send, args=("a", stream_a, via_a[k])),
                threading.Thread(target=send, args=("b", stream_b, via_b[k])),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(CALL_TIMEOUT_S)
            kinds = {name: outcome(r) for name, r in answers.items()}
            winners = [name for name, kind in kinds.items() if kind == "forecast"]
            assert len(winners) == 1, answers
            for name, r in answers.items():
                if name not in winners:
                    assert r.duplicate or r.error.reason == "state_conflict", r
                    conflicts += r.error.reason == "state_conflict"
            accepted.append((via_a if winners[0] == "a" else via_b)[k])
        stream_a.close()
        stream_b.close()
        final = get_session(stub_for(ca), "race")
    counted = sum(metric(scrape(s.metrics_url), "aaren_state_conflicts_total") for s in (a, b))
    assert counted == conflicts
    # The final state is the serial application of the accepted events.
    _, expected_session = reference(start_server, accepted)
    assert final.last_seq == 8
    assert_states_close(final, expected_session)


def waiting_loads(admin) -> int:
    """Clients whose script call a write-paused Redis holds (flag ``b``: postponed by CLIENT PAUSE)."""
    clients = admin.execute_command("CLIENT", "LIST").decode().splitlines()
    fields = [dict(part.split("=", 1) for part in line.split() if "=" in part) for line in clients]
    return sum("b" in f.get("flags", "") and f.get("cmd") == "evalsha" for f in fields)


def test_the_same_message_sent_to_two_replicas_at_once_has_one_winner(
    tmp_path, tiny_checkpoint, redis_server, redis_url, start_server
):
    """A hedging client sends each message to two replicas whose wall clocks read the same time
    (frozen with libfaketime), so both compute byte-identical records. Redis holds both loads (a
    write pause: scripts wait, CLIENT LIST does not) until both wait, so both replicas step from
    the same stored seq every time: exactly one must win, the other is told state_conflict."""
    evs = random_events("hedge", 60, seed=11)
    expected, expected_session = reference(start_server, evs)
    env = frozen_clock_env()
    # A long store timeout: a load waits in the paused Redis until the other replica's load arrives.
    url = redis_url + "&timeout_s=15"
    servers = [
        ServerProcess(tmp_path / f"hedge{i}.log", env=env, checkpoint=tiny_checkpoint, store_url=url) for i in range(2)
    ]
    admin = redis_server.client()
    channels = [grpc.insecure_channel(s.address) for s in servers]
    try:
        # One call carries all 60 pairs: its deadline only guards against a hang.
        streams = [OpenStream(stub_for(c), timeout=600) for c in channels]
        lost = [0, 0]
        for e in evs:
            admin.execute_command("CLIENT", "PAUSE", "15000", "WRITE")
            try:
                for stream in streams:
                    stream.put([e])
                wait_until(lambda: waiting_loads(admin) == 2, "both replicas' loads to wait in Redis", timeout=14)
            finally:
                admin.execute_command("CLIENT", "UNPAUSE")
            answers = [stream.next().results[0] for stream in streams]
            winners = [i for i, r in enumerate(answers) if outcome(r) == "forecast"]
            assert len(winners) == 1, f"seq {e.seq}: {len(winners)} winners: {answers}"
            loser = 1 - winners[0]
            assert_forecasts_close(assert_forecast(answers[winners[0]], "hedge", e.seq), expected[e.seq])
            assert_event_error(answers[loser], pb.ERROR_CODE_ABORTED, "state_conflict", ["resend from your last"])
            lost[loser] += 1
        for stream in streams:
            stream.close()
        session = get_session(stub_for(channels[0]), "hedge")
        conflicts = [metric(scrape(s.metrics_url), "aaren_state_conflicts_total") for s in servers]
    finally:
        for c in channels:
            c.close()
        for s in servers:
            s.stop()
    assert conflicts == lost, "each replica counts the conflicts it answered"
    assert session.last_seq == 60
    assert_states_close(session, expected_session)


def test_redis_killed_mid_stream_then_restarted_loses_nothing(start_server, tmp_path):
    redis = RedisProcess(tmp_path / "redis", aof=True).start()
    try:
        srv = start_server(store_url=redis.url, store_check_interval_s=0.1)
        evs = random_events("aof", 10, seed=5)
        expected, expected_session = reference(start_server, evs)
        with grpc.insecure_channel(srv.address) as channel:
            stub = stub_for(channel)
            stream = OpenStream(stub)
            for e in evs[:5]:
                assert_forecasts_close(assert_forecast(stream.send([e]).results[0], "aof", e.seq), expected[e.seq])

            redis.kill()
            error = stream.send([evs[5]]).results[0]
            assert_event_error(error, pb.ERROR_CODE_UNAVAILABLE, "store_unavailable", ["session store unavailable"])
            wait_until(lambda: health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING, "health NOT_SERVING")
            samples = scrape(srv.metrics_url)
            assert metric(samples, "aaren_store_up") == 0
            assert metric(samples, "aaren_store_errors_total", operation="load") >= 1

            redis.start()  # same port and directory: the append-only file brings the sessions back
            wait_until(lambda: health(channel) == health_pb2.HealthCheckResponse.SERVING, "health SERVING again")
            assert get_session(stub, "aof").last_seq == 5, "an acknowledged event was lost"
            for e in evs[5:]:
                assert_forecasts_close(assert_forecast(stream.send([e]).results[0], "aof", e.seq), expected[e.seq])
            stream.close()
            assert_states_close(get_session(stub, "aof"), expected_session)
            assert metric(scrape(srv.metrics_url), "aaren_store_up") == 1
    finally:
        redis.stop()


def test_server_started_while_redis_is_down_serves_once_it_comes_up(start_server, tmp_path):
    redis = RedisProcess(tmp_path / "redis", port=free_port())
    srv = start_server(store_url=redis.url, store_check_interval_s=0.1)
    try:
        with grpc.insecure_channel(srv.address) as channel:
            assert health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
            stream = OpenStream(stub_for(channel))
            refused = stream.send([ev("late", 1, 1.0)]).results[0]
            assert_event_error(refused, pb.ERROR_CODE_UNAVAILABLE, "store_unavailable")
            redis.start()
            wait_until(lambda: health(channel) == health_pb2.HealthCheckResponse.SERVING, "health SERVING")
            assert_forecast(stream.send([ev("late", 1, 1.0)]).results[0], "late", 1)
            stream.close()
    finally:
        redis.stop()


def test_idle_session_expires_in_redis_and_a_late_event_is_told(start_server, redis_url):
    srv = start_server(store_url=redis_url, idle_ttl_s=0.5)
    other = start_server(store_url=redis_url, idle_ttl_s=0.5)
    with grpc.insecure_channel(srv.address) as channel, grpc.insecure_channel(other.address) as other_channel:
        stream = OpenStream(stub_for(channel))
        assert_forecast(stream.send([ev("idle", 1, 1.0)]).results[0], "idle", 1)
        wait_until(lambda: get_session(stub_for(other_channel), "idle") is None, "the session to expire")
        late = stream.send([ev("idle", 2, 2.0)]).results[0]
        assert_event_error(late, pb.ERROR_CODE_NOT_FOUND, "session_evicted", ["evicted", "start it again with seq 1"])
        # Reported once across replicas: the replica that first saw it gone counted it.
        evicted = [metric(scrape(s.metrics_url), "aaren_sessions_evicted_total", cause="ttl") for s in (srv, other)]
        assert sorted(evicted) == [0, 1]
        assert_forecast(stream.send([ev("idle", 1, 3.0)]).results[0], "idle", 1)
        stream.close()


def test_state_of_another_model_is_refused_or_reset(start_server, redis_url, tmp_path, tiny_model_factory):
    other_ckpt = tmp_path / "other"
    save_checkpoint(other_ckpt, tiny_model_factory(seed=7), metadata={"name": "other"})
    writer = start_server(store_url=redis_url)
    refusing = start_server(store_url=redis_url, checkpoint=other_ckpt)
    resetting = start_server(store_url=redis_url, checkpoint=other_ckpt, on_model_mismatch="reset")
    with grpc.insecure_channel(writer.address) as c:
        stream = OpenStream(stub_for(c))
        assert_forecast(stream.send([ev("mm", 1, 1.0)]).results[0], "mm", 1)
        stream.close()
        written = get_session(stub_for(c), "mm")
    with grpc.insecure_channel(refusing.address) as c:
        stream = OpenStream(stub_for(c))
        error = stream.send([ev("mm", 2, 2.0)]).results[0]
        assert_event_error(error, pb.ERROR_CODE_FAILED_PRECONDITION, "model_mismatch", [written.model.version, "reset"])
        stream.close()
    samples = scrape(refusing.metrics_url)
    assert metric(samples, "aaren_events_rejected_total", reason="model_mismatch") == 1
    with grpc.insecure_channel(resetting.address) as c:
        stub = stub_for(c)
        stream = OpenStream(stub)
        assert_forecast(stream.send([ev("mm", 2, 2.0)]).results[0], "mm", 2)
        stream.close()
        session = get_session(stub, "mm")
        assert session.last_seq == 2 and session.model.version != written.model.version
    assert metric(scrape(resetting.metrics_url), "aaren_state_resets_total") == 1


PAUSE_S = 6.0


def test_slow_redis_times_out_as_unavailable_then_recovers(start_server, redis_server, redis_url):
    srv = start_server(store_url=redis_url + "&timeout_s=0.3", store_check_interval_s=0.1)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel), timeout=PAUSE_S + 60)
        assert_forecast(stream.send([ev("slow", 1, 1.0)]).results[0], "slow", 1)
        # every command waits out the pause. Long enough for a loaded machine to see it (health is NOT_SERVING
        # only while it lasts: a 1.5 s pause left a window of about 1 s); Redis 7.0 holds an UNPAUSE too
        redis_server.client().execute_command("CLIENT", "PAUSE", str(int(PAUSE_S * 1000)), "ALL")
        slow = stream.send([ev("slow", 2, 2.0)]).results[0]
        assert_event_error(slow, pb.ERROR_CODE_UNAVAILABLE, "store_unavailable", ["timed out"])
        wait_until(lambda: health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING, "health NOT_SERVING")
        wait_until(
            lambda: health(channel) == health_pb2.HealthCheckResponse.SERVING, "health SERVING again", PAUSE_S + 10
        )
        assert_forecast(stream.send([ev("slow", 2, 2.0)]).results[0], "slow", 2)
        stream.close()
    assert metric(scrape(srv.metrics_url), "aaren_store_errors_total", operation="load") >= 1


def test_active_sessions_gauge_counts_the_sessions_in_redis(start_server, redis_url):
    srv = start_server(store_url=redis_url, idle_ttl_s=4.0)  # the gauge refreshes every TTL/4 at most
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        stream.send([ev("g1", 1, 1.0), ev("g2", 1, 1.0), ev("g3", 1, 1.0)])
        stream.close()
    wait_until(lambda: metric(scrape(srv.metrics_url), "aaren_active_sessions") == 3, "3 active sessions")
    samples = scrape(srv.metrics_url)
    per_session = metric(samples, "aaren_state_bytes_per_session")
    assert metric(samples, "aaren_state_bytes") == 3 * per_session > 0
