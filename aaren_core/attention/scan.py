"""Aaren attention by a parallel prefix scan over ``combine``: chunked (the default) or Hillis-Steele.

``attention_scan(s [B, N, H], v [B, N, H, D], state) -> (o [B, N, H, D], final state)`` with
``o_k = w_k / u_k`` for ``(m_k, u_k, w_k) = combine(state, x_1, ..., x_k)``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from aaren_core.attention.combine import (
    ScanState,
    check_shapes,
    check_state,
    combine,
    compute_dtype,
    empty_state,
    leaves,
)

__all__ = ["DEFAULT_CHUNK", "attention_scan", "scan_chunked", "scan_hillis_steele"]

DEFAULT_CHUNK = 16


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
    check_shapes(s, v)
    cdt = compute_dtype(s.dtype)
    b, n, h = s.shape
    d = v.shape[-1]
    if state is None:
        state = empty_state(b, h, d, dtype=cdt, device=s.device)
    else:
        check_state(state, s, v)
        state = ScanState(state.m.to(cdt), state.u.to(cdt), state.w.to(cdt))
    if n == 0:
        return v.new_zeros(b, 0, h, d), state
    sc, vc = s.to(cdt), v.to(cdt)
    if method == "chunked":
        prefix = scan_chunked(sc, vc, chunk)
    elif method == "hillis_steele":
        prefix = scan_hillis_steele(leaves(sc, vc))
    else:
        raise ValueError(f"unknown scan method {method!r}; expected 'chunked' or 'hillis_steele'")
    full = combine(
        ScanState(state.m.unsqueeze(1), state.u.unsqueeze(1), state.w.unsqueeze(1)), prefix
    )  # [B, N, H(, D)]
    o = full.w / full.u.unsqueeze(-1)
    final = ScanState(full.m[:, -1], full.u[:, -1], full.w[:, -1])
    return o.to(v.dtype), final
