"""The wire contract: generated code is fresh, messages round-trip, and the service works over a real socket."""

import asyncio
import importlib.util
import math
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"


def _load_generate():
    spec = importlib.util.spec_from_file_location("aaren_proto_generate", PROTO_ROOT / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generate()


def test_committed_generated_code_is_fresh():
    problems = generate.stale_files()
    assert not problems, "stale generated code, run `python proto/generate.py`:\n" + "\n".join(problems)


def test_check_names_stale_missing_and_orphaned_files(tmp_path):
    root = tmp_path / "proto"
    shutil.copytree(PROTO_ROOT, root, ignore=shutil.ignore_patterns("__pycache__"))
    v1 = root / "aaren" / "v1"
    with (v1 / "aaren_pb2.py").open("a") as f:
        f.write("# hand edit\n")
    (v1 / "aaren_pb2.pyi").unlink()
    (v1 / "old_pb2.py").write_text("")

    done = subprocess.run(
        [sys.executable, str(root / "generate.py"), "--check"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 1
    for name in ("aaren_pb2.py: differs", "aaren_pb2.pyi: missing", "old_pb2.py: no .proto"):
        assert name in done.stderr

    generate.write(root)
    assert generate.stale_files(root) == []
    assert not (v1 / "old_pb2.py").exists()


def _commented_elements(proto_name: str) -> tuple[list[str], set[tuple[int, ...]]]:
    """Every message, field, oneof, enum, enum value, service and rpc of a file (by path) and the
    paths that carry a comment, from protoc's source info."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        args = [
            "grpc_tools.protoc",
            f"--proto_path={PROTO_ROOT}",
            f"--proto_path={resources.files('grpc_tools') / '_proto'}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            str(PROTO_ROOT / proto_name),
        ]
        assert protoc.main(args) == 0
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (file,) = fds.file
    commented = {
        tuple(loc.path) for loc in file.source_code_info.location if loc.leading_comments or loc.trailing_comments
    }
    elements: list[tuple[str, tuple[int, ...]]] = []

    def enum(e, path):
        elements.append((e.name, path))
        elements.extend((f"{e.name}.{v.name}", (*path, 2, j)) for j, v in enumerate(e.value))

    def message(m, path):
        elements.append((m.name, path))
        elements.extend((f"{m.name}.{f.name}", (*path, 2, j)) for j, f in enumerate(m.field))
        elements.extend((f"{m.name}.{o.name}", (*path, 8, j)) for j, o in enumerate(m.oneof_decl) if o.name[0] != "_")
        for j, nested in enumerate(m.nested_type):
            message(nested, (*path, 3, j))
        for j, e in enumerate(m.enum_type):
            enum(e, (*path, 4, j))

    for i, m in enumerate(file.message_type):
        message(m, (4, i))
    for i, e in enumerate(file.enum_type):
        enum(e, (5, i))
    for i, s in enumerate(file.service):
        elements.append((s.name, (6, i)))
        elements.extend((f"{s.name}.{r.name}", (6, i, 2, j)) for j, r in enumerate(s.method))
    missing = [name for name, path in elements if path not in commented]
    return missing, {path for _, path in elements}


def test_every_element_of_the_contract_is_commented():
    missing, elements = _commented_elements("aaren/v1/aaren.proto")
    assert len(elements) > 100
    assert missing == []


def test_error_codes_mirror_grpc_status_codes():
    for value in pb.ErrorCode.DESCRIPTOR.values:
        if value.number == 0:
            continue
        status = grpc.StatusCode[value.name.removeprefix("ERROR_CODE_")]
        assert status.value[0] == value.number, value.name
    assert len(pb.ErrorCode.DESCRIPTOR.values) == len(grpc.StatusCode)  # UNSPECIFIED stands in for OK


def test_stream_request_round_trips():
    events = [
        pb.Event(session_id="a", seq=1, time=0.5, mark=2, values=[1.25, -3.0]),
        pb.Event(session_id="b", seq=7, time=1e9 + 0.125, mark=0),
        pb.Event(session_id="a", seq=2, time=0.5, mark=1, values=[0.0, 2.5]),
    ]
    request = pb.StreamRequest(request_id="r1", events=events, forecast_mode=pb.FORECAST_MODE_LAST_PER_SESSION, top_k=3)
    back = pb.StreamRequest.FromString(request.SerializeToString())
    assert back == request
    assert [e.session_id for e in back.events] == ["a", "b", "a"]
    assert back.events[1].time == 1e9 + 0.125  # float64 keeps sub-second precision of absolute times
    assert list(back.events[0].values) == [1.25, -3.0]
    assert back.forecast_mode == pb.FORECAST_MODE_LAST_PER_SESSION

    result = pb.EventResult(
        session_id="a", seq=3, error=pb.EventError(code=pb.ERROR_CODE_FAILED_PRECONDITION, reason="seq_gap")
    )
    back = pb.EventResult.FromString(result.SerializeToString())
    assert back.WhichOneof("outcome") == "error"
    assert back.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]

    unseeded = pb.ForecastRequest(session_id="a", horizon=5)
    seeded = pb.ForecastRequest(session_id="a", horizon=5, seed=0)
    assert not pb.ForecastRequest.FromString(unseeded.SerializeToString()).HasField("seed")
    assert pb.ForecastRequest.FromString(seeded.SerializeToString()).HasField("seed")


NUM_MARKS = 5  # the tiny checkpoint's (conftest); its events carry two values


async def _talk(address: str) -> None:
    """The generated asyncio stubs against the real server: one request, then a message with every outcome."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.ForecastServiceStub(channel)
        call = stub.Stream()

        await call.write(
            pb.StreamRequest(request_id="one", events=[pb.Event(session_id="a", seq=1, time=2.0, values=[0.5, 1.0])])
        )
        first = await call.read()
        assert first.request_id == "one"
        (only,) = first.results
        assert only.WhichOneof("outcome") == "forecast"
        forecast = only.forecast
        assert (forecast.session_id, forecast.seq, forecast.last_time) == ("a", 1, 2.0)
        assert forecast.next_time.expected_time > 2.0 and math.isfinite(forecast.next_time.mean)
        quantiles = list(forecast.next_time.quantiles)
        assert quantiles and [q.q for q in quantiles] == sorted(q.q for q in quantiles)
        assert [q.value for q in quantiles] == sorted(q.value for q in quantiles)
        assert len(forecast.values) == 2 and forecast.model.name == "tiny"

        batch = pb.StreamRequest(
            request_id="many",
            events=[
                pb.Event(session_id="b", seq=1, time=0.0, mark=1, values=[4.0, 0.0]),
                pb.Event(session_id="a", seq=2, time=2.5, mark=2, values=[0.0, 0.0]),
                pb.Event(session_id="a", seq=2, time=2.5, mark=2, values=[0.0, 0.0]),  # resent: a duplicate
                pb.Event(session_id="b", seq=3, time=1.0, values=[0.0, 0.0]),  # gap
                pb.Event(session_id="b", seq=2, time=1.0, mark=NUM_MARKS, values=[0.0, 0.0]),  # bad mark
                pb.Event(session_id="b", seq=2, time=1.0, mark=0, values=[0.0, 0.0]),  # fixed; b goes on
            ],
        )
        await call.write(batch)
        await call.done_writing()
        responses = []
        while (response := await call.read()) != grpc.aio.EOF:
            responses.append(response)
        assert await call.code() == grpc.StatusCode.OK

        (second,) = responses
        assert second.request_id == "many"
        outcomes = [(r.session_id, r.seq, r.WhichOneof("outcome"), r.duplicate) for r in second.results]
        assert outcomes == [
            ("b", 1, "forecast", False),
            ("a", 2, "forecast", False),
            ("a", 2, "ack", True),
            ("b", 3, "error", False),
            ("b", 2, "error", False),
            ("b", 2, "forecast", False),
        ]
        assert second.results[2].ack.last_seq == 2
        gap, bad_mark = second.results[3].error, second.results[4].error
        assert (gap.code, gap.reason) == (pb.ERROR_CODE_FAILED_PRECONDITION, "seq_gap"), gap
        assert (bad_mark.code, bad_mark.reason) == (pb.ERROR_CODE_INVALID_ARGUMENT, "mark_out_of_range"), bad_mark

        info = await stub.GetSession(pb.GetSessionRequest(session_id="b"))
        assert (info.last_seq, info.model.name) == (2, "tiny")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetSession(pb.GetSessionRequest(session_id="nobody"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert ("aaren-error-reason", "session_not_found") in tuple(caught.value.trailing_metadata())


def test_stream_over_a_real_socket(start_server):
    server = start_server(metrics_port=-1)
    asyncio.run(asyncio.wait_for(_talk(server.address), timeout=60))  # the timeout keeps a bug from hanging
