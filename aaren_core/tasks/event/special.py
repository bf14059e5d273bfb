"""The normal CDF ``Phi`` and density of several arguments at once, in float64, branch-free so that the compiled
loop over them vectorizes (numba; the gap forecast's mixtures evaluate ``Phi`` at one argument per component).

``phi_many(x, phi, density, n)`` writes ``phi[k] = Phi(x[k])`` and ``density[k] = exp(-x[k]^2 / 2)`` for
``k < n``: no call into libm (whose scalar ``erf``, ``erfc`` and ``exp`` do not vectorize), every lane the same
instructions, the cases chosen by selects:

- ``|x| < 1``: ``Phi = 1/2 + erf(x / sqrt 2) / 2`` (as torch's ``ndtr``), ``erf(t) = t sum_j a_j t^2j``, the
  Maclaurin series to ``j = 14`` (the first term left out is under ``1e-18`` of the sum for ``t^2 <= 1/2``);
- past, ``Phi = erfc(|t|) / 2`` (or 1 minus it for ``x > 0``), relatively exact in the left tail, with
  ``erfc(z) = exp(-z^2) h(z) c / (c + z)``, ``h(z) = erfcx(z) (1 + z / c)``, ``c = 3``: ``h`` is smooth and between
  0.19 and 1 on ``[0, 27.3]`` and is a Chebyshev series (degree 23, ``_ERFCX_CHEB``) in
  ``y = ((z - c) / (z + c) - b) / a``, which maps ``[0, 27.3]`` onto ``[-1, 1]``, evaluated as powers of ``y``
  (``_ERFCX_POWERS``) by Horner's rule; past 27.3 ``erfc`` rounds to 0;
- the density ``exp(-x^2 / 2)`` (the ``exp(-z^2)`` of ``erfc``) with ``x^2 / 2`` as the exact ``x_h^2 / 2``
  (``x_h = x`` rounded to float32) plus ``(x - x_h) (x_h + x) / 2``, so the square's rounding (up to 1.6e-13
  relative at ``x = 37``; torch's ``ndtr`` via ``x / sqrt 2`` carries it) does not reach the result:
  ``n = round(-x^2 / (2 ln 2))``, ``r = -x^2 / 2 - n ln 2`` (``ln 2`` in two parts, Cody and Waite's
  reduction), ``exp(r)`` by its Taylor series to ``r^13`` (``|r| <= ln 2 / 2``: the first term left out is under
  5e-18), times ``2^n`` as two powers of two built from their bits, so that a subnormal result rounds once.

Errors (``tests/core/test_special.py``, against mpmath at 40 digits): ``Phi`` within ``1e-15`` relative in the left
tail and ``2^-53`` absolute throughout; ``density`` within ``4e-16`` relative.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import llvmlite.ir
import numba
import numba.extending
import numpy as np

from aaren.jit import compiled

__all__ = [
    "ERFCX_C",
    "ERFCX_Z_MAX",
    "EXP32_CONSTANTS",
    "bits_as_float",
    "chebyshev_powers",
    "exp32_many",
    "exp_row_pairs",
    "exp_rows",
    "float_as_bits",
    "phi_many",
]

#: ``c`` of ``h(z) = erfcx(z) (1 + z / c)`` and the end of its series' range (``erfc(27.3)`` rounds to 0)
ERFCX_C = 3.0
ERFCX_Z_MAX = 27.3
#: ``y = s / a - b / a`` for ``s = (z - c) / (z + c)`` in ``[-1, (27.3 - c) / (27.3 + c)]``
_S_HIGH = (ERFCX_Z_MAX - ERFCX_C) / (ERFCX_Z_MAX + ERFCX_C)
_Y_SCALE = 2.0 / (_S_HIGH + 1.0)
_Y_SHIFT = (_S_HIGH - 1.0) / (_S_HIGH + 1.0)
#: ``h``'s Chebyshev coefficients (``tests/core/test_special.py`` refits them with mpmath: interpolation at 92
#: Chebyshev nodes of ``erfc(z) exp(z^2) (1 + z / c)`` at 40 digits)
_ERFCX_CHEB = (
    0.49322559023980156, -0.3720720082029295, 0.10757323963844219, -0.023378161401072437,
    0.0035171408350738787, -0.0002618213275880422, -2.094574642414781e-05, 6.993860845391837e-06,
    -1.7099671353022923e-07, -1.4205877131351284e-07, 1.0404738636851008e-08, 3.285329531759066e-09,
    -3.168999884240872e-10, -9.306216088671814e-11, 7.839600438503669e-12, 3.0838412942765e-12,
    -1.2595459189815244e-13, -1.0870054862536422e-13, -2.422038299305895e-15, 3.670862263943637e-15,
    3.868597039184848e-16, -1.025130729737163e-16, -2.5001454786917274e-17, 1.3610290050395992e-18,
)  # fmt: skip


def chebyshev_powers(coefficients: tuple[float, ...]) -> tuple[float, ...]:
    """The coefficients ``a_j`` of ``sum_k c_k T_k(y) = sum_j a_j y^j``, converted in exact rational arithmetic
    (``T_(k+1) = 2 y T_k - T_(k-1)``) and each rounded once to float64."""
    rows: list[list[Fraction]] = [[Fraction(1)], [Fraction(0), Fraction(1)]]
    while len(rows) < len(coefficients):
        prev, last = rows[-2], rows[-1]
        nxt = [Fraction(0)] + [2 * v for v in last]
        for j, v in enumerate(prev):
            nxt[j] -= v
        rows.append(nxt)
    total = [Fraction(0)] * len(coefficients)
    for c, row in zip(coefficients, rows, strict=False):
        for j, v in enumerate(row):
            total[j] += Fraction(c) * v
    return tuple(float(v) for v in total)


#: ``h``'s series as powers of ``y`` (``phi_many`` evaluates it by Horner's rule: 23 multiply-adds where Clenshaw's
#: recurrence takes 46 operations): their absolute values sum to 1.002, as the Chebyshev coefficients' to 1.000, so
#: the two forms round alike
_ERFCX_POWERS = chebyshev_powers(_ERFCX_CHEB)

#: ``erf(t) / t = 2 / sqrt(pi) sum_j (-1)^j t^2j / (j! (2 j + 1))``, ``j <= 14``
_ERF_SERIES = tuple(2.0 / math.sqrt(math.pi) * (-1.0) ** j / (math.factorial(j) * (2 * j + 1)) for j in range(15))
#: ``exp(r) = sum_j r^j / j!``, ``j <= 13`` (and a 0 for ``j = 14``: ``_series15``'s length; its step adds nothing)
_EXP_SERIES = (*(1.0 / math.factorial(j) for j in range(14)), 0.0)
_LOG2E = 1.0 / math.log(2.0)
#: ``ln 2`` as a part with 32 significant bits (so ``n ln2_hi`` is exact for ``|n| < 2^21``) and the rest (the
#: float64 ``ln 2``'s own rounding, 2.3e-17, added back: ``n`` times it reaches 2.5e-14 at ``n = -1075``)
_LN2_HI = math.ldexp(math.floor(math.ldexp(math.log(2.0), 32)), -32)
_LN2_LO = (math.log(2.0) - _LN2_HI) + 2.3190468138462996e-17
#: adding then subtracting ``1.5 2^52`` rounds a float64 below 2^51 in size to the nearest integer
_ROUND = 6755399441055744.0
#: ``_exp_split`` holds its argument to ``[_EXP_FLOOR, -_EXP_FLOOR]``: ``2^n`` there is 0, resp. inf, as two
#: factors, each a float64 whose exponent field its bits can hold
_EXP_FLOOR = -1400.0
_SQRT1_2 = math.sqrt(0.5)
#: ``|x|`` past which ``erfc(|x| / sqrt 2)`` rounds to 0
_X_MAX = ERFCX_Z_MAX / _SQRT1_2


def _jit_vector(fn: Callable[..., Any]) -> Any:
    """numba's disk-cached compile with contraction only (each ``a x + b`` of the series one fused multiply-add,
    rounded once: more exact, not less) and numpy's error model; no flag that assumes ``inf`` or NaN away."""
    return compiled(fn, fastmath={"contract"}, error_model="numpy")


