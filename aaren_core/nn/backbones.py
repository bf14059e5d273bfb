"""Backbones with one interface: Aaren, Transformer with a KV cache, GRU.

Every backbone maps embedded events ``x [B, N, d_model]`` to features ``y [B, N, d_model]`` and has

- ``forward(x) -> y``: the whole sequence in parallel (training);
- ``prefill(x, state=None, dt=None) -> (y, state)``: the same, resuming from and returning a state;
- ``init_state(batch) -> state``: the state before any event;
- ``step(x_t [B, d_model], state, dt=None) -> (y_t [B, d_model], state)``: one event per row;

``dt [B, N]`` / ``[B]`` are the events' gaps (in units of the data's typical gap, 0 for a
session's first event); only an Aaren backbone with ``time_decay`` reads them.
- ``state_nbytes(state) -> int`` and ``state_from_bytes(data) -> state``.

States are never mutated in place (``aaren_core.attention.state``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Generic, Literal, TypeVar

import torch
from torch import Tensor, nn

from aaren_core.attention import ScanState
from aaren_core.attention.state import AarenState, GRUState, KVCacheState, State
from aaren_core.config import ConfigRecord, fields_of
from aaren_core.nn.layers import AarenLayer, TransformerLayer

__all__ = [
    "AarenModel",
    "Backbone",
    "BackboneConfig",
    "BackboneSizes",
    "GRUModel",
    "TransformerModel",
    "build_backbone",
]

BackboneKind = Literal["aaren", "transformer", "gru"]
S = TypeVar("S", bound=State)


@dataclasses.dataclass(frozen=True)
class BackboneSizes:
    """The sizes of a backbone: width ``d_model``, ``n_layers``, attention ``n_heads``, feed-forward
    width ``d_ff`` and ``dropout``. ``BackboneConfig`` and the train configs (which name the kind and
    the time decay by keys of their own) take these fields from here."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 0
    dropout: float = 0.0


@dataclasses.dataclass(frozen=True)
class BackboneConfig(BackboneSizes, ConfigRecord):
    """A backbone: its ``kind`` and ``BackboneSizes``. ``d_ff`` defaults to ``4 d_model``; the GRU
    ignores heads and ``d_ff``. ``time_decay``: Aaren scores decay with each event's age
    (``AarenAttention``)."""

    CONFIG_NAME: ClassVar[str] = "backbone config"
    RECORD_LEADS: ClassVar[tuple[str, ...]] = ("kind",)

    kind: BackboneKind = "aaren"
    time_decay: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("aaren", "transformer", "gru"):
            raise ValueError(f"unknown backbone kind {self.kind!r}; expected 'aaren', 'transformer' or 'gru'")
        if self.time_decay and self.kind != "aaren":
            raise ValueError(f"time_decay is a property of the aaren backbone; got kind {self.kind!r}")
        if self.d_model <= 0 or self.n_layers <= 0 or self.n_heads <= 0:
            raise ValueError(f"d_model, n_layers and n_heads must be positive; got {self}")
        if self.kind != "gru" and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.d_ff == 0:
            object.__setattr__(self, "d_ff", 4 * self.d_model)

    @classmethod
    def sized_as(cls, sizes: BackboneSizes, kind: str, time_decay: bool) -> BackboneConfig:
        """A ``kind`` backbone with the ``BackboneSizes`` of ``sizes`` (a train config)."""
        return cls(kind=kind, time_decay=time_decay, **fields_of(BackboneSizes, sizes))  # type: ignore[arg-type]


class Backbone(nn.Module, Generic[S]):
    """The shared interface (see the module docstring)."""

    state_type: ClassVar[type[State]]

    def __init__(self, config: BackboneConfig) -> None:
        super().__init__()
        self.config = config
        self.norm = nn.LayerNorm(config.d_model)

    @property
    def _dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    @property
    def _device(self) -> torch.device:
        return self.norm.weight.device

    def forward(self, x: Tensor) -> Tensor:
        """``x [B, N, d_model] -> y [B, N, d_model]`` in parallel."""
        return self.prefill(x)[0]

    def prefill(self, x: Tensor, state: S | None = None, dt: Tensor | None = None) -> tuple[Tensor, S]:
        raise NotImplementedError

    def init_state(self, batch: int, device: torch.device | str | None = None) -> S:
        raise NotImplementedError

    def step(self, x_t: Tensor, state: S, dt: Tensor | None = None) -> tuple[Tensor, S]:
        raise NotImplementedError

    def state_nbytes(self, state: S) -> int:
        """Bytes of ``state`` per row (per session)."""
        return state.nbytes // max(1, state.batch_size)

    def state_from_bytes(self, data: bytes, model_version: str | None = None) -> S:
        """Parse a state written by ``State.to_bytes``, checking it fits this backbone."""
        like = self.init_state(1, device="cpu")
        return self.state_type.from_bytes(data, like=like, model_version=model_version, device=self._device)  # type: ignore[return-value]

    def _check_input(self, x: Tensor, dims: int) -> None:
        if x.dim() != dims or x.shape[-1] != self.config.d_model:
            want = "[B, N, d_model]" if dims == 3 else "[B, d_model]"
            raise ValueError(f"expected input {want} with d_model={self.config.d_model}; got {tuple(x.shape)}")


