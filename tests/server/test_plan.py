"""The batch plan's compiled passes (``aaren.server.core.batcher``'s ``plan_*``) against a plain-Python statement of the
rules (docs/architecture.md section 3, "Validation"), on random batches: sessions with state and
without, seqs in and out of order with repeats and ``NEXT_SEQ``, times out of order, sessions of
another model version, a model of regular steps, and requests that want the last forecast only."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aaren.server.core import batcher as plan
from aaren.server.core.batcher import Why


def oracle_verdicts(sess, seq, times, exists, stored_seq, stored_time, foreign, step, most):
    """One event at a time, each session's seq and time moving on with its applied events."""
    cur = {u: (int(stored_seq[u]), float(stored_time[u])) for u in range(len(exists))}
    out = []  # (seq, verdict, why, dup_seq, ref_seq, ref_time)
    for u, s, t in zip(sess.tolist(), seq.tolist(), times.tolist(), strict=True):
        last, last_t = cur[u]
        if foreign[u]:
            out.append((s, plan.ERR, Why.MODEL_MISMATCH, 0, last, last_t))
            continue
        if s == 0 and last > 0:
            s = last + 1
        if s == 0 or (last == 0 and s > 1):
            out.append((s, plan.ERR, Why.SESSION_MISSING, 0, last, last_t))
        elif s <= stored_seq[u]:
            out.append((s, plan.DUP, 0, int(stored_seq[u]), last, last_t))
        elif s <= last:
            out.append((s, plan.DUP_OF_BATCH, 0, 0, last, last_t))
        elif s > last + 1:
            out.append((s, plan.ERR, Why.SEQ_GAP, 0, last, last_t))
        elif t < last_t:
            out.append((s, plan.ERR, Why.TIME_BEFORE_LAST, 0, last, last_t))
        else:
            why = 0
            if last > 0 and step > 0:
                k = round((t - last_t) / step)
                if k < 1 or abs((t - last_t) - k * step) > plan.GRID_TOLERANCE_S:
                    why = Why.OFF_GRID
                elif k - 1 > most:
                    why = Why.GAP_TOO_LONG
            if why:
                out.append((s, plan.ERR, why, 0, last, last_t))
            else:
                out.append((s, plan.APPLY, 0, 0, last, last_t))
                cur[u] = (s, t)
    return out


@st.composite
def batches(draw):
    n_sessions = draw(st.integers(1, 5))
    exists = np.array([draw(st.booleans()) for _ in range(n_sessions)])
    stored_seq = np.array([draw(st.integers(1, 4)) if e else 0 for e in exists], dtype=np.int64)
    step = draw(st.sampled_from([0.0, 60.0]))
    stored_time = np.array([60.0 * draw(st.integers(0, 3)) if e else -math.inf for e in exists])
    foreign = np.array([bool(e and draw(st.integers(0, 5)) == 0) for e in exists])
    n = draw(st.integers(1, 12))
    sess = np.array([draw(st.integers(0, n_sessions - 1)) for _ in range(n)], dtype=np.int64)
    seq = np.array([draw(st.integers(0, 7)) for _ in range(n)], dtype=np.int64)
    times = np.array([draw(st.sampled_from([0.0, 30.0, 60.0, 120.0, 180.0, 600.0, 60.0005])) for _ in range(n)])
    counts, left = [], n
    while left:
        c = draw(st.integers(1, left))
        counts.append(c)
        left -= c
    last_only = np.array([draw(st.booleans()) for _ in counts])
    return sess, seq, times, exists, stored_seq, stored_time, foreign, step, np.array(counts), last_only


