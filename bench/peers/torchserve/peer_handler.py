"""TorchServe handler of the peer: one state per ``sequence_id`` (an LRU of ``cache.capacity`` sequences),
each batch of sequences run as one step of ``peer_model.PeerModel``.

A request's ``data`` is ``D`` float32 (256 bytes); its reply is ``OUT`` float32 (64 bytes). A sequence
seen for the first time (or evicted) starts from the empty state, as an aaren session does at seq 1.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from peer_model import D, PeerModel, State


class PeerHandler:
    """TorchServe calls ``initialize(context)`` once per worker and ``handle(rows, context)`` per batch."""

    def __init__(self) -> None:
        self.initialized = False
        self.capacity = 1024
        self.states: OrderedDict[str, State] = OrderedDict()

    def initialize(self, context: Any) -> None:
        torch.set_num_threads(1)
        config = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        self.capacity = int(config.get("cache", {}).get("capacity", self.capacity))
        self.model = PeerModel(seed=0)
        self.empty = tuple(t[0] for t in PeerModel.initial_state(1))
        self.initialized = True

    def _state(self, sid: str) -> State:
        state = self.states.get(sid)
        if state is None:
            return self.empty  # type: ignore[return-value]
        self.states.move_to_end(sid)
        return state

    def _keep(self, sid: str, state: State) -> None:
        self.states[sid] = state
        self.states.move_to_end(sid)
        while len(self.states) > self.capacity:
            self.states.popitem(last=False)

    def _step(self, sids: list[str], xs: list[np.ndarray]) -> np.ndarray:
        rows = [self._state(s) for s in sids]
        state = tuple(torch.stack([r[i] for r in rows]) for i in range(3))
        y, (m, u, w) = self.model.step(torch.from_numpy(np.stack(xs)), state)  # type: ignore[arg-type]
        for j, sid in enumerate(sids):
            self._keep(sid, (m[j], u[j], w[j]))
        return y.numpy()

    def handle(self, rows: list[dict[str, bytes]], context: Any) -> list[bytes]:
        sids = [context.get_sequence_id(i) for i in range(len(rows))]
        xs = [np.frombuffer(row.get("data") or row.get("body"), dtype=np.float32, count=D) for row in rows]
        if len(set(sids)) == len(sids):
            return [y.tobytes() for y in self._step(sids, xs)]
        # One sequence twice in a batch (sequence batching should never do it): one at a time, in order.
        return [self._step([sid], [x])[0].tobytes() for sid, x in zip(sids, xs, strict=True)]