@numba.extending.intrinsic
def bits_as_float(typingctx: Any, bits: Any) -> Any:
    """The float64 whose bits are the int64 ``bits`` (LLVM's ``bitcast``: one register move, vectorizable)."""
    if bits != numba.types.int64:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], llvmlite.ir.DoubleType())

    return numba.types.float64(numba.types.int64), codegen


@numba.extending.intrinsic
def float_as_bits(typingctx: Any, value: Any) -> Any:
    """The int64 whose bits are the float64 ``value`` (LLVM's ``bitcast``: one register move, vectorizable)."""
    if value != numba.types.float64:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], llvmlite.ir.IntType(64))

    return numba.types.int64(numba.types.float64), codegen


#: the bits of ``_ROUND``: ``bits(_ROUND + n) - _ROUND_BITS = n`` for an integer ``|n| < 2^51``
_ROUND_BITS = int(np.array(_ROUND).view(np.int64))


@_jit_vector
def _series15(c: tuple, x: float) -> float:
    """``sum_j c_j x^j`` for the 15 coefficients ``c`` by Horner's rule, written out (LLVM unrolls a loop of 16
    or more steps only after it has decided not to vectorize the loop it sits in). Inlined where it is called."""
    p = c[14]
    p = p * x + c[13]
    p = p * x + c[12]
    p = p * x + c[11]
    p = p * x + c[10]
    p = p * x + c[9]
    p = p * x + c[8]
    p = p * x + c[7]
    p = p * x + c[6]
    p = p * x + c[5]
    p = p * x + c[4]
    p = p * x + c[3]
    p = p * x + c[2]
    p = p * x + c[1]
    p = p * x + c[0]
    return p


