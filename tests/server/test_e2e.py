"""End to end: real flights events through a real server equal the offline model (invariant 4)."""

from __future__ import annotations

import copy
import itertools
import random

import grpc
import numpy as np
import pytest
import torch
from servers import START_TIMEOUT_S

from aaren.server.stores.base import as_arrays
from aaren.server.tasks.runs import RunColumns
from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc
from aaren_core.checkpoint import load_checkpoint, save_checkpoint
from aaren_core.tasks.event.flights import load_flights

pytest.importorskip("pyarrow")  # the flights reader needs nothing else; this keeps the dev extra honest

N_SESSIONS = 6
EVENTS_PER_SESSION = 50


@pytest.fixture(scope="module")
def flights_events():
    data = load_flights()
    sequences = data.test[:N_SESSIONS]
    schema = data.schema
    return sequences, schema


@pytest.fixture(scope="module")
def flights_checkpoint(tmp_path_factory, flights_events, tiny_model_factory):
    _, schema = flights_events
    path = tmp_path_factory.mktemp("flights-ckpt")
    model = tiny_model_factory(seed=3, num_marks=schema.num_marks, value_width=schema.value_width)
    model.set_normalization(
        2.0, 1.0, torch.tensor(schema.value_mean, dtype=torch.float32), torch.tensor(schema.value_std)
    )
    # A random head can give a mixture component a log-space spread near exp(3) = 20; its mean
    # exp(mu + sigma^2 / 2) then turns float32 rounding (1e-7) into 1e-5 relative differences
    # between batch widths. Keep the random spreads ordinary so the 1e-5 comparison tests the
    # service, not that conditioning (the head's cap is a known open point).
    k = model.heads.n_components
    with torch.no_grad():
        model.heads.time.weight[2 * k :].mul_(0.1)
        model.heads.time.bias[2 * k :].mul_(0.1)
    save_checkpoint(path, model, metadata={"name": "tiny-flights", "schema": schema.to_dict()})
    return path


def offline_forecasts(model, seq, n):
    """What aaren_core computes for each prefix of the session: forecast after event k, k = 1..n,
    in the model's own dtype (float32 as served, float64 for the exact maths)."""
    dtype = next(model.parameters()).dtype
    times = torch.tensor(seq.times[:n], dtype=torch.float64)
    dt = torch.cat([torch.zeros(1, dtype=torch.float64), times.diff()]).to(dtype).unsqueeze(0)
    marks = torch.tensor(seq.marks[:n]).unsqueeze(0)
    values = torch.tensor(seq.values[:n]).to(dtype).unsqueeze(0)
    with torch.no_grad():
        y = model(dt, marks, values)[0]  # [n, d]
        return model.forecast(y, quantiles=(0.1, 0.5, 0.9), top_k=3)


def forecast_numbers(f: pb.Forecast) -> list[float]:
    """A served forecast's numbers in one order: mean, time quantiles, top-mark probabilities,
    value means, value stds."""
    return [
        f.next_time.mean,
        *(q.value for q in f.next_time.quantiles),
        *(m.probability for m in f.marks),
        *(v.mean for v in f.values),
        *(v.std for v in f.values),
    ]


def offline_numbers(want, k: int) -> list[float]:
    """The same numbers of an offline forecast after event k + 1 (or of the engine's ``EventOutputs`` row k)."""
    return [
        float(want.time_mean[k]),
        *want.time_quantiles[k].tolist(),
        *want.top_probs[k].tolist(),
        *want.value_mean[k].tolist(),
        *want.value_std[k].tolist(),
    ]


def apply_offline(engine, batches: list[list[pb.Event]], top_k: int) -> dict[tuple[str, int], list[float]]:
    """The numbers of every event's forecast when the engine applies ``batches`` one after another, each
    as one call of ``engine.apply`` (a session's events of a batch one run, in the batch's order), the
    rows kept between calls as the memory store keeps them: the path of the server's batches, had each
    batch been these events."""
    fresh = {name: t.unsqueeze(0).numpy() for name, t in engine.layout_rows().items()}
    rows: dict[str, dict[str, np.ndarray]] = {}
    last_time: dict[str, float] = {}
    numbers: dict[tuple[str, int], list[float]] = {}
    for batch in batches:
        runs: dict[str, list[pb.Event]] = {}
        for e in batch:
            runs.setdefault(e.session_id, []).append(e)
        order = [e for run in runs.values() for e in run]
        dt = []
        for e in order:
            dt.append(e.time - last_time.get(e.session_id, e.time))
            last_time[e.session_id] = e.time
        lengths = np.array([len(run) for run in runs.values()])
        columns = RunColumns(
            np.array(dt, dtype=np.float64),
            np.array([e.mark for e in order], dtype=np.int64),
            np.array([list(e.values) for e in order], dtype=np.float32),
            np.cumsum(lengths) - lengths,
            lengths,
            np.ones(len(order), dtype=bool),
        )
        old = {name: np.concatenate([rows.get(sid, fresh)[name] for sid in runs]) for name in fresh}
        new, out = engine.apply(old, columns, top_k)
        new = as_arrays(new)
        for r, sid in enumerate(runs):
            rows[sid] = {name: np.array(new[name][r : r + 1]) for name in fresh}
        for i, e in enumerate(order):
            numbers[(e.session_id, e.seq)] = offline_numbers(out, i)  # EventOutputs: the forecast's field names
    return numbers