class AarenModel(Backbone[AarenState]):
    """A stack of ``AarenLayer`` blocks and a final LayerNorm; state ``AarenState`` of constant size."""

    state_type = AarenState

    def __init__(self, config: BackboneConfig) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(
            AarenLayer(config.d_model, config.n_heads, config.d_ff, config.dropout, config.time_decay)
            for _ in range(config.n_layers)
        )

    def init_state(self, batch: int, device: torch.device | str | None = None) -> AarenState:
        device = self._device if device is None else device
        per_layer = [layer.mixer.init_state(batch, device) for layer in self.layers]
        return _pack_aaren(per_layer, torch.zeros(batch, dtype=torch.long, device=device))

    def prefill(
        self, x: Tensor, state: AarenState | None = None, dt: Tensor | None = None
    ) -> tuple[Tensor, AarenState]:
        self._check_input(x, 3)
        state = self.init_state(x.shape[0], x.device) if state is None else state
        h, new = x, []
        for i, layer in enumerate(self.layers):
            h, layer_state = layer(h, _layer_state(state, i), dt)
            new.append(layer_state)
        return self.norm(h), _pack_aaren(new, state.n_events + x.shape[1])

    def step(self, x_t: Tensor, state: AarenState, dt: Tensor | None = None) -> tuple[Tensor, AarenState]:
        self._check_input(x_t, 2)
        h, new = x_t, []
        for i, layer in enumerate(self.layers):
            h, layer_state = layer.step(h, _layer_state(state, i), dt)
            new.append(layer_state)
        return self.norm(h), _pack_aaren(new, state.n_events + 1)


def _layer_state(state: AarenState, i: int) -> ScanState:
    return ScanState(state.m[:, i], state.u[:, i], state.w[:, i])


def _pack_aaren(per_layer: list[ScanState], n_events: Tensor) -> AarenState:
    return AarenState(
        m=torch.stack([s.m for s in per_layer], dim=1),  # [B, L, H]
        u=torch.stack([s.u for s in per_layer], dim=1),  # [B, L, H]
        w=torch.stack([s.w for s in per_layer], dim=1),  # [B, L, H, Dh]
        n_events=n_events,
    )


class TransformerModel(Backbone[KVCacheState]):
    """The paper's baseline: the same blocks with causal self-attention; state: the KV cache."""

    state_type = KVCacheState

    def __init__(self, config: BackboneConfig) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(
            TransformerLayer(config.d_model, config.n_heads, config.d_ff, config.dropout)
            for _ in range(config.n_layers)
        )

    def init_state(self, batch: int, device: torch.device | str | None = None) -> KVCacheState:
        device = self._device if device is None else device
        c = self.config
        shape = (batch, c.n_layers, c.n_heads, 0, c.d_model // c.n_heads)
        empty = torch.zeros(shape, dtype=self._dtype, device=device)
        return KVCacheState(k=empty, v=empty.clone(), n_events=torch.zeros(batch, dtype=torch.long, device=device))

    def prefill(
        self, x: Tensor, state: KVCacheState | None = None, dt: Tensor | None = None
    ) -> tuple[Tensor, KVCacheState]:
        self._check_input(x, 3)
        state = self.init_state(x.shape[0], x.device) if state is None else state
        h, ks, vs = x, [], []
        for i, layer in enumerate(self.layers):
            cache = (state.k[:, i], state.v[:, i]) if state.k.shape[3] else None
            h, (k, v) = layer(h, cache)
            ks.append(k)
            vs.append(v)
        return self.norm(h), KVCacheState(
            k=torch.stack(ks, dim=1), v=torch.stack(vs, dim=1), n_events=state.n_events + x.shape[1]
        )

    def step(self, x_t: Tensor, state: KVCacheState, dt: Tensor | None = None) -> tuple[Tensor, KVCacheState]:
        self._check_input(x_t, 2)
        y, state = self.prefill(x_t.unsqueeze(1), state)
        return y.squeeze(1), state


class GRUModel(Backbone[GRUState]):
    """A stacked GRU (``torch.nn.GRU``) and a final LayerNorm; state ``h [B, L, d_model]``."""

    state_type = GRUState

    def __init__(self, config: BackboneConfig) -> None:
        super().__init__(config)
        self.gru = nn.GRU(
            config.d_model,
            config.d_model,
            num_layers=config.n_layers,
            batch_first=True,
            dropout=config.dropout if config.n_layers > 1 else 0.0,
        )

    def init_state(self, batch: int, device: torch.device | str | None = None) -> GRUState:
        device = self._device if device is None else device
        c = self.config
        return GRUState(
            h=torch.zeros(batch, c.n_layers, c.d_model, dtype=self._dtype, device=device),
            n_events=torch.zeros(batch, dtype=torch.long, device=device),
        )

    def prefill(self, x: Tensor, state: GRUState | None = None, dt: Tensor | None = None) -> tuple[Tensor, GRUState]:
        self._check_input(x, 3)
        state = self.init_state(x.shape[0], x.device) if state is None else state
        y, h = self.gru(x, state.h.transpose(0, 1).contiguous())  # h [L, B, d]
        return self.norm(y), GRUState(h=h.transpose(0, 1), n_events=state.n_events + x.shape[1])

    def step(self, x_t: Tensor, state: GRUState, dt: Tensor | None = None) -> tuple[Tensor, GRUState]:
        self._check_input(x_t, 2)
        y, state = self.prefill(x_t.unsqueeze(1), state)
        return y.squeeze(1), state


BACKBONES: dict[str, type[Backbone[Any]]] = {
    "aaren": AarenModel,
    "transformer": TransformerModel,
    "gru": GRUModel,
}


def build_backbone(config: BackboneConfig) -> Backbone[Any]:
    """The backbone named by ``config.kind``."""
    return BACKBONES[config.kind](config)
