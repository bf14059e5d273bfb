"""Blocks of the backbones: Aaren attention, causal self-attention with a KV cache, feed-forward.

Both blocks are pre-norm residual blocks, ``x + mix(LN(x))`` then ``x + FF(LN(x))``, and differ
only in the token mixer, so that Aaren and the Transformer are compared like for like
(Feng et al. 2024, section 4).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aaren_core.attention import ScanState, attention_scan, attention_step, empty_state

__all__ = ["AarenAttention", "AarenLayer", "CausalSelfAttention", "FeedForward", "TransformerLayer"]


def _dropout(p: float) -> nn.Module:
    """Dropout, or nothing at all when ``p == 0``: the serving step calls it twice per layer."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class FeedForward(nn.Module):
    """``Linear(d, d_ff) -> GELU -> Linear(d_ff, d) -> dropout``; ``[..., d] -> [..., d]``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = _dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc2(F.gelu(self.fc1(x))))


class AarenAttention(nn.Module):
    """Attention with one learned query token, computed as an RNN (the paper's Aaren module).

    The query token ``q0 [d_model]`` goes through the same query projection a Transformer has,
    ``q = W_q q0 + b_q``, split into ``H`` heads of width ``Dh = d_model / H``. For input tokens
    ``x_i``: ``k_i = W_k x_i``, ``v_i = W_v x_i``, ``s_i = q . k_i / sqrt(Dh)`` per head (computed
    with ``W_k`` folded into the query, see ``_score_value_projection``), and the
    mixer returns ``W_o o_k`` with ``o_k`` from ``aaren_core.attention``. Keeping ``W_q`` makes
    Aaren exactly ``d_model`` parameters larger than a Transformer block (the query token), the
    parity the paper reports (3,152,896 vs 3,152,384 for d_model 512, d_ff 2048).

    With ``time_decay`` each head ``h`` also has a learned rate ``lambda_h = exp(log_rate_h) > 0``
    and scores decay with the age of an event: at the time ``t_k`` of event ``k`` the output is

        o_k = sum_{i<=k} exp(s_i - lambda (t_k - t_i)) v_i / sum_{i<=k} exp(s_i - lambda (t_k - t_i))

    The ``- lambda t_k`` part is common to every term and cancels, so this is plain Aaren on the
    scores ``s_i + lambda t_i``: exact, associative, O(1) per event. The state is kept in the frame
    of the last event's time (its running max ``m`` is ``max_i (s_i - lambda (t_last - t_i))``), so an
    event after a gap ``dt`` first ages the state, ``m <- m - lambda dt`` (``u``, ``w`` are relative to
    ``m`` and do not change), then steps as usual; times never grow without bound in the state.
    ``dt`` comes in units of the data's typical gap (``EventModel`` scales it), ``0`` for a
    session's first event. Initial rates span ``1e-3 .. 1`` per typical gap over the heads, from
    a nearly order-free head to one that mostly sees the last few events.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, time_decay: bool = False) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.query = nn.Parameter(torch.randn(d_model) * 0.02)
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = _dropout(dropout)
        self.log_rate = (
            nn.Parameter(torch.linspace(math.log(1e-3), 0.0, n_heads) if n_heads > 1 else torch.full((1,), -4.6))
            if time_decay
            else None
        )
        self._fused: tuple[tuple[tuple[int, int], ...], Tensor, Tensor] | None = None

    def decay_rate(self) -> Tensor | None:
        """``lambda [H]``, the per-head decay rate per unit of (scaled) time; None without time decay."""
        return None if self.log_rate is None else torch.exp(self.log_rate)

    def _query(self) -> Tensor:
        return self.q_proj(self.query).view(self.n_heads, self.head_dim)  # [H, Dh]

    def _score_value_projection(self) -> tuple[Tensor, Tensor]:
        """One linear map ``x -> [s, v]``: weight ``[H + d, d]``, bias ``[H + d]``.

        The query is fixed per layer, so the score needs no key vector:
        ``s_h = q_h . (W_k x + b_k)_h / sqrt(Dh) = (W_k,h^T q_h / sqrt(Dh)) . x + q_h . b_k,h / sqrt(Dh)``.
        This folds ``W_k`` into an ``[H, d]`` matrix (d x H work per token instead of d x d) and
        lets one matmul give scores and values. Without autograd (serving) the result is cached
        until a parameter changes.
        """
        params = (self.query, self.q_proj.weight, self.q_proj.bias, self.k_proj.weight, self.k_proj.bias)
        params += (self.v_proj.weight, self.v_proj.bias)
        # Under torch.compile the fusion is traced into the graph instead (data pointers cannot be).
        cacheable = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
        key = tuple((p.data_ptr(), p._version) for p in params) if cacheable else ()
        if cacheable and self._fused is not None and self._fused[0] == key:
            return self._fused[1], self._fused[2]
        h, dh = self.n_heads, self.head_dim
        q = self._query() / math.sqrt(dh)  # [H, Dh]
        w_s = torch.einsum("hj,hjd->hd", q, self.k_proj.weight.view(h, dh, -1))  # [H, d]
        b_s = (q * self.k_proj.bias.view(h, dh)).sum(-1)  # [H]
        weight = torch.cat([w_s, self.v_proj.weight])
        bias = torch.cat([b_s, self.v_proj.bias])
        if cacheable:
            self._fused = (key, weight, bias)
        return weight, bias

    def init_state(self, batch: int, device: torch.device | str | None = None) -> ScanState:
        return empty_state(batch, self.n_heads, self.head_dim, dtype=self.query.dtype, device=device)

    def forward(self, x: Tensor, state: ScanState | None = None, dt: Tensor | None = None) -> tuple[Tensor, ScanState]:
        """``x [B, N, d]``, optional state, gaps ``dt [B, N]`` (scaled; used with time decay only)
        -> ``(y [B, N, d], final state)``."""
        b, n, d = x.shape
        sv = F.linear(x, *self._score_value_projection())  # [B, N, H + d]
        s = sv[..., : self.n_heads]  # [B, N, H]
        v = sv[..., self.n_heads :].reshape(b, n, self.n_heads, self.head_dim)  # [B, N, H, Dh]
        rate = self.decay_rate()
        if rate is None or dt is None:
            o, state = attention_scan(s, v, state)
            return self.dropout(self.out_proj(o.reshape(b, n, d))), state
        # Ages relative to the state's frame (the previous event): s_i + lambda t_i, t_i = dt_1 + ... + dt_i.
        cdt = torch.float64 if s.dtype == torch.float64 else torch.float32
        t = torch.cumsum(dt.to(torch.float64), dim=1).to(cdt)  # [B, N]
        age = t.unsqueeze(-1) * rate.to(cdt)  # [B, N, H]
        o, state = attention_scan(s.to(cdt) + age, v, state)
        state = ScanState(state.m - age[:, -1].to(state.m.dtype), state.u, state.w) if n else state
        return self.dropout(self.out_proj(o.reshape(b, n, d))), state

    def step(self, x_t: Tensor, state: ScanState, dt: Tensor | None = None) -> tuple[Tensor, ScanState]:
        """``x_t [B, d]``, state, gap ``dt [B]`` (scaled; time decay only) -> ``(y_t [B, d], new state)``:
        O(1) in the history length."""
        b, d = x_t.shape
        sv = F.linear(x_t, *self._score_value_projection())  # [B, H + d]
        s = sv[:, : self.n_heads]  # [B, H]
        v = sv[:, self.n_heads :].reshape(b, self.n_heads, self.head_dim)  # [B, H, Dh]
        rate = self.decay_rate()
        if rate is not None and dt is not None:
            state = ScanState(state.m - dt.to(state.m.dtype).unsqueeze(-1) * rate.to(state.m.dtype), state.u, state.w)
        o, state = attention_step(s, v, state)
        return self.out_proj(o.reshape(b, d)), state


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention whose state is the KV cache ``(k, v) [B, H, T, Dh]``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = _dropout(dropout)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, N, Dh]

    def forward(self, x: Tensor, cache: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``x [B, N, d]``, optional cache ``(k, v) [B, H, T, Dh]`` -> ``(y [B, N, d], cache [B, H, T+N, Dh])``."""
        b, n, d = x.shape
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        past = 0
        if cache is not None:
            past = cache[0].shape[2]
            k = torch.cat([cache[0].to(k.dtype), k], dim=2)
            v = torch.cat([cache[1].to(v.dtype), v], dim=2)
        if past == 0:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            rows = torch.arange(n, device=x.device).unsqueeze(1)
            cols = torch.arange(past + n, device=x.device).unsqueeze(0)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=cols <= rows + past)
        y = self.out_proj(o.transpose(1, 2).reshape(b, n, d))
        return self.dropout(y), (k, v)


class AarenLayer(nn.Module):
    """Pre-norm residual block with Aaren as the token mixer; state ``ScanState`` per block."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, time_decay: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.mixer = AarenAttention(d_model, n_heads, dropout, time_decay)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)

    def forward(self, x: Tensor, state: ScanState | None = None, dt: Tensor | None = None) -> tuple[Tensor, ScanState]:
        """``x [B, N, d]``, optional ``dt [B, N]`` -> ``(y [B, N, d], state)``."""
        h, state = self.mixer(self.norm1(x), state, dt)
        x = x + h
        return x + self.ff(self.norm2(x)), state

    def step(self, x_t: Tensor, state: ScanState, dt: Tensor | None = None) -> tuple[Tensor, ScanState]:
        """``x_t [B, d]``, optional ``dt [B]`` -> ``(y_t [B, d], state)``."""
        h, state = self.mixer.step(self.norm1(x_t), state, dt)
        x_t = x_t + h
        return x_t + self.ff(self.norm2(x_t)), state


class TransformerLayer(nn.Module):
    """Pre-norm residual block with causal self-attention; state: its KV cache."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.mixer = CausalSelfAttention(d_model, n_heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)

    def forward(self, x: Tensor, cache: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``x [B, N, d]`` -> ``(y [B, N, d], cache (k, v) [B, H, T+N, Dh])``."""
        h, cache = self.mixer(self.norm1(x), cache)
        x = x + h
        return x + self.ff(self.norm2(x)), cache
