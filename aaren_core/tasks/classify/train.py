"""The class task's part of the training loop, and its test scores.

A ``ClassModel`` trains on padded batches of the archive's train part minus a stratified
``val_fraction`` (the archive has no validation part), loss ``CE(final) + aux_weight *
mean_t CE(p_t)``; selection (``aaren_core.training.loop``) by validation accuracy, ties broken by
the lower train loss; test (``score_class_task``): final accuracy and accuracy after each
fraction of the sequence seen, beside the train majority class.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from aaren_core.tasks.classify.metrics import class_logits, early_accuracy, pad_sequences
from aaren_core.tasks.classify.model import ClassModel, ClassModelConfig, class_loss
from aaren_core.tasks.config import TaskTrainConfig
from aaren_core.tasks.series.data import ClassData, ClassSet
from aaren_core.tasks.series.train import epoch_batches
from aaren_core.training.loop import BestInMemory, EpochEnd, LoopState, StepLoss, Validation

__all__ = ["ClassLoop", "class_model", "score_class_task"]


def class_model(config: TaskTrainConfig, data: ClassData) -> ClassModel:
    """A fresh ``ClassModel`` for ``config``, with the data's normalization."""
    model = ClassModel(ClassModelConfig(config.backbone(), len(data.channels), data.n_classes))
    model.set_normalization(torch.from_numpy(data.mean), torch.from_numpy(data.std))
    return model


def score_class_task(model: ClassModel, config: TaskTrainConfig, data: ClassData) -> dict[str, Any]:
    """``test.accuracy`` at the end and ``test.accuracy_by_fraction`` (keys ``"0.1"``..``"1.0"``),
    beside the train majority class (``baselines``)."""
    model.eval()
    scores = early_accuracy(class_logits(model, data.test), data.test.labels)
    majority = int(np.bincount(data.train.labels, minlength=data.n_classes).argmax())
    return {
        "test": {
            "accuracy": scores.final,
            "accuracy_by_fraction": {str(k): v for k, v in scores.by_fraction.items()},
        },
        "baselines": {
            "majority_class": {
                "class": data.class_names[majority],
                "accuracy": float(np.mean(data.test.labels == majority)),
            }
        },
    }


def _padded(data: ClassSet, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seqs = [data.series[i] for i in index]
    lengths = torch.tensor([len(s) for s in seqs])
    return torch.from_numpy(pad_sequences(seqs)), torch.from_numpy(data.labels[index]), lengths


class ClassLoop(BestInMemory):
    """The class task's part of the loop (``aaren_core.training.loop.TaskLoop``): shuffled padded
    batches, ``class_loss``, the score ``(-val accuracy, train loss)``; the best weights are kept
    in memory."""

    def __init__(self, config: TaskTrainConfig, data: ClassData, model: ClassModel) -> None:
        self.config, self.model = config, model
        self.rng = np.random.default_rng(config.seed)
        self.fit, self.val = data.validation_split(config.val_fraction, config.seed)
        self.keep()

    def batches(self, epoch: int) -> list[np.ndarray]:
        return epoch_batches(self.rng.permutation(len(self.fit)), self.config)

    def step_loss(self, index: np.ndarray) -> StepLoss:
        values, labels, lengths = _padded(self.fit, index)
        loss, _ = class_loss(self.model(values), labels, lengths, self.config.aux_weight)
        return StepLoss(loss, loss.item(), 1)

    def validate(self, train_loss: float) -> Validation:
        val = self.val
        acc = early_accuracy(class_logits(self.model, val), val.labels, (1.0,)).final if len(val) else 0.0
        return Validation((-acc, train_loss), {"accuracy": acc})

    def record(self, end: EpochEnd) -> dict[str, Any]:
        return {
            "epoch": end.epoch - 1,
            "train_loss": end.train_loss,
            "val_accuracy": end.validation.metrics["accuracy"],
        }

    def summary(self, end: EpochEnd, record: dict[str, Any]) -> str:
        return f"epoch {record['epoch']}: train loss {end.train_loss:.4f}, val accuracy {record['val_accuracy']:.3f}"

    def selection(self, state: LoopState) -> dict[str, Any]:
        """What training reports of the selection: the best validation accuracy, its epoch, the epochs run."""
        return self.selected(state, "val_accuracy", -state.best_score[0])
