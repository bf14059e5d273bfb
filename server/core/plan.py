"""A batch's plan as compiled loops over its events: verdicts, runs, outcomes (numba).

A batch of ``E`` events of ``U`` sessions is planned in three passes, each one compiled call over
plain columns, so that a batch costs the batcher a handful of calls whatever its size (a batch of
one event paid a hundred-odd numpy calls of about a microsecond each when each check was an array
expression of its own):

- ``verdicts``: each event against its session's state, in batch order, the state moving with each
  applied event (docs/architecture.md section 3, "Validation"): a seq that duplicates the stored
  state, or an event applied earlier in this batch, a seq gap, a time before the session's last, a
  model version mismatch, and for a model of regular steps the step grid and the longest gap it fills.
  One loop serves sessions with one event and sessions with many alike.
- ``runs``: the applied events grouped by session (each session's in order), the gap of each event
  since its session's previous one, which events get a forecast.
- ``outcomes``: what became of each event once the states are stored (or a session's run failed).

Only codes and numbers come out; the batcher turns the rare error codes into the catalogue's errors.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

__all__ = [
    "APPLY",
    "DUP",
    "DUP_OF_BATCH",
    "ERR",
    "GRID_TOLERANCE_S",
    "Why",
    "grid",
    "outcomes",
    "runs",
    "verdicts",
]

# Verdicts, per event of a batch.
APPLY, DUP, DUP_OF_BATCH, ERR = 0, 1, 2, 3
#: How far an event of a model of regular steps may be from its session's grid (seconds).
GRID_TOLERANCE_S = 1e-3
# Outcome kinds (aaren.server.contract.columns: FORECAST, ACK, DUPLICATE, ERROR).
_FORECAST, _ACK, _DUPLICATE, _ERROR = 0, 1, 2, 3
_NEXT_SEQ = 0


class Why:
    """Why ``verdicts`` refused an event (``reason [E]``; 0 where it did not)."""

    NONE, MODEL_MISMATCH, SESSION_MISSING, SEQ_GAP, TIME_BEFORE_LAST, OFF_GRID, GAP_TOO_LONG = range(7)


def _jit(fn: Any) -> Any:
    """``numba.njit``, cached on disk where a cache can be written (else compiled once per process)."""
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return numba.njit(cache=False, nogil=True)(fn)


@_jit
def grid(dt: float, step: float, max_gap_steps: int) -> int:
    """The grid check of an event ``dt`` seconds after its session's previous one, for a model of step
    ``D = step``: with ``k = round(dt / D) - 1`` missing steps, ``OFF_GRID`` where
    ``|dt - (k + 1) D| > GRID_TOLERANCE_S`` or ``k < 0``, else ``GAP_TOO_LONG`` where ``k > max_gap_steps``,
    else 0 (on the grid)."""
    steps = np.rint(dt / step)
    if steps < 1 or abs(dt - steps * step) > GRID_TOLERANCE_S:
        return 5  # Why.OFF_GRID
    if steps - 1 > max_gap_steps:
        return 6  # Why.GAP_TOO_LONG
    return 0


@_jit
def verdicts(
    sess: np.ndarray,
    seq: np.ndarray,
    times: np.ndarray,
    exists: np.ndarray,
    stored_seq: np.ndarray,
    stored_time: np.ndarray,
    foreign: np.ndarray,
    step: float,
    max_gap_steps: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The verdict of each event ``i`` of session ``sess[i]`` (``[E]``, batch order) against the stored
    columns ``[U]`` (``exists``; ``stored_seq``, ``stored_time``: the last applied seq and time, 0 and -inf
    for a session without state; ``foreign``: written by another model version), each applied event moving
    its session's seq and time on for the events after it. ``step > 0``: a model of regular steps.

    Returns ``seq [E]`` with ``NEXT_SEQ`` (0) resolved to the seq after the session's last applied one
    (a copy), ``verdict [E]`` (``APPLY``, ``DUP``, ``DUP_OF_BATCH``, ``ERR``), ``reason [E]`` (``Why``),
    ``dup_seq [E]`` (a duplicate's acknowledged seq: the stored one), what a refusal compared with:
    ``ref_seq [E]``, ``ref_time [E]`` (the session's last applied seq and time at that event), and the
    number refused."""
    n = sess.shape[0]
    out_seq = seq.astype(np.int64)
    verdict = np.zeros(n, np.int8)
    reason = np.zeros(n, np.int8)
    dup_seq = np.zeros(n, np.int64)
    ref_seq = np.zeros(n, np.int64)
    ref_time = np.zeros(n, np.float64)
    cur_seq = stored_seq.astype(np.int64)
    cur_time = stored_time.astype(np.float64)
    refused = 0
    for i in range(n):
        u = sess[i]
        s = out_seq[i]
        t = times[i]
        last = cur_seq[u]
        ref_seq[i] = last
        ref_time[i] = cur_time[u]
        if foreign[u]:
            verdict[i] = 3
            reason[i] = 1  # MODEL_MISMATCH
            refused += 1
            continue
        if s == _NEXT_SEQ and last > 0:
            s = last + 1
            out_seq[i] = s
        if s == _NEXT_SEQ or (last == 0 and s > 1):
            verdict[i] = 3
            reason[i] = 2  # SESSION_MISSING
        elif s <= stored_seq[u]:
            verdict[i] = 1  # DUP
            dup_seq[i] = stored_seq[u]
        elif s <= last:
            verdict[i] = 2  # DUP_OF_BATCH
        elif s > last + 1:
            verdict[i] = 3
            reason[i] = 3  # SEQ_GAP
        elif t < cur_time[u]:
            verdict[i] = 3
            reason[i] = 4  # TIME_BEFORE_LAST
        else:
            off = grid(t - cur_time[u], step, max_gap_steps) if last > 0 and step > 0 else 0
            if off:
                verdict[i] = 3
                reason[i] = off
            else:
                cur_seq[u] = s
                cur_time[u] = t
        if verdict[i] == 3:
            refused += 1
    return out_seq, verdict, reason, dup_seq, ref_seq, ref_time, refused


