"""Both cores a front end can hold implement ``CoreAPI``: the in-process ``EngineCore`` and the IPC
client of a core in another process, with the protocol's signatures, and they answer alike."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import typing

import numpy as np
import pytest

from aaren.server.contract.columns import FORECAST, Outcomes
from aaren.server.contract.core_api import CoreAPI, ForecastOptions
from aaren.server.contract.errors import ServiceError
from aaren.server.core.engine_core import EngineCore
from aaren.server.frontends.aaren_v1.servicer import ForecastServicer
from aaren.server.frontends.grpc_server import GrpcFrontEnd
from aaren.server.frontends.oip.servicer import OipServicer
from aaren.server.frontends.streams import EventChecker
from aaren.server.ipc.client_side import CoreClient

SAMPLED = ForecastOptions(horizon=3, num_samples=8, seed=5, top_k=2, include_paths=True)
MEMBERS = [name for name in dir(CoreAPI) if not name.startswith("_")]
METHODS = [name for name in MEMBERS if inspect.isfunction(getattr(CoreAPI, name))]


def _shape(fn: typing.Callable[..., object]) -> tuple[bool, list[tuple[str, object, object]]]:
    """What a caller relies on: coroutine or not, and each parameter's name, kind and default."""
    params = [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
    return inspect.iscoroutinefunction(fn), params


@pytest.mark.parametrize("impl", [EngineCore, CoreClient], ids=["EngineCore", "CoreClient"])
def test_each_core_has_the_protocols_methods_with_its_signatures(impl):
    assert {"submit", "forecast", "get_session", "end_session", "open_stream"} <= set(METHODS)
    for name in METHODS:
        assert _shape(getattr(impl, name)) == _shape(getattr(CoreAPI, name)), name


def test_front_ends_hold_a_core_api():
    for attach in (ForecastServicer.attach, OipServicer.attach, GrpcFrontEnd.attach):
        assert typing.get_type_hints(attach)["core"] is CoreAPI, attach.__qualname__


@contextlib.asynccontextmanager
async def connected(srv: typing.Any, index: int) -> typing.AsyncIterator[CoreClient]:
    """A ``CoreClient`` on the server's core socket, as a front-end process holds one."""

    async def nothing(*_: object) -> None:
        return None

    client = CoreClient(srv.server.core_server.path, srv.server._key, index, nothing, nothing, nothing, {})
    await client.connect()
    try:
        yield client
    finally:
        await client.close()


def test_the_ipc_client_answers_as_the_engine_core_does(start_server):
    srv = start_server(frontends=1)
    core = srv.server.core
    assert isinstance(core, CoreAPI) and core.lost is False
    d = core.descriptions[0]
    checker = EventChecker(d.num_marks, d.value_names, 64)

    async def through_the_client() -> tuple:
        async with connected(srv, 7) as client:
            assert isinstance(client, CoreAPI) and not client.lost
            answered: asyncio.Future[Outcomes] = asyncio.get_running_loop().create_future()
            client.submit(
                checker.request(["api-1", "api-1"], [1, 2], [1.0, 2.5], [0, 1], [[0.0, 0.0]] * 2), answered.set_result
            )
            outcomes = await asyncio.wait_for(answered, 30)
            view = await client.get_session("api-1")
            future = await client.forecast("api-1", SAMPLED)
            refusal = await client.open_stream("")
            await client.close_stream("")
            return client.descriptions, client.aliases, outcomes, view, future, refusal

    descriptions, aliases, outcomes, view, future, refusal = asyncio.run(through_the_client())
    assert descriptions == core.descriptions and aliases == core.aliases and refusal is None
    np.testing.assert_array_equal(outcomes.kind, [FORECAST, FORECAST])
    assert outcomes.request_error is None and not outcomes.errors
    assert view == srv.call(core.get_session("api-1"))
    assert (view.last_seq, view.last_time) == (2, 2.5)
    here = srv.call(core.forecast("api-1", SAMPLED))
    assert (future.session_id, future.seq, future.last_time, future.top_k) == ("api-1", 2, 2.5, 2)
    assert len(future.steps) == 3 and len(future.times) == 8  # the seeded samples, equal on both paths
    assert (future.steps, future.times, future.marks, future.values) == (
        here.steps,
        here.times,
        here.marks,
        here.values,
    )
    assert type(future.outputs) is type(here.outputs)
    got, want = future.outputs.to_columns(), here.outputs.to_columns()
    assert got.keys() == want.keys()
    for name, column in want.items():
        np.testing.assert_array_equal(got[name], column)

    async def end_through_the_client() -> int | None:
        async with connected(srv, 8) as client:
            ended = await client.end_session("api-1")
            with pytest.raises(ServiceError) as missing:
                await client.get_session("api-1")
            assert missing.value.info.reason == "session_not_found"
            return ended

    assert asyncio.run(end_through_the_client()) == 2
