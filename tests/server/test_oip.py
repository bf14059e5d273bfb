"""The Open Inference Protocol front end, driven by the real Triton client (tritonclient.grpc) in both
process layouts: health, metadata, config, streaming and unary inference with sequences, errors
that leave the stream going, and forecasts equal to aaren.v1's for the same events."""

from __future__ import annotations

import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from server_helpers import (
    CALL_TIMEOUT_S,
    OpenStream,
    assert_forecasts,
    ev,
    get_session,
    layouts_of,
    stub_for,
    wait_until,
)
from tritonclient.utils import InferenceServerException

from aaren.oip.v2 import grpc_service_pb2 as oip
from aaren.server.security.auth import hash_token, new_token
from aaren.v1 import aaren_pb2 as pb

MODEL = "tiny"


@pytest.fixture
def start_server(start_server, frontends):
    """Every server of this module runs in both process layouts."""
    return layouts_of(start_server, frontends)


def inputs(time: float, mark: int, values=(0.0, 0.0), *, time_type="FP64", mark_type="INT64", values_shape=None):
    t = triton.InferInput("TIME", [1], time_type)
    t.set_data_from_numpy(np.array([time], np.float64 if time_type == "FP64" else np.float32))
    m = triton.InferInput("MARK", [1], mark_type)
    m.set_data_from_numpy(np.array([mark], np.int64 if mark_type == "INT64" else np.int32))
    v = np.array(values, np.float32)
    x = triton.InferInput("VALUES", values_shape or list(v.shape), "FP32")
    x.set_data_from_numpy(v) if values_shape is None else x.set_data_from_numpy(v.reshape(values_shape))
    return [t, m, x]


class TritonStream:
    """tritonclient's stream with its callback feeding a queue."""

    def __init__(self, client: triton.InferenceServerClient) -> None:
        self.client = client
        self.answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, time, mark=0, values=(0.0, 0.0), **kwargs) -> None:
        kwargs.setdefault("model_name", MODEL)
        self.client.async_stream_infer(inputs=inputs(time, mark, values), **kwargs)

    def next(self):
        return self.answers.get(timeout=CALL_TIMEOUT_S)

    def close(self) -> None:
        self.client.stop_stream()


def numbers(result) -> dict[str, np.ndarray]:
    return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}


def v1_numbers(forecast) -> dict[str, np.ndarray]:
    return {
        "SEQ": np.array([forecast.seq]),
        "MEAN_GAP": np.array([forecast.next_time.mean]),
        "EXPECTED_TIME": np.array([forecast.next_time.expected_time]),
        "GAP_QUANTILES": np.array([q.value for q in forecast.next_time.quantiles]),
        "TOP_MARKS": np.array([m.mark for m in forecast.marks]),
        "TOP_PROBS": np.array([m.probability for m in forecast.marks]),
        "VALUE_MEAN": np.array([v.mean for v in forecast.values]),
        "VALUE_STD": np.array([v.std for v in forecast.values]),
    }


