"""The serving step and forecast of an Aaren ``EventModel`` as one compiled CPU call (numba).

``FusedEventModel.step`` then ``.forecast`` compute the serving numbers in a few dozen torch ops
per layer, and at batch 1 almost all of their time is per-op overhead. ``EventKernel`` computes the
same numbers row by row in one ``numba.njit`` loop over the batch, from the fused weights packed
once into one flat float32 array (and a float64 one and a layout, so that a call passes three arrays;
``_pack``, ``_unpack``), matrices stored transposed, ``[in, out]`` (so that each
matrix-vector product is a sum of rows, ``y += x_i W^T[i]``, which vectorizes without
reassociating any sum; ``fastmath`` stays off but for contraction in the matrix products and
``erf32``, each ``y + x_i w`` one fused multiply-add, rounded once, as torch's own products round,
and reassociation in the layer norm's float64 moments; the layers take four rows of the batch and
four of ``W^T`` per pass, the same sums in the same order):

- the step, per row, as ``FusedEventModel.step`` (float32): ``x = (E + b)[mark] + W [phi(dt), v]``;
  per layer ``s, v = W_sv LN1(x) + b_sv``, with time decay ``m <- m - rate dt``, ``m' = max(m, s)``,
  ``u' = u exp(m - m') + exp(s - m')``, ``w' = w exp(m - m') + v exp(s - m')``,
  ``x += W_o (w' / u') + b_o``, ``x += W_2 GELU(W_1 LN2(x) + b_1) + b_2``; ``y = LN(x)``; the ``exp``s of every
  row's heads in one vectorized pass (``special.exp32_many``: float32, correctly rounded), as the softmax's below;
- the heads as ``FusedEventModel.forecast``: ``out = shift + clamp(W_h y + b_h, low, high) * scale`` (``W_h y``
  by the kernel's own loops, the same for a row in any batch: ``_OWN_LOOPS``); mark probabilities ``softmax``
  and the ``k`` largest (each mark's place counted from an integer key), value means and stds (float32);
- the gap summaries in float64 from the float32 mixture ``(logits, mu, log sigma)`` cast to float64,
  as ``heads.truncated_mean`` and ``heads.discrete_quantiles`` compute them (the same expressions;
  ``log_ndtr`` as torch evaluates it, below ``-20`` by its asymptotic series, where ``erfc`` nears
  underflow, for the log-space sums only); ``Phi`` and the normal density at all the arguments a step
  needs at once (``special.phi_many``: branch-free float64, vectorized across the arguments; within 2^-53
  of torch's ``(1 + erf) / 2``, relatively exact in the left tail);
- the continuous gap quantiles by a safeguarded Halley search in float64 (not the fused's float32
  grid): ``F(z) = sum_k pi_k Phi((z - mu_k) / sigma_k) = p`` on ``z = log tau``, bracketed by the
  components' own quantiles ``min_k / max_k (mu_k + sigma_k Phi^-1(p))``, started from their
  weighted mean, Halley steps kept inside the bracket (a bisection step where one would leave it;
  ``_search``, all levels side by side). The result is the root of the float32 parameters' mixture to about 1e-9,
  within the fused search's own error of its (float32) result. On a grid it only places
  ``heads.discrete_quantiles``' candidates: the search stops at a step under half a cell, and the
  cell is then found from the CDF at the grid points, which the candidates' integrated CDFs give
  (``_discrete_quantiles``; the full search where that is more than ``_WALK`` cells off).

Levels compare as float32 numbers cast to float64, as both torch paths hold them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from aaren.jit import compiled
from aaren_core.tasks.event import row_parts
from aaren_core.tasks.event.blas import MKL, NO_BLAS, find_sgemm, sgemm
from aaren_core.tasks.event.borrow import borrowed
from aaren_core.tasks.event.fused import FusedEventModel, FusedLayer
from aaren_core.tasks.event.special import (
    EXP32_CONSTANTS,
    chebyshev_powers,
    exp32_many,
    exp_row_pairs,
    exp_rows,
    float_as_bits,
    phi_many,
)

__all__ = ["EventKernel", "KernelOutputs", "erf32", "gap_summaries", "log_ndtr"]

#: numba's ``fastmath`` for every compiled function, read at import so that a benchmark can compare (with a
#: ``NUMBA_CACHE_DIR`` of its own: the cache does not key on it): ``AAREN_KERNEL_FASTMATH=1``: all of LLVM's
#: fast-math flags, ``=reassoc``: reassociation and contraction only. Off by default: every sum in the order
#: written (but the layer norm's, ``_SUMS_FASTMATH``; products contracted in ``_AFFINE_FASTMATH``'s functions),
#: and ``inf`` kept meaningful (a fresh state's ``m`` is ``-inf``; fast-math's ``ninf`` assumes none).
FASTMATH: bool | set[str] = {"1": True, "reassoc": {"reassoc", "contract"}}.get(
    os.environ.get("AAREN_KERNEL_FASTMATH", ""), False
)


def _jit(fn: Callable[..., Any], fastmath: bool | set[str] = FASTMATH) -> Any:
    """``aaren.jit.compiled`` (numba's disk cache) with the module's ``fastmath`` and numpy's error model."""
    return compiled(fn, fastmath=fastmath, error_model="numpy")


def _jit_inline(fn: Callable[..., Any]) -> Any:
    """``_jit``, inlined into each caller by numba (its own flags are the caller's: use it only for functions
    called from ``_jit`` ones). For the gap summaries' steps: as calls, each passed its tuples of scratch arrays
    by value (some 40 words and their reference counts a call), which took about a quarter of a row's
    forecast."""
    return compiled(fn, fastmath=FASTMATH, error_model="numpy", inline="always")


#: the matrix products' ``fastmath``: contraction (``a + x w`` as one fused multiply-add, rounded once, as
#: torch's matrix products round) on top of the module's flags; nothing there meets an ``inf``
_AFFINE_FASTMATH: bool | set[str] = FASTMATH if FASTMATH is True else {"contract", *(FASTMATH or ())}


def _jit_affine(fn: Callable[..., Any]) -> Any:
    """``_jit`` with ``_AFFINE_FASTMATH``: for the matrix products only."""
    return _jit(fn, _AFFINE_FASTMATH)


#: the layer norm's ``fastmath``: reassociation too (its float64 sums of float32 terms vectorize; any order is
#: exact to 1e-16, far below the float32 result's rounding), no flag that assumes ``inf`` or NaN away
_SUMS_FASTMATH: bool | set[str] = FASTMATH if FASTMATH is True else {"reassoc", "contract", *(FASTMATH or ())}


def _jit_sums(fn: Callable[..., Any]) -> Any:
    """``_jit`` with ``_SUMS_FASTMATH``: for the layer norm only."""
    return _jit(fn, _SUMS_FASTMATH)


_F32_HALF = np.float32(0.5)
_F32_ONE = np.float32(1.0)
_F32_ZERO = np.float32(0.0)
_F32_SQRT1_2 = np.float32(math.sqrt(0.5))
_SQRT1_2 = math.sqrt(0.5)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2 * math.pi)
#: below this ``log_ndtr`` uses its asymptotic series (13 terms: the first omitted is under 1e-17 there)
_LOG_NDTR_ASYMPTOTIC = -20.0
_SEARCH_MAX = 200
#: the quantile search stops after a Halley step below ``_STEP_TOL (1 + |z|)`` (its error then is of the order
#: of the step's cube over ``sigma^2``: under 1e-11 for ``sigma >= e^-7``), or where the bracket has shrunk below
#: ``_BRACKET_TOL (1 + |z|)``
_STEP_TOL = 1e-6
_BRACKET_TOL = 1e-13
#: on a grid the search stops at a step under this part of a cell (``_search``; the cell is then found
#: from the CDF at the grid points, ``_discrete_quantiles``)
_GRID_STEP = 0.5
#: cells ``_discrete_quantiles`` walks from the short search's quantile before the full search is run instead
_WALK = 2
#: sums of positive terms below this are taken in log space (``_truncated_mean``): a term that underflowed to 0
#: in the direct sum would weigh more than rounding there
_DIRECT_FLOOR = 1e-280
#: ``_discrete_quantiles`` skips the lowest candidate where ``F`` there is this far below the level
_DISCRETE_MARGIN = 1e-6


class KernelOutputs(NamedTuple):
    """One ``EventKernel.step_forecast`` call's results over ``B`` rows (new arrays).

    ``y [B, d]`` float32 features; the new state ``m, u [B, L, H]``, ``w [B, L, H, Dh]`` float32 and
    ``n_events [B]`` int64; ``forecast``: the six arrays ``FusedEventModel.forecast`` returns, in its order:
    the gap's mean ``[B]`` float64 and quantiles ``[B, Q]`` (float32, or float64 multiples of the time
    resolution where the model has one), the top marks ``[B, k]`` int64 and their probabilities ``[B, k]``
    float32 (descending), value means and stds ``[B, V]`` float32; ``finite [B]``: whether row ``b``'s new
    state and features are finite all, None where every row's are.
    """

    y: np.ndarray
    m: np.ndarray
    u: np.ndarray
    w: np.ndarray
    n_events: np.ndarray
    forecast: tuple[np.ndarray, ...]
    finite: np.ndarray | None


# --- float64 special functions, as torch evaluates them -------------------------------------------


@_jit
def log_ndtr(x: float) -> float:
    """``log Phi(x)`` (float64) as ``torch.special.log_ndtr``: ``log1p(-erfc(x / sqrt 2) / 2)`` from -1 up,
    ``log(erfc(-x / sqrt 2) / 2)`` down to -20, below that
    ``-x^2 / 2 - log(-x) - log(2 pi) / 2 + log(sum_n (-1)^n (2n - 1)!! / x^(2n))``."""
    if x < _LOG_NDTR_ASYMPTOTIC:
        x2 = x * x
        total = 1.0
        term = 1.0
        for n in range(1, 14):
            term *= -(2.0 * n - 1.0) / x2
            total += term
        return -0.5 * x2 - math.log(-x) - _HALF_LOG_2PI + math.log(total)
    if x < -1.0:
        return math.log(math.erfc(-x * _SQRT1_2) / 2.0)
    return math.log1p(-math.erfc(x * _SQRT1_2) / 2.0)


