"""The served ``policy`` task (issue 23): a tiny untrained Hopper-v5 policy, real servers, real gymnasium.

Served = offline: the actions a served rollout gets equal ``aaren_core.tasks.policy.rollout.rollout``'s
on the same seeds, in both process layouts, over aaren.v1 (rows and columns) and OIP; the state stays
the same size over 1,000 steps; a Redis-backed server SIGKILLed mid-episode continues the episode
exactly; bad events get the catalogue's errors and the stream goes on.
"""

from __future__ import annotations

import queue
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton
from policy_served import ENV, NAME, TARGET_RETURN, offline_rollout, policy_repository, tiny_policy
from server_helpers import CALL_TIMEOUT_S, OpenStream, assert_event_error, outcome, stub_for
from servers import ServerProcess, ServerThread, repository_of

from aaren.client.client import AarenError
from aaren.client.model_folder import describe_model_folder
from aaren.client.rollout import make_env, play, policy_event
from aaren.client.sync import SyncClient
from aaren.v1 import aaren_pb2 as pb

SEED, EPISODES, MAX_STEPS = 3, 2, 200


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny model steps one event at a time: more threads only contend (6x slower on 2 shared cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return policy_repository(tmp_path_factory.mktemp("policy") / "models")


@pytest.fixture(scope="module")
def offline():
    return offline_rollout(EPISODES, SEED, MAX_STEPS)


def _event(session: str, t: int, first: float, obs: np.ndarray) -> pb.Event:
    return pb.Event(session_id=session, seq=t + 1, time=float(t), values=[float(first), *obs.tolist()])


@pytest.mark.layouts
def test_a_served_rollout_equals_the_offline_rollout(start_server, layout, repository, offline):
    srv = repository_of(start_server, layout, repository)(metrics_port=-1)
    with SyncClient(srv.address) as client:
        info = client.describe_model(NAME)
        assert (info.task, info.action_width, info.env, info.target_return) == ("policy", 3, ENV, TARGET_RETURN)
        assert info.value_names[:2] == ("reward", "obs_0") and info.value_width == 12
        folder = describe_model_folder(repository / "policy", quantiles=(), limits=info.limits)
        facts = ("task", "value_names", "mark_names", "time_unit", "action_width", "env", "target_return")
        assert [getattr(folder, f) for f in facts] == [getattr(info, f) for f in facts]  # read without a server
        served = client.run(play(client.aio, ENV, episodes=EPISODES, seed=SEED, max_steps=MAX_STEPS, model=NAME))
        for e in served.episodes:  # every episode's session was ended
            with pytest.raises(AarenError) as gone:
                client.get_session(e.session_id, model=NAME)
            assert gone.value.reason == "session_not_found"
    assert served.target_return == TARGET_RETURN  # the model's default
    for e, actions, ret in zip(served.episodes, offline.actions, offline.returns, strict=True):
        assert e.length == len(actions) > 10
        np.testing.assert_allclose(np.array(e.actions), actions, atol=1e-5, rtol=0)
        assert e.episode_return == pytest.approx(float(ret), rel=1e-9)


def test_state_size_is_constant_over_1000_steps_and_a_history_equals_stepping(start_server, repository):
    """1,000 steps of one episode (random observations and rewards) sent as histories of 100 events
    (stepped position by position in the server): every action equals ``model.step``'s, and the
    stored state has the same size after 1, 500 and 1,000 steps."""
    srv = repository_of(start_server, 0, repository)(metrics_port=-1)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(1000, 11)).astype(np.float32)
    first = np.concatenate([[TARGET_RETURN], rng.uniform(0, 3, size=999)]).astype(np.float32)
    model = tiny_policy()
    state = model.init_state(1)
    expected_a, expected_r = [], []
    for t in range(1000):
        a, r, state = model.step(torch.from_numpy(obs[t : t + 1]), torch.from_numpy(first[t : t + 1]), state)
        expected_a.append(a[0].numpy())
        expected_r.append(float(r[0]))
    events = [_event("long", t, first[t], obs[t]) for t in range(1000)]
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        stream = OpenStream(stub)
        sizes = []
        (one,) = stream.send(events[:1], model=NAME).results
        sizes.append(get_session(stub, "long", model=NAME))
        block = stream.send(events[1:500], model=NAME, layout=pb.RESPONSE_LAYOUT_COLUMNS).forecast_columns
        sizes.append(get_session(stub, "long", model=NAME))
        rest = stream.send(events[500:], model=NAME, layout=pb.RESPONSE_LAYOUT_COLUMNS).forecast_columns
        sizes.append(get_session(stub, "long", model=NAME))
        stream.close()
        described = stub.DescribeModel(pb.DescribeModelRequest(model=NAME), timeout=CALL_TIMEOUT_S)
    actions = np.concatenate(
        [[one.forecast.policy.action], np.array(block.actions).reshape(-1, 3), np.array(rest.actions).reshape(-1, 3)]
    )
    rtg = [one.forecast.policy.return_to_go, *block.returns_to_go, *rest.returns_to_go]
    assert block.action_width == 3 and list(block.seq) == list(range(2, 501))
    np.testing.assert_allclose(actions, np.array(expected_a), atol=1e-5, rtol=0)
    np.testing.assert_allclose(rtg, expected_r, rtol=1e-6, atol=1e-3)
    assert [s.last_seq for s in sizes] == [1, 500, 1000]
    assert len({len(s.state) for s in sizes}) == 1 and len(sizes[0].state) > 0
    assert {s.state_bytes for s in sizes} == {described.state_bytes_per_session}


