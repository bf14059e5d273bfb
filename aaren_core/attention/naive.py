"""The O(N^2) reference of Aaren attention: a causal softmax, no state and no ``combine``.

It is what the scan and the step are tested against (tests/core/test_functional.py), so it shares
nothing with them but the shape check.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aaren_core.attention.combine import check_shapes, compute_dtype

__all__ = ["attention_naive"]


def attention_naive(s: Tensor, v: Tensor) -> Tensor:
    """The O(N^2) reference: causal softmax of scores applied to values.

    ``o[b, k, h] = sum_{i<=k} softmax_i(s[b, :k+1, h]) v[b, i, h]``. Shapes ``s [B, N, H]``,
    ``v [B, N, H, D]`` -> ``o [B, N, H, D]``. Independent of the scan: no state, no combine.
    """
    check_shapes(s, v)
    cdt = compute_dtype(s.dtype)
    n = s.shape[1]
    scores = s.to(cdt).transpose(1, 2).unsqueeze(2).expand(-1, -1, n, -1)  # [B, H, N(k), N(i)]
    future = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)  # [B, H, N, N]
    o = weights @ v.to(cdt).transpose(1, 2)  # [B, H, N, D]
    return o.transpose(1, 2).to(v.dtype)