def assert_same(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> None:
    assert ours.keys() == theirs.keys()
    for name in ours:
        # float32 model arithmetic: batches of other widths round differently (as in test_e2e)
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_health_metadata_config_and_unimplemented(start_server):
    srv = start_server(metrics_port=-1, idle_ttl_s=42.0, default_top_k=2)
    with triton.InferenceServerClient(srv.address) as client:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(MODEL) and not client.is_model_ready("other")
        meta = client.get_server_metadata()
        assert meta.name == "aaren" and {"sequence", "sequence(string_id)"} <= set(meta.extensions)

        model = client.get_model_metadata(MODEL)
        version = srv.server.core.description.version
        assert (model.name, list(model.versions)) == (MODEL, [version])
        assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [
            ("TIME", "FP64", [1]), ("MARK", "INT64", [1]), ("VALUES", "FP32", [2]),
        ]  # fmt: skip
        assert [(t.name, t.datatype, list(t.shape)) for t in model.outputs] == [
            ("SEQ", "INT64", [1]), ("MEAN_GAP", "FP64", [1]), ("EXPECTED_TIME", "FP64", [1]),
            ("GAP_QUANTILES", "FP64", [3]), ("TOP_MARKS", "INT64", [-1]), ("TOP_PROBS", "FP64", [-1]),
            ("VALUE_MEAN", "FP64", [2]), ("VALUE_STD", "FP64", [2]),
        ]  # fmt: skip

        config = client.get_model_config(MODEL).config
        assert config.name == MODEL and config.max_batch_size == 0
        assert config.WhichOneof("scheduling_choice") == "sequence_batching"
        assert config.sequence_batching.max_sequence_idle_microseconds == 42_000_000
        assert config.parameters["quantile_levels"].string_value == "0.1,0.5,0.9"
        assert config.parameters["default_top_k"].string_value == "2"
        assert [i.name for i in config.input] == ["TIME", "MARK", "VALUES"]

        with pytest.raises(InferenceServerException, match="Request for unknown model: 'other' is not found"):
            client.get_model_metadata("other")
        index = client.get_model_repository_index().models
        assert [(m.name, m.version, m.state) for m in index] == [(MODEL, version, "READY")]
        with pytest.raises(InferenceServerException) as unimplemented:
            client.load_model(MODEL)
        assert unimplemented.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "does not implement RepositoryModelLoad" in unimplemented.value.message()
        assert "ModelStreamInfer" in unimplemented.value.message()

        client.infer(MODEL, inputs(1.0, 0), sequence_id=1, sequence_start=True)
        stats = client.get_inference_statistics(MODEL).model_stats
        assert [s.name for s in stats] == [MODEL]
        # In the 2-frontends layout the counts of every front-end process add up.
        assert sum(s.inference_stats.success.count for s in stats) == 1


def test_stream_forecasts_equal_aaren_v1(start_server):
    """Int and string sequence ids interleaved on one stream, START and END, the request id echoed;
    every forecast equals aaren.v1's for the same events on other sessions."""
    srv = start_server(metrics_port=-1)
    rng = np.random.default_rng(7)
    sequences = {11: [], "user-ä": [], 2**40: []}
    clock = {sid: 0.0 for sid in sequences}
    order = [sid for _ in range(5) for sid in sequences]
    rng.shuffle(order)
    with triton.InferenceServerClient(srv.address) as client, grpc.insecure_channel(srv.address) as channel:
        stream = TritonStream(client)
        sent = []
        for n, sid in enumerate(order):
            clock[sid] += float(rng.exponential(2.0))
            mark, values = int(rng.integers(0, 5)), rng.normal(size=2).astype(np.float32).tolist()
            first = not sequences[sid]
            last = len(sequences[sid]) == 4
            sequences[sid].append((clock[sid], mark, values))
            stream.send(clock[sid], mark, values, sequence_id=sid, sequence_start=first, sequence_end=last,
                        request_id=f"r{n}")  # fmt: skip
            sent.append((sid, len(sequences[sid])))
        answers = [stream.next() for _ in sent]
        assert [e for _, e in answers] == [None] * len(sent)
        assert [r.get_response().id for r, _ in answers] == [f"r{n}" for n in range(len(sent))]
        assert [int(r.as_numpy("SEQ")[0]) for r, _ in answers] == [seq for _, seq in sent]

        # Every sequence was ended by its END: a request without START is refused, the stream goes on.
        stream.send(99.0, sequence_id=11, request_id="late")
        result, error = stream.next()
        assert result is None
        assert "inference request for sequence 11 to model 'tiny' must specify the START flag on the first " \
               "request of the sequence" in str(error)  # fmt: skip
        stream.send(1.0, sequence_id=11, sequence_start=True, request_id="again")
        result, error = stream.next()
        assert error is None and int(result.as_numpy("SEQ")[0]) == 1
        stream.close()

        v1 = OpenStream(stub_for(channel))
        ours = {}
        for (sid, seq), (result, _) in zip(sent, answers, strict=True):
            ours[(sid, seq)] = numbers(result)
        for sid, events in sequences.items():
            for seq, (t, mark, values) in enumerate(events, start=1):
                (forecast,) = assert_forecasts(
                    v1.send([ev(f"v1-{sid}", seq, t, mark, values)], top_k=3), [(f"v1-{sid}", seq)]
                )
                assert_same(ours[(sid, seq)], v1_numbers(forecast))
        v1.close()


def test_bad_requests_are_answered_and_the_stream_goes_on(start_server):
    srv = start_server(metrics_port=-1)
    with triton.InferenceServerClient(srv.address) as client:
        stream = TritonStream(client)
        stream.send(1.0, sequence_id="s", sequence_start=True, request_id="ok-1")
        shape = "unexpected shape for input 'VALUES' for model 'tiny'. Expected [2], got "
        cases = [
            (inputs(2.0, 0, time_type="FP32"), "input 'TIME' data-type is 'FP32', but model 'tiny' expects 'FP64'"),
            (inputs(2.0, 0, (0.0, 0.0, 0.0)), shape + "[3]"),
            (inputs(2.0, 0, values_shape=[1, 2]), shape + "[1, 2]"),
            (inputs(2.0, 0)[:2], "input 'VALUES' is missing"),
            (inputs(2.0, 9), "mark 9 of session 's'"),
            # OIP's marks are signed: a negative one is refused like any other out of range.
            (inputs(2.0, -1), "mark -1 of session 's'"),
        ]  # fmt: skip
        for n, (tensors, _) in enumerate(cases):
            client.async_stream_infer(MODEL, tensors, sequence_id="s", request_id=f"bad-{n}")
        extra = triton.InferInput("EXTRA", [1], "FP64")
        extra.set_data_from_numpy(np.array([1.0]))
        client.async_stream_infer(MODEL, [*inputs(2.0, 0), extra], sequence_id="s", request_id="bad-extra")
        client.async_stream_infer(MODEL, inputs(2.0, 0), request_id="bad-no-id")
        client.async_stream_infer(
            MODEL, inputs(2.0, 0), sequence_id="s", outputs=[triton.InferRequestedOutput("NOPE")], request_id="bad-out"
        )
        client.async_stream_infer("other", inputs(2.0, 0), sequence_id="s", request_id="bad-model")
        stream.send(2.0, sequence_id="s", request_id="ok-2", outputs=[triton.InferRequestedOutput("SEQ")])

        result, error = stream.next()
        assert error is None and result.get_response().id == "ok-1"
        for _, expected in cases:
            result, error = stream.next()
            assert result is None and expected in str(error), (expected, error)
        for expected in (
            "unexpected inference input 'EXTRA' for model 'tiny'",
            "must specify a non-zero or non-empty correlation ID",
            "unexpected inference output 'NOPE' for model 'tiny'",
            "Request for unknown model: 'other' is not found",
        ):
            result, error = stream.next()
            assert result is None and expected in str(error), (expected, error)
        result, error = stream.next()
        # The refused requests took no seq; only the requested output came back.
        assert error is None and result.get_response().id == "ok-2"
        assert [o.name for o in result.get_response().outputs] == ["SEQ"]
        assert result.as_numpy("SEQ").tolist() == [2]
        stream.close()


def test_unary_infer_with_sequence_flags(start_server):
    srv = start_server(metrics_port=-1)
    with triton.InferenceServerClient(srv.address) as client:
        first = client.infer(MODEL, inputs(1.0, 1), sequence_id=5, sequence_start=True, request_id="u1")
        assert first.get_response().id == "u1" and first.as_numpy("SEQ").tolist() == [1]
        assert client.infer(MODEL, inputs(2.0, 1), sequence_id=5).as_numpy("SEQ").tolist() == [2]
        # START on an open sequence ends it first: the new one starts at 1.
        assert client.infer(MODEL, inputs(3.0, 1), sequence_id=5, sequence_start=True).as_numpy("SEQ").tolist() == [1]
        end = client.infer(MODEL, inputs(4.0, 1), sequence_id=5, sequence_end=True, parameters=None)
        assert end.as_numpy("SEQ").tolist() == [2]
        with pytest.raises(InferenceServerException) as after_end:
            client.infer(MODEL, inputs(5.0, 1), sequence_id=5)
        assert after_end.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "must specify the START flag on the first request of the sequence" in after_end.value.message()
        with pytest.raises(InferenceServerException, match="earlier than its previous event"):
            client.infer(MODEL, inputs(1.0, 1), sequence_id="t", sequence_start=True)
            client.infer(MODEL, inputs(0.5, 1), sequence_id="t")


def test_typed_contents_and_int32_marks_through_the_raw_protocol(start_server):
    """Inputs as typed contents instead of raw bytes (what other OIP clients send), over the wire with
    this repository's copy of Triton's messages on Triton's method path."""
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=oip.ModelInferRequest.SerializeToString,
            response_deserializer=oip.ModelInferResponse.FromString,
        )
        request = oip.ModelInferRequest(model_name=MODEL, id="typed")
        request.parameters["sequence_id"].string_param = "typed"
        request.parameters["sequence_start"].bool_param = True
        request.parameters["top_k"].int64_param = 5
        request.inputs.add(name="TIME", datatype="FP64", shape=[1]).contents.fp64_contents.append(3.5)
        request.inputs.add(name="MARK", datatype="INT32", shape=[1]).contents.int_contents.append(2)
        request.inputs.add(name="VALUES", datatype="FP32", shape=[2]).contents.fp32_contents.extend([0.5, -0.5])
        response = infer(request, timeout=CALL_TIMEOUT_S)
        assert response.id == "typed" and response.model_name == MODEL
        names = [o.name for o in response.outputs]
        top = np.frombuffer(response.raw_output_contents[names.index("TOP_MARKS")], "<i8")
        assert sorted(top.tolist()) == [0, 1, 2, 3, 4]  # the top_k parameter: all five marks
        assert list(response.outputs[names.index("TOP_MARKS")].shape) == [5]