def get_session(stub, session_id: str, model: str) -> pb.GetSessionResponse:
    return stub.GetSession(
        pb.GetSessionRequest(session_id=session_id, include_state=True, model=model), timeout=CALL_TIMEOUT_S
    )


def test_rows_and_columns_agree_and_bad_events_get_the_catalogues_errors(start_server, repository):
    srv = repository_of(start_server, 0, repository)(metrics_port=-1)
    env = make_env(ENV)
    obs, _ = env.reset(seed=SEED)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        first = TARGET_RETURN
        for t in range(20):
            (row,) = stream.send([_event("rows", t, first, obs)], model=NAME).results
            block = stream.send(
                [_event("cols", t, first, obs)], model=NAME, layout=pb.RESPONSE_LAYOUT_COLUMNS
            ).forecast_columns
            assert outcome(row) == "forecast" and row.forecast.HasField("policy")
            assert list(row.forecast.policy.action) == list(block.actions)
            assert row.forecast.policy.return_to_go == block.returns_to_go[0]
            obs, reward, *_ = env.step(np.array(row.forecast.policy.action, np.float32))
            first = float(reward)
        # A wrong width and a NaN are refused with the catalogue's reasons; nothing changed.
        short = pb.Event(session_id="rows", seq=21, time=20.0, values=[first, *obs[:5].tolist()])
        nan = _event("rows", 20, float("nan"), obs)
        bad = stream.send([short, nan], model=NAME).results
        assert_event_error(bad[0], pb.ERROR_CODE_INVALID_ARGUMENT, "values_wrong_width", ["expected 12 (reward, obs_0"])
        assert_event_error(bad[1], pb.ERROR_CODE_INVALID_ARGUMENT, "values_not_finite", ["value 0 (reward)"])
        (good,) = stream.send([_event("rows", 20, first, obs)], model=NAME).results
        assert outcome(good) == "forecast" and good.forecast.seq == 21
        stream.close()
    env.close()


