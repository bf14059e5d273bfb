"""Labelled sequences in plain numpy, for the classification task (``class``).

``ClassSet`` is a list of sequences ``[n_i, C]`` with integer labels; ``ClassData`` an archive's own
train / test split with a per-channel standardization ``z = (x - mean) / std`` fitted on all train
steps (NaN ignored), and a stratified validation split held out of train.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from aaren.formats.errors import DataError

__all__ = ["ClassData", "ClassSet", "stratified_holdout"]


def stratified_holdout(labels: np.ndarray, n_classes: int, fraction: float, seed: int) -> np.ndarray:
    """A mask ``[n]`` of ``round(fraction * n_k)`` sequences of each class ``k`` (``labels [n]``),
    drawn by one generator seeded with ``seed`` over the classes in order."""
    rng = np.random.default_rng(seed)
    held = np.zeros(len(labels), dtype=bool)
    for k in range(n_classes):
        members = np.flatnonzero(labels == k)
        rng.shuffle(members)
        held[members[: round(fraction * len(members))]] = True
    return held


@dataclasses.dataclass(frozen=True)
class ClassSet:
    """Labelled sequences: ``series[i] [n_i, C]`` float32, ``labels [n]`` int64 in ``[0, K)``."""

    series: list[np.ndarray]
    labels: np.ndarray

    def __post_init__(self) -> None:
        labels = np.asarray(self.labels, dtype=np.int64)
        if labels.shape != (len(self.series),):
            raise DataError(f"{len(self.series)} sequences but labels of shape {labels.shape}")
        object.__setattr__(self, "labels", labels)

    def __len__(self) -> int:
        return len(self.series)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(s) for s in self.series], dtype=np.int64)

    def subset(self, index: Sequence[int] | np.ndarray) -> ClassSet:
        return ClassSet([self.series[i] for i in index], self.labels[np.asarray(index, dtype=np.int64)])


@dataclasses.dataclass(frozen=True)
class ClassData:
    """A classification archive: ``train`` and ``test`` as the archive splits them, class names,
    channel names, and ``mean, std [C]`` over all train steps (NaN ignored)."""

    name: str
    train: ClassSet
    test: ClassSet
    class_names: tuple[str, ...]
    channels: tuple[str, ...]
    source: str = ""
    mean: np.ndarray = dataclasses.field(default=None, repr=False)  # type: ignore[assignment]
    std: np.ndarray = dataclasses.field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        widths = {s.shape[1] for s in self.train.series + self.test.series}
        if widths != {len(self.channels)}:
            raise DataError(
                f"{self.name}: sequences have {sorted(widths)} channels; names given for {len(self.channels)}"
            )
        k = len(self.class_names)
        for part, data in (("train", self.train), ("test", self.test)):
            if len(data) == 0 or data.labels.min() < 0 or data.labels.max() >= k:
                raise DataError(f"{self.name}: {part} needs at least one sequence and labels in [0, {k})")
        if self.mean is None or self.std is None:
            steps = np.concatenate(self.train.series).astype(np.float64)
            std = np.nanstd(steps, axis=0)
            object.__setattr__(self, "mean", np.nanmean(steps, axis=0).astype(np.float32))
            object.__setattr__(self, "std", np.where(std > 1e-8, std, 1.0).astype(np.float32))

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    def validation_split(self, fraction: float = 0.2, seed: int = 0) -> tuple[ClassSet, ClassSet]:
        """The archive has no validation part: hold out ``fraction`` of each class of train
        (stratified, seeded) for model selection, so the test part is never used to choose."""
        held = stratified_holdout(self.train.labels, self.n_classes, fraction, seed)
        return self.train.subset(np.flatnonzero(~held)), self.train.subset(np.flatnonzero(held))
