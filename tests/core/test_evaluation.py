"""Evaluation: metrics on hand-made cases, the no-history baseline's closed forms, the report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from test_training import NUM_MARKS, make_sessions, make_tiny_data, tiny_config, write_hours_csv

from aaren_core.tasks.event.config import TrainConfig
from aaren_core.tasks.event.data import EventSchema, EventSequence, pad_batch
from aaren_core.tasks.event.heads import HeadOutput, LogNormalMixture
from aaren_core.tasks.event.metrics import (
    EvalSplit,
    NoHistoryModel,
    compute_metrics,
    constant_gap_metrics,
    fit_lognormal_mixture,
    model_predictor,
    recorded_metrics,
    score,
    score_recorded,
)
from aaren_core.tasks.event.report import _report, evaluate_checkpoint, point_forecast_verdict, shows_top3
from aaren_core.tasks.event.train import build_model, load_data, train

SCHEMA = EventSchema(tuple(f"m{k}" for k in range(NUM_MARKS)), ("a", "b"), "minutes", (0.0, 0.0), (1.0, 1.0))


def oracle(dt, marks, values):
    """Peeks at the next event: one-hot next mark, a log-normal at the next gap with a tiny spread."""
    next_dt = torch.cat([dt[:, 1:], torch.ones_like(dt[:, :1])], 1).clamp_min(1e-3)
    next_mark = torch.cat([marks[:, 1:], marks[:, :1]], 1)
    next_values = torch.cat([values[:, 1:], values[:, :1]], 1)
    time = LogNormalMixture(
        logits=torch.zeros(*dt.shape, 1),
        loc=torch.log(next_dt).unsqueeze(-1),
        log_scale=torch.full((*dt.shape, 1), -7.0),
    )
    logits = torch.nn.functional.one_hot(next_mark, NUM_MARKS).float() * 30
    return HeadOutput(time, logits, next_values, torch.ones_like(next_values))


def sessions_with_gaps(gaps: np.ndarray) -> list[EventSequence]:
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    n = len(times)
    return [EventSequence("s", times, np.arange(n) % NUM_MARKS, np.zeros((n, 2)))]


def test_a_perfect_predictor_scores_perfectly():
    seqs = make_sessions(3, 20, seed=0)
    seqs = [EventSequence(s.session_id, s.times + np.arange(len(s)) * 0.5, s.marks, s.values) for s in seqs]
    pred = score(oracle, seqs, [s.times for s in seqs], SCHEMA, batch_size=2)
    m = compute_metrics(pred, SCHEMA.value_names)
    assert m["events"] == 3 * 19
    assert m["mark_acc"] == 1.0 and m["top3_acc"] == 1.0
    assert m["time_rmse"] < 1e-4 and m["time_mae"] < 1e-4
    assert m["time_rmse_median"] < 1e-4 and m["time_mae_raw_median"] == pytest.approx(m["time_mae_raw"], abs=1e-4)
    assert m["value_rmse.a"] == pytest.approx(0.0, abs=1e-5)
    assert m["nll_mark"] < 1e-6
    assert list(pred.session) == [i for i in range(3) for _ in range(19)]
    assert list(pred.index[:19]) == list(range(1, 20))


def test_top3_counts_the_true_mark_among_the_three_most_likely():
    seqs = make_sessions(2, 30, seed=1)
    seqs = [EventSequence(s.session_id, s.times + np.arange(len(s)) * 0.5, s.marks, s.values) for s in seqs]

    def shifted(dt, marks, values):
        out = oracle(dt, marks, values)
        true = out.mark_logits.argmax(-1)
        logits = 2.0 * torch.nn.functional.one_hot((true + 1) % NUM_MARKS, NUM_MARKS) + torch.nn.functional.one_hot(
            true, NUM_MARKS
        )
        return HeadOutput(out.time, logits.float(), out.value_mean, out.value_std)

    m = compute_metrics(score(shifted, seqs, [s.times for s in seqs], SCHEMA))
    assert m["mark_acc"] == 0.0 and m["top3_acc"] == 1.0


def test_calibration_fractions_and_point_errors_by_hand():
    # Gaps e^z on a grid; the predictor says log gap ~ N(0, 1) for every event.
    z = np.linspace(-2.5, 2.5, 101)
    seqs = sessions_with_gaps(np.exp(z))

    def standard(dt, marks, values):
        shape = dt.shape
        time = LogNormalMixture(torch.zeros(*shape, 1), torch.zeros(*shape, 1), torch.zeros(*shape, 1))
        return HeadOutput(time, torch.zeros(*shape, NUM_MARKS), torch.zeros(*shape, 2), torch.ones(*shape, 2))

    pred = score(standard, seqs, [s.times for s in seqs], SCHEMA)
    m = compute_metrics(pred)
    for level, key in ((0.1, "calib_q10"), (0.5, "calib_q50"), (0.9, "calib_q90")):
        q = float(torch.special.ndtri(torch.tensor(level, dtype=torch.float64)))
        assert m[key] == pytest.approx(np.mean(z <= q), abs=1e-12)
    gaps = np.exp(z)
    mean = math.exp(0.5)
    assert m["time_rmse"] == pytest.approx(np.sqrt(np.mean((mean - gaps) ** 2)), rel=1e-5)
    assert m["time_mae"] == pytest.approx(np.mean(np.abs(mean - gaps)), rel=1e-5)
    assert m["time_rmse_median"] == pytest.approx(np.sqrt(np.mean((1.0 - gaps) ** 2)), rel=1e-5)
    assert m["max_mean_gap"] == pytest.approx(mean, rel=1e-6)
    assert m["nll_time"] == pytest.approx(np.mean(0.5 * z**2 + 0.5 * math.log(2 * math.pi) + z), rel=1e-5)
    assert m["nll_mark"] == pytest.approx(math.log(NUM_MARKS), rel=1e-6)
    np.testing.assert_allclose(pred.pit, 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2))), atol=1e-6)


def test_constant_predictors_are_the_train_mean_and_median():
    train = sessions_with_gaps(np.array([1.0, 2.0, 3.0, 10.0]))
    test = sessions_with_gaps(np.array([2.0, 4.0]))
    pred = score(oracle, test, [np.floor(s.times) for s in test], SCHEMA)
    c = constant_gap_metrics(train, [np.floor(s.times) for s in train], pred)
    assert c["train mean gap"]["value"] == 4.0 and c["train median gap"]["value"] == 2.5
    assert c["train mean gap"]["time_rmse"] == pytest.approx(math.sqrt((4 + 0) / 2))
    assert c["train median gap"]["time_mae"] == pytest.approx((0.5 + 1.5) / 2)


def test_no_history_fit_is_the_closed_form():
    seqs = make_sessions(6, 50, seed=4)
    seqs = [EventSequence(s.session_id, s.times + np.arange(len(s)) * 0.25, s.marks, s.values) for s in seqs]
    base = NoHistoryModel.fit(seqs, SCHEMA, n_components=1)
    marks = np.concatenate([s.marks[1:] for s in seqs])
    values = np.concatenate([s.values[1:] for s in seqs]).astype(np.float64)
    log_gaps = np.log(np.concatenate([np.diff(s.times) for s in seqs]))
    freqs = np.bincount(marks, minlength=NUM_MARKS) / marks.size
    np.testing.assert_allclose(torch.softmax(base.mark_logits, 0).numpy(), freqs, rtol=1e-12)
    np.testing.assert_allclose(base.value_mean.numpy(), values.mean(0), rtol=1e-12)
    np.testing.assert_allclose(base.value_std.numpy(), values.std(0), rtol=1e-12)
    assert float(base.time_loc[0]) == pytest.approx(log_gaps.mean(), rel=1e-12)
    assert math.exp(float(base.time_log_scale[0])) == pytest.approx(log_gaps.std(), rel=1e-12)
    # Its mark NLL is the entropy of the empirical frequencies (scored on its own training data).
    pred = score(base, seqs, [s.times for s in seqs], SCHEMA)
    m = compute_metrics(pred)
    assert m["nll_mark"] == pytest.approx(-(freqs * np.log(freqs)).sum(), rel=1e-5)
    assert m["mark_acc"] == pytest.approx(freqs.max(), rel=1e-9)
    assert base.parameter_count() == 3 - 1 + NUM_MARKS - 1 + 4


def test_em_recovers_two_separated_log_normals():
    rng = np.random.default_rng(0)
    gaps = np.exp(np.concatenate([rng.normal(-2, 0.3, 3000), rng.normal(2, 0.5, 1000)]))
    weights, loc, scale = fit_lognormal_mixture(gaps, 2)
    order = np.argsort(loc)
    np.testing.assert_allclose(weights[order], [0.75, 0.25], atol=0.01)
    np.testing.assert_allclose(loc[order], [-2, 2], atol=0.05)
    np.testing.assert_allclose(scale[order], [0.3, 0.5], atol=0.03)


def test_scored_nll_is_the_training_loss():
    data = make_tiny_data()
    model = build_model(tiny_config("unused"), data, (0.5, 1.0)).eval()
    seqs = [EventSequence(s.session_id, s.times + np.arange(len(s)) * 0.5, s.marks, s.values) for s in data.val]
    pred = score(model_predictor(model), seqs, [s.times for s in seqs], data.schema, batch_size=3)
    m = compute_metrics(pred)
    batch = pad_batch(seqs, data.schema, raw_values=True)
    with torch.no_grad():
        terms = model.nll(batch.dt, batch.marks, batch.values, batch.mask).mean()
    for key in ("time", "mark", "value", "total"):
        assert m[f"nll_{key}"] == pytest.approx(float(terms[key]), rel=1e-5)


def test_evaluate_checkpoint_writes_report_metrics_and_plots(tmp_path):
    data = make_tiny_data()
    result = train(tiny_config(tmp_path / "run", epochs=2), data=data, log=lambda _: None)
    out = tmp_path / "eval"
    metrics = evaluate_checkpoint(result.best_dir, split="test", out_dir=out, data=data)
    assert metrics["name"] == "tiny" and metrics["model"]["events"] == sum(len(s) - 1 for s in data.test)
    assert set(metrics["constant"]) == {"train mean gap", "train median gap"}
    recorded = metrics["recorded"]
    assert recorded["resolution"] == metrics["train_config"]["jitter"] > 0
    assert recorded["model"]["events"] == metrics["model"]["events"]
    for key in ("calib_q10_below", "calib_q10", "pit_ks", "nll_time", "time_mae_median"):
        assert math.isfinite(recorded["model"][key]) and math.isfinite(recorded["no_history"][key])
    assert metrics["model"]["max_mean_gap"] <= metrics["gap_bound"]
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["model"] == pytest.approx(metrics["model"])
    report = (out / "report.md").read_text()
    for needle in (
        "Dequantization",
        "no-history",
        "q90",
        "train median gap",
        "![timeline.png](timeline.png)",
        "point forecast: mean truncated at U",
        "At the recorded resolution (as the server sees it)",
        "randomized PIT",
    ):
        assert needle in report
    for png in ("gap_distribution.png", "calibration.png", "timeline.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_the_point_forecast_verdict_calls_a_model_worse_than_the_constant_worse():
    worse = point_forecast_verdict(0.263, 0.01)
    assert worse.startswith("History buys no point forecast of the next gap: neither the model's point forecast nor")
    assert "+26.3%" in worse and "+1.0%" in worse and "only a little" not in worse
    # The case: the median's MAE 437 h against 433 h for the training median.
    median_only = point_forecast_verdict(-0.01, 437 / 433 - 1)
    assert median_only.startswith("History does not reliably help")
    assert "median is no better than a constant" in median_only
    mixed = point_forecast_verdict(0.05, -0.2)
    assert mixed.startswith("History does not reliably help") and "point forecast is no better" in mixed
    assert point_forecast_verdict(0.0, 0.0).startswith("History buys no point forecast")  # a tie is not better
    assert point_forecast_verdict(-0.02, -0.05).startswith("History helps the point forecast of the next gap only a")
    assert point_forecast_verdict(-0.3, -0.2).startswith("History helps the point forecast of the next gap: ")


def test_the_report_says_plainly_when_history_buys_no_point_forecast(tmp_path):
    """A model whose median is worse than the training median by a hair: the report says so."""
    data = make_tiny_data()
    result = train(tiny_config(tmp_path / "run", epochs=1), data=data, log=lambda _: None)
    metrics = evaluate_checkpoint(result.best_dir, split="test", out_dir=tmp_path / "eval", data=data, plots=False)
    ev = EvalSplit.from_config(TrainConfig.from_dict(metrics["train_config"]), "test", data)
    best_mae = min(c["time_mae"] for c in metrics["constant"].values())
    metrics["model"]["time_mae_median"] = best_mae * 437 / 433
    metrics["model"]["time_rmse"] = min(c["time_rmse"] for c in metrics["constant"].values()) * 0.99
    report = _report(metrics, ev, [])
    verdict = "History does not reliably help the point forecast of the next gap: the model's median is no better"
    assert verdict in report
    assert "+0.9%" in report and "mean truncated at U" in report


def test_recorded_scores_are_calibrated_for_the_true_discrete_distribution():
    """Recorded gaps drawn from the model's own recorded-gap law: P(G < q) <= p <= P(G <= q) for the
    served quantiles, the randomized PIT is uniform, and the continuous quantiles are not calibrated."""
    w, n = 1.0, 6000
    rng = np.random.default_rng(0)
    tau = np.exp(rng.normal(0.0, 1.0, n))  # the jittered gap ~ LogNormal(0, 1)
    gaps = w * np.floor((tau + rng.uniform(0, w, n)) / w)  # recorded: a difference of floors
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    seqs = [EventSequence("s", times, np.zeros(n + 1, dtype=np.int64), np.zeros((n + 1, 2)))]

    def standard(dt, marks, values):
        shape = dt.shape
        time = LogNormalMixture(torch.zeros(*shape, 1), torch.zeros(*shape, 1), torch.zeros(*shape, 1))
        return HeadOutput(time, torch.zeros(*shape, NUM_MARKS), torch.zeros(*shape, 2), torch.ones(*shape, 2))

    pred = score_recorded(standard, seqs, SCHEMA, resolution=w, bound=1e3)
    m = recorded_metrics(pred)
    assert m["zero_gap_fraction"] == pytest.approx(np.mean(gaps == 0))
    assert np.allclose(pred.quantiles % w, 0) and (pred.point <= 1e3).all()
    for p in (10, 50, 90):
        assert m[f"calib_q{p}_below"] - 0.02 <= p / 100 <= m[f"calib_q{p}"] + 0.02
        assert m[f"pit_q{p}"] == pytest.approx(p / 100, abs=0.02)
    assert m["pit_ks"] < 0.03
    assert m["calib_q10_continuous"] > 0.2  # P(G = 0) is about 0.35 here: the continuous q10 overstates
    # The discrete NLL is -log P(G = g) of the closed form: check it against the empirical frequencies.
    freq = {g: np.mean(gaps == g) for g in np.unique(gaps)}
    assert m["nll_time"] == pytest.approx(-np.mean([math.log(freq[g]) for g in gaps]), abs=0.02)


def test_top3_accuracy_is_shown_only_with_more_than_three_marks():
    assert [shows_top3({"num_marks": k}) for k in (2, 3, 4)] == [False, False, True]


def test_evaluate_a_time_split_checkpoint_reports_its_split_and_derived_resolution(tmp_path):
    events = write_hours_csv(tmp_path / "long.csv", sessions=10, length=50, span=24 * 30, grid=0.25)
    config = tiny_config(tmp_path / "run", data=str(events), time_unit="hours", epochs=1)
    result = train(config, log=lambda _: None)
    metrics = evaluate_checkpoint(result.best_dir, out_dir=tmp_path / "eval", plots=False)
    data = load_data(config)
    assert metrics["model"]["events"] == sum(s.predicted for s in data.test)  # held-out events only
    assert metrics["data_split"]["method"] == "time" and metrics["data_split"]["cutoffs"] == list(data.split.cutoffs)
    report = (tmp_path / "eval" / "report.md").read_text()
    c1, c2 = data.split.cutoffs
    assert f"Split by event time at {c1:.10g} and {c2:.10g} hours" in report and "chosen by default" in report
    assert (
        "recorded to a resolution of 0.25 hours (derived from the training times: 100.0% of the positive gaps" in report
    )
    assert "resolution of 1 " not in report

    # A given jitter is reported as given; continuous times as not dequantized.
    given = train(config.replace(out_dir=str(tmp_path / "given"), jitter="0.5"), log=lambda _: None)
    evaluate_checkpoint(given.best_dir, out_dir=tmp_path / "eval-given", plots=False)
    assert (
        "resolution of 0.5 hours (given as jitter=0.5; the training times alone give 0.25)"
        in (tmp_path / "eval-given" / "report.md").read_text()
    )
    smooth = write_hours_csv(tmp_path / "smooth.csv", sessions=10, length=50, span=24 * 30, grid=None)
    cont = train(config.replace(out_dir=str(tmp_path / "cont"), data=str(smooth)), log=lambda _: None)
    evaluate_checkpoint(cont.best_dir, out_dir=tmp_path / "eval-cont", plots=False)
    text = (tmp_path / "eval-cont" / "report.md").read_text()
    assert "are continuous (derived from the training times: on no common grid, and no gap is 0)" in text
    assert "not dequantized" in text
