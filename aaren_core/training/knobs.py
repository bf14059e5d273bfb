"""The knobs of a training run that every task's train config has, declared once: ``TrainKnobs``."""

from __future__ import annotations

import dataclasses
import math

__all__ = ["TrainKnobs"]


@dataclasses.dataclass(frozen=True)
class TrainKnobs:
    """How a run trains, whatever the task, in four groups: each step, a batch of ``batch_size``
    (sessions, windows or sequences), AdamW with learning rate ``lr`` and ``weight_decay``, the
    gradient norm clipped to ``grad_clip`` (0: none); what the run writes, the run directory
    ``out_dir`` and the served model ``name`` (empty: the config's ``run_name``); how long it runs,
    at most ``epochs``, early stopping after ``patience`` epochs without a better validation score,
    a time budget of ``max_minutes`` after which no new epoch starts (0: none); and the process, ``seed``
    of everything random and ``threads`` torch CPU threads (0: torch's default).

    The base of the event task's ``TrainConfig`` (whose defaults these are) and of the series and
    class tasks' ``TaskTrainConfig`` (which declares its own ``batch_size``, ``lr``, ``weight_decay``,
    ``out_dir``, ``epochs`` and ``patience``). The keys are written flat, beside the config's own.
    """

    batch_size: int = 8
    lr: float = 2e-3
    weight_decay: float = 0.01
    grad_clip: float = 1.0

    out_dir: str = "runs/aaren"
    name: str = ""

    epochs: int = 40
    patience: int = 8
    max_minutes: float = 0.0

    seed: int = 0
    threads: int = 0

    def knob_checks(self) -> dict[str, bool]:
        """What the knobs must hold (expectation -> whether it does), for ``ConfigRecord.require``."""
        return {
            "batch_size >= 1": self.batch_size >= 1,
            "lr > 0": self.lr > 0,
            "weight_decay >= 0": self.weight_decay >= 0,
            "grad_clip >= 0": self.grad_clip >= 0,
            "epochs >= 1": self.epochs >= 1,
            "patience >= 1": self.patience >= 1,
            "max_minutes >= 0": self.max_minutes >= 0 and math.isfinite(self.max_minutes),
            "threads >= 0": self.threads >= 0,
        }
