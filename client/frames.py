"""pandas in and out: a DataFrame of events to the server, a DataFrame of its forecasts back.

Events: one row per event with ``session_id``, ``time`` (numbers in the model's time unit, or
datetimes, read as ``aaren train`` reads them: that unit since the Unix epoch, naive ones as UTC),
optionally ``mark`` (a number, or a name from the model's ``mark_names``; default 0), one column
per value named as the model's ``value_names``, and optionally ``seq``. Without ``seq`` each session's
events are numbered in frame order from the server's ``last_seq + 1`` (1 for a new session), so a
cell that streams a session's next events can run again and again.

pandas is imported inside the functions: ``import aaren.client`` stays free of numpy and pandas.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from aaren.client.client import (
    AarenClient,
    AarenError,
    AckOut,
    EventErrorOut,
    EventIn,
    ForecastOut,
    ModelInfoOut,
    Outcome,
    StreamResult,
)
from aaren.formats.marks import mark_reader
from aaren.formats.times import TIME_UNITS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["apply_frame", "events_from_frame", "forecasts_frame", "value_columns"]

Apply = Callable[..., Awaitable[StreamResult]]


def value_columns(model: ModelInfoOut) -> list[str]:
    """The frame column of each model value: its name, or ``value<i>`` when the model has none."""
    if len(model.value_names) == model.value_width:
        return list(model.value_names)
    return [f"value{i}" for i in range(model.value_width)]


def _marks(column: pd.Series, model: ModelInfoOut) -> list[int]:
    """The model's mark ids: a mark name of the model or an id (``aaren.formats.marks.mark_reader``, as
    ``aaren replay`` reads a file's marks); a whole float (2.0) counts as its integer."""
    read = mark_reader(model.mark_names, model.num_marks)
    return [read(int(m) if isinstance(m, float) and m.is_integer() else m) for m in column.tolist()]


def _times(column: pd.Series, model: ModelInfoOut) -> list[float]:
    """Numbers as they are; datetimes (or ISO strings) in the model's time unit since the Unix epoch,
    naive ones read as UTC: the way ``aaren train`` reads them, so the model sees the times it was
    trained on."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(column):
        return column.astype(float).tolist()
    unit = TIME_UNITS.get(model.time_unit)
    if unit is None:
        raise ValueError(f"datetimes need a time unit in {sorted(TIME_UNITS)}; the model's is {model.time_unit!r}")
    seconds = (pd.to_datetime(column, utc=True, format="ISO8601") - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    return (seconds / unit).tolist()


def events_from_frame(
    frame: pd.DataFrame, model: ModelInfoOut, last_seqs: dict[str, int] | None = None
) -> list[EventIn]:
    """The frame's events in row order. ``seq`` comes from the frame's ``seq`` column, or else counts
    each session's rows from ``last_seqs[session] + 1`` (from 1 for a session not in ``last_seqs``)."""
    missing = [c for c in ("session_id", "time", *value_columns(model)) if c not in frame.columns]
    if missing:
        raise ValueError(
            f"events frame: missing columns {missing}; expected session_id, time, [seq], [mark] and the model's "
            f"values {value_columns(model)}"
        )
    sessions = frame["session_id"].astype(str)
    if "seq" in frame.columns:
        seqs = [int(s) for s in frame["seq"]]
    else:
        start = sessions.map(lambda s: (last_seqs or {}).get(s, 0) + 1)
        seqs = [int(s) for s in start + sessions.groupby(sessions, sort=False).cumcount()]
    marks = _marks(frame["mark"], model) if "mark" in frame.columns else [0] * len(frame)
    values = frame[value_columns(model)].astype(float).values.tolist() if model.value_width else [[]] * len(frame)
    times = _times(frame["time"], model)
    return [
        EventIn(sid, seq, t, mark, v)
        for sid, seq, t, mark, v in zip(sessions.tolist(), seqs, times, marks, values, strict=True)
    ]


