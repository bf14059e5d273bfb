"""The checks of an event that need no session state, on whole requests at once (numpy).

Front ends run these before anything reaches the engine core (docs/architecture.md section 3,
"Validation"): a non-empty session id of bounded UTF-8 length, seq >= 1, a finite time, a mark in
the model's range, exactly the model's number of finite values. The checks that need the
session's state (seq order, time order, model version) are the engine core's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from aaren.server.contract.columns import MAX_SEQ, NEXT_SEQ, CoreRequest, EventColumns
from aaren.server.contract.errors import ErrorInfo, Reasons

__all__ = ["EventChecker"]


class EventChecker:
    """Builds a ``CoreRequest`` from a request's fields, refusing the events that fail a check."""

    def __init__(self, num_marks: int, value_names: Sequence[str], max_session_id_bytes: int) -> None:
        self.num_marks = num_marks
        self.value_names = tuple(value_names)
        self.width = len(self.value_names)
        self.max_id_bytes = max_session_id_bytes
        # Ids of at most this many characters fit the byte limit whatever they hold (UTF-8: <= 4 bytes each).
        self._fast_id_chars = max_session_id_bytes // 4

    def session_id_error(self, sid: str) -> ErrorInfo | None:
        if not sid:
            return Reasons.session_id_empty()
        n_bytes = len(sid.encode("utf-8", "surrogatepass"))
        if n_bytes > self.max_id_bytes:
            return Reasons.session_id_too_long(n_bytes, self.max_id_bytes)
        return None

    def request(
        self,
        session_ids: list[str],
        seqs: Sequence[int],
        times: Sequence[float],
        marks: Sequence[int],
        values: Sequence[Sequence[float]],
        *,
        next_seq: bool = False,
        **fields: object,
    ) -> CoreRequest:
        """``n`` events as parallel sequences (``values[i]`` the values of event ``i``) -> a
        ``CoreRequest`` holding the valid ones as columns; ``fields`` go to the request as they are.
        ``next_seq``: ``seqs`` may hold ``NEXT_SEQ`` (0), "the session's next seq".

        The checks run on plain lists first (a sum of floats is finite only if every term is), so
        a request of valid events costs a few builtins and one array per column; only a request
        with a bad event is looked at event by event."""
        n = len(session_ids)
        if not n:
            return CoreRequest(0, np.zeros(0, np.int64), self.empty(), {}, **fields)  # type: ignore[arg-type]
        width = self.width
        fast = self._fast_id_chars
        flat = [x for v in values for x in v]
        valid = (
            len(flat) == n * width
            and all(len(v) == width for v in values)
            and min(seqs) >= (NEXT_SEQ if next_seq else 1)
            and max(seqs) <= MAX_SEQ
            and min(marks) >= 0
            and max(marks) < self.num_marks
            and math.isfinite(math.fsum(times) if n > 1 else times[0])
            and (not flat or math.isfinite(sum(flat)))
            and all(0 < len(sid) <= fast for sid in session_ids)
        )
        if valid:
            columns = EventColumns(
                session_ids,
                np.array(seqs, dtype=np.int64),
                np.array(times, dtype=np.float64),
                np.array(marks, dtype=np.int64),
                np.array(flat, dtype=np.float32).reshape(n, width),
            )
            return CoreRequest(n, np.arange(n), columns, {}, **fields)  # type: ignore[arg-type]
        errors: dict[int, ErrorInfo] = {}
        keep: list[int] = []
        for i in range(n):
            error = self.explain(session_ids[i], int(seqs[i]), float(times[i]), int(marks[i]), values[i], next_seq)
            if error is None:
                keep.append(i)
            else:
                errors[i] = error
        columns = EventColumns(
            [session_ids[i] for i in keep],
            np.array([min(int(seqs[i]), MAX_SEQ) for i in keep], dtype=np.int64),
            np.array([times[i] for i in keep], dtype=np.float64),
            np.array([marks[i] for i in keep], dtype=np.int64),
            np.array([x for i in keep for x in values[i]], dtype=np.float32).reshape(len(keep), width),
        )
        return CoreRequest(n, np.array(keep, dtype=np.int64), columns, errors, **fields)  # type: ignore[arg-type]

    def explain(
        self, sid: str, seq: int, time: float, mark: int, values: Sequence[float], next_seq: bool = False
    ) -> ErrorInfo | None:
        """What is wrong with one event (None when nothing is), checks in a fixed order."""
        error = self.session_id_error(sid)
        if error is not None:
            return error
        if seq < 1 and not (next_seq and seq == NEXT_SEQ):
            return Reasons.seq_zero(sid, seq)
        if not math.isfinite(time):
            return Reasons.time_not_finite(sid, seq, time)
        if not 0 <= mark < self.num_marks:
            return Reasons.mark_out_of_range(sid, seq, mark, self.num_marks)
        if len(values) != self.width:
            return Reasons.values_wrong_width(sid, seq, len(values), self.value_names)
        for j, v in enumerate(values):
            if not math.isfinite(v):
                return Reasons.values_not_finite(sid, seq, j, self.value_names[j], v)
        return None

    def empty(self) -> EventColumns:
        return EventColumns.empty(self.width)
