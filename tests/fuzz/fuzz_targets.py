"""Coverage-guided fuzz targets (atheris) for the code that reads untrusted bytes.

    python tests/fuzz/fuzz_targets.py requests CORPUS_DIR -runs=20000     # request parsing and validation
    python tests/fuzz/fuzz_targets.py state CORPUS_DIR -max_total_time=60 # state bytes and Redis records

CORPUS_DIR (created when missing) is seeded with valid inputs (requests with good and bad events;
real state bytes and Redis records), which libFuzzer mutates: protobuf and safetensors parse in
native code that atheris does not see, so starting from valid inputs is what reaches our code.

``requests``: bytes -> ``aaren.v1.StreamRequest`` -> the front end's columns and stateless checks
(``ForecastServicer.core_request``: ``EventChecker``) and the session-id scoping; ``state``: bytes ->
``state_from_bytes`` (any kind), the served model's
``state_from_bytes`` and the Redis store's record parser. A target may reject its input only with
the documented error (DecodeError, StateFormatError); anything else is a crash, and atheris stops
with a reproducer file. tests/fuzz/test_fuzz.py runs both briefly in the suite.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import atheris
import torch
from google.protobuf.message import DecodeError

import aaren.server.contract.validation
import aaren.server.frontends.aaren_v1.servicer
import aaren.server.stores.redis_store
import aaren_core.attention.state
from aaren.server.core.batcher import Scope
from aaren.server.core.engine_core import EngineCore
from aaren.server.frontends.aaren_v1.servicer import ForecastServicer
from aaren.server.observability.metrics import Metrics
from aaren.server.settings import ServerSettings
from aaren.server.stores import SessionMeta, StateLayout
from aaren.server.stores.memory import MemoryStore
from aaren.server.stores.redis_store import WRITE_ID_BYTES, RedisStore
from aaren.server.tasks.event.task import load_event_task
from aaren.v1 import aaren_pb2 as pb
from aaren_core.attention.state import StateFormatError, state_from_bytes


def _instrument(*modules: object) -> None:
    """Coverage for our modules' functions only (instrumenting torch too would take minutes)."""
    for module in modules:
        for value in list(vars(module).values()):
            functions = [value] if callable(value) and getattr(value, "__module__", None) == module.__name__ else []
            if isinstance(value, type) and value.__module__ == module.__name__:
                functions = [f for f in vars(value).values() if callable(f)]
            for function in functions:
                if hasattr(function, "__code__"):
                    atheris.instrument_func(function)


_instrument(
    aaren_core.attention.state,
    aaren.server.contract.validation,
    aaren.server.frontends.aaren_v1.servicer,
    aaren.server.stores.redis_store,
)

ENGINE = load_event_task(None, torch.device("cpu"), (0.1, 0.5, 0.9))
LAYOUT = StateLayout(ENGINE.layout_rows())
FRONT_END = ForecastServicer(ServerSettings(), Metrics())
FRONT_END.attach(EngineCore(ENGINE, MemoryStore(LAYOUT, capacity=10, idle_ttl_s=60), ServerSettings(), Metrics()))
SCOPE = Scope(tenancy=True)
RECORDS = RedisStore.__new__(RedisStore)  # only the record parser is exercised: no connection
RECORDS._row_nbytes = LAYOUT.row_nbytes


def fuzz_requests(data: bytes) -> None:
    try:
        request = pb.StreamRequest.FromString(data)
    except DecodeError:
        return
    core_request = FRONT_END.core_request(request, "tenant")
    assert len(core_request.index) + len(core_request.errors) == len(request.events)
    for error in core_request.errors.values():
        assert error.code and error.reason and error.message, error
    assert SCOPE.shown(SCOPE.key(request.request_id, "tenant")) == request.request_id


def fuzz_state(data: bytes) -> None:
    with contextlib.suppress(StateFormatError):
        state_from_bytes(data)
    with contextlib.suppress(StateFormatError):
        ENGINE.model.backbone.state_from_bytes(data, model_version=ENGINE.version)
    meta, state = RECORDS._parse(data)
    assert state is None or len(state) == LAYOUT.row_nbytes
    assert isinstance(meta.last_seq, int) and isinstance(meta.model_version, str)


def seeds(target: str) -> list[bytes]:
    if target == "requests":
        good = pb.Event(session_id="s", seq=1, time=1.0, mark=0, values=[0.5] * ENGINE.description.value_width)
        bad = [
            pb.Event(session_id="", seq=1),
            pb.Event(session_id="é" * 200, seq=0, time=float("nan"), mark=99, values=[float("inf")]),
            pb.Event(session_id="s", seq=2**64 - 1, time=-1e308, mark=2**32 - 1, values=[1.0, 2.0, 3.0]),
        ]
        return [pb.StreamRequest(request_id="r", events=[good, *bad]).SerializeToString()] + [
            pb.StreamRequest(events=[e]).SerializeToString() for e in (good, *bad)
        ]
    state = ENGINE.state_of(LAYOUT.empty(1)).to_bytes(model_version=ENGINE.version)
    meta = SessionMeta(3, 2.5, 1.0, 2.0, ENGINE.version)
    record = RedisStore._record(meta, b"\0" * LAYOUT.row_nbytes, b"\1" * WRITE_ID_BYTES)
    return [state, record, record[:-WRITE_ID_BYTES]]  # and a record from before write ids


TARGETS = {"requests": fuzz_requests, "state": fuzz_state}

if __name__ == "__main__":
    name, corpus = sys.argv[1], Path(sys.argv[2])
    corpus.mkdir(parents=True, exist_ok=True)
    if not any(corpus.iterdir()):
        for i, seed in enumerate(seeds(name)):
            (corpus / f"seed-{i}").write_bytes(seed)
    atheris.Setup([sys.argv[0], str(corpus), *sys.argv[3:]], TARGETS[name])
    atheris.Fuzz()