def test_tritonclient_drives_an_episode_over_oip(start_server, repository, offline):
    srv = repository_of(start_server, 0, repository)(metrics_port=-1)
    env = make_env(ENV)
    answers: queue.Queue = queue.Queue()
    got = []
    with triton.InferenceServerClient(srv.address) as client:
        meta = client.get_model_metadata(NAME)
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
            ("TIME", "FP64", [1]),
            ("VALUES", "FP32", [12]),
        ]
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
            ("SEQ", "INT64", [1]), ("ACTION", "FP32", [3]), ("RETURN_TO_GO", "FP32", [1]),
        ]  # fmt: skip
        params = client.get_model_config(NAME).config.parameters
        assert params["task"].string_value == "policy" and params["env"].string_value == ENV
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        obs, _ = env.reset(seed=SEED)
        first = TARGET_RETURN
        n = len(offline.actions[0])
        for t in range(n):
            time = triton.InferInput("TIME", [1], "FP64")
            time.set_data_from_numpy(np.array([float(t)]))
            values = triton.InferInput("VALUES", [12], "FP32")
            values.set_data_from_numpy(np.array([first, *obs], np.float32))
            client.async_stream_infer(
                NAME, [time, values], sequence_id="episode-0", sequence_start=t == 0, sequence_end=t == n - 1
            )
            result, error = answers.get(timeout=CALL_TIMEOUT_S)
            assert error is None, error
            assert int(result.as_numpy("SEQ")[0]) == t + 1
            action = result.as_numpy("ACTION")
            got.append(action)
            if t == 5:  # the sequence is the aaren.v1 session of the same id
                with SyncClient(srv.address) as v1:
                    assert v1.get_session("episode-0", model=NAME).last_seq == 6
            obs, reward, terminated, truncated, _ = env.step(np.clip(action, -1, 1))
            first = float(reward)
        client.stop_stream()
    env.close()
    assert terminated or truncated or n == MAX_STEPS
    np.testing.assert_allclose(np.array(got), offline.actions[0], atol=1e-5, rtol=0)
    with SyncClient(srv.address) as v1, pytest.raises(AarenError) as gone:  # END ended the episode's session
        v1.get_session("episode-0", model=NAME)
    assert gone.value.reason == "session_not_found"


def test_a_redis_backed_server_killed_mid_episode_continues_it_exactly(tmp_path, repository, redis_url, offline):
    """Steps 0..29 on one server, SIGKILL, a new server on the same Redis takes the episode on from
    seq 31: every action equals the uninterrupted offline rollout's."""
    env = make_env(ENV)
    obs, _ = env.reset(seed=SEED)
    first, actions, kill_at = TARGET_RETURN, [], 30
    expected = offline.actions[0]

    def serve(log: str) -> ServerProcess:
        return ServerProcess(tmp_path / log, models_dir=repository, store_url=redis_url)

    srv = serve("first.log")
    client = SyncClient(srv.address)
    try:
        for t in range(len(expected)):
            if t == kill_at:
                srv.kill()
                client.close()
                srv = serve("second.log")
                client = SyncClient(srv.address)
                assert client.get_session("episode", model=NAME).last_seq == kill_at
            (result,) = client.apply([policy_event("episode", t, first, obs)], model=NAME).results
            assert result.seq == t + 1, result
            action = np.array(result.action, np.float32)
            actions.append(action)
            obs, reward, *_ = env.step(action)
            first = float(reward)
    finally:
        client.close()
        srv.stop()
        env.close()
    assert len(expected) > kill_at + 5
    np.testing.assert_allclose(np.array(actions), expected, atol=1e-5, rtol=0)


def test_a_gru_policy_is_served_and_a_transformer_policy_refused(tmp_path, offline):
    from aaren.server.contract.errors import ConfigError
    from aaren_core.checkpoint import save_checkpoint
    from aaren_core.tasks.policy.rollout import rollout

    gru = tiny_policy(kind="gru")
    save_checkpoint(tmp_path / "gru" / "p", gru, {"name": "gru-policy", "env": ENV})
    expected = rollout(gru, ENV, 1, 3600.0, seed=SEED, max_steps=60)
    with (
        ServerThread(checkpoint=None, models_dir=tmp_path / "gru", metrics_port=-1) as srv,
        SyncClient(srv.address) as c,
    ):
        assert c.describe_model().target_return == 3600.0  # none in the checkpoint: DT's for the Hopper
        served = c.run(play(c.aio, ENV, episodes=1, seed=SEED, max_steps=60))
    np.testing.assert_allclose(np.array(served.episodes[0].actions), expected.actions[0], atol=1e-5, rtol=0)

    save_checkpoint(tmp_path / "kv" / "p", tiny_policy(kind="transformer"), {"name": "kv-policy", "env": ENV})
    refused = ServerThread(checkpoint=None, models_dir=tmp_path / "kv", metrics_port=-1)
    with pytest.raises(ConfigError, match="the 'transformer' backbone's state grows with every event"):
        refused.__enter__()
    refused.stop()
