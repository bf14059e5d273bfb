"""The vectorized normal CDF and density (aaren_core.tasks.event.special) against mpmath at 40 digits and torch.

``phi_many`` replaced libm's scalar ``erf``, ``erfc`` and ``exp`` in the gap forecast: these hold it to the errors
its docstring states, far into both tails, at the boundaries between its cases, for every count of arguments
(the vector loop's remainder included), and refit its Chebyshev coefficients from their definition (and
check the powers it evaluates against them).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

from aaren_core.tasks.event import special
from aaren_core.tasks.event.special import exp_rows, phi_many

mpmath.mp.dps = 40


def _phi(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    phi, density = np.full(x.size + 3, -7.0), np.full(x.size + 3, -7.0)
    phi_many(np.ascontiguousarray(x, np.float64), phi, density, x.size)
    assert (phi[x.size :] == -7.0).all() and (density[x.size :] == -7.0).all()  # nothing past n written
    return phi[: x.size], density[: x.size]


def _arguments() -> np.ndarray:
    rng = np.random.default_rng(7)
    sqrt2 = math.sqrt(2.0)
    edges = [1.0, -1.0, special.ERFCX_C * sqrt2, special.ERFCX_Z_MAX * sqrt2, 0.0]  # where the cases meet
    near = [e + d for e in edges for d in (-1e-12, 0.0, 1e-12)]
    return np.concatenate(
        [
            np.linspace(-40.0, 40.0, 2001),
            -np.logspace(-8.0, 7.0, 300),
            np.logspace(-8.0, 2.0, 100),
            rng.normal(0.0, 4.0, 1000),
            near,
        ]
    )


def test_phi_and_density_match_mpmath_and_torch() -> None:
    x = _arguments()
    phi, density = _phi(x)
    want = np.array([float(mpmath.ncdf(mpmath.mpf(v))) for v in x])
    want_density = np.array([float(mpmath.exp(-(mpmath.mpf(v) ** 2) / 2)) for v in x])
    assert np.abs(phi - want).max() <= 2.0**-53
    normal = want > 1e-300  # below, float64 subnormals: absolute errors of 1e-316
    left = (x < -1.0) & normal
    assert (np.abs(phi[left] - want[left]) / want[left]).max() < 1e-15
    assert np.abs(phi[~normal] - want[~normal]).max() < 1e-310
    dense = want_density > 1e-300
    assert (np.abs(density[dense] - want_density[dense]) / want_density[dense]).max() < 4e-16
    assert np.abs(density[~dense] - want_density[~dense]).max() < 1e-310
    # torch's float64 ndtr, which the fused path and the heads use: (1 + erf(x / sqrt 2)) / 2
    assert np.abs(phi - torch.special.ndtr(torch.from_numpy(x)).numpy()).max() <= 2.0**-53
    assert ((phi >= 0.0) & (phi <= 1.0)).all() and (np.diff(phi[:2001]) >= 0.0).all()  # a CDF on the grid


@pytest.mark.parametrize("n", [0, 1, 3, 7, 8, 9, 17, 40])
def test_every_count_of_arguments_is_served_alike(n: int) -> None:
    """The vectorized loop and its remainder give each argument the same value as a call of its own."""
    x = np.random.default_rng(n).normal(-2.0, 5.0, n)
    phi, density = _phi(x)
    for k in range(n):
        one_phi, one_density = _phi(x[k : k + 1])
        assert phi[k] == one_phi[0] and density[k] == one_density[0], k


def test_nan_stays_nan_and_the_infinities_give_the_limits() -> None:
    phi, density = _phi(np.array([math.nan, -math.inf, math.inf]))
    assert math.isnan(phi[0]) and math.isnan(density[0])
    assert phi[1] == 0.0 and phi[2] == 1.0 and density[1] == 0.0 and density[2] == 0.0


def test_the_chebyshev_coefficients_are_the_fit_their_comment_describes() -> None:
    """Refit ``h(z) = erfc(z) exp(z^2) (1 + z / c)`` in ``y``: interpolation at 92 Chebyshev nodes, 40 digits."""
    c, n = special.ERFCX_C, 92
    s_high = (special.ERFCX_Z_MAX - c) / (special.ERFCX_Z_MAX + c)
    a, b = (s_high + 1) / 2, (s_high - 1) / 2
    nodes = [mpmath.cos(mpmath.pi * (k + 0.5) / n) for k in range(n)]
    values = []
    for y in nodes:
        s = a * y + b
        z = c * (1 + s) / (1 - s)
        values.append(mpmath.erfc(z) * mpmath.exp(z * z) * (1 + z / c))
    coefficients = [
        mpmath.fsum(values[k] * mpmath.cos(mpmath.pi * j * (k + 0.5) / n) for k in range(n)) * 2 / n
        for j in range(len(special._ERFCX_CHEB))
    ]
    coefficients[0] /= 2
    assert np.array_equal(np.array([float(v) for v in coefficients]), np.array(special._ERFCX_CHEB))


def test_the_power_coefficients_are_the_chebyshev_series_rewritten() -> None:
    """``_ERFCX_POWERS`` (what ``phi_many`` evaluates) is the same polynomial as ``_ERFCX_CHEB``: at 1,001 points
    of ``[-1, 1]`` the two, summed at 40 digits, agree within the powers' own rounding (half an ulp each), and
    their absolute values sum to about the Chebyshev coefficients' (no cancellation for Horner's rule to amplify)."""
    powers, cheb = special._ERFCX_POWERS, special._ERFCX_CHEB
    assert len(powers) == len(cheb)
    worst = 0.0
    for y in np.linspace(-1.0, 1.0, 1001):
        y_mp = mpmath.mpf(y)
        by_powers = mpmath.fsum(mpmath.mpf(a) * y_mp**j for j, a in enumerate(powers))
        by_chebyshev = mpmath.fsum(mpmath.mpf(c) * mpmath.chebyt(k, y_mp) for k, c in enumerate(cheb))
        worst = max(worst, float(abs(by_powers - by_chebyshev)))
    rounding = sum(float(np.spacing(abs(a))) / 2 for a in powers)
    assert worst <= rounding, (worst, rounding)
    assert sum(abs(a) for a in powers) < 1.01 * sum(abs(c) for c in cheb)


def exp_of(x: np.ndarray) -> np.ndarray:
    """``special.exp_rows`` of ``x`` (row 0 of a table into row 2), checking that it leaves row 1 and the
    column past ``x`` alone."""
    table = np.full((3, x.size + 1), -7.0)
    table[0, :-1] = x
    exp_rows(table, 0, 2, x.size)
    assert table[2, -1] == -7.0 and (table[1] == -7.0).all() and np.array_equal(table[0, :-1], x, equal_nan=True)
    return table[2, :-1]


def test_exp_matches_mpmath_to_an_ulp_and_keeps_its_limits() -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [np.linspace(-745.0, 709.7, 3001), rng.normal(0.0, 3.0, 1000), [0.0, -0.0, 1e-300, -1e-300, 700.0, -708.0]]
    )
    out = exp_of(x)
    want = np.array([float(mpmath.exp(mpmath.mpf(v))) for v in x])
    normal = want > 1e-300
    assert (np.abs(out[normal] - want[normal]) / want[normal]).max() <= 2.0**-52
    assert np.abs(out[~normal] - want[~normal]).max() < 1e-310
    got = exp_of(np.array([710.0, 1e5, math.inf, -746.0, -1e5, -math.inf, math.nan]))
    assert (got[:3] == math.inf).all() and (got[3:6] == 0.0).all() and math.isnan(got[6])


def test_exp32_is_the_correctly_rounded_float32_exp_through_its_limits() -> None:
    """``exp32_many`` (the kernel's softmax and recurrence exps) in place on float32: the float32 nearest to the exact
    ``e^x`` (mpmath) at arguments across its whole range, the float32 subnormals and the edges of overflow included,
    for counts that leave a remainder past the vector loop, and nothing past ``n`` written."""
    rng = np.random.default_rng(7)
    x = np.concatenate(
        [
            np.linspace(-110.0, 90.0, 2001),
            rng.normal(0.0, 4.0, 1500),
            rng.uniform(-104.0, -87.0, 300),  # results subnormal in float32
            [0.0, -0.0, 88.72, 88.73, -103.97, -103.98, 1e-8, -1e-8],
        ]
    ).astype(np.float32)
    for n in (x.size, 1, 3, 13):
        buf = np.append(x[:n], np.float32(-7.0))
        special.exp32_many(buf, n, special.EXP32_CONSTANTS)
        assert buf[n] == np.float32(-7.0)
        with np.errstate(over="ignore"):
            want = np.array([float(mpmath.exp(mpmath.mpf(float(v)))) for v in x[:n]]).astype(np.float32)
        assert np.array_equal(buf[:n], want), np.flatnonzero(buf[:n] != want)[:5]
    limits = np.array([90.0, 1e30, math.inf, -110.0, -1e30, -math.inf, math.nan], np.float32)
    special.exp32_many(limits, limits.size, special.EXP32_CONSTANTS)
    assert (limits[:3] == math.inf).all() and (limits[3:6] == 0.0).all() and math.isnan(limits[6])


def test_exp_row_pairs_is_exp_rows_of_each_row() -> None:
    """``exp_row_pairs`` writes each target row as ``exp_rows`` would, bit for bit, and no other entry."""
    rng = np.random.default_rng(11)
    for n in (1, 5, 8, 13):
        table = np.full((5, n + 1), -7.0)
        table[0, :n] = rng.normal(0.0, 30.0, n)
        table[3, :n] = np.append([math.inf, -math.inf, math.nan], rng.normal(0.0, 3.0, n))[:n]
        want = table.copy()
        exp_rows(want, 0, 1, n)
        exp_rows(want, 3, 4, n)
        special.exp_row_pairs(table, 0, 1, 3, 4, n)
        assert np.array_equal(table, want, equal_nan=True), n