@_jit
def _logsumexp(a: np.ndarray, n: int) -> float:
    """``log sum_k exp(a_k)`` over ``a[:n]`` as ``torch.logsumexp`` (-inf when every term is -inf)."""
    top = -math.inf
    for k in range(n):
        if a[k] > top:
            top = a[k]
    if top == -math.inf:
        return -math.inf
    if top == math.inf:
        return math.inf
    total = 0.0
    for k in range(n):
        total += math.exp(a[k] - top)
    return math.log(total) + top


#: unsigned 0, 1, 2 for the running indices of the gap summaries' loops: numba adds no wrap-around of negative
#: indices to an unsigned index (a select an access, which kept those loops scalar)
_U0, _U1, _U2 = np.uint64(0), np.uint64(1), np.uint64(2)


#: rows of the per-row mixture table ``mix [MIX_ROWS, K]`` (float64), filled once per row by ``_mixture``
_LOG_WEIGHTS, _LOC, _LOG_SCALE, _WEIGHTS, _SCALE, _INV_SCALE, _LPE_CONST, _PARTIAL, _TERMS = range(9)
MIX_ROWS = 9


@_jit_inline
def _mixture(heads: np.ndarray, row: int, mix: np.ndarray) -> None:
    """Fill ``mix`` from the float32 ``logits, mu, log sigma [K]`` of ``heads[row]`` (its first ``3 K`` columns, in
    that order; indexed, not sliced: see ``_layer_norms``) cast to float64: ``log pi = log_softmax(logits)``
    (``(x - max) - log sum exp(x - max)``, as torch), ``pi = exp(x - max) / sum exp(x - max)`` (the same to an
    ulp or two, from the sum's terms), ``sigma``, ``1 / sigma`` and ``log pi_k + mu_k + sigma_k^2 / 2``, the part
    of ``log_partial_expectation``'s terms that ``x`` leaves alone, and its ``exp`` (``_integrated_cdf``'s terms;
    inf where it overflows); the ``exp``s in ``special.exp_row_pairs`` and ``special.exp_rows``."""
    k_all = mix.shape[1]
    top = -math.inf
    for k in range(k_all):
        top = max(top, np.float64(heads[row, k]))
    for k in range(k_all):
        mix[_TERMS, k] = np.float64(heads[row, k]) - top
        mix[_LOG_SCALE, k] = np.float64(heads[row, 2 * k_all + k])
    exp_row_pairs(mix, _TERMS, _WEIGHTS, _LOG_SCALE, _SCALE, k_all)
    total = 0.0
    for k in range(k_all):
        total += mix[_WEIGHTS, k]
    log_total = math.log(total)
    for k in range(k_all):
        lw = mix[_TERMS, k] - log_total
        mu = np.float64(heads[row, k_all + k])
        scale = mix[_SCALE, k]
        mix[_LOG_WEIGHTS, k] = lw
        mix[_LOC, k] = mu
        mix[_WEIGHTS, k] = mix[_WEIGHTS, k] / total
        mix[_INV_SCALE, k] = 1.0 / scale
        mix[_LPE_CONST, k] = (lw + mu) + 0.5 * (scale * scale)
    exp_rows(mix, _LPE_CONST, _PARTIAL, k_all)


@_jit
def _log_partial_expectation(mix: np.ndarray, log_x: float) -> float:
    """``heads.log_partial_expectation`` at one ``log x``:
    ``log sum_k pi_k e^(mu_k + sigma_k^2 / 2) Phi(z_k - sigma_k)``, ``z_k = (log x - mu_k) / sigma_k``."""
    terms = mix[_TERMS]
    for k in range(terms.shape[0]):
        scale = mix[_SCALE, k]
        terms[k] = mix[_LPE_CONST, k] + log_ndtr((log_x - mix[_LOC, k]) / scale - scale)
    return _logsumexp(terms, terms.shape[0])


#: ``work``, the scratch of the gap summaries (``_gap_work``): the arguments of ``Phi``, its values and the density
#: there (``[N]`` each, ``N = 4 K Q``), the levels' search
#: state ``[6, Q]`` (bracket low and high, ``z``, whether still searching, the candidates' ``m0``, the answer)
#: and the points whose ``(I, F)`` are wanted ``[3, 2 Q + 1]`` (``x``, ``I(x)``, ``F(x)``)
_LO, _HI, _Z, _SEARCHING, _M0, _ANSWER = range(6)
_X, _INTEGRAL, _CDF = range(3)


@_jit
def _gap_work(k_all: int, n_levels: int) -> tuple:
    """``work`` for mixtures of ``k_all`` components and ``n_levels`` levels."""
    q = max(n_levels, 1)
    n = 4 * k_all * q
    return (
        np.empty(n, np.float64),
        np.empty(n, np.float64),
        np.empty(n, np.float64),
        np.empty((6, q), np.float64),
        np.empty((3, 2 * q + 1), np.float64),  # and one slot for _integrated_cdf
    )


@_jit_inline
def _lent(work: tuple) -> tuple:
    """``_gap_work``'s arrays, each ``borrowed`` (``aaren_core.tasks.event.borrow``)."""
    return borrowed(work[0]), borrowed(work[1]), borrowed(work[2]), borrowed(work[3]), borrowed(work[4])


@_jit_inline
def _truncated_mean(mix: np.ndarray, args: np.ndarray, phi: np.ndarray, density: np.ndarray, bound: float) -> float:
    """``heads.truncated_mean``: ``E[tau | tau <= U] = sum_k pi_k e^(mu_k + sigma_k^2/2) Phi(z_k - sigma_k) /
    sum_k pi_k Phi(z_k)``, ``z_k = (log U - mu_k) / sigma_k``, at most ``U``: both sums directly (the ``2 K``
    values of ``Phi`` in one ``phi_many``), unless one comes within ``_DIRECT_FLOOR`` of underflow (or a factor
    overflows), then in log space as the heads."""
    k_all = mix.shape[1]
    log_u = math.log(bound)
    for k in range(k_all):
        scale = mix[_SCALE, k]
        args[2 * k] = (log_u - mix[_LOC, k]) / scale - scale
        args[2 * k + 1] = (log_u - mix[_LOC, k]) * mix[_INV_SCALE, k]
    phi_many(args, phi, density, 2 * k_all)
    num = 0.0
    den = 0.0
    for k in range(k_all):
        num += mix[_PARTIAL, k] * phi[2 * k]
        den += mix[_WEIGHTS, k] * phi[2 * k + 1]
    if _DIRECT_FLOOR < num < math.inf and den > _DIRECT_FLOOR:
        out = num / den
        return bound if out > bound else out
    log_num = _log_partial_expectation(mix, log_u)
    terms = mix[_TERMS]
    for k in range(terms.shape[0]):
        terms[k] = mix[_LOG_WEIGHTS, k] + log_ndtr((log_u - mix[_LOC, k]) * mix[_INV_SCALE, k])
    out = math.exp(log_num - _logsumexp(terms, terms.shape[0]))
    return bound if out > bound else out


@_jit_inline
def _integrated_cdfs(
    mix: np.ndarray,
    args: np.ndarray,
    phi: np.ndarray,
    density: np.ndarray,
    points: np.ndarray,
    first: int,
    n_points: int,
) -> None:
    """``heads.integrated_cdf`` at the points ``points[_X, first : first + n_points]``: ``(I(x), F(x))`` into
    ``[_INTEGRAL]`` and ``[_CDF]``, ``I(x) = x F(x) - E[tau; tau <= x]``, both 0 for ``x <= 0``; the ``2 K`` values
    of ``Phi`` of every distinct positive point in one ``phi_many``. A point equal to an earlier one is copied from
    it and one at or below 0 is not evaluated: the levels' candidates often share a cell, and a low level's
    often starts at 0 (the bundled model, 256 flights-like rows: 4.7 distinct positive points of 6 a row, 14 %
    of the row's ``Phi`` values spared).

    ``E[tau; tau <= x] = sum_k pi_k e^(mu_k + sigma_k^2 / 2) Phi(z_k - sigma_k)`` summed directly (one ``Phi`` a
    term where the heads' log-space sum takes a ``log_ndtr`` and an ``exp``), unless a term's factor overflows:
    a sum of positive terms either way, the same to rounding."""
    k_all = mix.shape[1]
    n = _U0
    for p in range(first, first + n_points):
        x = points[_X, p]
        # where this point's values come from, until they are written there: p itself, an earlier point, or -1
        source = -1.0
        if x > 0.0:
            source = float(p)
            for q in range(first, p):
                if points[_X, q] == x:
                    source = float(q)
                    break
        points[_INTEGRAL, p] = source
        if source != p:
            continue
        log_x = math.log(x)
        for k in range(k_all):
            args[n] = (log_x - mix[_LOC, k]) * mix[_INV_SCALE, k]
            scale = mix[_SCALE, k]
            args[n + _U1] = (log_x - mix[_LOC, k]) / scale - scale
            n += _U2
    phi_many(args, phi, density, np.int64(n))
    n = _U0
    for p in range(first, first + n_points):
        x = points[_X, p]
        source = int(points[_INTEGRAL, p])
        if source < 0:
            points[_INTEGRAL, p] = 0.0
            points[_CDF, p] = 0.0
            continue
        if source != p:  # an earlier point's, written already
            points[_INTEGRAL, p] = points[_INTEGRAL, source]
            points[_CDF, p] = points[_CDF, source]
            continue
        cdf = 0.0
        partial = 0.0
        for k in range(k_all):
            cdf += mix[_WEIGHTS, k] * phi[n]
            partial += mix[_PARTIAL, k] * phi[n + _U1]
            n += _U2
        if not partial < math.inf:
            partial = math.exp(_log_partial_expectation(mix, math.log(x)))
        out = x * cdf - partial
        points[_INTEGRAL, p] = 0.0 if out < 0.0 else out
        points[_CDF, p] = cdf


