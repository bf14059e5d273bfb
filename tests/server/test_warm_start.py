"""No request compiles: every compiled (numba) function that a served model's batches call is compiled, or loaded
from numba's cache, when the engine core starts. A compile on a request stalls the event loop, and with it every
stream, for seconds (in a new container, with an empty cache: the event kernel's float64-gap version took 9 s on
the first event, the finiteness check of a history's rows 5 s, the forecast alone on the first history)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import torch
from numba.core.registry import CPUDispatcher

import aaren.models
from aaren.server.core.engine_core import EngineCore
from aaren.server.frontends.streams import EventChecker
from aaren.server.observability.metrics import Metrics
from aaren.server.settings import ServerSettings
from aaren.server.stores import StateLayout, open_store
from aaren.server.tasks.repository import load_models


def compiled_versions() -> dict[str, int]:
    """The versions compiled so far of every numba function of the project's modules."""
    return {
        f"{module_name}.{name}": len(value.signatures)
        for module_name, module in list(sys.modules.items())
        if module_name.startswith("aaren")
        for name, value in list(vars(module).items())
        if isinstance(value, CPUDispatcher)
    }


def test_no_first_event_or_history_of_any_bundled_model_compiles():
    async def serve_each_model_once() -> tuple[dict[str, int], dict[str, int], list[str]]:
        settings = ServerSettings()
        served = load_models(
            checkpoint=None,
            models_dir=Path(aaren.models.__file__).parent,
            default_model=None,
            device=torch.device("cpu"),
            quantiles=settings.quantiles,
        )
        stores = [
            (task, open_store("memory://", StateLayout(task.layout_rows()), capacity=64, idle_ttl_s=3600.0))
            for task in served.tasks
        ]
        core = EngineCore(stores[0][0], stores[0][1], settings, Metrics(), more=stores[1:])
        await core.start()
        before = compiled_versions()
        kinds: list[str] = []
        try:
            loop = asyncio.get_running_loop()
            for task, _ in stores:
                d = task.description
                checker = EventChecker.for_model(d, settings.max_session_id_bytes)
                step = float(d.step_seconds) or 1.0
                for n in (1, 12):  # one event (the kernel's batch), then a history in one message
                    seqs = list(range(1, n + 1))
                    request = checker.request(
                        [f"{d.name}-{n}"] * n, seqs, [1000.0 + step * q for q in seqs], [0] * n,
                        [[0.1] * checker.width] * n, model=d.name,
                    )  # fmt: skip
                    answered = loop.create_future()
                    core.submitter(d.name)(request, answered.set_result)
                    outcomes = await answered
                    kinds.append(f"{d.name} x{n}: {sorted(set(outcomes.kind.tolist()))} {outcomes.errors}")
        finally:
            await core.close()
        return before, compiled_versions(), kinds

    before, after, kinds = asyncio.run(serve_each_model_once())
    assert len(kinds) == 8 and all(k.endswith(": [0] {}") for k in kinds), kinds  # every event forecast
    assert {k: v for k, v in after.items() if v != before.get(k, 0)} == {}
    assert before["aaren.server.core.batcher.rows_finite"] >= 2  # warm_plan's and the models' field tuples


#: A server's requests in a fresh process (the pytest process has compiled what earlier tests served), to every bundled
#: model: one event, one message of 256 sessions' events (two parts on the kernel's two threads) in each reply layout,
#: and a history; each message on a time step of the model's grid (a series model's).
_WIRE_SCRIPT = """
import json, pathlib, sys
import grpc
sys.path.insert(0, sys.argv[1])
import aaren.models
from servers import ServerThread
from test_warm_start import compiled_versions
from aaren.v1 import aaren_pb2 as pb, aaren_pb2_grpc

models_dir = pathlib.Path(aaren.models.__file__).parent
with ServerThread(checkpoint=None, models_dir=models_dir, kernel_threads=2) as server:
    stub = aaren_pb2_grpc.ForecastServiceStub(grpc.insecure_channel(server.address))
    names = stub.DescribeModel(pb.DescribeModelRequest()).served_models
    models = [stub.DescribeModel(pb.DescribeModelRequest(model=name)) for name in names]
    before = compiled_versions()
    answered = {}
    for model in models:
        step = model.step_seconds or 60.0

        def event(session, seq):
            values = [0.5] * model.value_width
            return pb.Event(session_id=session, seq=seq, time=(1000 + seq) * step, mark=0, values=values)

        messages = [
            pb.StreamRequest(events=[event("one", 1)]),
            pb.StreamRequest(events=[event(f"rows-{i}", 1) for i in range(256)]),
            pb.StreamRequest(events=[event(f"cols-{i}", 1) for i in range(256)], layout=pb.RESPONSE_LAYOUT_COLUMNS),
            pb.StreamRequest(events=[event("history", seq) for seq in range(1, 13)]),
        ]
        answered[model.name] = []
        for message in messages:  # one at a time: each its own batch
            message.model = model.name
            (response,) = list(stub.Stream(iter([message])))
            forecasts = [r for r in response.results if r.WhichOneof("outcome") == "forecast"]
            answered[model.name].append(len(forecasts) or len(response.forecast_columns.event_index))
    after = compiled_versions()
    server.stop()
print(json.dumps({"answered": answered, "compiled": {k: v for k, v in after.items() if v != before.get(k, 0)}}))
"""


def test_no_request_on_the_wire_compiles():
    """The same through a real server's gRPC front end, in a process of its own, for every bundled model: the request
    reader, the reply writer in both layouts and each task's own, and a batch large enough for the event kernel to run
    in parts."""
    tests = Path(__file__).parents[1]
    done = subprocess.run(
        [sys.executable, "-c", _WIRE_SCRIPT, str(tests)],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["answered"]) == 4 and all(n == [1, 256, 256, 12] for n in result["answered"].values()), result
    assert result["compiled"] == {}