@_jit_vector
def _series24(c: tuple, x: float) -> float:
    """``sum_j c_j x^j`` for the 24 coefficients ``c`` by Horner's rule, written out (see ``_series15``)."""
    p = c[23]
    p = p * x + c[22]
    p = p * x + c[21]
    p = p * x + c[20]
    p = p * x + c[19]
    p = p * x + c[18]
    p = p * x + c[17]
    p = p * x + c[16]
    p = p * x + c[15]
    p = p * x + c[14]
    p = p * x + c[13]
    p = p * x + c[12]
    p = p * x + c[11]
    p = p * x + c[10]
    p = p * x + c[9]
    p = p * x + c[8]
    p = p * x + c[7]
    p = p * x + c[6]
    p = p * x + c[5]
    p = p * x + c[4]
    p = p * x + c[3]
    p = p * x + c[2]
    p = p * x + c[1]
    p = p * x + c[0]
    return p


@_jit_vector
def _exp_split(hi: float, lo: float) -> float:
    """``exp(hi + lo)`` for ``|lo|`` far below ``|hi|``'s ulp (``hi`` held to ``[-1400, 1400]``, where the result
    is 0 or inf): the reduction, series and powers of two of the module docstring. Inlined where it is called."""
    hi = min(max(hi, _EXP_FLOOR), -_EXP_FLOOR)
    rounded = hi * _LOG2E + _ROUND
    n_f = rounded - _ROUND
    r = (hi - n_f * _LN2_HI) - n_f * _LN2_LO + lo
    p = _series15(_EXP_SERIES, r)
    n_i = float_as_bits(rounded) - _ROUND_BITS  # n_f as an integer, read off its bits (AVX2 has no vector cvtpd2qq)
    half = n_i >> 1
    return (p * bits_as_float((half + 1023) << 52)) * bits_as_float((n_i - half + 1023) << 52)


@_jit_vector
def exp_rows(table: np.ndarray, source: int, target: int, n: int) -> None:
    """``table[target, k] = exp(table[source, k])`` for ``k < n`` (float64, within an ulp; inf past 709.78, 0 below
    -745.1, NaN kept), ``target != source``: the rows of the mixture table indexed, not sliced (a slice takes a
    reference to its array and gives it back)."""
    for k in range(n):
        table[target, k] = _exp_of(table[source, k])


@_jit_vector
def exp_row_pairs(table: np.ndarray, source: int, target: int, source2: int, target2: int, n: int) -> None:
    """``exp_rows`` of two rows in one loop (``source -> target``, ``source2 -> target2``; no target a source):
    one call's set-up (the series' constants made ready for the loop) where two calls took two."""
    for k in range(n):
        table[target, k] = _exp_of(table[source, k])
        table[target2, k] = _exp_of(table[source2, k])


@_jit_vector
def _exp_of(v: float) -> float:
    """``exp(v)`` (float64, within an ulp; inf past 709.78, 0 below -745.1, NaN kept). Inlined where it is called."""
    e = _exp_split(v, 0.0)
    return e if v == v else v


