"""pandas in and out: a DataFrame of events to the server, a DataFrame of its forecasts back, for
each task's models (``model=`` names one, as ``client.stream(model=...)`` does; "" the default).

Event models: one row per event with ``session_id``, ``time`` (numbers in the model's time unit, or
datetimes, read as ``aaren train`` reads them: that unit since the Unix epoch, naive ones as UTC),
optionally ``mark`` (a number, or a name from the model's ``mark_names``; default 0), one column
per value named as the model's ``value_names``, and optionally ``seq``.

Series and class models: one row per observation (a series' step, a sequence's step) with ``time``
(a series' in Unix seconds, or datetimes), one column per channel named as the model's
``value_names`` (numbers; NaN for a missing value), and optionally ``session_id`` (without it the
whole frame is one series or sequence, ``session_id="frame"`` unless given) and ``seq``.

Without ``seq`` each session's rows are numbered in frame order from the server's ``last_seq + 1``
(1 for a new session), so a cell that streams a session's next rows can run again and again.
What comes back (``forecasts_frame``) is one row per event, and for a series one row per event and
forecast step, so that a fan chart is a filter and a ``fill_between`` away.

pandas is imported inside the functions: ``import aaren.client`` stays free of numpy and pandas.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from aaren.client.client import (
    AarenError,
    AckOut,
    ClassForecastOut,
    EventErrorOut,
    EventIn,
    ForecastOut,
    SeriesForecastOut,
)
from aaren.formats.errors import DataError
from aaren.formats.marks import mark_reader
from aaren.formats.times import TIME_UNITS

if TYPE_CHECKING:
    import pandas as pd

    from aaren.client.client import AarenClient, ModelInfoOut, Outcome, StreamResult

__all__ = ["DEFAULT_SESSION", "apply_frame", "events_from_frame", "forecasts_frame", "value_columns"]

Apply = Callable[..., Awaitable["StreamResult"]]

#: The session of a series or class frame without a ``session_id`` column: the whole frame.
DEFAULT_SESSION = "frame"
#: Forecast numbers per request of a series frame at most (means and quantiles, H * C * (Q + 1) per
#: event): a long history of a wide model is sent in several requests rather than one huge answer.
_SERIES_NUMBERS_PER_REQUEST = 1_000_000


def value_columns(model: ModelInfoOut) -> list[str]:
    """The frame column of each model value (a series or class model's channels): its name, or
    ``value<i>`` when the model has none."""
    if len(model.value_names) == model.value_width:
        return list(model.value_names)
    return [f"value{i}" for i in range(model.value_width)]


def _marks(column: pd.Series, model: ModelInfoOut) -> list[int]:
    """The model's mark ids: a mark name of the model or an id (``aaren.formats.marks.mark_reader``, as
    ``aaren replay`` reads a file's marks); a whole float (2.0) counts as its integer."""
    read = mark_reader(model.mark_names, model.num_marks)
    return [read(int(m) if isinstance(m, float) and m.is_integer() else m) for m in column.tolist()]


def _times(column: pd.Series, model: ModelInfoOut, what: str = "events") -> list[float]:
    """Numbers as they are; datetimes (or ISO strings) in the model's time unit since the Unix epoch,
    naive ones read as UTC: the way ``aaren train`` reads them, so the model sees the times it was
    trained on."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(column):
        return column.astype(float).tolist()
    unit = TIME_UNITS.get(model.time_unit)
    if unit is None:
        raise DataError(
            f"{what} frame: column 'time' holds {column.dtype} values; the model's time unit is "
            f"{model.time_unit!r}, so it expects numbers (datetimes need a time unit in {sorted(TIME_UNITS)})"
        )
    try:
        stamps = pd.to_datetime(column, utc=True, format="ISO8601")
    except (ValueError, TypeError) as exc:
        raise DataError(
            f"{what} frame: column 'time' is neither numbers nor datetimes ({exc}); expected numbers in "
            f"{model.time_unit} or datetimes"
        ) from None
    seconds = (stamps - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    return (seconds / unit).tolist()


def _numbers(frame: pd.DataFrame, columns: Sequence[str], what: str) -> list[list[float]]:
    """The rows of ``columns`` as floats (``[N][len(columns)]``); a missing cell (None, NaN) is NaN.
    A cell that is no number fails with its column and row."""
    import pandas as pd

    if not columns:
        return [[] for _ in range(len(frame))]
    for name in columns:
        column = frame[name]
        if pd.api.types.is_numeric_dtype(column):
            continue
        bad = pd.to_numeric(column, errors="coerce").isna() & column.notna()
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise DataError(
                f"{what} frame: column {name!r} holds {column.iloc[row]!r} (row {row}), not a number; "
                "expected numbers (NaN for a missing value)"
            )
    return frame[list(columns)].apply(pd.to_numeric).astype(float).values.tolist()


def _sessions(frame: pd.DataFrame, model: ModelInfoOut, session_id: str) -> pd.Series:
    """Each row's session: the ``session_id`` column, or for a series or class frame without one
    ``session_id`` for all."""
    import pandas as pd

    if "session_id" in frame.columns or model.task == "event":
        return frame["session_id"].astype(str)
    return pd.Series([session_id] * len(frame), index=frame.index, dtype=object)


def _required(model: ModelInfoOut) -> tuple[list[str], str]:
    """The columns a frame for ``model`` must have, and how to say what is expected."""
    values = value_columns(model)
    if model.task == "event":
        return ["session_id", "time", *values], f"session_id, time, [seq], [mark] and the model's values {values}"
    return ["time", *values], f"time, [session_id], [seq] and the model's channels {values}"


def events_from_frame(
    frame: pd.DataFrame,
    model: ModelInfoOut,
    last_seqs: dict[str, int] | None = None,
    *,
    session_id: str = DEFAULT_SESSION,
) -> list[EventIn]:
    """The frame's events in row order (module docstring: the columns per task). ``seq`` comes from
    the frame's ``seq`` column, or else counts each session's rows from ``last_seqs[session] + 1``
    (from 1 for a session not in ``last_seqs``). ``session_id``: the session of a series or class
    frame without a ``session_id`` column. Raises ``DataError`` (a ``ValueError``) for a missing
    column or a cell that is no number."""
    what = {"event": "events"}.get(model.task, model.task)
    required, expected = _required(model)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise DataError(f"{what} frame: missing columns {missing}; expected {expected}")
    sessions = _sessions(frame, model, session_id)
    if "seq" in frame.columns:
        seqs = [int(s) for s in frame["seq"]]
    else:
        last = dict(last_seqs or {})
        seqs = []
        for sid in sessions.tolist():
            last[sid] = last.get(sid, 0) + 1
            seqs.append(last[sid])
    # Series and class models have one mark, the observation.
    use_marks = model.task == "event" and "mark" in frame.columns
    marks = _marks(frame["mark"], model) if use_marks else [0] * len(frame)
    values = _numbers(frame, value_columns(model), what)
    times = _times(frame["time"], model, what)
    return [
        EventIn(sid, seq, t, mark, v)
        for sid, seq, t, mark, v in zip(sessions.tolist(), seqs, times, marks, values, strict=True)
    ]


def _status(outcome: Outcome) -> tuple[str, str | None]:
    """``outcome`` column (``forecast``, ``ack``, ``duplicate`` or ``error``) and ``error`` column."""
    if isinstance(outcome, EventErrorOut):
        return "error", f"{outcome.reason}: {outcome.message}"
    if isinstance(outcome, AckOut):
        return ("duplicate" if outcome.duplicate else "ack"), None
    return "forecast", None


def forecasts_frame(
    events: Sequence[EventIn], outcomes: Sequence[Outcome], model: ModelInfoOut, *, datetimes: bool = False
) -> pd.DataFrame:
    """The outcomes of ``events`` as a frame, per the model's task. Every layout starts with
    ``session_id, seq, time, outcome`` (``forecast``, ``ack``, ``duplicate`` or ``error``) and
    ``error`` (the server's ``reason: message``, else None); the forecast columns are NaN where an
    event got no forecast.

    - event: one row per event; the next event's ``mean_gap``, ``expected_time``, ``gap_q<level>``
      per quantile level, ``p_<mark name>`` per mark (NaN for a mark outside the forecast's top
      ones), ``<value>_mean`` and ``<value>_std`` per value.
    - series: one row per event and forecast step ``step = 1..H`` (``N * H`` rows, each event's
      steps in order): ``target_time = time + step * step_seconds``, then per channel
      ``<channel>_mean`` and ``<channel>_q<level>`` per quantile level. ``datetimes``: ``time`` and
      ``target_time`` as UTC datetimes (else Unix seconds).
    - class: one row per event; ``predicted`` (the most likely class after it; None without a
      forecast) and ``p_<class name>`` per class (NaN outside the forecast's top ones).
    """
    if model.task == "series":
        return _series_frame(events, outcomes, model, datetimes=datetimes)
    if model.task == "class":
        return _class_frame(events, outcomes, model)
    return _event_frame(events, outcomes, model)


def _head(events: Sequence[EventIn], outcomes: Sequence[Outcome]) -> dict[str, list[Any]]:
    status = [_status(o) for o in outcomes]
    return {
        "session_id": [e.session_id for e in events],
        "seq": [e.seq for e in events],
        "time": [e.time for e in events],
        "outcome": [s for s, _ in status],
        "error": [m for _, m in status],
    }


def _event_frame(events: Sequence[EventIn], outcomes: Sequence[Outcome], model: ModelInfoOut) -> pd.DataFrame:
    import pandas as pd

    nan = float("nan")
    levels = list(model.quantile_levels)
    mark_cols = [f"p_{model.mark_name(m)}" for m in range(model.num_marks)]
    value_cols = value_columns(model)
    rows: dict[str, list[Any]] = {
        **_head(events, outcomes),
        "mean_gap": [],
        "expected_time": [],
        **{f"gap_q{q:g}": [] for q in levels},
        **{c: [] for c in mark_cols},
        **{f"{v}_{s}": [] for v in value_cols for s in ("mean", "std")},
    }
    for outcome in outcomes:
        f = outcome if isinstance(outcome, ForecastOut) else None
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


def _series_frame(
    events: Sequence[EventIn], outcomes: Sequence[Outcome], model: ModelInfoOut, *, datetimes: bool
) -> pd.DataFrame:
    """``N * H`` rows: means ``[N, H, C]`` and quantiles ``[N, H, C, Q]`` flattened event-major."""
    import numpy as np
    import pandas as pd

    n, h, channels = len(events), model.horizon, value_columns(model)
    levels = list(model.quantile_levels)
    means = np.full((n, h, len(channels)), np.nan)
    quantiles = np.full((n, h, len(channels), len(levels)), np.nan)
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, SeriesForecastOut):
            means[i] = outcome.means
            for k, q in enumerate(levels):
                quantiles[i, :, :, k] = outcome.quantiles[q]
    head = {name: np.repeat(np.asarray(column, dtype=object), h) for name, column in _head(events, outcomes).items()}
    step = np.tile(np.arange(1, h + 1), n)
    time = np.repeat(np.array([e.time for e in events], dtype=float), h)
    head["seq"], head["time"] = head["seq"].astype(np.int64), time
    target = time + step * model.step_seconds
    columns: dict[str, Any] = {**head, "step": step, "target_time": target}
    for c, name in enumerate(channels):
        columns[f"{name}_mean"] = means[:, :, c].reshape(-1)
        for k, q in enumerate(levels):
            columns[f"{name}_q{q:g}"] = quantiles[:, :, c, k].reshape(-1)
    frame = pd.DataFrame(columns)
    if datetimes:
        for name in ("time", "target_time"):
            frame[name] = pd.to_datetime(frame[name], unit="s", utc=True)
    return frame


def _class_frame(events: Sequence[EventIn], outcomes: Sequence[Outcome], model: ModelInfoOut) -> pd.DataFrame:
    import pandas as pd

    nan = float("nan")
    names = list(model.class_names)
    rows: dict[str, list[Any]] = {**_head(events, outcomes), "predicted": [], **{f"p_{c}": [] for c in names}}
    for outcome in outcomes:
        f = outcome if isinstance(outcome, ClassForecastOut) else None
        rows["predicted"].append(f.predicted if f and f.classes else None)
        probs = dict(f.classes) if f else {}
        for c in names:
            rows[f"p_{c}"].append(probs.get(c, nan))
    return pd.DataFrame(rows)


async def _last_seq(client: AarenClient, session_id: str, model: str) -> int:
    try:
        return (await client.get_session(session_id, model=model)).last_seq
    except AarenError as exc:
        if exc.code == "NOT_FOUND":
            return 0
        raise


def _request_size(model: ModelInfoOut, n: int) -> int:
    """Events per request: the server's limit, and for a series model a bound on its answer."""
    size = model.limits.max_events_per_request or n
    if model.task == "series":
        per_event = max(1, model.horizon * model.value_width * (len(model.quantile_levels) + 1))
        size = min(size, _SERIES_NUMBERS_PER_REQUEST // per_event)
    return max(1, size)


async def apply_frame(
    client: AarenClient,
    events: pd.DataFrame,
    *,
    model: str = "",
    restart: bool = False,
    top_k: int = 0,
    session_id: str = DEFAULT_SESSION,
    apply: Apply | None = None,
) -> pd.DataFrame:
    """Send a DataFrame (module docstring: the columns per task) to ``model`` (by name, as
    ``describe_model().served_models`` lists them; "" the server's default) and return
    ``forecasts_frame`` of the outcomes.

    Without a ``seq`` column each session continues from its last applied seq on the server, so a
    rerun never comes back as all duplicates; events earlier than a session's last event come back
    as ``error`` rows (the server keeps a session's times in order). ``restart`` ends each session
    of the frame first, so the frame is streamed from seq 1 again and a rerun gives the same
    forecasts. ``top_k``: marks (event models) or classes (class models) per forecast (0: all of
    them). ``session_id``: the session of a series or class frame without a ``session_id`` column.
    A series frame given datetimes gets its ``time`` and ``target_time`` back as UTC datetimes.
    ``apply`` sends one request (default: a stream of its own, closed at the end).
    """
    import pandas as pd

    info = await client.describe_model(model)
    sessions = list(dict.fromkeys(_sessions(events, info, session_id))) if len(events) else []
    last_seqs: dict[str, int] = {}
    for sid in sessions:
        if restart:
            await client.end_session(sid, model=model)
            last_seqs[sid] = 0
        elif "seq" not in events.columns:
            last_seqs[sid] = await _last_seq(client, sid, model)
    if restart and "seq" in events.columns:
        events = events.drop(columns="seq")
    batch = events_from_frame(events, info, last_seqs, session_id=session_id)
    size = _request_size(info, len(batch))
    top_k = top_k or (len(info.class_names) if info.task == "class" else info.num_marks)
    outcomes: list[Outcome] = []
    if apply is None:
        async with client.stream(model=model) as stream:
            for i in range(0, len(batch), size):
                outcomes += _outcomes(await stream.apply(batch[i : i + size], top_k=top_k, columns=True))
    else:
        for i in range(0, len(batch), size):
            outcomes += _outcomes(await apply(batch[i : i + size], top_k=top_k, columns=True, model=model))
    datetimes = "time" in events.columns and not pd.api.types.is_numeric_dtype(events["time"])
    return forecasts_frame(batch, outcomes, info, datetimes=datetimes)


def _outcomes(result: StreamResult) -> list[Outcome]:
    if result.request_error is not None:
        raise AarenError(result.request_error.code, result.request_error.reason, result.request_error.message)
    return result.results