def forecasts_frame(events: Sequence[EventIn], outcomes: Sequence[Outcome], model: ModelInfoOut) -> pd.DataFrame:
    """One row per event: ``session_id, seq, time, outcome`` (``forecast``, ``ack``, ``duplicate`` or
    ``error``), ``error`` (the server's message, else None), then the forecast of the next event:
    ``mean_gap``, ``expected_time``, ``gap_q<level>`` per quantile level, ``p_<mark name>`` per mark
    (NaN for a mark outside the forecast's top ones), ``<value>_mean`` and ``<value>_std`` per value;
    NaN where the event got no forecast."""
    import pandas as pd

    nan = float("nan")
    levels = list(model.quantile_levels)
    mark_cols = [f"p_{model.mark_name(m)}" for m in range(model.num_marks)]
    value_cols = value_columns(model)
    rows: dict[str, list[Any]] = {
        "session_id": [e.session_id for e in events],
        "seq": [e.seq for e in events],
        "time": [e.time for e in events],
        "outcome": [],
        "error": [],
        "mean_gap": [],
        "expected_time": [],
        **{f"gap_q{q:g}": [] for q in levels},
        **{c: [] for c in mark_cols},
        **{f"{v}_{s}": [] for v in value_cols for s in ("mean", "std")},
    }
    for outcome in outcomes:
        f = outcome if isinstance(outcome, ForecastOut) else None
        if isinstance(outcome, EventErrorOut):
            rows["outcome"].append("error")
            rows["error"].append(f"{outcome.reason}: {outcome.message}")
        else:
            duplicate = isinstance(outcome, AckOut) and outcome.duplicate
            rows["outcome"].append("forecast" if f else "duplicate" if duplicate else "ack")
            rows["error"].append(None)
        rows["mean_gap"].append(f.mean_gap if f else nan)
        rows["expected_time"].append(f.expected_time if f else nan)
        for q in levels:
            rows[f"gap_q{q:g}"].append(f.quantiles.get(q, nan) if f else nan)
        probs = dict(f.marks) if f else {}
        for m, c in enumerate(mark_cols):
            rows[c].append(probs.get(m, nan))
        pairs = f.values if f else [(nan, nan)] * len(value_cols)
        for v, (mean, std) in zip(value_cols, pairs, strict=True):
            rows[f"{v}_mean"].append(mean)
            rows[f"{v}_std"].append(std)
    return pd.DataFrame(rows)


async def _last_seq(client: AarenClient, session_id: str) -> int:
    try:
        return (await client.get_session(session_id)).last_seq
    except AarenError as exc:
        if exc.code == "NOT_FOUND":
            return 0
        raise


async def apply_frame(
    client: AarenClient,
    events: pd.DataFrame,
    *,
    restart: bool = False,
    top_k: int = 0,
    apply: Apply | None = None,
) -> pd.DataFrame:
    """Send a DataFrame of events (module docstring) and return ``forecasts_frame`` of the outcomes.

    Without a ``seq`` column each session continues from its last applied seq on the server, so a
    rerun never comes back as all duplicates; events earlier than a session's last event come back
    as ``error`` rows (the server keeps a session's times in order). ``restart`` ends each session
    of the frame first, so the frame is streamed from seq 1 again and a rerun gives the same
    forecasts. ``top_k``: marks per forecast (0: all of them). ``apply`` sends one request
    (default: a stream of its own, closed at the end).
    """
    model = await client.describe_model()
    sessions = list(dict.fromkeys(events["session_id"].astype(str))) if len(events) else []
    last_seqs: dict[str, int] = {}
    for sid in sessions:
        if restart:
            await client.end_session(sid)
            last_seqs[sid] = 0
        elif "seq" not in events.columns:
            last_seqs[sid] = await _last_seq(client, sid)
    if restart and "seq" in events.columns:
        events = events.drop(columns="seq")
    batch = events_from_frame(events, model, last_seqs)
    size = max(1, model.limits.max_events_per_request or len(batch))
    top_k = top_k or model.num_marks
    outcomes: list[Outcome] = []
    if apply is None:
        async with client.stream() as stream:
            for i in range(0, len(batch), size):
                outcomes += _outcomes(await stream.apply(batch[i : i + size], top_k=top_k, columns=True))
    else:
        for i in range(0, len(batch), size):
            outcomes += _outcomes(await apply(batch[i : i + size], top_k=top_k, columns=True))
    return forecasts_frame(batch, outcomes, model)


def _outcomes(result: StreamResult) -> list[Outcome]:
    if result.request_error is not None:
        raise AarenError(result.request_error.code, result.request_error.reason, result.request_error.message)
    return result.results
