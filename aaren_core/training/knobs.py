"""The knobs of a training run that every task's train config has, declared once: ``TrainKnobs``."""

from __future__ import annotations

import dataclasses
import math

__all__ = ["TrainKnobs"]


@dataclasses.dataclass(frozen=True)
class TrainKnobs:
    """How a run trains, whatever the task: at most ``epochs`` of batches of ``batch_size``
    (sessions, windows or sequences), AdamW with learning rate ``lr`` and ``weight_decay``, the
    gradient norm clipped to ``grad_clip`` (0: none), early stopping after ``patience`` epochs
    without a better validation score, ``seed`` of everything random, ``threads`` torch CPU threads
    (0: torch's default), a time budget of ``max_minutes`` after which no new epoch starts (0: none),
    the run directory ``out_dir`` and the served model ``name`` (empty: the config's ``run_name``).

    The base of the event task's ``TrainConfig`` (whose defaults these are) and of the series and
    class tasks' ``TaskTrainConfig`` (which declares its own ``epochs``, ``batch_size``, ``lr``,
    ``weight_decay``, ``patience`` and ``out_dir``). The keys are written flat, beside the config's own.
    """

    epochs: int = 40
    batch_size: int = 8
    lr: float = 2e-3
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    patience: int = 8
    seed: int = 0
    threads: int = 0
    max_minutes: float = 0.0
    out_dir: str = "runs/aaren"
    name: str = ""

    def knob_checks(self) -> dict[str, bool]:
        """What the knobs must hold (expectation -> whether it does), for ``ConfigRecord.require``."""
        return {
            "epochs >= 1": self.epochs >= 1,
            "batch_size >= 1": self.batch_size >= 1,
            "lr > 0": self.lr > 0,
            "weight_decay >= 0": self.weight_decay >= 0,
            "grad_clip >= 0": self.grad_clip >= 0,
            "patience >= 1": self.patience >= 1,
            "threads >= 0": self.threads >= 0,
            "max_minutes >= 0": self.max_minutes >= 0 and math.isfinite(self.max_minutes),
        }
