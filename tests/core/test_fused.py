"""The fused serving path equals the module-by-module reference: steps, final states, forecasts."""

from __future__ import annotations

import pytest
import torch

from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.event.fused import CPU_SCHEDULE, FusedEventModel, SearchConstants, mixture_quantiles
from aaren_core.tasks.event.heads import LogNormalMixture
from aaren_core.tasks.event.model import EventModel, EventModelConfig

LEVELS = (0.01, 0.1, 0.5, 0.9, 0.99)


def model_of(kind="aaren", d_model=16, n_heads=4, value_width=2, num_marks=5, seed=0):
    torch.manual_seed(seed)
    cfg = EventModelConfig(
        backbone=BackboneConfig(kind=kind, d_model=d_model, n_layers=2, n_heads=n_heads),
        num_marks=num_marks,
        value_width=value_width,
        n_components=3,
    )
    model = EventModel(cfg).eval()
    value_mean, value_std = torch.tensor([3.0, -1.0][:value_width]), torch.tensor([2.0, 0.5][:value_width])
    model.set_normalization(1.0, 0.8, value_mean, value_std)
    return model


def rel_err(got, want):
    if want.numel() == 0:
        return 0.0
    return ((got.double() - want.double()).abs() / want.double().abs().clamp_min(1)).max().item()


def random_events(b, v, marks, seed):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.rand(b, generator=g) * 5,
        torch.randint(0, marks, (b,), generator=g),
        torch.randn(b, v, generator=g) * 2,
    )