@_jit_inline
def _integrated_cdf(
    mix: np.ndarray, args: np.ndarray, phi: np.ndarray, density: np.ndarray, points: np.ndarray, x: float
) -> tuple[float, float]:
    """``(I(x), F(x))`` at one point (``_integrated_cdfs``; in ``points``' last slot)."""
    last = points.shape[1] - 1
    points[_X, last] = x
    _integrated_cdfs(mix, args, phi, density, points, last, 1)
    return points[_INTEGRAL, last], points[_CDF, last]


@_jit_inline
def _discrete_quantiles(
    mix: np.ndarray,
    args: np.ndarray,
    phi: np.ndarray,
    density: np.ndarray,
    state: np.ndarray,
    points: np.ndarray,
    levels: np.ndarray,
    resolution: float,
    walk: int,
) -> None:
    """``heads.discrete_quantiles`` for each level ``p`` of ``levels [Q]`` into ``state[_ANSWER, :Q]``: the
    first of ``m0 - 1, m0, m0 + 1`` (``m0 = max(ceil(q / w), 1)``) with ``H(m w) = (I(m w) - I((m - 1) w)) / w
    >= p`` (the last always), served as ``max(m - 1, 0) w``.

    The quantile ``q`` (``state[_ANSWER, :Q]`` on entry) may be a few cells off (``_search`` on a grid stops early):
    ``m0`` moves up while ``F(m0 w) < p`` and down while ``F((m0 - 1) w) >= p``, one ``I`` a cell (``F`` comes with
    ``I``), to the ``m0`` of the exact ``q``; -1 where that takes more than ``walk`` cells. ``H(x) <= F(x)``, and
    ``F((m0 - 1) w) < p`` then: ``I((m0 - 2) w)`` is needed only where ``F((m0 - 1) w)`` comes within
    ``_DISCRETE_MARGIN`` of ``p`` (far above rounding: then ``H((m0 - 1) w)`` is computed and compared as
    ``heads.discrete_quantiles`` does). The first two points of every level are evaluated together."""
    w = resolution
    n_levels = levels.shape[0]
    for q in range(n_levels):
        m0 = max(np.ceil(state[_ANSWER, q] / w), 1.0)
        state[_M0, q] = m0
        points[_X, 2 * q] = (m0 - 1.0) * w
        points[_X, 2 * q + 1] = m0 * w
    _integrated_cdfs(mix, args, phi, density, points, 0, 2 * n_levels)
    for q in range(n_levels):
        level = levels[q]
        m0 = state[_M0, q]
        mid, cdf_mid = points[_INTEGRAL, 2 * q], points[_CDF, 2 * q]
        high, cdf_high = points[_INTEGRAL, 2 * q + 1], points[_CDF, 2 * q + 1]
        answer = 0.0
        for moves in range(walk + 1):
            up = cdf_high < level
            if not up and not (m0 > 1.0 and cdf_mid >= level):
                break
            if moves == walk:
                answer = -1.0
                break
            if up:
                m0 += 1.0
                mid, cdf_mid = high, cdf_high
                high, cdf_high = _integrated_cdf(mix, args, phi, density, points, m0 * w)
            else:
                m0 -= 1.0
                high, cdf_high = mid, cdf_mid
                mid, cdf_mid = _integrated_cdf(mix, args, phi, density, points, (m0 - 1.0) * w)
        if answer < 0.0:
            state[_ANSWER, q] = answer
            continue
        if cdf_mid >= level - _DISCRETE_MARGIN:
            low = _integrated_cdf(mix, args, phi, density, points, (m0 - 2.0) * w)[0]
            if (mid - low) / w >= level:
                state[_ANSWER, q] = max(m0 - 2.0, 0.0) * w
                continue
        state[_ANSWER, q] = (m0 - 1.0) * w if (high - mid) / w >= level else m0 * w


@_jit_inline
def _search(
    mix: np.ndarray,
    args: np.ndarray,
    phi: np.ndarray,
    density: np.ndarray,
    state: np.ndarray,
    levels: np.ndarray,
    ppf: np.ndarray,
    resolution: float,
) -> None:
    """``z = log tau`` with ``F(z) = sum_k pi_k Phi((z - mu_k) / sigma_k) = p`` for each level ``p`` of ``levels [Q]``
    (``mix`` from ``_mixture``, ``ppf = Phi^-1(p)``) into ``state[_Z, :Q]``, the levels searched side by side
    (one ``phi_many`` a step over every level still searching): Halley's method (``z -= 2 g F' / (2 F'^2 - g F'')``,
    ``g = F(z) - p``; cubic where Newton is quadratic, for the ``F''`` that the density's terms give at no cost;
    Newton's step where ``|g F''| > F'^2``, whose Halley step could be small far from the root) in the bracket
    ``[min_k, max_k] (mu_k + sigma_k Phi^-1(p))``, where every component is below, resp. above, its own level,
    so ``F(lo) <= p <= F(hi)``. A step that would leave the bracket bisects it instead (``_STEP_TOL``).

    For a quantile of the gap recorded at ``resolution`` ``w > 0`` (``_discrete_quantiles`` places its candidates
    from ``e^z`` and walks to the right cell where that is off) the search stops at a step under
    ``_GRID_STEP min(1, w e^-z)``, half a cell in ``z`` (the error then is of the order of its cube), where that is
    the looser: 1.5 evaluations a level where 3 reach ``_STEP_TOL`` (the bundled model)."""
    k_all = mix.shape[1]
    n_levels = levels.shape[0]
    searching = 0
    for q in range(n_levels):
        lo = math.inf
        hi = -math.inf
        z = 0.0  # the components' quantiles averaged with their weights: inside the bracket, often near the root
        for k in range(k_all):
            zk = mix[_LOC, k] + mix[_SCALE, k] * ppf[q]
            lo = min(lo, zk)
            hi = max(hi, zk)
            z += mix[_WEIGHTS, k] * zk
        state[_LO, q] = lo
        state[_HI, q] = hi
        state[_Z, q] = z if hi > lo else lo
        state[_SEARCHING, q] = 1.0 if hi > lo else 0.0
        searching += hi > lo
    for _ in range(_SEARCH_MAX):
        if searching == 0:
            return
        n = _U0
        for q in range(n_levels):
            if state[_SEARCHING, q] > 0.0:
                for k in range(k_all):
                    args[n] = (state[_Z, q] - mix[_LOC, k]) * mix[_INV_SCALE, k]
                    n += _U1
        phi_many(args, phi, density, np.int64(n))
        n = _U0
        for q in range(n_levels):
            if not state[_SEARCHING, q] > 0.0:
                continue
            cdf = 0.0
            pdf = 0.0  # F' sqrt(2 pi)
            slope = 0.0  # F'' sqrt(2 pi)
            for k in range(k_all):
                inv = mix[_INV_SCALE, k]
                cdf += mix[_WEIGHTS, k] * phi[n]
                term = mix[_WEIGHTS, k] * inv * density[n]
                pdf += term
                slope -= term * args[n] * inv
                n += _U1
            z = state[_Z, q]
            gap = cdf - levels[q]
            if gap == 0.0:
                state[_SEARCHING, q] = 0.0
                searching -= 1
                continue
            if gap < 0.0:
                state[_LO, q] = z
            else:
                state[_HI, q] = z
            lo, hi = state[_LO, q], state[_HI, q]
            f1 = pdf * _INV_SQRT_2PI
            curve = gap * slope * _INV_SQRT_2PI  # g F''
            # Halley's step where it is within 2/3 .. 2 of Newton's (so small only near the root), else Newton's:
            # where F' is small for its curvature (between narrow components), often a bisection then
            nxt = z - 2.0 * gap * f1 / (2.0 * f1 * f1 - curve) if abs(curve) <= f1 * f1 else z - gap / f1
            done = False
            if lo < nxt < hi:
                step = abs(nxt - z)
                on_grid = resolution > 0.0 and step <= _GRID_STEP
                done = step <= _STEP_TOL * (1.0 + abs(z)) or (
                    on_grid and step <= _GRID_STEP * resolution * math.exp(-nxt)
                )
            else:
                nxt = 0.5 * (lo + hi)
                done = hi - lo <= _BRACKET_TOL * (1.0 + abs(z))
            state[_Z, q] = nxt
            if done:
                state[_SEARCHING, q] = 0.0
                searching -= 1


# --- float32 building blocks --------------------------------------------------------------------

