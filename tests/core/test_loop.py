"""The one training loop (aaren_core.training.loop.fit) with a scripted task: selection, early
stopping on raw and tuple scores, the schedule it sets, the resumed state, and real optimizer steps."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from aaren_core.training import loop


class Scripted:
    """Fits ``y = 3 x`` with one weight; validation returns the scripted scores in turn."""

    def __init__(self, model: nn.Linear, scores: list[Any]) -> None:
        self.model, self.scores = model, list(scores)
        self.best_epochs: list[int] = []
        self.lrs: list[float] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self.x = torch.linspace(-1, 1, 8)[:, None]

    def batches(self, epoch: int) -> list[torch.Tensor]:
        return [self.x[:4], self.x[4:]]

    def step_loss(self, x: torch.Tensor) -> loop.StepLoss:
        assert self.optimizer is not None
        self.lrs.append(self.optimizer.param_groups[0]["lr"])
        loss = (self.model(x) - 3 * x).square().sum()
        return loop.StepLoss(loss, loss.item(), len(x))

    def validate(self, train_loss: float) -> loop.Validation:
        assert not self.model.training
        return loop.Validation(self.scores.pop(0), {"train_loss": train_loss})

    def record(self, end: loop.EpochEnd) -> dict[str, Any]:
        return {"epoch": end.epoch, "score": end.validation.score, "best": end.improved, "lr": end.lr}

    def summary(self, end: loop.EpochEnd, record: dict[str, Any]) -> str:
        return f"epoch {end.epoch}"

    def on_best(self, end: loop.EpochEnd) -> None:
        self.best_epochs.append(end.epoch)

    def on_epoch_end(self, state: loop.LoopState, stopper: loop.EarlyStopping, end: loop.EpochEnd) -> None:
        pass


def run(scores: list[Any], **settings: Any) -> tuple[loop.LoopState, Scripted, list[str]]:
    torch.manual_seed(0)
    model = nn.Linear(1, 1, bias=False)
    task = Scripted(model, scores)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    task.optimizer = optimizer
    lines: list[str] = []
    base = {"epochs": len(scores), "schedule": loop.Schedule.constant(0.05), "patience": 2}
    state = loop.fit(model, optimizer, task, loop.LoopSettings(**{**base, **settings}), say=lines.append)
    return state, task, lines


def test_the_best_raw_score_is_kept_and_patience_ends_the_run():
    state, task, lines = run([3.0, 2.0, 2.5, 2.4, 1.0, 0.5])
    assert state.epoch == 4 and state.stopped_early and lines == ["epoch 1", "epoch 2", "epoch 3", "epoch 4"]
    assert task.best_epochs == [1, 2] and state.best_epoch == 2 and state.best_score == 2.0
    assert [r["best"] for r in state.history] == [True, True, False, False]
    assert state.step == 8 and len(state.step_losses) == 8


def test_smoothing_rides_out_one_bad_epoch_that_the_raw_rule_stops_on():
    scores = [3.0, 2.0, 2.2, 1.9, 1.8, 1.7]
    assert run(scores, patience=1)[0].epoch == 3
    smoothed, _, _ = run(scores, patience=1, smoothing=0.5)
    assert smoothed.epoch == 6 and not smoothed.stopped_early and smoothed.best_epoch == 6


def test_tuple_scores_compare_in_order():
    # (-accuracy, train loss): the same accuracy with a lower loss is better, a lower accuracy is not.
    state, task, _ = run([(-0.5, 2.0), (-0.5, 1.0), (-0.4, 0.1), (-0.5, 1.5)], patience=3)
    assert task.best_epochs == [1, 2] and state.best_score == (-0.5, 1.0) and state.epoch == 4


def test_the_schedule_sets_every_step_and_training_reaches_the_target():
    schedule = loop.Schedule(0.2, total_steps=20, warmup_steps=4, min_lr_ratio=0.1)
    state, task, _ = run([1.0 - 0.01 * i for i in range(10)], schedule=schedule, patience=10)
    assert task.lrs == pytest.approx([schedule.at(s) for s in range(20)])
    assert task.lrs[:4] == pytest.approx([0.05, 0.1, 0.15, 0.2]) and 0.02 < task.lrs[-1] < 0.025
    assert state.history[-1]["lr"] == pytest.approx(schedule.at(19))
    assert abs(task.model.weight.item() - 3.0) < 0.05  # real steps: w -> 3
    assert loop.Schedule.constant(0.3).at(0) == loop.Schedule.constant(0.3).at(10**6) == 0.3


def test_a_resumed_state_goes_on_from_its_epoch():
    first, _, _ = run([3.0, 2.0, 2.5, 1.0], stop_after=2)
    assert first.epoch == 2 and not first.stopped_early
    torch.manual_seed(0)
    model = nn.Linear(1, 1, bias=False)
    task = Scripted(model, [2.5, 1.0])
    task.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = loop.LoopSettings(epochs=4, schedule=loop.Schedule.constant(0.05), patience=2)
    state = loop.fit(model, task.optimizer, task, settings, state=first)
    assert state.epoch == 4 and state.best_epoch == 4 and [r["epoch"] for r in state.history] == [1, 2, 3, 4]


def test_early_stopping_state_round_trips():
    stopper = loop.EarlyStopping(patience=3, min_delta=0.1, smoothing=0.5)
    for val in (2.0, 1.0, 1.2):
        stopper.update(val)
    again = loop.EarlyStopping(patience=3, min_delta=0.1, smoothing=0.5)
    again.load(stopper.state())
    assert again.state() == stopper.state() and not math.isnan(again.smoothed)
    assert again.update(5.0) == stopper.update(5.0)
