"""The typed async client against a real server (the tiny model: 5 marks m0..m4, values a and b)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from aaren.client.client import (
    AarenClient,
    AarenError,
    AckOut,
    EventErrorOut,
    EventIn,
    ForecastOut,
    to_jsonable,
)


def ev(sid: str, seq: int, time: float, mark: int = 0, values=(0.5, 1.0)) -> EventIn:
    return EventIn(sid, seq, time, mark, list(values))


def test_stream_apply_forecasts_acks_duplicates_and_typed_errors(start_server):
    srv = start_server()

    async def main():
        async with AarenClient(srv.address) as client:
            model = await client.describe_model()
            async with client.stream() as stream:
                first = await stream.apply([ev("a", 1, 10.0, 1)])
                assert first.request_error is None and len(first.results) == 1
                f = first.results[0]
                assert isinstance(f, ForecastOut)
                assert (f.session_id, f.seq, f.last_time) == ("a", 1, 10.0)
                assert list(f.quantiles) == list(model.quantile_levels)
                assert list(f.quantiles.values()) == sorted(f.quantiles.values())
                assert f.expected_time == pytest.approx(f.last_time + f.mean_gap)
                assert len(f.marks) == model.limits.default_top_k
                assert [p for _, p in f.marks] == sorted((p for _, p in f.marks), reverse=True)
                assert len(f.values) == model.value_width and all(std >= 0 for _, std in f.values)
                assert (f.model_name, f.model_version) == (model.name, model.version)

                # A history in one message: only the last event of the session gets a forecast.
                history = await stream.apply([ev("a", 2, 11.0, 2), ev("a", 3, 12.5, 3)], last_only=True, top_k=5)
                ack, last = history.results
                assert ack == AckOut("a", 2, 2, False)
                assert isinstance(last, ForecastOut) and last.seq == 3 and len(last.marks) == 5

                dup = await stream.apply([ev("a", 2, 11.0, 2)])
                assert dup.results == [AckOut("a", 2, 3, True)]

                bad = await stream.apply(
                    [
                        ev("a", 5, 13.0),  # gap
                        ev("a", 4, 12.0),  # earlier than seq 3
                        ev("a", 4, 13.0, mark=7),  # mark out of range
                        ev("a", 4, 13.0, values=(1.0,)),  # wrong width
                        ev("a", 4, float("nan")),
                        ev("", 1, 0.0),
                        ev("a", 4, 13.0, 4),  # fine
                    ]
                )
                errors = bad.results[:6]
                assert all(isinstance(e, EventErrorOut) for e in errors)
                assert [e.session_id for e in errors] == ["a"] * 5 + [""]
                assert [(e.code, e.reason) for e in errors] == [
                    ("FAILED_PRECONDITION", "seq_gap"),
                    ("FAILED_PRECONDITION", "time_before_last"),
                    ("INVALID_ARGUMENT", "mark_out_of_range"),
                    ("INVALID_ARGUMENT", "values_wrong_width"),
                    ("INVALID_ARGUMENT", "time_not_finite"),
                    ("INVALID_ARGUMENT", "session_id_empty"),
                ]
                assert "expected seq 4" in errors[0].message
                assert isinstance(bad.results[6], ForecastOut) and bad.results[6].seq == 4
                assert bad.errors == errors
                assert to_jsonable(bad)["results"][0]["reason"] == "seq_gap"

    asyncio.run(main())


def test_stream_send_then_iterate_every_answer_once_in_session_order(start_server):
    srv = start_server()

    async def main():
        async with AarenClient(srv.address) as client, client.stream() as stream:
            sent = {}
            for k in range(1, 7):
                for sid in ("x", "y", "z"):
                    events = [ev(sid, k, float(k))]
                    sent[await stream.send(events)] = events
            assert await stream.send([]) not in sent  # an empty request is a ping
            await stream.done_writing()
            got, seqs = [], {"x": [], "y": [], "z": []}
            async for result in stream:
                got.append(result.request_id)
                assert result.latency_s > 0
                for r in result.results:
                    assert isinstance(r, ForecastOut)
                    seqs[r.session_id].append(r.seq)
            assert sorted(got) == sorted([*sent, str(len(sent) + 1)])
            assert all(s == list(range(1, 7)) for s in seqs.values())
            assert await stream.recv() is None  # the end, again
            assert stream.pending == 0
            with pytest.raises(AarenError):
                await stream.send([ev("x", 7, 7.0)])

    asyncio.run(main())


def test_stream_forecast_equals_unary_forecast_and_request_errors(start_server):
    srv = start_server(max_events_per_request=4)

    async def main():
        async with AarenClient(srv.address) as client:
            async with client.stream() as stream:
                streamed = (await stream.apply([ev("s", k, 2.0 * k, k % 5) for k in range(1, 5)])).results[-1]
                refused = await stream.apply([ev("t", k, float(k)) for k in range(1, 6)])
            assert refused.results == [] and refused.request_error is not None
            assert (refused.request_error.code, refused.request_error.reason) == (
                "RESOURCE_EXHAUSTED",
                "too_many_events",
            )
            assert refused.errors == [refused.request_error]
            unary = (await client.forecast("s")).forecast
            assert (unary.session_id, unary.seq, unary.last_time) == (streamed.session_id, streamed.seq, 8.0)
            assert unary.mean_gap == pytest.approx(streamed.mean_gap, rel=1e-5)
            assert [m for m, _ in unary.marks] == [m for m, _ in streamed.marks]
            with pytest.raises(AarenError) as info:
                await client.get_session("t")  # the refused request applied nothing
            assert info.value.reason == "session_not_found"

    asyncio.run(main())


def test_unary_helpers_and_typed_errors(start_server):
    srv = start_server()

    async def main():
        async with AarenClient(srv.address) as client:
            model = await client.describe_model()
            assert (model.num_marks, model.value_width, model.time_unit) == (5, 2, "minutes")
            assert model.mark_names == ("m0", "m1", "m2", "m3", "m4") and model.value_names == ("a", "b")
            assert model.backbone == "aaren" and model.state_bytes_per_session > 0
            assert model.mark_name(3) == "m3" and model.mark_name(99) == "99"

            with pytest.raises(AarenError) as info:
                await client.forecast("nobody")
            err = info.value
            assert (err.code, err.reason, err.status) == ("NOT_FOUND", "session_not_found", grpc.StatusCode.NOT_FOUND)
            assert "nobody" in err.message
            with pytest.raises(AarenError) as info:
                await client.get_session("nobody")
            assert info.value.reason == "session_not_found"

            async with client.stream() as stream:
                await stream.apply([ev("u", k, 3.0 * k, k % 5) for k in range(1, 4)])

            future = await client.forecast("u", horizon=3, num_samples=8, seed=7, top_k=2, include_paths=True)
            again = await client.forecast("u", horizon=3, num_samples=8, seed=7, top_k=2, include_paths=True)
            assert future.forecast.seq == 3 and len(future.forecast.marks) == 2
            assert [s.step for s in future.steps] == [1, 2, 3]
            assert len(future.paths) == 8 and all(len(p) == 3 for p in future.paths)
            assert all(p[0].time >= 9.0 and len(p[0].values) == 2 for p in future.paths)
            assert future == again  # same seed, same samples
            plain = await client.forecast("u")
            assert plain.steps == [] and plain.paths == []
            with pytest.raises(AarenError) as info:
                await client.forecast("u", horizon=model.limits.max_horizon + 1)
            assert (info.value.code, info.value.reason) == ("INVALID_ARGUMENT", "horizon_too_large")

            info_ = await client.get_session("u")
            assert (info_.last_seq, info_.n_events, info_.last_time) == (3, 3, 9.0)
            assert info_.state == b"" and info_.state_bytes == model.state_bytes_per_session
            assert info_.model_version == model.version and info_.created_at <= info_.updated_at
            with_state = await client.get_session("u", include_state=True)
            assert len(with_state.state) > 0

            ended = await client.end_session("u")
            assert (ended.existed, ended.last_seq) == (True, 3)
            assert (await client.end_session("u")).existed is False
            with pytest.raises(AarenError):
                await client.forecast("u")

    asyncio.run(main())


def test_stream_wide_failure_raises_and_unreachable_server():
    async def main():
        client = AarenClient("127.0.0.1:1", timeout=2)
        try:
            with pytest.raises(AarenError) as info:
                await client.wait_ready(0.3)
            assert info.value.code == "UNAVAILABLE"
            with pytest.raises(AarenError) as info:
                await client.describe_model()
            assert info.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
            with pytest.raises(AarenError):
                async with client.stream() as stream:
                    await stream.apply([ev("a", 1, 0.0)])
        finally:
            await client.close()

    asyncio.run(main())


def test_oversized_message_fails_the_stream_with_resource_exhausted(start_server):
    srv = start_server(max_message_bytes=1024)

    async def main():
        async with AarenClient(srv.address) as client:
            with pytest.raises(AarenError) as info:
                async with client.stream() as stream:
                    await stream.apply([ev("big", k, float(k)) for k in range(1, 200)])
            assert info.value.code == "RESOURCE_EXHAUSTED"
            assert stream.error is not None and stream.error.code == "RESOURCE_EXHAUSTED"

    asyncio.run(main())


def test_server_shutdown_ends_the_stream_with_a_typed_error(start_server):
    srv = start_server()

    async def main():
        async with AarenClient(srv.address) as client:
            stream = client.stream()
            stream.open()
            assert isinstance((await stream.apply([ev("a", 1, 0.0)])).results[0], ForecastOut)
            await asyncio.to_thread(srv.stop, 0.2)
            with pytest.raises(AarenError) as info:
                await stream.recv()
            assert info.value.code == "UNAVAILABLE" and "resend" in info.value.message
            assert stream.error is info.value
            with pytest.raises(AarenError):
                await stream.apply([ev("a", 2, 1.0)])

    asyncio.run(main())