#: ``erf(x) / x`` on ``x^2 in [0, 3.9^2]`` as a Chebyshev series in ``u = 2 x^2 / 3.9^2 - 1`` (degree 16; the
#: least-squares fit at 400 Chebyshev nodes of ``math.erf``), rewritten as powers of ``u`` (``_ERF_POWERS``:
#: ``special.chebyshev_powers``, rounded to float32) and evaluated by Horner's rule in float32, each step one fused
#: multiply-add (``_AFFINE_FASTMATH``); ``erf(x)`` rounds to 1 in float32 past 3.9. The power form is as well
#: conditioned as the series here: its coefficients' signs alternate, so their absolute values sum to its value at
#: ``u = -1`` (``2 / sqrt(pi)``) and no step cancels. Horner's 16 steps are half the 31 operations of Clenshaw's
#: recurrence, which evaluated the series before (the GELU loop runs 2x faster).
#: Its error is at most 1.5e-7 on [-6, 6] (Clenshaw's was 2.2e-7; torch's own vectorized float32 ``erf``, which
#: its GELU uses, is an approximation with error up to 1.5e-7); being branch-free and call-free, the GELU loop
#: vectorizes.
_ERF_CLAMP = np.float32(3.9)
_ERF_U_SCALE = np.float32(2.0 / (3.9 * 3.9))
_ERF_CHEB = (
    0.49416765570640564, -0.3464145064353943, 0.15958236157894135, -0.07387416064739227,
    0.03267776221036911, -0.013576622121036053, 0.005263722967356443, -0.0019008819945156574,
    0.0006396954413503408, -0.00020093601779080927, 5.9044752561021596e-05, -1.6271855201921426e-05,
    4.216555680613965e-06, -1.0300764188286848e-06, 2.378285302029326e-07, -5.202186059705127e-08,
    1.0805005778991017e-08,
)  # fmt: skip
_ERF_POWERS = tuple(np.float32(a) for a in chebyshev_powers(_ERF_CHEB))

#: the GELU loop's constants as one float32 array that the kernel's callers pass in at run time (``EventKernel``'s
#: packed ``step``, its last item): ``_ERF_POWERS`` [0:17], then the clamp, ``u``'s scale, 1, 1/2 and sqrt(1/2).
#: Written into the code as constants instead, they were too many for AVX2's 16 vector registers, and LLVM
#: re-made each one inside the vectorized loop (numba's large code model: an address load and a broadcast a
#: constant a vector, 75 instructions a vector of 8 values). Read from an argument, LLVM loads them once before the
#: loop, and the ones that do not fit in a register are read from the stack by the multiply-adds themselves (33
#: instructions a vector; the same values, bit for bit)
_GELU_CLAMP, _GELU_U_SCALE, _GELU_ONE, _GELU_HALF, _GELU_SQRT1_2 = range(17, 22)
GELU_CONSTANTS = np.array([*_ERF_POWERS, _ERF_CLAMP, _ERF_U_SCALE, _F32_ONE, _F32_HALF, _F32_SQRT1_2], np.float32)


@_jit_affine
def _erf32_of(x: np.float32, c: np.ndarray) -> np.float32:
    """``erf(x)`` in float32 (see ``_ERF_POWERS``) with the constants ``c = GELU_CONSTANTS`` passed in:
    ``clip(x_c P(u), -1, 1)``, ``x_c = clip(x, -3.9, 3.9)``, ``P(u) = sum_k a_k u^k`` by Horner's rule, written out."""
    one = c[_GELU_ONE]
    xc = min(max(x, -c[_GELU_CLAMP]), c[_GELU_CLAMP])
    u = xc * xc * c[_GELU_U_SCALE] - one
    p = c[16] * u + c[15]
    p = p * u + c[14]
    p = p * u + c[13]
    p = p * u + c[12]
    p = p * u + c[11]
    p = p * u + c[10]
    p = p * u + c[9]
    p = p * u + c[8]
    p = p * u + c[7]
    p = p * u + c[6]
    p = p * u + c[5]
    p = p * u + c[4]
    p = p * u + c[3]
    p = p * u + c[2]
    p = p * u + c[1]
    p = p * u + c[0]
    r = xc * p
    return min(max(r, -one), one)


@_jit_affine
def erf32(x: np.float32) -> np.float32:
    """``erf(x)`` in float32 (``_erf32_of``), for one value: the constants compiled in."""
    return _erf32_of(x, GELU_CONSTANTS)


@_jit_affine
def _gelu_rows(hidden: np.ndarray, n_rows: int, c: np.ndarray) -> None:
    """``h <- h Phi(h) = h (1 + erf(h / sqrt 2)) / 2`` in place over the first ``n_rows`` rows of ``hidden [., n]``
    (float32), the constants ``c = GELU_CONSTANTS`` passed in (see there); indexed, not sliced (``_layer_norms``)."""
    half, one, scale = c[_GELU_HALF], c[_GELU_ONE], c[_GELU_SQRT1_2]
    for r in range(n_rows):
        for j in range(hidden.shape[1]):
            a = hidden[r, j]
            hidden[r, j] = a * half * (one + _erf32_of(a * scale, c))


@_jit_affine
def _affine(x: np.ndarray, weight_t: np.ndarray, bias: np.ndarray, out: np.ndarray) -> None:
    """``out = W x + b`` for ``x [n]``, ``W^T [n, p]``, ``b [p]`` (float32):
    ``out_j = fma(x_1, W_j1, fma(x_0, W_j0, 0)) ... + b_j``, summed in the order of ``i``, four rows of ``W^T``
    per pass over ``out`` (the same sums as one row per pass, a quarter of the loads and stores of ``out``)."""
    n, p = weight_t.shape
    for j in range(p):
        out[j] = _F32_ZERO
    i = 0
    while i + 4 <= n:
        x0, x1, x2, x3 = x[i], x[i + 1], x[i + 2], x[i + 3]
        w0, w1, w2, w3 = weight_t[i], weight_t[i + 1], weight_t[i + 2], weight_t[i + 3]
        for j in range(p):
            out[j] = (((out[j] + x0 * w0[j]) + x1 * w1[j]) + x2 * w2[j]) + x3 * w3[j]
        i += 4
    while i < n:
        xi = x[i]
        wi = weight_t[i]
        for j in range(p):
            out[j] += xi * wi[j]
        i += 1
    for j in range(p):
        out[j] += bias[j]


#: the most rows of a batch the layers take at a time in ``_step_forecast_rows`` (their activations stay in cache:
#: 256 KiB for the bundled model's widest, ``hidden``). sgemm packs the layer's weights once a call: at 64 rows a chunk
#: that was 1,250 instructions a row of the bundled model under callgrind, at 256 about 300 (a 256-row batch: 52.0k
#: instructions a row against 52.9k, and no slower in wall time here: 4.22 against 4.35 us a row). A batch is cut
#: into nearly equal chunks of at most ``CHUNK`` rows, not ``CHUNK`` rows and the rest: a rest of 1-3 rows would go
#: through the kernel's loops (``_matrix``), and its rows' sums would differ from the BLAS's that the same rows get in
#: another cut (a batch of 514 rows in one call, or in parts of 257: ``row_parts``). Equal chunks of a batch of
#: ``BLOCK`` rows or more all have ``BLOCK`` or more, so every row takes the BLAS (``blas.rows_exact``: the same bits
#: whatever rows are beside it).
CHUNK = 256


#: ``_matrix``'s ``blas`` for the heads' matrix: the kernel's own loops, the same sums in the same order for a row
#: whatever rows are beside it (sgemm's tiles may group them otherwise), so that the forecast computed again from a
#: stored ``y`` (``forecast``, the unary ``Forecast``) is the one ``step_forecast`` served, bit for bit
_OWN_LOOPS = (0, NO_BLAS, 0)


#: rows per pass of the layers' matrices in ``_step_forecast_rows`` (each row of ``W^T`` loaded once for all)
BLOCK = 4


@_jit_affine
def _affine_rows(x: np.ndarray, weight_t: np.ndarray, bias: np.ndarray, out: np.ndarray, n_rows: int) -> None:
    """``out[r] = W x[r] + b`` for the first ``n_rows <= BLOCK`` rows of ``x [., n]``, ``out [BLOCK, p]`` (float32):
    the sums of ``_affine``, in the same order, four rows of ``x`` and four of ``W^T`` a pass where there are
    four rows (a sixteenth of the loads and stores of ``out`` that one row of each would take)."""
    if n_rows < BLOCK:
        for r in range(n_rows):
            _affine(x[r], weight_t, bias, out[r])
        return
    n, p = weight_t.shape
    o0, o1, o2, o3 = out[0], out[1], out[2], out[3]
    for j in range(p):
        o0[j] = _F32_ZERO
        o1[j] = _F32_ZERO
        o2[j] = _F32_ZERO
        o3[j] = _F32_ZERO
    i = 0
    while i + 4 <= n:
        w0, w1, w2, w3 = weight_t[i], weight_t[i + 1], weight_t[i + 2], weight_t[i + 3]
        a0, a1, a2, a3 = x[0, i], x[0, i + 1], x[0, i + 2], x[0, i + 3]
        b0, b1, b2, b3 = x[1, i], x[1, i + 1], x[1, i + 2], x[1, i + 3]
        c0, c1, c2, c3 = x[2, i], x[2, i + 1], x[2, i + 2], x[2, i + 3]
        d0, d1, d2, d3 = x[3, i], x[3, i + 1], x[3, i + 2], x[3, i + 3]
        for j in range(p):
            v0, v1, v2, v3 = w0[j], w1[j], w2[j], w3[j]
            o0[j] = (((o0[j] + a0 * v0) + a1 * v1) + a2 * v2) + a3 * v3
            o1[j] = (((o1[j] + b0 * v0) + b1 * v1) + b2 * v2) + b3 * v3
            o2[j] = (((o2[j] + c0 * v0) + c1 * v1) + c2 * v2) + c3 * v3
            o3[j] = (((o3[j] + d0 * v0) + d1 * v1) + d2 * v2) + d3 * v3
        i += 4
    while i < n:
        w0 = weight_t[i]
        a0, a1, a2, a3 = x[0, i], x[1, i], x[2, i], x[3, i]
        for j in range(p):
            v0 = w0[j]
            o0[j] += a0 * v0
            o1[j] += a1 * v0
            o2[j] += a2 * v0
            o3[j] += a3 * v0
        i += 1
    for j in range(p):
        o0[j] += bias[j]
        o1[j] += bias[j]
        o2[j] += bias[j]
        o3[j] += bias[j]


