"""Offline scores of the class task: accuracy of the final prediction, and accuracy after a
fraction ``f`` of each sequence (the prediction at step ``ceil(f n_i)``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch

from aaren_core.tasks.classify.model import ClassModel
from aaren_core.tasks.series.data import ClassSet

__all__ = ["DEFAULT_FRACTIONS", "EarlyAccuracy", "class_logits", "early_accuracy", "pad_sequences"]

DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def pad_sequences(seqs: Sequence[np.ndarray]) -> np.ndarray:
    """Sequences ``[n_i, C]`` zero-padded at the end into one ``[B, max n_i, C]`` float32 batch."""
    n = max(len(s) for s in seqs)
    padded = np.zeros((len(seqs), n, seqs[0].shape[1]), dtype=np.float32)
    for j, s in enumerate(seqs):
        padded[j, : len(s)] = s
    return padded


@torch.no_grad()
def class_logits(model: ClassModel, data: ClassSet, batch: int = 64) -> list[np.ndarray]:
    """Logits after every step of every sequence: ``[n_i, K]`` each, in order."""
    out: list[np.ndarray] = []
    for i in range(0, len(data), batch):
        seqs = data.series[i : i + batch]
        logits = model(torch.from_numpy(pad_sequences(seqs))).numpy()
        out.extend(logits[j, : len(s)] for j, s in enumerate(seqs))
    return out


@dataclasses.dataclass(frozen=True)
class EarlyAccuracy:
    """Accuracy at the end and after each fraction of the sequences seen."""

    final: float
    by_fraction: dict[float, float]


def early_accuracy(
    logits: Sequence[np.ndarray], labels: np.ndarray, fractions: Sequence[float] = DEFAULT_FRACTIONS
) -> EarlyAccuracy:
    """``logits[i] [n_i, K]``, ``labels [n]``: the prediction after ``ceil(f n_i)`` steps (at least
    one) scored for each fraction ``f``; ``final`` is ``f = 1``."""
    by = {}
    for f in fractions:
        hits = [
            int(np.argmax(lg[max(1, math.ceil(f * len(lg) - 1e-9)) - 1]) == y)
            for lg, y in zip(logits, labels, strict=True)
        ]
        by[float(f)] = float(np.mean(hits))
    final = float(np.mean([int(np.argmax(lg[-1]) == y) for lg, y in zip(logits, labels, strict=True)]))
    return EarlyAccuracy(final, by)
