"""The one stream loop (``aaren.server.frontends.streams``) behaves alike on both protocols, in both
process layouts: a message that does not parse ends an OIP stream as it ends an aaren.v1 one
(tests/server/test_robustness.py): INVALID_ARGUMENT, after the answer to what came before it."""

from __future__ import annotations

import grpc
import pytest
from server_helpers import CALL_TIMEOUT_S, layouts_of

from aaren.oip.v2 import grpc_service_pb2 as oip

MODEL = "tiny"
#: ModelInferRequest.model_name = b"\xff\xfe": not UTF-8, so the message does not parse.
BAD_UTF8 = b"\x0a\x02\xff\xfe"


@pytest.fixture
def start_server(start_server, frontends):
    """Every server of this module runs in both process layouts."""
    return layouts_of(start_server, frontends)


def oip_event(request_id: str, sequence_id: str, time: float, *, start: bool = False) -> bytes:
    request = oip.ModelInferRequest(model_name=MODEL, id=request_id)
    request.parameters["sequence_id"].string_param = sequence_id
    request.parameters["sequence_start"].bool_param = start
    request.inputs.add(name="TIME", datatype="FP64", shape=[1]).contents.fp64_contents.append(time)
    request.inputs.add(name="MARK", datatype="INT64", shape=[1]).contents.int64_contents.append(1)
    request.inputs.add(name="VALUES", datatype="FP32", shape=[2]).contents.fp32_contents.extend([0.5, -0.5])
    return request.SerializeToString()


def test_a_malformed_oip_message_ends_the_stream_with_invalid_argument(start_server):
    srv = start_server(metrics_port=-1)
    with grpc.insecure_channel(srv.address) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda raw: raw,
            response_deserializer=oip.ModelStreamInferResponse.FromString,
        )(iter([oip_event("good", "malformed-1", 1.0, start=True), BAD_UTF8]), timeout=CALL_TIMEOUT_S)
        answers = []
        with pytest.raises(grpc.RpcError) as ended:
            for response in call:
                answers.append((response.infer_response.id, response.error_message))
        assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ended.value
        assert "malformed request message" in ended.value.details()
        assert dict(ended.value.trailing_metadata() or ()).get("aaren-error-reason") == "malformed_request"
        assert answers == [("good", "")]