@_jit_sums
def _layer_norms(
    x: np.ndarray, n_rows: int, gamma: np.ndarray, beta: np.ndarray, eps: np.float32, out: np.ndarray, at: int
) -> None:
    """``out[at + r] = (x[r] - mean) / sqrt(var + eps) * gamma + beta`` for the first ``n_rows`` rows of ``x [., n]``
    (biased variance; moments summed in float64, in any order: ``_SUMS_FASTMATH``). The rows are indexed, not
    sliced: a slice a row would take a reference to its array and give it back (two atomic operations).
    A variance past float32's range makes the row NaN, as the float32 reference's does: an activation
    that large is a numeric overflow (the server refuses the event), not a normalized row."""
    n = x.shape[1]
    for r in range(n_rows):
        total = 0.0
        for i in range(n):
            total += x[r, i]
        mean = total / n
        total = 0.0
        for i in range(n):
            c = x[r, i] - mean
            total += c * c
        mean32 = np.float32(mean)
        var32 = np.float32(total / n)
        rstd = np.float32(1.0 / math.sqrt(var32 + eps)) if math.isfinite(var32) else np.float32(np.nan)
        for i in range(n):
            out[at + r, i] = (x[r, i] - mean32) * rstd * gamma[i] + beta[i]


@_jit
def _gap_row(
    b: int,
    heads: np.ndarray,
    row: int,
    levels: np.ndarray,
    ppf: np.ndarray,
    gap_bound: float,
    resolution: float,
    mix: np.ndarray,
    work: tuple,
    time_mean: np.ndarray,
    quantiles: np.ndarray,
) -> None:
    """Row ``b`` of the gap summaries from the float32 mixture ``(logits, loc, log_scale)`` ``[K]`` each in
    ``heads[row, :3 K]``, at ``levels [Q]``, their ``ppf = Phi^-1(levels)``, ``gap_bound`` and ``resolution``:
    ``time_mean[b]`` and ``quantiles[b]`` (float64; the continuous quantiles rounded to float32 values where
    ``resolution`` is 0). ``mix``: the ``[MIX_ROWS, K]`` table, ``work``: ``_gap_work``'s scratch, unpacked here
    once and passed on array by array (each unpacking takes a reference to every array and gives it back)."""
    args, phi, density, state, points = work
    n_levels = levels.shape[0]
    _mixture(heads, row, mix)
    time_mean[b] = _truncated_mean(mix, args, phi, density, gap_bound)
    _search(mix, args, phi, density, state, levels, ppf, resolution)
    if resolution == 0.0:
        for q in range(n_levels):
            quantiles[b, q] = np.float32(math.exp(state[_Z, q]))
        return
    for q in range(n_levels):
        state[_ANSWER, q] = math.exp(state[_Z, q])
    _discrete_quantiles(mix, args, phi, density, state, points, levels, resolution, _WALK)
    for q in range(n_levels):
        quantiles[b, q] = state[_ANSWER, q]
    for q in range(n_levels):
        if quantiles[b, q] < 0.0:
            # the short search's quantile is off by more than _WALK cells only where a narrow component misleads
            # it: the full search and walk for this level alone
            level, level_ppf = levels[q : q + 1], ppf[q : q + 1]
            _search(mix, args, phi, density, state, level, level_ppf, 0.0)
            state[_ANSWER, 0] = math.exp(state[_Z, 0])
            _discrete_quantiles(mix, args, phi, density, state, points, level, resolution, _SEARCH_MAX)
            quantiles[b, q] = state[_ANSWER, 0]


@_jit
def _gap_rows(mixtures: np.ndarray, spec: tuple) -> tuple[np.ndarray, np.ndarray]:
    """``_gap_row`` of every row of ``mixtures [B, 3 K]`` (``logits | loc | log_scale``, float32)."""
    levels, ppf, gap_bound, resolution = spec
    rows, k_all = mixtures.shape[0], mixtures.shape[1] // 3
    mix = np.empty((MIX_ROWS, k_all), np.float64)
    work = _gap_work(k_all, levels.shape[0])
    time_mean = np.empty(rows, np.float64)
    quantiles = np.empty((rows, levels.shape[0]), np.float64)
    mixtures_b, levels_b, ppf_b, mix_b = borrowed(mixtures), borrowed(levels), borrowed(ppf), borrowed(mix)
    work_b, time_mean_b, quantiles_b = _lent(work), borrowed(time_mean), borrowed(quantiles)
    for b in range(rows):
        _gap_row(b, mixtures_b, b, levels_b, ppf_b, gap_bound, resolution, mix_b, work_b, time_mean_b, quantiles_b)
    return time_mean, quantiles