def test_sequences_are_sessions_of_the_callers_tenant(start_server, tmp_path):
    """The bearer token scopes a sequence id as it scopes an aaren.v1 session id; a session is the
    same one over both protocols; no token, no OIP call."""
    tokens = {"tenant-a": new_token(), "tenant-b": new_token()}
    path = tmp_path / "tokens.txt"
    path.write_text("".join(f"{tenant} {hash_token(token)}\n" for tenant, token in tokens.items()))
    srv = start_server(metrics_port=-1, auth_tokens_file=path)
    headers = {tenant: {"authorization": f"Bearer {token}"} for tenant, token in tokens.items()}
    with triton.InferenceServerClient(srv.address) as client, grpc.insecure_channel(srv.address) as channel:
        with pytest.raises(InferenceServerException) as refused:
            client.is_server_live()
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"

        a = client.infer(MODEL, inputs(1.0, 0), sequence_id=1, sequence_start=True, headers=headers["tenant-a"])
        a = client.infer(MODEL, inputs(2.0, 0), sequence_id=1, headers=headers["tenant-a"])
        assert a.as_numpy("SEQ").tolist() == [2]
        # Tenant b has no sequence 1.
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            client.infer(MODEL, inputs(2.0, 0), sequence_id=1, headers=headers["tenant-b"])
        # Tenant a's aaren.v1 session "1" is that sequence: it goes on at seq 3.
        stub = stub_for(channel)
        metadata = [("authorization", headers["tenant-a"]["authorization"])]
        session = stub.GetSession(pb.GetSessionRequest(session_id="1"), metadata=metadata, timeout=CALL_TIMEOUT_S)
        assert session.last_seq == 2
        v1 = OpenStream(stub, metadata=metadata)
        assert_forecasts(v1.send([ev("1", 3, 3.0)]), [("1", 3)])
        v1.close()
        assert client.infer(MODEL, inputs(4.0, 0), sequence_id=1, headers=headers["tenant-a"]).as_numpy(
            "SEQ"
        ).tolist() == [4]


def test_an_idle_sequence_is_evicted_and_a_stream_ends_on_drain(start_server):
    srv = start_server(metrics_port=-1, idle_ttl_s=0.3)
    with triton.InferenceServerClient(srv.address) as client, grpc.insecure_channel(srv.address) as channel:
        assert client.infer(MODEL, inputs(1.0, 0), sequence_id="idle", sequence_start=True).as_numpy("SEQ") == [1]
        wait_until(lambda: get_session(stub_for(channel), "idle") is None, "the idle sequence to be evicted")
        stream = TritonStream(client)
        stream.send(2.0, sequence_id="idle", request_id="late")
        result, error = stream.next()
        assert result is None
        assert "inference request for sequence idle to model 'tiny' must specify the START flag on the first " \
               "request of the sequence (it was evicted after being idle or for capacity)" in str(error)  # fmt: skip
        stream.send(3.0, sequence_id="idle", sequence_start=True, request_id="again")
        result, error = stream.next()
        assert error is None and result.as_numpy("SEQ").tolist() == [1]

        # Draining: the open stream ends UNAVAILABLE once what it sent is answered.
        srv.stop(grace=1.0)
        result, error = stream.next()
        assert result is None and "StatusCode.UNAVAILABLE" in str(error)
        stream.close()