#: ``exp32_many``'s constants, passed in at run time: ``1 / j!`` for ``j = 0 .. 11`` [0:12], ``log2 e``, ``ln 2`` in two
#: parts, ``_ROUND``, and the arguments' clamp ``[-110, 90]`` (past which the float32 result is 0, resp. inf)
_E32_LOG2E, _E32_LN2_HI, _E32_LN2_LO, _E32_ROUND, _E32_LOW, _E32_HIGH = range(12, 18)
EXP32_CONSTANTS = np.array(
    [*(1.0 / math.factorial(j) for j in range(12)), _LOG2E, _LN2_HI, _LN2_LO, _ROUND, -110.0, 90.0], np.float64
)


@_jit_vector
def exp32_many(x: np.ndarray, n: int, c: np.ndarray) -> None:
    """``x[k] <- exp(x[k])`` for ``k < n``, float32 in place (``c = EXP32_CONSTANTS``): evaluated in float64 (the
    reduction of ``_exp_split``, ``exp(r)`` by its Taylor series to ``r^11``, under 7e-15 relative for
    ``|r| <= ln 2 / 2``, times ``2^n``, ``n`` in ``[-159, 130]``, one power of two) and rounded once to float32: the
    correctly rounded ``expf`` but where the exact value lies within 7e-15 of a float32 rounding boundary (NaN kept,
    ``exp(-inf) = 0``; glibc's ``expf``, which it replaces in the kernel, misrounds about 1 argument in 1,700).
    Branch- and call-free, so that the loop vectorizes; the constants come from ``c``, an argument, because the 18
    of them written into the code would not stay in AVX2's registers, and LLVM re-makes each such constant inside
    the loop (numba's large code model: two instructions a constant a vector)."""
    for k in range(n):
        v = np.float64(x[k])
        hi = min(max(v, c[_E32_LOW]), c[_E32_HIGH])
        rounded = hi * c[_E32_LOG2E] + c[_E32_ROUND]
        n_f = rounded - c[_E32_ROUND]
        r = (hi - n_f * c[_E32_LN2_HI]) - n_f * c[_E32_LN2_LO]
        p = c[11]
        p = p * r + c[10]
        p = p * r + c[9]
        p = p * r + c[8]
        p = p * r + c[7]
        p = p * r + c[6]
        p = p * r + c[5]
        p = p * r + c[4]
        p = p * r + c[3]
        p = p * r + c[2]
        p = p * r + c[1]
        p = p * r + c[0]
        # bits(rounded) = _ROUND_BITS + n, whose low 12 bits are 0: (bits + 1023) << 52 is 2^n's bits
        e = np.float32(p * bits_as_float((float_as_bits(rounded) + 1023) << 52))
        x[k] = e if v == v else x[k]


@_jit_vector
def phi_many(x: np.ndarray, phi: np.ndarray, density: np.ndarray, n: int) -> None:
    """``phi[k] = Phi(x[k])`` and ``density[k] = exp(-x[k]^2 / 2)`` for ``k < n`` (float64). See the module
    docstring. One loop of straight-line code: LLVM vectorizes it across ``k`` (8 lanes with AVX-512), and
    unrolls no loop of 16 or more steps before it has decided not to, so the series are written out."""
    for k in range(n):
        # exp(-x^2 / 2): -x^2 / 2 = hi + lo, hi exact
        ax = min(abs(x[k]), _X_MAX)
        ax_h = np.float64(np.float32(ax))
        hi = -0.5 * (ax_h * ax_h)
        lo = -0.5 * ((ax - ax_h) * (ax_h + ax))
        e = _exp_split(hi, lo)
        density[k] = e
        # erfc(z) = e h(z) c / (c + z), h by Horner's rule in y, each step one multiply-add
        t = x[k] * _SQRT1_2
        z = min(abs(t), ERFCX_Z_MAX)  # past it e is 0; an infinite z would make y NaN
        y = min(((z - ERFCX_C) / (z + ERFCX_C)) * _Y_SCALE - _Y_SHIFT, 1.0)
        h = _series24(_ERFCX_POWERS, y)
        half_erfc = 0.5 * (e * (h * (ERFCX_C / (ERFCX_C + z))))
        tail = 1.0 - half_erfc if t > 0.0 else half_erfc
        # erf(t) for |t| < sqrt(1/2)
        u = t * t
        s = _series15(_ERF_SERIES, u)
        phi[k] = 0.5 + 0.5 * (t * s) if z < _SQRT1_2 else tail