@pytest.mark.parametrize(
    ("compile_model", "kernel", "frontends"),
    [(False, True, 0), (False, True, 2), (False, False, 0), (True, False, 0)],
    ids=["kernel", "kernel-2-frontends", "torch-eager", "compiled"],
)
def test_streamed_forecasts_equal_offline_model(
    start_server, flights_events, flights_checkpoint, compile_model, kernel, frontends
):
    """In both process layouts (one process; the engine core with two front-end processes), with
    the default numba kernel for batches of single events, with the torch eager path, and with the
    step and forecast ``torch.compile``d (opt-in).

    The yardstick is the exact maths: the same model evaluated offline in float64. Every float32
    evaluation rounds its own way: the offline model by a parallel scan; the server one batch at a
    time, by the kernel's loops (1-3 rows), a BLAS (4 rows or more, where one is row-exact), or
    torch's step and scan (a batch with a run of several events), each of whose sums may group
    otherwise at another batch width. Which batches form depends on timing, so the served numbers
    are one of many float32 evaluations. The bound is made of the ones the server can take: the
    engine itself, offline on the same events, with every event alone, the sessions side by side,
    and 1, 2 or 4 of the test's messages a batch; plus the offline model. A served forecast must be
    no further from the exact answer than twice the worst of those. (Held to twice the offline model's
    alone, the kernel at two front ends failed one CI run in three: 1.04x that bound on an Intel host,
    where MKL's rows and the loops' sum otherwise; here the batches of 2 and 4 messages reach
    1.35-1.43x the offline model's rounding, and the served forecasts 0.77-1.27x; AMD host.)"""
    sequences, _ = flights_events
    # Compiling while loading takes 25-45 s here with a cold inductor cache (a fresh machine), and
    # longer on a loaded one: the start bound only catches a hung server.
    start_timeout_s = 600 if compile_model else START_TIMEOUT_S  # the numba cache may be cold too
    srv = start_server(
        checkpoint=flights_checkpoint, compile_model=compile_model, frontends=frontends, start_timeout_s=start_timeout_s
    )
    engine = srv.server.core.task
    engine.kernel = kernel  # the core runs in this process in both layouts
    assert (engine._kernel is not None) == (not compile_model)
    # These machines have a C++ compiler: a silent fallback to eager would test nothing new here.
    assert (engine._step != engine._step_tensors) == compile_model
    stub = aaren_pb2_grpc.ForecastServiceStub(grpc.insecure_channel(srv.address))

    events = []
    for seq in sequences:
        for k in range(EVENTS_PER_SESSION):
            events.append(
                pb.Event(
                    session_id=seq.session_id,
                    seq=k + 1,
                    time=float(seq.times[k]),
                    mark=int(seq.marks[k]),
                    values=seq.values[k].tolist(),
                )
            )
    events.sort(key=lambda e: (e.time, e.session_id, e.seq))  # interleaved as they happened
    rng = random.Random(0)
    messages, at = [], 0
    while at < len(events):
        size = rng.choice([1, 1, 1, 3, 7])  # single events (batched steps) and runs (parallel scans)
        messages.append(pb.StreamRequest(request_id=str(len(messages)), events=events[at : at + size]))
        at += size

    got: dict[tuple[str, int], pb.Forecast] = {}
    for response in stub.Stream(iter(messages)):
        assert not response.HasField("request_error")
        for result in response.results:
            assert result.WhichOneof("outcome") == "forecast", result
            got[(result.session_id, result.seq)] = result.forecast
    assert len(got) == len(events) == N_SESSIONS * EVENTS_PER_SESSION

    model = load_checkpoint(flights_checkpoint).model
    exact_model = copy.deepcopy(model).double()

    def distance(a: float, b: float) -> float:
        return abs(a - b) / max(1.0, abs(b))

    # The paths a served event's numbers can take, each alone over the same events, offline in the
    # server's own engine (idle now): every event its own batch; the sessions' k-th events as one
    # batch; each message as one batch (its runs scanned, its single events stepped beside them), and
    # 2 or 4 messages as one, as the server gathers the messages that wait while it runs a batch.
    top_k = len(got[(sequences[0].session_id, 1)].marks)
    by_session = {seq.session_id: [e for e in events if e.session_id == seq.session_id] for seq in sequences}
    path_batches = {
        "each event alone": [[e] for session in by_session.values() for e in session],
        "sessions side by side": [list(step) for step in zip(*by_session.values(), strict=True)],
        **{
            f"{n} messages at a time": [
                [e for m in messages[i : i + n] for e in m.events] for i in range(0, len(messages), n)
            ]
            for n in (1, 2, 4)
        },
    }
    paths = {name: apply_offline(engine, batches, top_k) for name, batches in path_batches.items()}
    rounding = dict.fromkeys(["offline model", *paths], 0.0)
    served, worst_at = 0.0, None
    for seq in sequences:
        want = offline_forecasts(model, seq, EVENTS_PER_SESSION)
        exact = offline_forecasts(exact_model, seq, EVENTS_PER_SESSION)
        for k in range(EVENTS_PER_SESSION):
            f = got[(seq.session_id, k + 1)]
            assert f.seq == k + 1 and f.last_time == pytest.approx(float(seq.times[k]))
            truth = offline_numbers(exact, k)
            for name, numbers in [("offline model", offline_numbers(want, k))] + [
                (name, path[(seq.session_id, k + 1)]) for name, path in paths.items()
            ]:
                for a, b in zip(numbers, truth, strict=True):
                    rounding[name] = max(rounding[name], distance(a, b))
            for a, b in zip(forecast_numbers(f), truth, strict=True):
                if distance(a, b) > served:
                    served, worst_at = distance(a, b), (seq.session_id, k, a, b)
            top = [m.mark for m in f.marks]
            probs = exact.top_probs[k].tolist()
            # Top marks agree, up to the order of ties within float32 rounding.
            if all(abs(p - q) > 1e-6 for p, q in itertools.combinations(probs, 2)):
                assert top == exact.top_marks[k].tolist()
    assert all(0 < r < 1e-4 for r in rounding.values()), rounding  # float32 rounds, and no more than it should
    bound = 2 * max(rounding.values())
    assert served <= bound, (served, bound, worst_at, rounding)