@settings(max_examples=400, deadline=None)
@given(batches())
def test_the_plan_follows_the_rules(batch):
    sess, seq, times, exists, stored_seq, stored_time, foreign, step, counts, last_only = batch
    most = 2
    got = plan.plan_verdicts(sess, seq, times, stored_seq, stored_time, foreign, step, most)
    out_seq, verdict, why, dup_seq, ref_seq, ref_time, refused = got
    if not refused:  # the refusal columns come only where something was refused
        assert why is None and ref_seq is None and ref_time is None
        why = np.zeros(len(sess), np.int8)
    want = oracle_verdicts(sess, seq, times, exists, stored_seq, stored_time, foreign, step, most)
    for i, (s, v, w, d, rs, rt) in enumerate(want):
        assert (out_seq[i], verdict[i], why[i]) == (s, v, w), i
        if v == plan.DUP:
            assert dup_seq[i] == d
        if v == plan.ERR:
            assert (ref_seq[i], ref_time[i]) == (rs, rt)
    assert refused == sum(v == plan.ERR for _, v, *_ in want)
    assert (seq >= 0).all()  # the request's own column is left as it was sent

    (applied, run_of), (starts, lengths, run_sess, ends), dt, wanted, in_order = plan.plan_runs(
        verdict, sess, times, exists, stored_time, counts, last_only, len(exists)
    )
    # runs: the applied events grouped by session in code order, each in batch order
    order = [i for u in range(len(exists)) for i in range(len(sess)) if sess[i] == u and verdict[i] == plan.APPLY]
    assert applied.tolist() == order
    assert in_order == (order == list(range(len(sess))))
    piece = np.repeat(np.arange(len(counts)), counts)
    for r in range(len(run_sess)):
        members = applied[starts[r] : starts[r] + lengths[r]]
        assert set(sess[members].tolist()) == {run_sess[r]} and ends[r] == starts[r] + lengths[r] - 1
        assert (run_of[starts[r] : starts[r] + lengths[r]] == r).all()
        u = run_sess[r]
        previous = stored_time[u] if exists[u] else times[members[0]]
        for a, i in zip(range(starts[r], starts[r] + lengths[r]), members.tolist(), strict=True):
            assert dt[a] == times[i] - previous
            previous = times[i]
            later = [j for j in members.tolist() if j > i and piece[j] == piece[i]]
            assert wanted[a] == (not last_only[piece[i]] or not later)

    ok_run = np.array([r % 3 != 1 for r in range(len(run_sess))], dtype=bool)
    kind, last_seq, forecast_row, failed_run, n_applied, n_dups, n_rows = plan.plan_outcomes(
        verdict, sess, out_seq, dup_seq, applied, wanted, run_of, run_sess, ends, ok_run, len(exists)
    )
    assert n_rows == int(wanted.sum())
    if failed_run is None:  # no event's run failed
        assert all(ok_run[r] for r in run_of.tolist())
        failed_run = np.full(len(sess), -1)
    rows = {int(i): f for f, i in enumerate(applied[wanted].tolist())}
    run_by_session = {int(u): r for r, u in enumerate(run_sess.tolist())}
    for i in range(len(sess)):
        v = int(verdict[i])
        if v == plan.APPLY:
            r = int(run_of[applied.tolist().index(i)])
            if ok_run[r]:
                assert kind[i] == (0 if i in rows else 1) and last_seq[i] == out_seq[i] and failed_run[i] == -1
                assert forecast_row[i] == rows.get(i, -1)
            else:
                assert kind[i] == 3 and failed_run[i] == r and forecast_row[i] == -1
        elif v == plan.DUP:
            assert kind[i] == 2 and last_seq[i] == dup_seq[i]
        elif v == plan.DUP_OF_BATCH:
            r = run_by_session[int(sess[i])]
            if ok_run[r]:
                assert kind[i] == 2 and last_seq[i] == out_seq[applied[ends[r]]]
            else:
                assert kind[i] == 3 and failed_run[i] == r
        else:
            assert kind[i] == 3 and failed_run[i] == -1
    assert n_applied == sum(1 for i in range(len(sess)) if kind[i] in (0, 1))
    assert n_dups == int((kind == 2).sum())


def test_finite_rows_names_the_rows_with_a_nan_or_an_infinity():
    """The batcher's check of a batch's new rows: fields of any layout (a strided view among them) and
    dtype; integer fields are not looked at."""
    import torch

    from aaren.server.core.batcher import _finite_rows

    a = torch.zeros(4, 3)
    b = torch.ones(4, 5, dtype=torch.float64)
    strided = torch.zeros(4, 6)
    rows = {"a": a, "b": b, "s": strided[:, ::2], "n": torch.zeros(4, dtype=torch.int64)}
    assert _finite_rows(rows) is None
    a[1, 2] = float("nan")
    b[3, 0] = -float("inf")
    strided[2, 3] = float("inf")  # between the view's columns: not its business
    assert _finite_rows(rows).tolist() == [True, False, True, False]
    strided[2, 2] = float("inf")
    assert _finite_rows(rows).tolist() == [True, False, False, False]
    finite, bad = plan.rows_finite((np.zeros((2, 3), np.float32), np.ones((2, 1), np.float32)))
    assert finite.all() and bad == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "é", "c/d", ""]), max_size=12))
def test_sessions_are_coded_in_order_of_first_appearance(keys: list[str]) -> None:
    sess, ids = plan.code_sessions(keys)
    first: dict[str, int] = {}
    for k in keys:
        first.setdefault(k, len(first))
    assert sess.dtype == np.int64
    assert sess.tolist() == [first[k] for k in keys]
    assert ids == list(first)
