"""Series baselines and scores (TSLib protocol) and class accuracy by fraction seen, on generated data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.classify.metrics import early_accuracy
from aaren_core.tasks.event.data import DataError
from aaren_core.tasks.series.baselines import DLinear, DLinearConfig, last_value, seasonal_naive, windows
from aaren_core.tasks.series.data import SeriesData, calendar_features, ett_borders, ratio_borders
from aaren_core.tasks.series.metrics import (
    ErrorSums,
    model_window_predictor,
    score_series,
    score_streaming,
    streaming_forecasts,
)
from aaren_core.tasks.series.model import SeriesModel, SeriesModelConfig


def daily_series(n: int = 400, channels: int = 2, seed: int = 0) -> SeriesData:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    values = np.stack(
        [np.sin(2 * np.pi * t / 24) * (c + 1) + 0.05 * rng.standard_normal(n) for c in range(channels)], 1
    )
    return SeriesData("daily", 3600.0 * t, values, tuple(f"c{c}" for c in range(channels)), ratio_borders(n), 3600.0)


def test_borders_follow_tslib():
    assert ett_borders(34_589, 1) == (8640, 11_520, 14_400)
    assert ett_borders(60_000, 4) == (34_560, 46_080, 57_600)
    assert ratio_borders(26_304) == (18_412, 21_044, 26_304)
    with pytest.raises(DataError, match="needs 14400 steps"):
        ett_borders(100, 1)


def test_forecast_origins_and_windows():
    s = daily_series()
    _, b, c = s.borders
    origins = s.forecast_origins("test", 24, 12)
    assert origins[0] == b and origins[-1] == c - 12 and np.all(np.diff(origins) == 1)
    assert s.forecast_origins("train", 24, 12)[0] == 24
    z = s.standardized()
    w = windows(z, origins[:3], 24)
    assert w.shape == (3, 24, 2) and np.array_equal(w[1], z[origins[1] - 24 : origins[1]])
    with pytest.raises(DataError, match="no window"):
        s.forecast_origins("val", 24, 100)


def test_naive_baselines_and_error_sums():
    z = np.arange(60, dtype=np.float32).reshape(30, 2)
    o = np.array([10, 20])
    assert np.array_equal(last_value(z, o, 3)[1], np.repeat(z[19:20], 3, 0))
    sn = seasonal_naive(z, o, 7, period=5)
    assert np.array_equal(sn[0, :, 0], z[[5, 6, 7, 8, 9, 5, 6], 0])
    with pytest.raises(DataError, match="origins >= 5"):
        seasonal_naive(z, np.array([3]), 2, 5)
    sums = ErrorSums(2)
    sums.update(np.zeros((2, 2, 1)), np.array([[[1.0], [2.0]], [[3.0], [-4.0]]]))
    r = sums.result()
    assert r["mse"] == pytest.approx((1 + 4 + 9 + 16) / 4) and r["mae"] == pytest.approx(10 / 4)
    assert r["mse_by_step"] == pytest.approx([5.0, 10.0])


def test_seasonal_naive_beats_last_value_on_a_daily_series():
    s = daily_series()
    z = s.standardized()
    naive = score_series(lambda o: seasonal_naive(z, o, 12, 24), s, "test", 24, 12)
    last = score_series(lambda o: last_value(z, o, 12), s, "test", 24, 12)
    assert naive["mse"] < 0.1 < last["mse"] and naive["windows"] == last["windows"]


def test_dlinear_decomposition_and_shapes():
    m = DLinear(DLinearConfig(lookback=24, horizon=6, kernel=5))
    w = torch.randn(3, 24, 2)
    rest, trend = m.decompose(w)
    assert torch.allclose(rest + trend, w)
    assert torch.allclose(trend[:, 10], w[:, 8:13].mean(1), atol=1e-6)
    assert torch.allclose(trend[:, 0], (3 * w[:, 0] + w[:, 1] + w[:, 2]) / 5, atol=1e-6)
    assert m(w).shape == (3, 6, 2)


def test_streaming_forecasts_equal_whole_series_forward():
    """Chunked ingestion (history in one call, resumed) gives the forecasts of one forward pass."""
    s = daily_series(200)
    torch.manual_seed(0)
    model = SeriesModel(
        SeriesModelConfig(BackboneConfig(d_model=8, n_layers=1, n_heads=2), 2, horizon=6, time_features=4)
    ).eval()
    model.set_normalization(torch.from_numpy(s.mean), torch.from_numpy(s.std))
    origins = s.forecast_origins("test", 24, 6)
    got = dict()
    for o, pred in streaming_forecasts(model, s, origins, 6, chunk=37):
        got.update(zip(o.tolist(), pred, strict=True))
    with torch.no_grad():
        full = model(torch.from_numpy(s.values)[None], torch.from_numpy(calendar_features(s.times))[None]).mean[0]
    assert sorted(got) == origins.tolist()
    worst = max(np.abs(got[o] - full[o - 1].numpy()).max() for o in origins)
    assert worst < 1e-5
    streamed = score_streaming(model, s, "test", 24, 6)
    restricted = score_series(model_window_predictor(model, s, 24, 6), s, "test", 24, 6)
    assert streamed["windows"] == restricted["windows"] == len(origins)


def test_calendar_features_hour_and_weekday():
    monday_6am = 4 * 86_400 + 6 * 3600.0  # 1970-01-05 was a Monday
    f = calendar_features(np.array([monday_6am]))[0]
    assert f[0] == pytest.approx(1.0) and f[1] == pytest.approx(0.0, abs=1e-6)
    assert f[2] == pytest.approx(np.sin(2 * np.pi * 0.25 / 7), abs=1e-6)


def test_early_accuracy_by_fraction():
    # Sequence 0 (length 10) is right from step 3 on; sequence 1 (length 4) only at its last step.
    lg0 = np.tile([1.0, 0.0], (10, 1))
    lg0[3:] = [0.0, 1.0]
    lg1 = np.tile([0.0, 1.0], (4, 1))
    lg1[3] = [1.0, 0.0]
    acc = early_accuracy([lg0, lg1], np.array([1, 0]), (0.1, 0.3, 0.4, 0.75, 1.0))
    assert acc.by_fraction == {0.1: 0.0, 0.3: 0.0, 0.4: 0.5, 0.75: 0.5, 1.0: 1.0}
    assert acc.final == 1.0
