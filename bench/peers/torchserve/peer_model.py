"""The TorchServe peer's model: a recurrent Aaren step stack the size of aaren's backbone, random weights
from a seed (no training, no forecast maths: the peer's job is the serving, not the model).

Per layer (``D`` = 64 wide, ``H`` = 4 heads of ``DH`` = 16, feed-forward ``FF`` = 256), an input ``x [B, D]``
and a state per head ``m [B, H]``, ``u [B, H]``, ``w [B, H, DH]`` (Aaren's running max, denominator and
numerator; docs/architecture.md section 1):

    k, v = split(W_kv LN(x));   s = <q_h, k_h> / sqrt(DH)          (q_h: a learned query per head)
    m' = max(m, s);   u' = u exp(m - m') + exp(s - m');   w' = w exp(m - m') + v exp(s - m')
    x <- x + W_o (w' / u');   x <- x + FF(LN(x))

then a linear head ``D -> OUT`` (16). 92,816 parameters. The handler and the client's ``--verify`` build it
from the same seed, so a served reply equals a local run of the whole sequence to float32 rounding.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

D, H, FF, LAYERS, OUT = 64, 4, 256, 2, 16
DH = D // H
State = tuple[Tensor, Tensor, Tensor]  # m [B, LAYERS, H], u [B, LAYERS, H], w [B, LAYERS, H, DH]


class StepLayer(nn.Module):
    """One Aaren layer, one step: ``(x [B, D], m, u, w) -> (x', m', u', w')`` (shapes as above, per layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm_in = nn.LayerNorm(D)
        self.kv = nn.Linear(D, 2 * D)
        self.query = nn.Parameter(torch.randn(H, DH) / math.sqrt(DH))
        self.out = nn.Linear(D, D)
        self.norm_ff = nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, FF), nn.ReLU(), nn.Linear(FF, D))

    def forward(self, x: Tensor, m: Tensor, u: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        batch = x.shape[0]
        k, v = self.kv(self.norm_in(x)).view(batch, 2, H, DH).unbind(1)
        s = (k * self.query).sum(-1) / math.sqrt(DH)
        m_new = torch.maximum(m, s)
        keep, add = torch.exp(m - m_new), torch.exp(s - m_new)
        u_new = u * keep + add
        w_new = w * keep.unsqueeze(-1) + v * add.unsqueeze(-1)
        x = x + self.out((w_new / u_new.unsqueeze(-1)).reshape(batch, D))
        return x + self.ff(self.norm_ff(x)), m_new, u_new, w_new


class PeerModel(nn.Module):
    """``LAYERS`` step layers and the head, weights drawn from ``seed`` (the global RNG is left as it was)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.layers = nn.ModuleList([StepLayer() for _ in range(LAYERS)])
            self.head = nn.Linear(D, OUT)
        self.eval()

    @staticmethod
    def initial_state(batch: int = 1) -> State:
        """The empty state: ``m`` = -1e30 (no score yet), ``u`` = ``w`` = 0."""
        return torch.full((batch, LAYERS, H), -1e30), torch.zeros(batch, LAYERS, H), torch.zeros(batch, LAYERS, H, DH)

    @torch.no_grad()
    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        """One event per row: ``x [B, D]`` -> ``(y [B, OUT], state')``."""
        m, u, w = state
        ms, us, ws = [], [], []
        for i, layer in enumerate(self.layers):
            x, mi, ui, wi = layer(x, m[:, i], u[:, i], w[:, i])
            ms.append(mi)
            us.append(ui)
            ws.append(wi)
        return self.head(x), (torch.stack(ms, 1), torch.stack(us, 1), torch.stack(ws, 1))
