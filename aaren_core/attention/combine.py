"""The Aaren state of one attention layer and its associative operator ``combine``.

Notation (docs/architecture.md section 1, Feng et al. 2024 section 3): for scores ``s_i = q . k_i / sqrt(d)``
and values ``v_i`` the many-to-many output is

    o_k = sum_{i<=k} exp(s_i) v_i / sum_{i<=k} exp(s_i)

computed from the running state ``(m_k, u_k, w_k)`` (max score, rescaled denominator, rescaled
numerator) with the associative operator ``combine``. Shapes: ``B`` batch, ``N`` tokens, ``H``
heads, ``D`` value width per head. Scores ``s [B, N, H]``, values ``v [B, N, H, D]``.

Every function of ``aaren_core.attention`` computes in float32, or in float64 when given float64,
and returns outputs in the input dtype. States are returned in the compute dtype and never
mutated in place. The three ways to compute the output live beside this module: ``naive`` (the
O(N^2) reference), ``scan`` (the parallel prefix scan) and ``step`` (one token).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["ScanState", "check_shapes", "check_state", "combine", "compute_dtype", "empty_state", "leaves"]


class ScanState(NamedTuple):
    """The Aaren state of one attention layer: ``m [B, H]``, ``u [B, H]``, ``w [B, H, D]``.

    ``m`` is the running max score, ``u = sum_i exp(s_i - m)`` and ``w = sum_i exp(s_i - m) v_i``.
    The empty state is ``m = -inf, u = 0, w = 0``; the output is ``o = w / u``.
    """

    m: Tensor
    u: Tensor
    w: Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def empty_state(
    batch: int, heads: int, dim: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> ScanState:
    """The state before any token: ``m = -inf [B, H]``, ``u = 0 [B, H]``, ``w = 0 [B, H, D]``."""
    dtype = compute_dtype(dtype)
    return ScanState(
        m=torch.full((batch, heads), float("-inf"), dtype=dtype, device=device),
        u=torch.zeros(batch, heads, dtype=dtype, device=device),
        w=torch.zeros(batch, heads, dim, dtype=dtype, device=device),
    )


def combine(a: ScanState, b: ScanState) -> ScanState:
    """The associative operator: the state of segment ``A`` followed by segment ``B``.

    ``m = max(m_A, m_B)``, ``u = u_A exp(m_A - m) + u_B exp(m_B - m)``,
    ``w = w_A exp(m_A - m) + w_B exp(m_B - m)``. Broadcasts over leading dims; ``w`` has one more
    trailing dim than ``m`` and ``u``. An empty segment (``m = -inf``) gets weight 0.
    """
    m = torch.maximum(a.m, b.m)
    # Only where both segments are empty is m = -inf; subtracting the lowest finite float there
    # instead keeps -inf - -inf = nan out of the values and the gradients (exp(-inf - x) = 0).
    # One clamp rather than isneginf + where: it changes no finite m, nor its gradient.
    shift = m.clamp_min(torch.finfo(m.dtype).min)
    ca = torch.exp(a.m - shift)
    cb = torch.exp(b.m - shift)
    return ScanState(
        m=m,
        u=a.u * ca + b.u * cb,
        w=a.w * ca.unsqueeze(-1) + b.w * cb.unsqueeze(-1),
    )


def leaves(s: Tensor, v: Tensor) -> ScanState:
    """Each token as a one-token segment: ``(m, u, w) = (s_i, 1, v_i)``."""
    return ScanState(m=s, u=torch.ones_like(s), w=v)


def check_shapes(s: Tensor, v: Tensor) -> None:
    if s.dim() != 3 or v.dim() != 4 or v.shape[:3] != s.shape:
        raise ValueError(
            f"expected scores s [B, N, H] and values v [B, N, H, D] with matching B, N, H; "
            f"got s {tuple(s.shape)} and v {tuple(v.shape)}"
        )


def check_state(state: ScanState, s: Tensor, v: Tensor) -> None:
    b, _, h = s.shape
    d = v.shape[-1]
    if state.m.shape != (b, h) or state.u.shape != (b, h) or state.w.shape != (b, h, d):
        raise ValueError(
            f"expected a state with m, u [{b}, {h}] and w [{b}, {h}, {d}]; "
            f"got m {tuple(state.m.shape)}, u {tuple(state.u.shape)}, w {tuple(state.w.shape)}"
        )
