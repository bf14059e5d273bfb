"""RESPONSE_LAYOUT_COLUMNS: the same outcomes as the row layout, number for number, in event order,
with forecasts packed as columns and only the other outcomes as rows. A real server and client."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from aaren.client.client import AarenClient, AckOut, EventErrorOut, EventIn, ForecastOut


def ev(sid: str, seq: int, time: float, mark: int = 0, values=(0.5, 1.0)) -> EventIn:
    return EventIn(sid, seq, time, mark, list(values))


def script(prefix: str) -> list[tuple[list[EventIn], dict]]:
    """Requests with every kind of outcome: forecasts of many sessions, a history with acks, a
    duplicate, errors between forecasts, more marks than the model has."""
    many = [ev(f"{prefix}{i}", 1, float(i), i % 5, (0.1 * i, -1.0)) for i in range(40)]
    return [
        (many, {}),
        (
            [ev(f"{prefix}0", 2, 50.0, 1), ev(f"{prefix}0", 3, 51.0, 2), ev(f"{prefix}1", 2, 52.0, 3)],
            {"last_only": True},
        ),
        (
            [
                ev(f"{prefix}2", 2, 60.0, 4),
                ev(f"{prefix}2", 2, 60.0, 4),  # duplicate of the previous event, same batch
                ev(f"{prefix}3", 5, 61.0),  # seq gap
                ev(f"{prefix}4", 2, 62.0, mark=9),  # mark out of range
                ev(f"{prefix}5", 2, 63.0, 3),
            ],
            {"top_k": 9},  # more than the 5 marks: all of them
        ),
    ]


def strip(outcome, prefix: str):
    """The outcome with its session id made prefix-free, to compare two runs on distinct sessions."""
    changes = {"session_id": outcome.session_id.removeprefix(prefix)}
    if isinstance(outcome, EventErrorOut):
        changes["message"] = outcome.message.replace(f"'{prefix}", "'")
    return dataclasses.replace(outcome, **changes)


def test_columns_carry_the_same_outcomes_as_rows(start_server):
    srv = start_server()

    async def run(prefix: str, columns: bool):
        async with AarenClient(srv.address) as client, client.stream() as stream:
            answers = [await stream.apply(events, columns=columns, **kw) for events, kw in script(prefix)]
        return answers

    rows = asyncio.run(run("r", False))
    cols = asyncio.run(run("c", True))
    for by_rows, by_cols in zip(rows, cols, strict=True):
        assert not by_rows.raw.HasField("forecast_columns")
        assert by_cols.raw.HasField("forecast_columns")
        # Only the events without a forecast travel as rows.
        assert len(by_cols.raw.results) == sum(not isinstance(r, ForecastOut) for r in by_rows.results)
        assert [strip(r, "c") for r in by_cols.results] == [strip(r, "r") for r in by_rows.results]
    kinds = {type(r) for answer in cols for r in answer.results}
    assert kinds == {ForecastOut, AckOut, EventErrorOut}
    block = cols[0].raw.forecast_columns
    assert len(block.event_index) == 40 and list(block.event_index) == list(range(40))
    assert len(block.gap_quantiles) == 40 * len(block.quantile_levels)
    assert block.top_k == 3 and len(block.marks) == 40 * 3 and len(block.value_means) == 40 * 2
    assert cols[2].raw.forecast_columns.top_k == 5  # top_k 9 of a 5-mark model


@pytest.mark.parametrize("columns", [False, True])
def test_request_errors_look_the_same_in_both_layouts(start_server, columns):
    srv = start_server(max_events_per_request=2)

    async def main():
        async with AarenClient(srv.address) as client, client.stream() as stream:
            return await stream.apply([ev("x", 1, 1.0), ev("x", 2, 2.0), ev("x", 3, 3.0)], columns=columns)

    answer = asyncio.run(main())
    assert answer.results == [] and answer.request_error.reason == "too_many_events"
