"""No request compiles: every compiled (numba) function that a served model's batches call is compiled, or loaded
from numba's cache, when the engine core starts. A compile on a request stalls the event loop, and with it every
stream, for seconds (in a new container, with an empty cache: the event kernel's float64-gap version took 9 s on
the first event, the finiteness check of a history's rows 5 s, the forecast alone on the first history)."""

from __future__ import annotations

import asyncio
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