@pytest.mark.parametrize("batch", [1, 3, 17, 64])
@pytest.mark.parametrize(("n_heads", "value_width"), [(4, 2), (2, 0), (1, 2)])
def test_fused_steps_equal_model_steps(batch, n_heads, value_width):
    model = model_of(n_heads=n_heads, value_width=value_width)
    fused = FusedEventModel.from_model(model)
    state = model.init_state(batch)
    tensors = tuple(state.tensors().values())
    with torch.inference_mode():
        for t in range(13):
            dt, marks, values = random_events(batch, value_width, 5, seed=t)
            if t == 0:
                dt = torch.zeros(batch)
            y, state = model.step(dt, marks, values, state)
            y_fused, *tensors = fused.step(dt, marks, values, *tensors)
            assert rel_err(y_fused, y) < 1e-5
        for got, (name, want) in zip(tensors, state.tensors().items(), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype, name
            assert rel_err(got, want) < 1e-5, name
        ref = model.forecast(y, LEVELS, top_k=5)
        got = fused.forecast(y, LEVELS)
    names = ("time_mean", "time_quantiles", "top_marks", "top_probs", "value_mean", "value_std")
    for name, g in zip(names, got, strict=True):
        want = getattr(ref, name)
        assert g.shape == want.shape and g.dtype == want.dtype, name
        if name != "top_marks":
            assert rel_err(g, want) < 1e-5, name
    assert torch.equal(got[2], ref.top_marks)  # the same softmax and topk


@pytest.mark.parametrize("rows", [2, 40, 300])  # each of CPU_SCHEDULE's searches
def test_fused_forecast_equals_model_forecast_at_every_search_schedule(rows):
    model = model_of()
    y = torch.randn(rows, 16, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        ref, got = model.forecast(y, LEVELS, top_k=5), FusedEventModel.from_model(model).forecast(y, LEVELS)
    assert rel_err(got[0], ref.time_mean) < 1e-5 and rel_err(got[1], ref.time_quantiles) < 1e-5
    assert rel_err(got[3], ref.top_probs) < 1e-6


def test_fused_step_leaves_its_inputs_alone():
    model = model_of()
    fused = FusedEventModel.from_model(model)
    with torch.inference_mode():
        _, state = model.step(*random_events(4, 2, 5, seed=1), model.init_state(4))
        before = [t.clone() for t in state.tensors().values()]
        fused.step(*random_events(4, 2, 5, seed=2), *state.tensors().values())
    assert all(torch.equal(a, b) for a, b in zip(before, state.tensors().values(), strict=True))


def test_fused_forecast_for_a_backbone_without_fused_step():
    model = model_of(kind="gru")
    fused = FusedEventModel.from_model(model)
    assert not fused.has_step
    with pytest.raises(ValueError, match="no fused step"):
        fused.step(*random_events(2, 2, 5, 0), *[torch.zeros(2)] * 4)
    y = torch.randn(7, 16)
    with torch.inference_mode():
        ref, got = model.forecast(y, LEVELS, top_k=2), fused.forecast(y, LEVELS, top_k=2)
    assert rel_err(got[0], ref.time_mean) < 1e-5 and rel_err(got[1], ref.time_quantiles) < 1e-5
    assert torch.equal(got[2], ref.top_marks) and got[3].shape == (7, 2)


def test_fused_weights_are_a_snapshot():
    model = model_of()
    fused = FusedEventModel.from_model(model)
    y = torch.randn(3, 16)
    with torch.no_grad():
        before = fused.forecast(y, LEVELS)[0].clone()
        model.heads.time.bias.add_(1.0)
        assert torch.equal(fused.forecast(y, LEVELS)[0], before)
        assert rel_err(FusedEventModel.from_model(model).forecast(y, LEVELS)[0], model.forecast(y).time_mean) < 1e-5


def bisection_quantiles(mix: LogNormalMixture, levels, iters=200):
    """Float64 reference: plain bisection on the mixture CDF from a bracket no component escapes."""
    logits, loc, log_scale = (t.double() for t in (mix.logits, mix.loc, mix.log_scale))
    scale = torch.exp(log_scale)
    p = torch.tensor(levels, dtype=torch.float64)
    lo = (loc - 40 * scale).amin(-1, keepdim=True).expand(-1, len(levels))
    hi = (loc + 40 * scale).amax(-1, keepdim=True).expand(-1, len(levels))
    weights = torch.softmax(logits, -1).unsqueeze(1)
    for _ in range(iters):
        mid = (lo + hi) / 2
        below = (weights * torch.special.ndtr((mid.unsqueeze(-1) - loc.unsqueeze(1)) / scale.unsqueeze(1))).sum(-1) < p
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    return torch.exp((lo + hi) / 2)


def random_mixture(n, k, seed, min_log_scale):
    g = torch.Generator().manual_seed(seed)
    return LogNormalMixture(
        logits=torch.randn(n, k, generator=g) * 2,
        loc=torch.randn(n, k, generator=g) * 2,
        log_scale=torch.rand(n, k, generator=g) * (0.5 - min_log_scale) + min_log_scale,
    )


SCHEDULES = [schedule for _, schedule in CPU_SCHEDULE]


def fast_quantiles(mix: LogNormalMixture, levels, dtype=torch.float32, schedule=(3, 16)):
    mix = LogNormalMixture(*(t.to(dtype) for t in (mix.logits, mix.loc, mix.log_scale)))
    constants = SearchConstants.make(levels, dtype, stages=schedule[0], grid=schedule[1])
    return mixture_quantiles(torch.softmax(mix.logits, -1), mix.loc, torch.exp(-mix.log_scale), constants)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("k", "seed"), [(1, 0), (3, 1), (8, 2)])
def test_mixture_quantiles_against_float64_bisection(k, seed, schedule):
    """Spreads sigma in [e^-1.5, e^0.5] (trained models: about e^-1 to e^0.5). Float32: 1e-7 to 1e-6
    relative typically; at worst a few 1e-5 where the level falls where the CDF is flat (float32's
    CDF then fixes the root no better; LogNormalMixture.quantiles, the old search, measured alike),
    and on some CPUs 2e-4 (one quantile of 20,000, level 0.01, on a Xeon whose float32 exp and erf
    round differently). Float64 shows the search itself is exact to about 1e-9 there."""
    mix = random_mixture(4000, k, seed, min_log_scale=-1.5)
    want = bisection_quantiles(mix, LEVELS)
    err32 = ((fast_quantiles(mix, LEVELS, schedule=schedule).double() - want) / want).abs()
    err64 = ((fast_quantiles(mix, LEVELS, torch.float64, schedule) - want) / want).abs()
    assert err32.max() < 5e-4 and err32.median() < 5e-7, (err32.max(), err32.median())
    assert err64.max() < 1e-9, err64.max()
    assert (fast_quantiles(mix, LEVELS, schedule=schedule).diff(dim=-1) >= 0).all()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_mixture_quantiles_error_is_bounded_for_narrow_components(schedule):
    """Components down to sigma = e^-7 (the heads' floor): the grid bounds the error by its last cell,
    whatever Newton does inside it; no worse than LogNormalMixture.quantiles, the old search."""
    mix = random_mixture(4000, 8, 3, min_log_scale=-7.0)
    want = bisection_quantiles(mix, LEVELS)
    err = ((fast_quantiles(mix, LEVELS, schedule=schedule).double() - want) / want).abs()
    old = ((mix.quantiles(torch.tensor(LEVELS)).double() - want) / want).abs()
    assert err.max() <= old.max() and err.median() < 1e-6, (err.max(), old.max(), err.median())


def test_search_constants_refuse_bad_levels():
    with pytest.raises(ValueError, match="levels in"):
        SearchConstants.make((0.5, 1.0), torch.float32)


@pytest.mark.parametrize("resolution", [1.0, 1 / 60])
def test_fused_forecast_equals_model_forecast_on_the_recorded_grid(resolution):
    """With a time resolution both paths serve the recorded gap's quantiles (float64, on the grid) and
    the mean truncated at gap_max: the same numbers, the quantiles up to one grid step where the two
    float32 searches straddle a cell boundary (none did here)."""
    torch.manual_seed(0)
    cfg = EventModelConfig(
        backbone=BackboneConfig(kind="aaren", d_model=16, n_layers=2, n_heads=4),
        num_marks=5,
        value_width=2,
        n_components=3,
        gap_max=40.0,
        time_resolution=resolution,
    )
    model = EventModel(cfg).eval()
    model.set_normalization(1.0, 0.8, torch.tensor([3.0, -1.0]), torch.tensor([2.0, 0.5]))
    y = torch.randn(300, 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref, got = model.forecast(y, LEVELS, top_k=5), FusedEventModel.from_model(model).forecast(y, LEVELS)
    assert got[1].dtype == ref.time_quantiles.dtype == torch.float64
    steps = ref.time_quantiles / resolution
    assert (steps - steps.round()).abs().max() < 1e-6
    assert torch.equal(got[1], ref.time_quantiles)
    assert rel_err(got[0], ref.time_mean) < 1e-5 and (got[0] <= 40.0).all()
