"""Recurrent states of the backbones as typed, immutable, storable objects.

Every state is a frozen dataclass of tensors whose first dim is the batch (one row per session)
plus ``n_events [B]``, the number of events each row has seen. States stack into a batch and
split back, move between devices, and serialize to bytes (safetensors, no pickle) that refuse
another model's shape with a clear error.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, ClassVar, Self

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

__all__ = [
    "AarenState",
    "GRUState",
    "KVCacheState",
    "State",
    "StateFormatError",
    "state_from_bytes",
]

STATE_FORMAT = "aaren-state"
STATE_FORMAT_VERSION = 1
HEADER_KEY = "aaren"


class StateFormatError(ValueError):
    """Bytes that are not a state of the expected kind, version or shape."""


@dataclasses.dataclass(frozen=True, eq=False)
class State:
    """Base of all states: named tensors with a leading batch dim, plus ``n_events [B]``.

    Subclasses declare their tensor fields; ``n_events`` is always the last field.
    """

    kind: ClassVar[str] = "state"
    #: Fields whose second-to-batch dims may differ between states (the KV cache's time dim).
    growing: ClassVar[tuple[str, ...]] = ()

    def tensors(self) -> dict[str, Tensor]:
        """The fields by name, in declaration order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def batch_size(self) -> int:
        return int(self.n_events.shape[0])  # type: ignore[attr-defined]

    @property
    def device(self) -> torch.device:
        return self.n_events.device  # type: ignore[attr-defined]

    @property
    def nbytes(self) -> int:
        """Bytes held by the state's tensors (all rows)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def to(self, device: torch.device | str) -> Self:
        return type(self)(**{k: t.to(device) for k, t in self.tensors().items()})

    def select(self, index: Tensor | Sequence[int] | slice) -> Self:
        """Rows ``index`` of the batch (a gather; the result owns no storage with ``self`` for an index tensor)."""
        if not isinstance(index, slice):
            index = torch.as_tensor(index, dtype=torch.long, device=self.device)
        return type(self)(**{k: t[index] for k, t in self.tensors().items()})

    def split(self) -> list[Self]:
        """One state per row, each with batch size 1."""
        return [self.select(slice(i, i + 1)) for i in range(self.batch_size)]

    @classmethod
    def stack(cls, states: Sequence[Self]) -> Self:
        """Concatenate states along the batch dim (all of one kind and shape)."""
        if not states:
            raise ValueError(f"cannot stack an empty list of {cls.__name__}")
        first = states[0].tensors()
        for st in states[1:]:
            if type(st) is not type(states[0]):
                raise TypeError(f"cannot stack {type(st).__name__} with {type(states[0]).__name__}")
            for k, t in st.tensors().items():
                if t.shape[1:] != first[k].shape[1:]:
                    raise ValueError(
                        f"cannot stack {cls.__name__}: field {k!r} has shape {tuple(t.shape[1:])} "
                        f"per row, expected {tuple(first[k].shape[1:])}"
                    )
        return type(states[0])(**{k: torch.cat([st.tensors()[k] for st in states]) for k in first})

    def spec(self) -> dict[str, list[int | str]]:
        """Per-row shape and dtype of every field (growing dims reported as ``"*"``)."""
        out: dict[str, list[int | str]] = {}
        for k, t in self.tensors().items():
            dims: list[int | str] = list(t.shape[1:])
            if k in self.growing:
                dims[-2] = "*"
            out[k] = [*dims, str(t.dtype).removeprefix("torch.")]
        return out

    def to_bytes(self, model_version: str = "") -> bytes:
        """Serialize (safetensors; bit-exact; no pickle). ``model_version`` is recorded and checked on load."""
        tensors = {k: t.detach().contiguous().cpu() for k, t in self.tensors().items()}
        meta = {
            "format": STATE_FORMAT,
            "format_version": STATE_FORMAT_VERSION,
            "kind": self.kind,
            "model_version": model_version,
            "spec": self.spec(),
        }
        # One metadata entry holding sorted JSON: safetensors keeps metadata in a hash map, so
        # several entries would come out in a different order on every call.
        meta = {HEADER_KEY: json.dumps(meta, sort_keys=True, separators=(",", ":"))}
        return st_save(tensors, metadata=meta)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        like: State | None = None,
        model_version: str | None = None,
        device: torch.device | str = "cpu",
    ) -> Self:
        """Parse bytes written by ``to_bytes``.

        ``like`` (e.g. ``model.init_state(1)``) fixes the expected per-row shapes and dtypes;
        ``model_version`` must equal the recorded one when given. Raises ``StateFormatError`` with
        what was found and what was expected.
        """
        meta, tensors = _parse(data)
        if meta.get("kind") != cls.kind:
            raise StateFormatError(f"state bytes hold a {meta.get('kind')!r} state; expected {cls.kind!r}")
        if model_version is not None and meta.get("model_version") != model_version:
            raise StateFormatError(
                f"state was written by model version {meta.get('model_version')!r}; "
                f"this model is version {model_version!r}"
            )
        names = [f.name for f in dataclasses.fields(cls)]
        if sorted(tensors) != sorted(names):
            raise StateFormatError(f"state bytes hold fields {sorted(tensors)}; expected {sorted(names)}")
        state = cls(**{k: tensors[k].to(device) for k in names})
        batch = {t.shape[0] if t.dim() else None for t in tensors.values()}
        if len(batch) != 1:
            raise StateFormatError(f"state fields disagree on the batch size: {sorted(map(str, batch))}")
        if meta.get("spec") != state.spec():
            raise StateFormatError(f"state bytes do not match their own header spec {meta.get('spec')}")
        if like is not None and state.spec() != like.spec():
            raise StateFormatError(f"state shape {state.spec()} does not match this model's state shape {like.spec()}")
        return state


def _parse(data: bytes) -> tuple[dict[str, Any], dict[str, Tensor]]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise StateFormatError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    try:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + header_len]).get("__metadata__") or {}
        meta = json.loads(header.get(HEADER_KEY, "{}"))
    except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
        raise StateFormatError(f"state bytes are damaged or truncated ({len(data)} bytes): {exc}") from exc
    if not isinstance(meta, dict):
        meta = {}
    if meta.get("format") != STATE_FORMAT:
        raise StateFormatError(f"bytes are not an {STATE_FORMAT!r} (format={meta.get('format')!r})")
    if meta.get("format_version") != STATE_FORMAT_VERSION:
        raise StateFormatError(
            f"state format version {meta.get('format_version')!r} is not supported; expected {STATE_FORMAT_VERSION}"
        )
    return meta, tensors


def state_from_bytes(data: bytes, **kwargs: object) -> State:
    """Parse bytes of any state kind (dispatch on the recorded kind)."""
    meta, _ = _parse(data)
    kinds = {c.kind: c for c in (AarenState, GRUState, KVCacheState)}
    cls = kinds.get(meta.get("kind", ""))
    if cls is None:
        raise StateFormatError(f"unknown state kind {meta.get('kind')!r}; expected one of {sorted(kinds)}")
    return cls.from_bytes(data, **kwargs)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, eq=False)
class AarenState(State):
    """Aaren's constant-size state for ``L`` layers of ``H`` heads of width ``Dh``.

    ``m [B, L, H]`` running max score, ``u [B, L, H]`` rescaled denominator,
    ``w [B, L, H, Dh]`` rescaled numerator, ``n_events [B]`` (int64).
    """

    kind: ClassVar[str] = "aaren"

    m: Tensor
    u: Tensor
    w: Tensor
    n_events: Tensor


@dataclasses.dataclass(frozen=True, eq=False)
class GRUState(State):
    """A stacked GRU's hidden state: ``h [B, L, d_model]``, ``n_events [B]``."""

    kind: ClassVar[str] = "gru"

    h: Tensor
    n_events: Tensor


@dataclasses.dataclass(frozen=True, eq=False)
class KVCacheState(State):
    """A Transformer's KV cache: ``k, v [B, L, H, T, Dh]`` for ``T`` cached tokens, ``n_events [B]``.

    It grows by one token per event. Rows of one batch share ``T``.
    """

    kind: ClassVar[str] = "kv_cache"
    growing: ClassVar[tuple[str, ...]] = ("k", "v")

    k: Tensor
    v: Tensor
    n_events: Tensor
