"""How the batcher cuts its queue into batches: at most ``max_batch_size`` sessions a batch, every event of
every queued request answered, each session's events applied in order across requests and batches."""

from __future__ import annotations

import asyncio

import numpy as np

from aaren.server.contract.columns import FORECAST, Outcomes
from aaren.server.core.engine_core import EngineCore
from aaren.server.frontends.streams import EventChecker
from aaren.server.observability.metrics import Metrics
from aaren.server.settings import ServerSettings, bundled_checkpoint
from aaren.server.stores import StateLayout, open_store
from aaren.server.tasks.event.task import load_event_task, resolve_device


def test_batches_hold_at_most_max_batch_size_sessions_and_answer_every_queued_event_in_order():
    max_sessions = 4
    rng = np.random.default_rng(3)
    # 30 requests queued at once, of 1-6 events of sessions drawn from 9 (repeats within a request too):
    # batches must cut inside requests, between them, and where a request's sessions fill a batch exactly
    requests = [rng.integers(0, 9, rng.integers(1, 7)).tolist() for _ in range(30)]
    requests[0] = [0, 1, 2, 3]  # the first batch is full of sessions at a request's end
    requests[1] = [0]  # a session of that batch, next: waits for the next batch (or joins it as a run)

    async def serve() -> tuple[list[Outcomes], list[int], dict[str, int]]:
        settings = ServerSettings(max_batch_size=max_sessions)
        engine = load_event_task(str(bundled_checkpoint()), resolve_device("cpu"), settings.quantiles)
        store = open_store("memory://", StateLayout(engine.layout_rows()), capacity=64, idle_ttl_s=3600.0)
        loaded_sessions: list[int] = []
        load = store.load

        async def counted_load(ids):  # the store's own load; one a batch, of the batch's sessions
            loaded_sessions.append(len(ids))
            return await load(ids)

        store.load = counted_load
        core = EngineCore(engine, store, settings, Metrics())
        d = engine.description
        checker = EventChecker(d.num_marks, d.value_names, settings.max_session_id_bytes)
        seq: dict[str, int] = {}
        futures = []
        loop = asyncio.get_running_loop()
        for sessions in requests:  # all queued before the batcher runs
            ids = [f"s{u}" for u in sessions]
            seqs = []
            for i in ids:
                seq[i] = seq.get(i, 0) + 1
                seqs.append(seq[i])
            times = [float(s) for s in seqs]
            future = loop.create_future()
            core.submit(checker.request(ids, seqs, times, [0] * len(ids), [[0.0, 0.0]] * len(ids)), future.set_result)
            futures.append(future)
        await core.start()
        try:
            outcomes = await asyncio.wait_for(asyncio.gather(*futures), 60)
            batches = list(loaded_sessions)  # the batches' loads (get_session below may load too)
            stored = {sid: (await core.get_session(sid)).last_seq for sid in seq}
        finally:
            await core.close()
        return outcomes, batches, stored

    outcomes, batches, stored = asyncio.run(serve())
    assert batches[0] == max_sessions and max(batches) == max_sessions, batches  # the first request fills one
    for sessions, got in zip(requests, outcomes, strict=True):
        assert got.request_error is None and not got.errors, got.errors
        assert (got.kind == FORECAST).all() and len(got.kind) == len(sessions)
    assert stored == {f"s{u}": sum(r.count(u) for r in requests) for u in {u for r in requests for u in r}}