def _level_arrays(levels: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The levels as float32 numbers in float64 (as both torch paths hold them) and ``Phi^-1`` of each."""
    if not levels or not all(0 < p < 1 for p in levels):
        raise ValueError(f"need levels in (0, 1); got {levels}")
    level32 = torch.tensor(levels, dtype=torch.float32).double()
    return np.ascontiguousarray(level32.numpy()), np.ascontiguousarray(torch.special.ndtri(level32).numpy())


def gap_summaries(
    logits: np.ndarray,
    loc: np.ndarray,
    log_scale: np.ndarray,
    levels: tuple[float, ...],
    gap_bound: float,
    resolution: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's gap summaries of float32 mixtures ``logits, mu, log sigma [B, K]`` (as the heads output them):
    ``E[tau | tau <= gap_bound] [B]`` and the quantiles at ``levels`` ``[B, Q]``, of the gap recorded at
    ``resolution`` (> 0) or of the continuous gap (0: float32 values), both float64."""
    level_arr, ppf = _level_arrays(levels)
    mixtures = np.concatenate([np.asarray(a, dtype=np.float32) for a in (logits, loc, log_scale)], axis=1)
    return _gap_rows(mixtures, (level_arr, ppf, float(gap_bound), float(resolution)))


@_jit
def _forecast_outputs(rows: int, top_k: int, head: tuple) -> tuple:
    """The outputs ``(time_mean, time_quantiles, top_marks, top_probs, value_mean, value_std)`` of ``rows``
    forecasts (uninitialized)."""
    levels, value_width = head[7], head[14]
    return (
        np.empty(rows, np.float64),
        np.empty((rows, levels.shape[0]), np.float64),
        np.empty((rows, top_k), np.int64),
        np.empty((rows, top_k), np.float32),
        np.empty((rows, value_width), np.float32),
        np.empty((rows, value_width), np.float32),
    )


@_jit
def _forecast_scratch(rows: int, head: tuple) -> tuple:
    """The scratch of a call over ``rows`` forecasts: ``(heads [min(rows, CHUNK), P], probs [M], keys [M] int64,
    mix [MIX_ROWS, K], work)`` (``work``: ``_gap_work``'s)."""
    head_b, levels, n_components, num_marks = head[1], head[7], head[12], head[13]
    return (
        np.empty((max(min(rows, CHUNK), 1), head_b.shape[0]), np.float32),
        np.empty(num_marks, np.float32),
        np.empty(num_marks, np.int64),
        np.empty((MIX_ROWS, n_components), np.float64),
        _gap_work(n_components, levels.shape[0]),
    )


@_jit
def _forecast_chunk(
    heads: np.ndarray, n_rows: int, first: int, top_k: int, head: tuple, outputs: tuple, scratch: tuple
) -> None:
    """The forecasts of rows ``first .. first + n_rows`` of ``outputs`` (``FusedEventModel.forecast``) from their
    head pre-activations ``heads[r] = W_h y + b_h [P]`` (overwritten), ``r < n_rows``; the tuples unpacked once.

    ``head``: ``EventKernel``'s packed head weights; ``outputs``, ``scratch`` from ``_forecast_outputs`` and
    ``_forecast_scratch``."""
    head_low, head_high, head_scale, head_shift, value_std = head[2:7]
    levels, ppf, exp_constants, gap_bound, resolution, k_all, m_all, v_all = head[7:]
    time_mean, quantiles, top_marks, top_probs, value_mean, value_stds = outputs
    exps, keys, mix, work = scratch[1:]
    # the arrays the rows' calls take, borrowed once (``borrow``): no atomic reference count a call and a row
    heads_b, levels_b, ppf_b, mix_b = borrowed(heads), borrowed(levels), borrowed(ppf), borrowed(mix)
    work_b, time_mean_b, quantiles_b = _lent(work), borrowed(time_mean), borrowed(quantiles)
    exps_b, constants_b = borrowed(exps), borrowed(exp_constants)
    for r in range(n_rows):
        b = first + r
        for j in range(heads.shape[1]):
            c = min(max(heads[r, j], head_low[j]), head_high[j])
            heads[r, j] = head_shift[j] + c * head_scale[j]
        # columns [logits | loc | log scale | value log std | marks | value mean]
        for j in range(v_all):
            value_stds[b, j] = np.exp(heads[r, 3 * k_all + j]) * value_std[j]
            value_mean[b, j] = heads[r, 3 * k_all + v_all + m_all + j]
        # mark probabilities: softmax (times the reciprocal of the sum, as torch), then the k largest
        marks_at = 3 * k_all + v_all
        top = heads[r, marks_at]
        for j in range(1, m_all):
            top = max(top, heads[r, marks_at + j])
        for j in range(m_all):
            exps[j] = heads[r, marks_at + j] - top
        exp32_many(exps_b, m_all, constants_b)
        total = _F32_ZERO
        for j in range(m_all):
            total += exps[j]
        inv = _F32_ONE / total
        # the k largest, descending, the lower mark first among equals: each mark's place counted, the marks before
        # it in that order, from one integer key a mark (the bits of p >= 0 order as p does; ties broken by the
        # low digits, a NaN, which only an overflowed row has, after every number): one comparison a pair, a loop
        # that vectorizes, where an insertion into the sorted top k took about 1,000 instructions a row (16 marks)
        for j in range(m_all):
            p = exps[j] * inv
            exps[j] = p
            tie = m_all - 1 - j
            keys[j] = (float_as_bits(np.float64(p)) >> 29) * m_all + tie if p == p else tie - m_all
        for j in range(m_all):
            key = keys[j]
            place = 0
            for i in range(m_all):
                place += keys[i] > key
            if place < top_k:
                top_probs[b, place] = exps[j]
                top_marks[b, place] = j
        _gap_row(b, heads_b, r, levels_b, ppf_b, gap_bound, resolution, mix_b, work_b, time_mean_b, quantiles_b)


@_jit
def _forecast_rows(y: np.ndarray, top_k: int, head: tuple) -> tuple:
    """The forecast of feature rows ``y [B, d]`` (C-contiguous; see ``_forecast_chunk``), ``CHUNK`` rows at a
    time."""
    outputs, scratch = _forecast_outputs(y.shape[0], top_k, head), _forecast_scratch(y.shape[0], head)
    heads = scratch[0]
    for first in range(0, y.shape[0], CHUNK):
        n_rows = min(CHUNK, y.shape[0] - first)
        _matrix(y[first:], head[0], head[1], heads, n_rows, _OWN_LOOPS)
        _forecast_chunk(heads, n_rows, first, top_k, head, outputs, scratch)
    return outputs


@_jit_affine
def _matrix(x: np.ndarray, weight_t: np.ndarray, bias: np.ndarray, out: np.ndarray, n_rows: int, blas: tuple) -> None:
    """``out[r] = W x[r] + b`` for the first ``n_rows`` rows of ``x [., n]`` into ``out [., p]`` (float32): by a
    BLAS ``sgemm`` where ``blas = (address, kind, threads)`` has one (``aaren_core.tasks.event.blas``: MKL's, inside
    torch, or numpy's OpenBLAS) and there are ``BLOCK`` rows or more (one fused multiply-add a term, as ``_affine``
    does, but the library may group a sum's terms otherwise, by its register tiles and the length of ``i``: the
    same within float32 rounding), else ``_affine_rows`` ``BLOCK`` rows at a time; the bias added last."""
    if blas[1] != NO_BLAS and n_rows >= BLOCK:
        for r in range(n_rows):  # the bias first: sgemm adds each finished sum to it (rows indexed: _layer_norms)
            for j in range(out.shape[1]):
                out[r, j] = bias[j]
        sgemm(blas, x[:n_rows], weight_t, out)
        return
    for first in range(0, n_rows, BLOCK):
        k = min(BLOCK, n_rows - first)
        _affine_rows(x[first : first + k], weight_t, bias, out[first : first + k], k)


@_jit
def _mark_infinite(values: np.ndarray, finite: np.ndarray) -> int:
    """``finite[b] = False`` where row ``b`` of ``values [B, n]`` holds an infinity or a NaN (the check an
    or-reduction over the row, with no branch in it, so that the loop vectorizes); how many rows it marked. The
    whole array is checked first, in one loop (its rows are short: 8 values a row of ``m``), and row by row only
    where that finds one."""
    flat = values.reshape(values.size)
    any_bad = False
    for i in range(flat.size):
        any_bad |= not np.isfinite(flat[i])
    if not any_bad:
        return 0
    marked = 0
    for b in range(values.shape[0]):
        bad = False
        for j in range(values.shape[1]):
            bad |= not np.isfinite(values[b, j])
        if bad:
            finite[b] = False
            marked += 1
    return marked


@_jit
def _step_outputs(rows: int, top_k: int, head: tuple, m: np.ndarray, w: np.ndarray) -> tuple:
    """The outputs of a ``_step_forecast_rows`` call over ``rows`` rows, uninitialized but ``finite`` (all True):
    ``(y [rows, d], m, u [rows, L, H], w [rows, L, H, Dh], n_events [rows], forecast outputs, finite [rows])``,
    the state's shapes those of ``m`` and ``w`` past their first dimension."""
    n_layers, n_heads, head_dim = w.shape[1], w.shape[2], w.shape[3]
    return (
        np.empty((rows, n_heads * head_dim), np.float32),
        np.empty((rows, m.shape[1], m.shape[2]), np.float32),
        np.empty((rows, m.shape[1], m.shape[2]), np.float32),
        np.empty((rows, n_layers, n_heads, head_dim), np.float32),
        np.empty(rows, np.int64),
        _forecast_outputs(rows, top_k, head),
        np.ones(rows, np.bool_),
    )


@_jit
def _step_forecast_rows(inputs: tuple, top_k: int, step: tuple, head: tuple, blas: tuple, out: tuple) -> int:
    """One event per row, then the forecast from its features (see the module docstring), written into ``out``
    (``_step_outputs``' arrays, as many rows as the inputs); how many rows it marked not finite in ``out``'s
    ``finite`` (a row whose new state or features overflowed: the server refuses it). ``inputs`` are
    ``EventKernel.step_forecast``'s arrays ``(dt, marks, values, m, u, w, n_events)``; ``step`` and ``head``:
    ``EventKernel``'s packed weights; ``blas``: ``(address, kind, threads)`` of a BLAS ``sgemm``
    (``blas.find_sgemm``). Rows go through the layers ``CHUNK`` at a time, each matrix over the chunk's rows
    (``_matrix``)."""
    dt, marks, values, m, u, w, n_events = inputs
    y, m_new, u_new, w_new, n_new, outputs, finite = out
    freqs, mark_table, embed_wt, norms, eps, rate, has_rate = step[:7]
    sv_wt, sv_b, out_wt, out_b, fc1_wt, fc1_b, fc2_wt, fc2_b, final_norm, final_eps, gelu_constants = step[7:]
    rows = dt.shape[0]
    n_layers, n_heads, head_dim = w.shape[1], w.shape[2], w.shape[3]
    d = n_heads * head_dim
    n_freqs = freqs.shape[0]
    value_width = values.shape[1]
    # the loops below index by these shapes without bounds checks
    if marks.shape[0] != rows or values.shape[0] != rows or n_events.shape[0] != rows or w.shape[0] != rows:
        raise ValueError("dt, marks, values, w and n_events must have one row per event")
    if value_width != embed_wt.shape[0] - 1 - 2 * n_freqs:
        raise ValueError("values: not the model's value width")
    if m.shape != (rows, n_layers, n_heads) or u.shape != m.shape or n_layers != norms.shape[0]:
        raise ValueError("m, u: not [B, L, H] of the model")
    if d != sv_b.shape[1] - n_heads or n_heads != rate.shape[1]:
        raise ValueError("w: not [B, L, H, Dh] of the model")
    if y.shape != (rows, d) or m_new.shape != m.shape or u_new.shape != m.shape or w_new.shape != w.shape:
        raise ValueError("out: not the inputs' rows and state shapes")
    if n_new.shape[0] != rows or finite.shape[0] != rows or outputs[0].shape[0] != rows:
        raise ValueError("out: not the inputs' rows")
    for b in range(rows):
        n_new[b] = n_events[b] + 1
    size = min(rows, CHUNK)
    x = np.empty((size, d), np.float32)
    h = np.empty((size, d), np.float32)
    o = np.empty((size, d), np.float32)
    acc = np.empty((size, d), np.float32)
    sv = np.empty((size, sv_b.shape[1]), np.float32)
    hidden = np.empty((size, fc1_b.shape[1]), np.float32)
    features = np.empty(embed_wt.shape[0], np.float32)
    gaps = np.empty(size, np.float32)
    n_scales = 2 * n_heads  # a head's exp(m - m') and exp(s - m'), row by row
    decay = np.empty(size * n_scales, np.float32)
    exp_constants = head[9]
    scratch = _forecast_scratch(rows, head)
    n_chunks = (rows + CHUNK - 1) // CHUNK
    for c in range(n_chunks):
        first = rows * c // n_chunks
        n_rows = rows * (c + 1) // n_chunks - first
        for r in range(n_rows):
            b = first + r
            gap = np.float32(dt[b])  # a float64 gap past float32's range becomes inf: its row overflows
            gap = gap if not gap < _F32_ZERO else _F32_ZERO
            gaps[r] = gap
            log_dt = np.log1p(gap)
            features[0] = log_dt
            for f in range(n_freqs):
                angle = log_dt * freqs[f]
                features[1 + f] = np.sin(angle)
                features[1 + n_freqs + f] = np.cos(angle)
            for j in range(value_width):
                features[1 + 2 * n_freqs + j] = values[b, j]
            mark = marks[b]
            if mark < 0 or mark >= mark_table.shape[0]:
                raise ValueError("a mark is outside [0, num_marks)")
            _affine(features, embed_wt, mark_table[mark], x[r])
        for layer in range(n_layers):
            _layer_norms(x, n_rows, norms[layer, 0], norms[layer, 1], eps[layer, 0], h, 0)
            _matrix(h, sv_wt[layer], sv_b[layer], sv, n_rows, blas)
            # the exponents of every row's heads first, then their exps in one vectorized pass (exp32_many)
            for r in range(n_rows):
                b = first + r
                for hh in range(n_heads):
                    m_old = m[b, layer, hh]
                    if has_rate[layer]:
                        m_old = m_old - gaps[r] * rate[layer, hh]
                    s = sv[r, hh]
                    m_top = m_old if m_old >= s else s
                    decay[r * n_scales + 2 * hh] = m_old - m_top
                    decay[r * n_scales + 2 * hh + 1] = s - m_top
                    m_new[b, layer, hh] = m_top
            exp32_many(decay, n_rows * n_scales, exp_constants)
            for r in range(n_rows):
                b = first + r
                for hh in range(n_heads):
                    c_old = decay[r * n_scales + 2 * hh]
                    c_new = decay[r * n_scales + 2 * hh + 1]
                    u_next = c_new + u[b, layer, hh] * c_old
                    u_new[b, layer, hh] = u_next
                    # unsigned offsets: numba adds no wrap-around of negative indices to them, so the accesses
                    # are consecutive and the loop vectorizes (and no row is sliced: see _layer_norms)
                    at = np.uint64(hh * head_dim)
                    value_at = np.uint64(n_heads) + at
                    for e in range(np.uint64(head_dim)):
                        w_e = sv[r, value_at + e] * c_new + w[b, layer, hh, e] * c_old
                        w_new[b, layer, hh, e] = w_e
                        o[r, at + e] = w_e / u_next
            _matrix(o, out_wt[layer], out_b[layer], acc, n_rows, blas)
            for r in range(n_rows):
                for j in range(d):
                    x[r, j] += acc[r, j]
            _layer_norms(x, n_rows, norms[layer, 2], norms[layer, 3], eps[layer, 1], h, 0)
            _matrix(h, fc1_wt[layer], fc1_b[layer], hidden, n_rows, blas)
            _gelu_rows(hidden, n_rows, gelu_constants)
            _matrix(hidden, fc2_wt[layer], fc2_b[layer], acc, n_rows, blas)
            for r in range(n_rows):
                for j in range(d):
                    x[r, j] += acc[r, j]
        _layer_norms(x, n_rows, final_norm[0], final_norm[1], final_eps, y, first)
        heads = scratch[0]
        _matrix(y[first:], head[0], head[1], heads, n_rows, _OWN_LOOPS)
        _forecast_chunk(heads, n_rows, first, top_k, head, outputs, scratch)
    marked = 0
    for values in (y, m_new.reshape((rows, -1)), u_new.reshape((rows, -1)), w_new.reshape((rows, -1))):
        marked += _mark_infinite(values, finite)
    return marked


#: the number of dimensions of each packed array, in the order of ``EventKernel``'s ``step`` then ``head`` tuples
#: (0: a scalar); ``head``'s last three (``K``, ``M``, ``V``) are in the layout's last row
_STEP_NDIMS = (1, 2, 2, 3, 2, 2, 1, 3, 2, 3, 2, 3, 2, 3, 2, 2, 0, 1)
_HEAD_NDIMS = (2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0)


@_jit
def _part(flat: np.ndarray, layout: np.ndarray, i: int) -> np.ndarray:
    """Packed array ``i`` as a 1-D view of ``flat``: ``layout[i] = (offset, size, d0, d1, d2)``."""
    return flat[layout[i, 0] : layout[i, 0] + layout[i, 1]]


@_jit
def _unpack(flat32: np.ndarray, flat64: np.ndarray, layout: np.ndarray) -> tuple:
    """``(step, head)``, the tuples ``_step_forecast_rows`` and ``_forecast_rows`` take, as views of the packed
    weights (``EventKernel._pack``): a numba call types three arrays here where it would type 31 items."""

    step = (
        _part(flat32, layout, 0),
        _part(flat32, layout, 1).reshape((layout[1, 2], layout[1, 3])),
        _part(flat32, layout, 2).reshape((layout[2, 2], layout[2, 3])),
        _part(flat32, layout, 3).reshape((layout[3, 2], layout[3, 3], layout[3, 4])),
        _part(flat32, layout, 4).reshape((layout[4, 2], layout[4, 3])),
        _part(flat32, layout, 5).reshape((layout[5, 2], layout[5, 3])),
        _part(flat32, layout, 6),
        _part(flat32, layout, 7).reshape((layout[7, 2], layout[7, 3], layout[7, 4])),
        _part(flat32, layout, 8).reshape((layout[8, 2], layout[8, 3])),
        _part(flat32, layout, 9).reshape((layout[9, 2], layout[9, 3], layout[9, 4])),
        _part(flat32, layout, 10).reshape((layout[10, 2], layout[10, 3])),
        _part(flat32, layout, 11).reshape((layout[11, 2], layout[11, 3], layout[11, 4])),
        _part(flat32, layout, 12).reshape((layout[12, 2], layout[12, 3])),
        _part(flat32, layout, 13).reshape((layout[13, 2], layout[13, 3], layout[13, 4])),
        _part(flat32, layout, 14).reshape((layout[14, 2], layout[14, 3])),
        _part(flat32, layout, 15).reshape((layout[15, 2], layout[15, 3])),
        flat32[layout[16, 0]],
        _part(flat32, layout, 17),
    )
    head = (
        _part(flat32, layout, 18).reshape((layout[18, 2], layout[18, 3])),
        _part(flat32, layout, 19),
        _part(flat32, layout, 20),
        _part(flat32, layout, 21),
        _part(flat32, layout, 22),
        _part(flat32, layout, 23),
        _part(flat32, layout, 24),
        _part(flat64, layout, 25),
        _part(flat64, layout, 26),
        _part(flat64, layout, 27),
        flat64[layout[28, 0]],
        flat64[layout[29, 0]],
        layout[30, 2],
        layout[30, 3],
        layout[30, 4],
    )
    return step, head


@_jit
def _step_forecast_packed(
    inputs: tuple, top_k: int, flat32: np.ndarray, flat64: np.ndarray, layout: np.ndarray, blas: tuple
) -> tuple:
    """``_step_forecast_rows`` on the packed weights, into new arrays: ``(y, m, u, w, n_events, forecast outputs,
    finite)``, ``finite`` None where every row is finite (the common case: numba hands each array it returns to
    Python through a lookup of its type, some 3,000 instructions an array; a None costs nothing)."""
    step, head = _unpack(flat32, flat64, layout)
    out = _step_outputs(inputs[0].shape[0], top_k, head, inputs[3], inputs[5])
    marked = _step_forecast_rows(inputs, top_k, step, head, blas, out)
    y, m_new, u_new, w_new, n_new, outputs, finite = out
    return y, m_new, u_new, w_new, n_new, outputs, (finite if marked else None)


@_jit
def _step_outputs_packed(
    rows: int, top_k: int, flat32: np.ndarray, flat64: np.ndarray, layout: np.ndarray, m: np.ndarray, w: np.ndarray
) -> tuple:
    """``_step_outputs`` on the packed weights: the arrays a batch's parts (``_step_forecast_span``) write into."""
    return _step_outputs(rows, top_k, _unpack(flat32, flat64, layout)[1], m, w)


@_jit
def _step_forecast_span(
    inputs: tuple,
    top_k: int,
    flat32: np.ndarray,
    flat64: np.ndarray,
    layout: np.ndarray,
    blas: tuple,
    out: tuple,
    start: int,
    stop: int,
) -> int:
    """``_step_forecast_rows`` on rows ``start .. stop`` of ``inputs`` into the same rows of ``out``
    (``_step_outputs_packed``' arrays over the whole batch): one part of a batch (``row_parts``), its outputs
    written in place, none joined afterwards; how many of its rows it marked not finite. Every input and output
    must have the batch's rows (a part's slices of unequal arrays could agree)."""
    dt, marks, values, m, u, w, n_events = inputs
    y, m_new, u_new, w_new, n_new, outputs, finite = out
    rows = dt.shape[0]
    for length in (marks.shape[0], values.shape[0], m.shape[0], u.shape[0], w.shape[0], n_events.shape[0]):
        if length != rows:
            raise ValueError("dt, marks, values, m, u, w and n_events must have one row per event")
    for length in (y.shape[0], m_new.shape[0], u_new.shape[0], w_new.shape[0], n_new.shape[0], finite.shape[0]):
        if length != rows:
            raise ValueError("out: not the inputs' rows")
    if not 0 <= start <= stop <= rows:
        raise ValueError("a part's rows: expected 0 <= start <= stop <= the batch's rows")
    step, head = _unpack(flat32, flat64, layout)
    part_inputs = (
        dt[start:stop],
        marks[start:stop],
        values[start:stop],
        m[start:stop],
        u[start:stop],
        w[start:stop],
        n_events[start:stop],
    )
    part_outputs = (
        outputs[0][start:stop],
        outputs[1][start:stop],
        outputs[2][start:stop],
        outputs[3][start:stop],
        outputs[4][start:stop],
        outputs[5][start:stop],
    )
    part_out = (
        y[start:stop],
        m_new[start:stop],
        u_new[start:stop],
        w_new[start:stop],
        n_new[start:stop],
        part_outputs,
        finite[start:stop],
    )
    return _step_forecast_rows(part_inputs, top_k, step, head, blas, part_out)


@_jit
def _forecast_packed(y: np.ndarray, top_k: int, flat32: np.ndarray, flat64: np.ndarray, layout: np.ndarray) -> tuple:
    """``_forecast_rows`` on the packed weights."""
    return _forecast_rows(y, top_k, _unpack(flat32, flat64, layout)[1])


def _pack(step: tuple, head: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(flat32, flat64, layout)``: the float32 items of ``step`` and ``head`` (``has_rate`` as 0/1) one after
    another in ``flat32``, the float64 ones in ``flat64``, and per item ``(offset, size, shape...)`` in
    ``layout [31, 5]`` int64 (its last row: ``K, M, V``)."""
    parts32: list[np.ndarray] = []
    parts64: list[np.ndarray] = []
    layout = np.zeros((len(_STEP_NDIMS) + len(_HEAD_NDIMS) + 1, 5), np.int64)
    items = [*step, *head[:12]]
    for i, (item, ndim) in enumerate(zip(items, (*_STEP_NDIMS, *_HEAD_NDIMS), strict=True)):
        # levels, Phi^-1(levels), exp32_many's constants, gap_bound, resolution
        wide = len(_STEP_NDIMS) + 7 <= i <= len(_STEP_NDIMS) + 11
        array = np.asarray(item, np.float64 if wide else np.float32).reshape(-1)
        parts = parts64 if wide else parts32
        layout[i, 0], layout[i, 1] = sum(p.size for p in parts), array.size
        shape = np.shape(item)
        assert len(shape) == ndim, (i, shape)
        layout[i, 2 : 2 + ndim] = shape
        parts.append(array)
    layout[-1, 2:] = head[12:]
    return np.concatenate(parts32), np.concatenate(parts64), layout


#: the heads' matrix has its columns padded with zeros to a multiple of this (a vector of 8 float32 lanes): its
#: loop over the columns (``_affine_rows``) then has no scalar remainder (64 x 44 on the bundled model: 2,430
#: instructions a row under callgrind, 1,839 padded to 48); the padded columns come out 0 and are not read
HEAD_COLUMNS_MULTIPLE = 8


def _padded_columns(a: np.ndarray) -> np.ndarray:
    """``a [..., P]`` with zeros after its last column up to a multiple of ``HEAD_COLUMNS_MULTIPLE`` (C-contiguous)."""
    extra = -a.shape[-1] % HEAD_COLUMNS_MULTIPLE
    return np.ascontiguousarray(np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, extra)]))


def _f32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().to(torch.float32).numpy())


_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)
_INPUT_NAMES = ("dt", "marks", "values", "m", "u", "w", "n_events")
_F64 = np.dtype(np.float64)
_INPUT_DTYPES = ((_F32, _F64), (_I64,), (_F32,), (_F32,), (_F32,), (_F32,), (_I64,))


class EventKernel:
    """``FusedEventModel``'s step and forecast as one compiled call per batch (see the module docstring).

    Build with ``from_fused``: a snapshot of the fused weights as float32 numpy arrays, matrices transposed.
    """

    def __init__(
        self,
        fused: FusedEventModel,
        levels: tuple[float, ...],
        step: tuple[np.ndarray | np.float32, ...],
        head: tuple[np.ndarray | float | int, ...],
        blas: tuple[int, int, int] | None = None,
    ) -> None:
        self.d_model = fused.d_model
        self.num_marks = fused.num_marks
        self.value_width = fused.value_width
        self.time_resolution = float(fused.time_resolution)
        self.levels = levels
        self._packed = _pack(step, head)
        #: the layers' products ``[B, n] x [n, p]``, as ``(n, p)``: score-value, output, feed-forward in and out
        self.shapes = tuple((int(a.shape[1]), int(a.shape[2])) for a in (step[7], step[9], step[11], step[13]))
        #: the sgemm of the layers' matrices (``blas.find_sgemm``, a library whose rows are exact on these shapes
        #: where it chooses; ``(0, NO_BLAS, 0)``: the kernel's loops)
        self._blas = find_sgemm(self.shapes) if blas is None else blas

    @classmethod
    def from_fused(
        cls, fused: FusedEventModel, levels: tuple[float, ...], blas: tuple[int, int, int] | None = None
    ) -> EventKernel:
        """Pack ``fused``'s weights and the quantile ``levels`` in (0, 1); ``blas``: the layers' ``sgemm`` as
        ``blas.available`` gives one (default ``blas.find_sgemm`` on the layers' shapes, as ``AAREN_KERNEL_BLAS``
        chooses).

        Raises ``ValueError`` for a backbone without a fused step (``fused.layers is None``) or bad levels.
        """
        if fused.layers is None:
            raise ValueError("this backbone has no fused step; EventKernel needs the Aaren backbone")
        level_arr, ppf = _level_arrays(levels)
        layers = fused.layers
        h = fused.n_heads

        def stacked(get: Callable[[FusedLayer], torch.Tensor]) -> np.ndarray:
            return np.ascontiguousarray(np.stack([_f32(get(layer)) for layer in layers]))

        step = (
            _f32(fused.freqs),
            _f32(fused.mark_table),
            _f32(fused.embed_weight.t()),
            np.ascontiguousarray(np.stack([[_f32(t) for t in (*lay.norm1, *lay.norm2)] for lay in layers])),
            np.array([lay.eps for lay in layers], np.float32),  # [L, 2]
            np.stack([_f32(lay.rate) if lay.rate is not None else np.zeros(h, np.float32) for lay in layers]),
            np.array([lay.rate is not None for lay in layers], np.bool_),
            stacked(lambda lay: lay.score_value[0].t()),
            stacked(lambda lay: lay.score_value[1]),
            stacked(lambda lay: lay.out[0].t()),
            stacked(lambda lay: lay.out[1]),
            stacked(lambda lay: lay.fc1[0].t()),
            stacked(lambda lay: lay.fc1[1]),
            stacked(lambda lay: lay.fc2[0].t()),
            stacked(lambda lay: lay.fc2[1]),
            np.stack([_f32(fused.final_norm[0]), _f32(fused.final_norm[1])]),
            np.float32(fused.final_norm[2]),
            GELU_CONSTANTS,
        )
        # the heads' matrix, its bias and the bounds, scales and shifts of its columns: padded alike
        padded = (fused.head[0].t(), fused.head[1], fused.head_low, fused.head_high, fused.head_scale, fused.head_shift)
        head = (
            *(_padded_columns(_f32(t)) for t in padded),
            _f32(fused.value_std),
            level_arr,
            ppf,
            EXP32_CONSTANTS,
            float(fused.gap_bound),
            float(fused.time_resolution),
            int(fused.n_components),
            int(fused.num_marks),
            int(fused.value_width),
        )
        return cls(fused, levels, step, head, blas)

    @property
    def blas_name(self) -> str:
        """What computes the layers' products: ``mkl``, ``openblas`` (``blas.find_sgemm``'s kinds) or ``loops``."""
        return {NO_BLAS: "loops", MKL: "mkl"}.get(self._blas[1], "openblas")

    def _finish(self, forecast: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        if self.time_resolution > 0:
            return forecast
        return (forecast[0], forecast[1].astype(np.float32), *forecast[2:])

    def step_forecast(
        self,
        dt: np.ndarray,
        marks: np.ndarray,
        values: np.ndarray,
        m: np.ndarray,
        u: np.ndarray,
        w: np.ndarray,
        n_events: np.ndarray,
        top_k: int,
    ) -> KernelOutputs:
        """One event per row, then the forecast of the next: ``dt [B]`` float32 (or float64, rounded to
        float32 here, where a gap past float32's range becomes inf), ``marks [B]`` int64,
        ``values [B, V]`` float32, the state ``m, u [B, L, H]``, ``w [B, L, H, Dh]`` float32 and
        ``n_events [B]`` int64 (not changed) -> ``KernelOutputs`` with ``k = min(top_k, M)`` marks.

        Where ``row_parts.set_threads`` allows more than one thread, a batch with rows for two parts or more (128 rows
        a part by default) runs in parts, each its own compiled call on its own thread, writing its rows of the
        same output arrays: the same bits as one call.

        Arrays of another dtype, or of shapes that disagree with the model or each other, and marks outside
        ``[0, M)`` raise ``ValueError``. Pass C-contiguous arrays: numba compiles a version of its own (once,
        seconds) for any other layout.
        """
        inputs = (dt, marks, values, m, u, w, n_events)
        for name, array, dtypes in zip(_INPUT_NAMES, inputs, _INPUT_DTYPES, strict=True):
            if array.dtype not in dtypes:
                raise ValueError(f"{name}: expected {' or '.join(map(str, dtypes))}, got {array.dtype}")
        k = max(0, min(int(top_k), self.num_marks))
        packed, blas = self._packed, self._blas
        bounds = row_parts.parts(len(dt))
        if len(bounds) == 1:
            y, m2, u2, w2, n2, forecast, finite = _step_forecast_packed(inputs, k, *packed, blas)
        else:  # a large batch: its rows in parts on the kernel's threads (row_parts), each written in place
            out = _step_outputs_packed(len(dt), k, *packed, m, w)

            def part(start: int, stop: int) -> int:
                return _step_forecast_span(inputs, k, *packed, blas, out, start, stop)

            marked = sum(row_parts.in_parts(part, bounds))
            y, m2, u2, w2, n2, forecast, finite = out
            finite = finite if marked else None
        return KernelOutputs(y, m2, u2, w2, n2, self._finish(forecast), finite)

    def prepare(self, m: np.ndarray, u: np.ndarray, w: np.ndarray, n_events: np.ndarray, top_k: int) -> None:
        """Compile (or load from numba's cache) now every path a request can take, on one fresh row of the state
        ``m, u [1, L, H]``, ``w [1, L, H, Dh]``, ``n_events [1]`` (as the store holds it), so that no request pays
        for compiling: ``step_forecast`` in one call and, where ``row_parts`` has threads, in parts (compiled the
        first time a batch of ``2 x MIN_PART_ROWS`` rows came: a stall of 5 s on a cold cache on this 2-core
        machine), and the forecast alone (a history's, the unary ``Forecast``'s)."""
        inputs = (
            np.zeros(1, np.float64),  # gaps as float64, as a batch's RunColumns hold them
            np.zeros(1, np.int64),
            np.zeros((1, self.value_width), np.float32),
            m,
            u,
            w,
            n_events,
        )
        self.step_forecast(*inputs, top_k)
        if row_parts.threads() > 1:
            k = max(0, min(int(top_k), self.num_marks))
            out = _step_outputs_packed(1, k, *self._packed, m, w)
            _step_forecast_span(inputs, k, *self._packed, self._blas, out, 0, 1)
        self.forecast(np.zeros((1, self.d_model), np.float32), top_k)

    def forecast(self, y: np.ndarray, top_k: int) -> tuple[np.ndarray, ...]:
        """The forecast alone from features ``y [B, d]`` float32 (C-contiguous): ``KernelOutputs.forecast``'s
        six arrays."""
        if y.dtype != _F32 or y.ndim != 2 or y.shape[1] != self.d_model:
            raise ValueError(f"y: expected float32 [B, {self.d_model}], got {y.dtype} {list(y.shape)}")
        k = max(0, min(int(top_k), self.num_marks))
        return self._finish(_forecast_packed(np.ascontiguousarray(y), k, *self._packed))