@_jit
def runs(
    verdict: np.ndarray,
    sess: np.ndarray,
    times: np.ndarray,
    exists: np.ndarray,
    stored_time: np.ndarray,
    piece_counts: np.ndarray,
    last_only: np.ndarray,
    n_sessions: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """The applied events (``verdict == APPLY``) of a batch of ``E`` events of ``n_sessions`` sessions as
    runs, one per session with applied events, in order of their sessions' codes (each run's events in
    batch order).

    ``piece_counts [P]``: the events of each piece (request) of the batch, one after another;
    ``last_only [P]``: whether a piece wants the forecast of each session's last applied event only
    (the others are acknowledged).

    Returns ``applied [A]`` (batch positions, grouped by run), ``starts [R]``, ``lengths [R]``,
    ``run_sess [R]`` (each run's session), ``run_of [A]``, ``ends [R]`` (each run's last event, an index
    into ``applied``), ``dt [A]`` (each event's gap since its session's previous one: the stored last
    time for a run's first event of a session with state, else 0), ``want [A]``, and whether ``applied`` is
    every event in batch order (``0..E-1``: the batch's columns serve as the runs' as they are)."""
    n = sess.shape[0]
    piece_of = np.empty(n, np.int64)
    at = 0
    for p in range(piece_counts.shape[0]):
        piece_of[at : at + piece_counts[p]] = p
        at += piece_counts[p]
    count = np.zeros(n_sessions + 1, np.int64)
    n_applied = 0
    for i in range(n):
        if verdict[i] == 0:
            count[sess[i] + 1] += 1
            n_applied += 1
    n_runs = 0
    for u in range(n_sessions):
        if count[u + 1] > 0:
            n_runs += 1
        count[u + 1] += count[u]
    applied = np.empty(n_applied, np.int64)
    for i in range(n):
        if verdict[i] == 0:
            u = sess[i]
            applied[count[u]] = i
            count[u] += 1
    starts = np.empty(n_runs, np.int64)
    lengths = np.empty(n_runs, np.int64)
    run_sess = np.empty(n_runs, np.int64)
    ends = np.empty(n_runs, np.int64)
    run_of = np.empty(n_applied, np.int64)
    dt = np.empty(n_applied, np.float64)
    want = np.ones(n_applied, np.bool_)
    r = -1
    for a in range(n_applied):
        i = applied[a]
        u = sess[i]
        if a == 0 or sess[applied[a - 1]] != u:
            r += 1
            starts[r] = a
            lengths[r] = 0
            run_sess[r] = u
            dt[a] = times[i] - stored_time[u] if exists[u] else 0.0
        else:
            dt[a] = times[i] - times[applied[a - 1]]
            p = piece_of[applied[a - 1]]
            if last_only[p] and piece_of[i] == p:
                want[a - 1] = False
        lengths[r] += 1
        ends[r] = a
        run_of[a] = r
    in_order = n_applied == n
    for a in range(n_applied):
        if applied[a] != a:
            in_order = False
            break
    return applied, starts, lengths, run_sess, run_of, ends, dt, want, in_order


@_jit
def outcomes(
    verdict: np.ndarray,
    sess: np.ndarray,
    seq: np.ndarray,
    dup_seq: np.ndarray,
    applied: np.ndarray,
    want: np.ndarray,
    run_of: np.ndarray,
    run_sess: np.ndarray,
    ends: np.ndarray,
    ok_run: np.ndarray,
    n_sessions: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int, int]:
    """What became of each of a batch's ``E`` events, the runs where ``ok_run [R]`` is false failed.

    Returns ``kind [E]`` (``FORECAST``, ``ACK``, ``DUPLICATE``, ``ERROR``), ``last_seq [E]`` (an ack's or a
    duplicate's seq), ``forecast_row [E]`` (the row of its forecast among the outputs of the wanted
    applied events, which the task made in the order of ``applied``; -1: none), ``failed_run [E]`` (the
    run whose failure is the event's error; -1: none), the numbers applied and duplicate, and the rows of
    those outputs."""
    n = sess.shape[0]
    kind = np.full(n, _ERROR, np.int8)
    last_seq = np.zeros(n, np.int64)
    forecast_row = np.full(n, -1, np.int64)
    failed_run = np.full(n, -1, np.int64)
    n_applied = 0
    n_dups = 0
    row = 0
    for a in range(applied.shape[0]):
        i = applied[a]
        r = run_of[a]
        if ok_run[r]:
            last_seq[i] = seq[i]
            n_applied += 1
            if want[a]:
                kind[i] = _FORECAST
                forecast_row[i] = row
            else:
                kind[i] = _ACK
        else:
            failed_run[i] = r
        if want[a]:
            row += 1
    run_of_sess = np.full(n_sessions, -1, np.int64)
    for r in range(run_sess.shape[0]):
        run_of_sess[run_sess[r]] = r
    for i in range(n):
        v = verdict[i]
        if v == 1:  # DUP
            kind[i] = _DUPLICATE
            last_seq[i] = dup_seq[i]
            n_dups += 1
        elif v == 2:  # DUP_OF_BATCH: as its session's run went
            r = run_of_sess[sess[i]]
            if r >= 0 and ok_run[r]:
                kind[i] = _DUPLICATE
                last_seq[i] = seq[applied[ends[r]]]
                n_dups += 1
            elif r >= 0:
                failed_run[i] = r
    return kind, last_seq, forecast_row, failed_run, n_applied, n_dups, row


@_jit
def finite_rows(views: Any) -> tuple[np.ndarray, int]:
    """Which rows ``r`` of a batch's new state are finite in every field: ``views`` is a tuple of its float
    fields as ``[R, n]`` arrays of one dtype and layout. Returns ``finite [R]`` and how many are not (a numeric
    overflow is an error for its session's events, never a stored state)."""
    n_rows = views[0].shape[0]
    finite = np.ones(n_rows, np.bool_)
    for v in views:
        for r in range(n_rows):
            if finite[r]:
                row = v[r]
                for j in range(row.shape[0]):
                    if not np.isfinite(row[j]):
                        finite[r] = False
                        break
    bad = 0
    for r in range(n_rows):
        if not finite[r]:
            bad += 1
    return finite, bad
