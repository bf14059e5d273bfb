"""Aaren attention as functions: the O(N^2) reference, the parallel prefix scan and one step.

Notation (docs/architecture.md section 1, Feng et al. 2024 section 3): for scores ``s_i = q . k_i / sqrt(d)``
and values ``v_i`` the many-to-many output is

    o_k = sum_{i<=k} exp(s_i) v_i / sum_{i<=k} exp(s_i)

computed from the running state ``(m_k, u_k, w_k)`` (max score, rescaled denominator, rescaled
numerator) with the associative operator ``combine``. Shapes: ``B`` batch, ``N`` tokens, ``H``
heads, ``D`` value width per head. Scores ``s [B, N, H]``, values ``v [B, N, H, D]``.

Every function computes in float32, or in float64 when given float64, and returns outputs in the
input dtype. States are returned in the compute dtype and never mutated in place.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

__all__ = [
    "ScanState",
    "attention_naive",
    "attention_scan",
    "attention_step",
    "combine",
    "empty_state",
    "scan_chunked",
    "scan_hillis_steele",
]

DEFAULT_CHUNK = 16


class ScanState(NamedTuple):
    """The Aaren state of one attention layer: ``m [B, H]``, ``u [B, H]``, ``w [B, H, D]``.

    ``m`` is the running max score, ``u = sum_i exp(s_i - m)`` and ``w = sum_i exp(s_i - m) v_i``.
    The empty state is ``m = -inf, u = 0, w = 0``; the output is ``o = w / u``.
    """

    m: Tensor
    u: Tensor
    w: Tensor


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def empty_state(
    batch: int, heads: int, dim: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> ScanState:
    """The state before any token: ``m = -inf [B, H]``, ``u = 0 [B, H]``, ``w = 0 [B, H, D]``."""
    dtype = _compute_dtype(dtype)
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


def _leaves(s: Tensor, v: Tensor) -> ScanState:
    """Each token as a one-token segment: ``(m, u, w) = (s_i, 1, v_i)``."""
    return ScanState(m=s, u=torch.ones_like(s), w=v)


def _check_shapes(s: Tensor, v: Tensor) -> None:
    if s.dim() != 3 or v.dim() != 4 or v.shape[:3] != s.shape:
        raise ValueError(
            f"expected scores s [B, N, H] and values v [B, N, H, D] with matching B, N, H; "
            f"got s {tuple(s.shape)} and v {tuple(v.shape)}"
        )


def _check_state(state: ScanState, s: Tensor, v: Tensor) -> None:
    b, _, h = s.shape
    d = v.shape[-1]
    if state.m.shape != (b, h) or state.u.shape != (b, h) or state.w.shape != (b, h, d):
        raise ValueError(
            f"expected a state with m, u [{b}, {h}] and w [{b}, {h}, {d}]; "
            f"got m {tuple(state.m.shape)}, u {tuple(state.u.shape)}, w {tuple(state.w.shape)}"
        )


def attention_naive(s: Tensor, v: Tensor) -> Tensor:
    """The O(N^2) reference: causal softmax of scores applied to values.

    ``o[b, k, h] = sum_{i<=k} softmax_i(s[b, :k+1, h]) v[b, i, h]``. Shapes ``s [B, N, H]``,
    ``v [B, N, H, D]`` -> ``o [B, N, H, D]``. Independent of the scan: no state, no combine.
    """
    _check_shapes(s, v)
    cdt = _compute_dtype(s.dtype)
    n = s.shape[1]
    scores = s.to(cdt).transpose(1, 2).unsqueeze(2).expand(-1, -1, n, -1)  # [B, H, N(k), N(i)]
    future = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)  # [B, H, N, N]
    o = weights @ v.to(cdt).transpose(1, 2)  # [B, H, N, D]
    return o.transpose(1, 2).to(v.dtype)


def scan_hillis_steele(x: ScanState) -> ScanState:
    """Inclusive prefix scan along dim 1 (Hillis & Steele 1986; the paper's Algorithm).

    ``log2 N`` rounds; in round ``j`` every position ``k >= 2^j`` combines with ``k - 2^j``.
    O(N log N) work, O(log N) depth. Shapes ``m, u [B, N, H]``, ``w [B, N, H, D]``.
    """
    n = x.m.shape[1]
    offset = 1
    while offset < n:
        earlier = ScanState(x.m[:, :-offset], x.u[:, :-offset], x.w[:, :-offset])
        later = ScanState(x.m[:, offset:], x.u[:, offset:], x.w[:, offset:])
        merged = combine(earlier, later)
        x = ScanState(
            torch.cat([x.m[:, :offset], merged.m], dim=1),
            torch.cat([x.u[:, :offset], merged.u], dim=1),
            torch.cat([x.w[:, :offset], merged.w], dim=1),
        )
        offset *= 2
    return x


def scan_chunked(s: Tensor, v: Tensor, chunk: int = DEFAULT_CHUNK) -> ScanState:
    """Inclusive prefix states by chunks: exact attention inside a chunk, a scan across chunks.

    Inside each chunk of ``C`` tokens the prefix state is computed directly from the running max
    ``m_k = cummax(s)_k``: ``u_k = sum_{i<=k} exp(s_i - m_k)``, ``w_k = sum_{i<=k} exp(s_i - m_k) v_i``
    (one batched matmul, O(N C) work). The chunk totals are scanned with Hillis-Steele over
    ``N / C`` elements and each chunk's exclusive prefix is combined into its tokens.
    Shapes ``s [B, N, H]`` (compute dtype), ``v [B, N, H, D]`` -> states ``[B, N, H(, D)]``.
    """
    b, n, h = s.shape
    d = v.shape[-1]
    c = max(1, min(chunk, n))
    n_chunks = -(-n // c)
    pad = n_chunks * c - n
    if pad:
        # Padding sits after every real token, so causality keeps it out of the real prefixes.
        s = torch.cat([s, s.new_zeros(b, pad, h)], dim=1)
        v = torch.cat([v, v.new_zeros(b, pad, h, d)], dim=1)
    sc = s.view(b, n_chunks, c, h).permute(0, 1, 3, 2)  # [B, K, H, C]
    vc = v.view(b, n_chunks, c, h, d).permute(0, 1, 3, 2, 4)  # [B, K, H, C, D]
    m_local = torch.cummax(sc, dim=-1).values  # [B, K, H, C]
    causal = torch.ones(c, c, dtype=torch.bool, device=s.device).tril()  # [C(k), C(i)]
    logits = sc.unsqueeze(-2) - m_local.unsqueeze(-1)  # [B, K, H, C(k), C(i)]
    weights = torch.where(causal, torch.exp(logits.masked_fill(~causal, 0.0)), 0.0)
    u_local = weights.sum(-1)  # [B, K, H, C]
    w_local = weights @ vc  # [B, K, H, C, D]

    if n_chunks > 1:
        totals = ScanState(m_local[..., -1], u_local[..., -1], w_local[..., -1, :])  # [B, K, H(, D)]
        carried = scan_hillis_steele(
            ScanState(totals.m[:, :-1], totals.u[:, :-1], totals.w[:, :-1])
        )  # prefix of chunks 0..k-1, for chunks 1..K-1
        empty = empty_state(b, h, d, dtype=s.dtype, device=s.device)
        carry = ScanState(
            torch.cat([empty.m.unsqueeze(1), carried.m], dim=1).unsqueeze(-1),  # [B, K, H, 1]
            torch.cat([empty.u.unsqueeze(1), carried.u], dim=1).unsqueeze(-1),
            torch.cat([empty.w.unsqueeze(1), carried.w], dim=1).unsqueeze(-2),  # [B, K, H, 1, D]
        )
        local = combine(carry, ScanState(m_local, u_local, w_local))
    else:
        local = ScanState(m_local, u_local, w_local)

    return ScanState(
        m=local.m.permute(0, 1, 3, 2).reshape(b, n_chunks * c, h)[:, :n],
        u=local.u.permute(0, 1, 3, 2).reshape(b, n_chunks * c, h)[:, :n],
        w=local.w.permute(0, 1, 3, 2, 4).reshape(b, n_chunks * c, h, d)[:, :n],
    )


def attention_scan(
    s: Tensor,
    v: Tensor,
    state: ScanState | None = None,
    *,
    method: Literal["chunked", "hillis_steele"] = "chunked",
    chunk: int = DEFAULT_CHUNK,
) -> tuple[Tensor, ScanState]:
    """Many-to-many Aaren output by a parallel prefix scan, resuming from ``state``.

    ``s [B, N, H]``, ``v [B, N, H, D]``, optional ``state`` (``m, u [B, H]``, ``w [B, H, D]``)
    -> ``(o [B, N, H, D], final state)``. ``o_k = w_k / u_k`` where ``(m_k, u_k, w_k)`` is
    ``combine(state, x_1, ..., x_k)``. ``N = 0`` returns an empty output and the state unchanged.

    ``method="chunked"`` (the default, chunks of 16) is the O(N C) chunked scan; with chunks of 16
    it beat ``"hillis_steele"`` (O(N log N) work, the paper's algorithm) at every N from 256 to
    8192 in ``bench/core.py`` on CPU, by 1.5-2.7x for forward+backward, because its inner step is
    a small matmul and it keeps ``log N`` fewer full-size intermediates. Chunks of 64 or more
    lose that lead (the O(N C) part dominates).
    """
    _check_shapes(s, v)
    cdt = _compute_dtype(s.dtype)
    b, n, h = s.shape
    d = v.shape[-1]
    if state is None:
        state = empty_state(b, h, d, dtype=cdt, device=s.device)
    else:
        _check_state(state, s, v)
        state = ScanState(state.m.to(cdt), state.u.to(cdt), state.w.to(cdt))
    if n == 0:
        return v.new_zeros(b, 0, h, d), state
    sc, vc = s.to(cdt), v.to(cdt)
    if method == "chunked":
        prefix = scan_chunked(sc, vc, chunk)
    elif method == "hillis_steele":
        prefix = scan_hillis_steele(_leaves(sc, vc))
    else:
        raise ValueError(f"unknown scan method {method!r}; expected 'chunked' or 'hillis_steele'")
    full = combine(
        ScanState(state.m.unsqueeze(1), state.u.unsqueeze(1), state.w.unsqueeze(1)), prefix
    )  # [B, N, H(, D)]
    o = full.w / full.u.unsqueeze(-1)
    final = ScanState(full.m[:, -1], full.u[:, -1], full.w[:, -1])
    return o.to(v.dtype), final


def attention_step(s_t: Tensor, v_t: Tensor, state: ScanState) -> tuple[Tensor, ScanState]:
    """One token: ``s_t [B, H]``, ``v_t [B, H, D]``, state -> ``(o_t [B, H, D], new state)``.

    ``m' = max(m, s_t)``, ``u' = u exp(m - m') + exp(s_t - m')``, ``w' = w exp(m - m') + v_t exp(s_t - m')``,
    ``o_t = w' / u'`` (docs/architecture.md section 1).
    """
    if s_t.dim() != 2 or v_t.dim() != 3 or v_t.shape[:2] != s_t.shape:
        raise ValueError(f"expected s_t [B, H] and v_t [B, H, D]; got {tuple(s_t.shape)} and {tuple(v_t.shape)}")
    cdt = _compute_dtype(s_t.dtype)
    out_dtype = v_t.dtype
    m, u, w = state
    if s_t.dtype != cdt or m.dtype != cdt:
        s_t, v_t, m, u, w = s_t.to(cdt), v_t.to(cdt), m.to(cdt), u.to(cdt), w.to(cdt)
    # combine(state, (s_t, 1, v_t)) written out for one token: this runs once per event per layer.
    m_new = torch.maximum(m, s_t)
    shift = m_new.clamp_min(torch.finfo(m_new.dtype).min)  # as in combine
    c_old = torch.exp(m - shift)  # [B, H]
    c_new = torch.exp(s_t - shift)
    u_new = torch.addcmul(c_new, u, c_old)
    w_new = torch.addcmul(v_t * c_new.unsqueeze(-1), w, c_old.unsqueeze(-1))
    o = w_new / u_new.unsqueeze(-1)
    return (o if o.dtype == out_dtype else o.to(out_dtype)), ScanState(m_new, u_new, w_new)
