"""Run by tests/proto/test_kserve.py inside a throwaway venv that holds KServe's SDK (and not aaren):
drive a running aaren server with KServe's own gRPC client (``kserve.InferenceGRPCClient``).

stdin: ``{"address", "model", "requests": [{"sequence_id", "start", "end", "time", "mark", "values"}]}``;
stdout: JSON with the readiness answers and, per request, its outputs (name -> list) or its error.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import sys

import grpc
import kserve
import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest


def _inputs(request: dict) -> list[InferInput]:
    time = InferInput("TIME", [1], "FP64")
    time.set_data_from_numpy(np.array([request["time"]], np.float64))
    mark = InferInput("MARK", [1], "INT64")
    mark.set_data_from_numpy(np.array([request["mark"]], np.int64))
    values = InferInput("VALUES", [len(request["values"])], "FP32")
    values.set_data_from_numpy(np.array(request["values"], np.float32))
    return [time, mark, values]


async def main(job: dict) -> dict:
    out: dict = {"kserve": importlib.metadata.version("kserve"), "file": kserve.__file__, "answers": []}
    async with InferenceGRPCClient(job["address"], retries=0, timeout=20) as client:
        out["server_ready"] = await client.is_server_ready()
        out["model_ready"] = await client.is_model_ready(job["model"])
        for n, request in enumerate(job["requests"]):
            parameters = {"sequence_id": request["sequence_id"], "sequence_start": request["start"]}
            parameters["sequence_end"] = request["end"]
            infer = InferRequest(job["model"], _inputs(request), request_id=f"k{n}", parameters=parameters)
            try:
                response = await client.infer(infer)
            except grpc.RpcError as error:
                out["answers"].append({"error": f"{error.code().name}: {error.details()}"})
                continue
            answer = {o.name: o.as_numpy().tolist() for o in response.outputs}
            out["answers"].append({"id": response.id, "model": response.model_name, "outputs": answer})
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.load(sys.stdin)))))
