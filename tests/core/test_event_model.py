"""Forecast heads and the event model: exact densities, closed forms, parallel == step."""

from __future__ import annotations

import pytest
import torch

from aaren_core.checkpoint import load_checkpoint, save_checkpoint
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.event.heads import LogNormalMixture
from aaren_core.tasks.event.model import EventModel, EventModelConfig


def mixture(batch=(3,), k=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return LogNormalMixture(
        logits=torch.randn(*batch, k, generator=g, dtype=dtype),
        loc=torch.randn(*batch, k, generator=g, dtype=dtype),
        log_scale=torch.randn(*batch, k, generator=g, dtype=dtype) * 0.3 - 0.3,
    )


def test_log_density_integrates_to_one():
    mix = mixture()
    # Integrate over log tau (tau = e^z, d tau = e^z dz) on a fine grid wide enough for every component.
    z = torch.linspace(-15, 15, 200_001, dtype=torch.float64)
    dens = torch.exp(mix.log_prob(torch.exp(z).unsqueeze(-1).expand(-1, 3)) + z.unsqueeze(-1))  # [Z, 3]
    total = torch.trapezoid(dens, z, dim=0)
    assert torch.allclose(total, torch.ones(3, dtype=torch.float64), atol=1e-6)


def test_cdf_is_the_integral_of_the_density():
    mix = mixture(batch=(2,), seed=1)
    z = torch.linspace(-15, 0.7, 100_001, dtype=torch.float64)
    dens = torch.exp(mix.log_prob(torch.exp(z).unsqueeze(-1).expand(-1, 2)) + z.unsqueeze(-1))
    integral = torch.trapezoid(dens, z, dim=0)
    assert torch.allclose(integral, mix.cdf(torch.full((2,), float(torch.exp(z[-1])), dtype=torch.float64)), atol=1e-6)


def test_sampled_mean_matches_closed_form():
    mix = mixture(batch=(2,), seed=2)
    g = torch.Generator().manual_seed(0)
    many = LogNormalMixture(*(t.unsqueeze(0).expand(400_000, -1, -1) for t in (mix.logits, mix.loc, mix.log_scale)))
    samples = many.sample(g)  # [400000, 2]
    closed = mix.mean()
    stderr = samples.std(0) / 400_000**0.5
    assert ((samples.mean(0) - closed).abs() < 5 * stderr).all(), (samples.mean(0), closed)


def test_quantiles_invert_the_cdf():
    mix = mixture(batch=(5,), seed=3)
    levels = torch.tensor([0.01, 0.1, 0.5, 0.9, 0.99], dtype=torch.float64)
    q = mix.quantiles(levels)  # [5, 5]
    assert (q.diff(dim=-1) > 0).all()
    back = torch.stack([mix.cdf(q[:, j]) for j in range(5)], dim=-1)
    assert torch.allclose(back, levels.expand(5, -1), atol=1e-9)


def tiny_model(value_width=2, kind="aaren", seed=0):
    torch.manual_seed(seed)
    cfg = EventModelConfig(
        backbone=BackboneConfig(kind=kind, d_model=16, n_layers=2, n_heads=4), num_marks=5, value_width=value_width
    )
    model = EventModel(cfg).eval()
    model.set_normalization(1.0, 0.8, torch.tensor([3.0, -1.0][:value_width]), torch.tensor([2.0, 0.5][:value_width]))
    return model


def events(b=3, n=30, v=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = torch.rand(b, n, generator=g) * 5 + 0.01
    dt[:, 0] = 0
    marks = torch.randint(0, 5, (b, n), generator=g)
    values = torch.randn(b, n, v, generator=g) * 2 + 3
    return dt, marks, values


@pytest.mark.parametrize("kind", ["aaren", "transformer", "gru"])
def test_parallel_and_step_forecasts_agree(kind):
    model = tiny_model(kind=kind)
    dt, marks, values = events()
    with torch.no_grad():
        y = model(dt, marks, values)
        state = model.init_state(3)
        ys = []
        for t in range(dt.shape[1]):
            y_t, state = model.step(dt[:, t], marks[:, t], values[:, t], state)
            ys.append(y_t)
        f_par = model.forecast(y.reshape(-1, 16))
        f_step = model.forecast(torch.stack(ys, dim=1).reshape(-1, 16))
    for name in ("time_mean", "time_quantiles", "top_probs", "value_mean", "value_std"):
        a, b = getattr(f_par, name), getattr(f_step, name)
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), name
    # Top marks agree wherever the ranking is not a near tie (neighbouring probabilities 1e-5 apart).
    gaps = (f_par.top_probs[:, :-1] - f_par.top_probs[:, 1:]).abs().min(dim=-1).values
    decided = gaps > 1e-5
    assert decided.float().mean() > 0.9
    assert torch.equal(f_par.top_marks[decided], f_step.top_marks[decided])


def test_nll_is_finite_and_trains():
    model = tiny_model().train()
    dt, marks, values = events(b=8, n=40, seed=1)
    mask = torch.ones_like(marks, dtype=torch.bool)
    mask[0, 30:] = False
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        terms = model.nll(dt, marks, values, mask)
        loss = terms.mean()["total"]
        assert torch.isfinite(loss)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert model.nll(dt, marks, values, mask).mean()["total"].item() < first - 0.5


def test_nll_refuses_zero_gaps():
    model = tiny_model()
    dt, marks, values = events()
    dt[1, 5] = 0.0
    with pytest.raises(ValueError, match="dequantize"):
        model.nll(dt, marks, values, torch.ones_like(marks, dtype=torch.bool))


def test_forecast_summaries_are_consistent():
    model = tiny_model()
    dt, marks, values = events()
    with torch.no_grad():
        f = model.forecast(model(dt, marks, values)[:, -1], quantiles=(0.1, 0.5, 0.9), top_k=3)
    assert f.time_quantiles.shape == (3, 3) and (f.time_quantiles.diff(dim=-1) > 0).all()
    assert f.top_marks.shape == (3, 3) and (f.top_probs.diff(dim=-1) <= 0).all()
    assert (f.top_probs.sum(-1) <= 1 + 1e-6).all() and (f.time_mean > 0).all()
    assert f.value_mean.shape == (3, 2) and (f.value_std > 0).all()


def test_sample_paths_shapes_and_determinism():
    model = tiny_model()
    dt, marks, values = events(b=1)
    with torch.no_grad():
        y, state = model.prefill(dt, marks, values)
        a = model.sample_paths(y[:, -1], state, horizon=4, num_samples=6, generator=torch.Generator().manual_seed(1))
        b = model.sample_paths(y[:, -1], state, horizon=4, num_samples=6, generator=torch.Generator().manual_seed(1))
    assert a[0].shape == (6, 4) and a[1].shape == (6, 4) and a[2].shape == (6, 4, 2)
    assert (a[0] > 0).all() and ((a[1] >= 0) & (a[1] < 5)).all()
    assert all(torch.equal(x, z) for x, z in zip(a, b, strict=True))


def test_event_model_checkpoint_round_trip(tmp_path):
    model = tiny_model()
    version = save_checkpoint(tmp_path, model, metadata={"schema": {"mark_names": list("abcde")}})
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.kind == "event_model" and ckpt.model_version == version
    dt, marks, values = events()
    with torch.no_grad():
        assert torch.equal(ckpt.model(dt, marks, values), model(dt, marks, values))
    assert torch.equal(ckpt.model.heads.value_std, model.heads.value_std)


def test_model_without_values():
    model = tiny_model(value_width=0)
    dt, marks, _ = events(v=0)
    with torch.no_grad():
        f = model.forecast(model(dt, marks, torch.zeros(3, 30, 0))[:, -1])
    assert f.value_mean.shape == (3, 0)
