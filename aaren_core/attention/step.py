"""Aaren attention for one token: ``combine(state, (s_t, 1, v_t))`` written out (the serving step)."""

from __future__ import annotations

import torch
from torch import Tensor

from aaren_core.attention.combine import ScanState, compute_dtype

__all__ = ["attention_step"]


def attention_step(s_t: Tensor, v_t: Tensor, state: ScanState) -> tuple[Tensor, ScanState]:
    """One token: ``s_t [B, H]``, ``v_t [B, H, D]``, state -> ``(o_t [B, H, D], new state)``.

    ``m' = max(m, s_t)``, ``u' = u exp(m - m') + exp(s_t - m')``, ``w' = w exp(m - m') + v_t exp(s_t - m')``,
    ``o_t = w' / u'`` (docs/architecture.md section 1).
    """
    if s_t.dim() != 2 or v_t.dim() != 3 or v_t.shape[:2] != s_t.shape:
        raise ValueError(f"expected s_t [B, H] and v_t [B, H, D]; got {tuple(s_t.shape)} and {tuple(v_t.shape)}")
    cdt = compute_dtype(s_t.dtype)
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
