"""The checks of an event that need no session state, on whole requests at once (numpy).

Front ends run these before anything reaches the engine core (shared/DESIGN.md section 3,
"Validation"): a non-empty session id of bounded UTF-8 length, seq >= 1, a finite time, a mark in
the model's range, exactly the model's number of finite values. The checks that need the
session's state (seq order, time order, model version) are the engine core's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from aaren.server.columns import MAX_SEQ, NEXT_SEQ, CoreRequest, EventColumns
from aaren.server.errors import ErrorInfo, catalogue

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
            return catalogue.session_id_empty()
        n_bytes = len(sid.encode("utf-8", "surrogatepass"))
        if n_bytes > self.max_id_bytes:
            return catalogue.session_id_too_long(n_bytes, self.max_id_bytes)
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
        ``next_seq``: ``seqs`` may hold ``NEXT_SEQ`` (0), "the session's next seq"."""
        n = len(session_ids)
        seq = np.fromiter(seqs, dtype=np.uint64, count=n)
        time = np.fromiter(times, dtype=np.float64, count=n)
        mark = np.fromiter(marks, dtype=np.int64, count=n)
        width = self.width
        widths_ok = all(len(v) == width for v in values)
        if widths_ok:
            flat = np.fromiter((x for v in values for x in v), dtype=np.float32, count=n * width).reshape(n, width)
            value_ok = np.isfinite(flat).all(axis=1) if width else np.ones(n, dtype=bool)
        else:
            flat = np.zeros((n, width), dtype=np.float32)
            value_ok = np.zeros(n, dtype=bool)
            for i, v in enumerate(values):
                if len(v) == width:
                    flat[i] = v
                    value_ok[i] = bool(np.isfinite(flat[i]).all())
        fast = self._fast_id_chars
        id_ok = np.fromiter((0 < len(s) <= fast for s in session_ids), dtype=bool, count=n)
        seq_ok = (seq >= 1) | (seq == NEXT_SEQ) if next_seq else seq >= 1
        ok = id_ok & seq_ok & np.isfinite(time) & (mark < self.num_marks) & value_ok
        errors: dict[int, ErrorInfo] = {}
        if not ok.all():
            for i in np.flatnonzero(~ok).tolist():
                error = self.explain(session_ids[i], int(seq[i]), float(time[i]), int(mark[i]), values[i], next_seq)
                if error is None:  # a long id within the byte limit
                    ok[i] = True
                else:
                    errors[i] = error
        if errors:
            index = np.flatnonzero(ok)
            ids = [session_ids[i] for i in index.tolist()]
            seq, time, mark, flat = seq[index], time[index], mark[index], flat[index]
        else:
            index = np.arange(n)
            ids = session_ids
        columns = EventColumns(ids, np.minimum(seq, MAX_SEQ).astype(np.int64), time, mark, flat)
        return CoreRequest(n, index, columns, errors, **fields)  # type: ignore[arg-type]

    def explain(
        self, sid: str, seq: int, time: float, mark: int, values: Sequence[float], next_seq: bool = False
    ) -> ErrorInfo | None:
        """What is wrong with one event (None when nothing is), checks in a fixed order."""
        error = self.session_id_error(sid)
        if error is not None:
            return error
        if seq < 1 and not (next_seq and seq == NEXT_SEQ):
            return catalogue.seq_zero(sid, seq)
        if not math.isfinite(time):
            return catalogue.time_not_finite(sid, seq, time)
        if not 0 <= mark < self.num_marks:
            return catalogue.mark_out_of_range(sid, seq, mark, self.num_marks)
        if len(values) != self.width:
            return catalogue.values_wrong_width(sid, seq, len(values), self.value_names)
        for j, v in enumerate(values):
            if not math.isfinite(v):
                return catalogue.values_not_finite(sid, seq, j, self.value_names[j], v)
        return None

    def empty(self) -> EventColumns:
        return EventColumns.empty(self.width)