def test_seq_rules_hold_end_to_end(start_server, flights_events, flights_checkpoint):
    sequences, _ = flights_events
    seq = sequences[0]
    srv = start_server(checkpoint=flights_checkpoint)
    stub = aaren_pb2_grpc.ForecastServiceStub(grpc.insecure_channel(srv.address))

    def event(k, session=seq.session_id):
        return pb.Event(
            session_id=session, seq=k, time=float(seq.times[k - 1]), mark=int(seq.marks[k - 1]),
            values=seq.values[k - 1].tolist(),
        )  # fmt: skip

    def send(*evs):
        (response,) = list(stub.Stream(iter([pb.StreamRequest(events=list(evs))])))
        return response.results

    first = send(event(1), event(2), event(3))
    assert [r.WhichOneof("outcome") for r in first] == ["forecast"] * 3
    state_before = stub.GetSession(pb.GetSessionRequest(session_id=seq.session_id, include_state=True)).state

    # Duplicates are acknowledged and not applied; a gap is an error and changes nothing.
    again = send(event(2), event(3), event(5))
    assert [r.WhichOneof("outcome") for r in again] == ["ack", "ack", "error"]
    assert again[0].duplicate and again[1].duplicate and again[0].ack.last_seq == 3
    assert again[2].error.reason == "seq_gap" and again[2].error.code == pb.ERROR_CODE_FAILED_PRECONDITION
    info = stub.GetSession(pb.GetSessionRequest(session_id=seq.session_id, include_state=True))
    assert info.last_seq == 3 and info.state == state_before

    # Resending from the last acknowledged seq continues exactly where a single pass would be.
    cont = send(event(4), event(5))
    assert [r.forecast.seq for r in cont] == [4, 5]
    model = load_checkpoint(flights_checkpoint).model
    want = offline_forecasts(model, seq, 5)
    assert cont[1].forecast.next_time.mean == pytest.approx(want.time_mean[4].item(), rel=1e-5)
