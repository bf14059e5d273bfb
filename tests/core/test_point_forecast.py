"""Adversarial heads: the served point forecast stays within the data's bound, whatever the head says.

A component with a negligible weight and the largest location and spread the heads allow barely
moves the likelihood, yet its mean ``exp(mu + sigma^2 / 2)`` can be astronomically large. The served
point forecast (``E[tau | tau <= U]``, ``U = gap_max``) must stay in ``(0, U]``, in the reference
(``EventModel.forecast``) and the fused path alike, and the served quantiles on the data's grid.
"""

from __future__ import annotations

import math

import pytest
import torch
from generated import GAP_MAX, RESOLUTION, adversarial_model

from aaren_core.tasks.event.fused import FusedEventModel
from aaren_core.tasks.event.heads import MAX_TIME_LOC, LogNormalMixture

LEVELS = (0.1, 0.5, 0.9)


def features(seed: int, rows: int = 64) -> torch.Tensor:
    return torch.randn(rows, 8, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("seed", range(40))
def test_adversarial_heads_keep_the_point_forecast_within_the_data_bound(seed):
    model = adversarial_model(seed)
    y = features(seed)
    with torch.inference_mode():
        ref = model.forecast(y, LEVELS)
        fused = FusedEventModel.from_model(model).forecast(y, LEVELS)
    for point in (ref.time_mean, fused[0]):
        assert point.dtype == torch.float64
        assert torch.isfinite(point).all() and (point > 0).all() and (point <= GAP_MAX).all()
    torch.testing.assert_close(fused[0], ref.time_mean, rtol=1e-4, atol=1e-9 * GAP_MAX)
    for q in (ref.time_quantiles, fused[1]):
        assert torch.isfinite(q).all() and (q >= 0).all()
        steps = q.double() / RESOLUTION
        assert (steps - steps.round()).abs().max() < 1e-3  # on the recorded grid
    # (Reference and fused quantiles are compared on ordinary heads in test_fused.py: on spikes this
    # narrow the reference's coarser float32 search is itself off by more than a grid step.)


def test_the_adversarial_heads_do_explode_the_plain_mean():
    """The family above is adversarial: on most seeds the untruncated mean passes the bound tenfold."""
    exploded = 0
    for seed in range(40):
        with torch.inference_mode():
            plain = adversarial_model(seed).heads(features(seed)).time.mean()
        exploded += float(plain.max()) > 10 * GAP_MAX
    assert exploded >= 20


def test_a_negligible_far_component_explodes_the_mean_but_not_the_point_forecast():
    """The issue's failure by hand: weight 1e-9 at mu = 30, sigma = 5 (mean about e^42.5)."""
    dist = LogNormalMixture(
        logits=torch.tensor([[0.0, math.log(1e-9)]], dtype=torch.float64),
        loc=torch.tensor([[1.0, 30.0]], dtype=torch.float64),
        log_scale=torch.tensor([[math.log(0.5), math.log(5.0)]], dtype=torch.float64),
    )
    assert float(dist.mean()) > 1e9
    point = float(dist.truncated_mean(GAP_MAX))
    assert point == pytest.approx(math.exp(1 + 0.125), rel=1e-3)  # the main component's mean


def test_every_component_past_the_bound_gives_the_bound():
    dist = LogNormalMixture(torch.zeros(1, 2), torch.full((1, 2), 50.0), torch.zeros(1, 2))
    # log tau given log tau <= log U is then about log U minus an exponential of rate |z| / sigma = 43.8:
    # E[tau | tau <= U] is about U (1 - 1 / (1 + 43.8)).
    point = float(dist.truncated_mean(GAP_MAX))
    assert point <= GAP_MAX and point == pytest.approx(GAP_MAX * (1 - 1 / (1 + 50 - math.log(GAP_MAX))), rel=2e-3)


def test_an_old_checkpoint_without_gap_max_is_bounded_by_its_log_gap_scale():
    model = adversarial_model(0, gap_max=0.0, resolution=0.0)
    bound = model.heads.gap_bound()
    assert bound == pytest.approx(
        math.exp(float(model.heads.log_dt_mean) + MAX_TIME_LOC * float(model.heads.log_dt_std))
    )
    with torch.inference_mode():
        ref = model.forecast(features(0), LEVELS)
    assert (ref.time_mean <= bound).all()


def test_the_truncated_mean_equals_the_mean_without_mass_past_the_bound():
    torch.manual_seed(0)
    dist = LogNormalMixture(torch.randn(50, 3), torch.randn(50, 3) * 0.3, torch.full((50, 3), -1.0))
    torch.testing.assert_close(dist.truncated_mean(1e6), dist.mean(), rtol=1e-6, atol=0)  # float32 inputs


def test_the_recorded_gap_distribution_matches_a_simulation():
    """P(G <= n w) for G = w floor((u + tau) / w), u ~ U(0, w): the closed form against 200k draws."""
    g = torch.Generator().manual_seed(0)
    base = LogNormalMixture(
        torch.tensor([[0.3, -0.2]], dtype=torch.float64),
        torch.tensor([[-0.5, 1.0]], dtype=torch.float64),
        torch.tensor([[-1.0, -0.3]], dtype=torch.float64),
    )
    n, w = 200_000, 0.7
    draws = LogNormalMixture(*(t.expand(n, 2) for t in (base.logits, base.loc, base.log_scale))).sample(g)
    recorded = w * torch.floor((draws + torch.rand(n, generator=g, dtype=torch.float64) * w) / w)
    grid = torch.arange(0, 8, dtype=torch.float64) * w
    empirical = (recorded.unsqueeze(-1) <= grid + 1e-9).double().mean(0)
    torch.testing.assert_close(base.discrete_cdf(grid.unsqueeze(0), w)[0], empirical, atol=4e-3, rtol=0)
    q = base.discrete_quantiles(torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64), w)[0]
    for level, value in zip((0.1, 0.5, 0.9), q.tolist(), strict=True):
        assert float((recorded < value - 1e-9).double().mean()) <= level + 4e-3
        assert float((recorded <= value + 1e-9).double().mean()) >= level - 4e-3
