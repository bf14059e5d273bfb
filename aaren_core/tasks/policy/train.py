"""Training a policy offline (task ``policy``): ``PolicyTrainConfig``, the task's part of the one
training loop, the rollout evaluation, the run directory.

``train_policy(config)`` fits a ``PolicyModel`` (backbone ``aaren``, ``transformer`` or ``gru``) on
windows of ``context`` steps (``aaren_core.tasks.policy.data``) with the squared error of the
predicted actions on the real steps of each window, or a ``BCModel`` (``bc``) on single transitions
(``batch_size * context`` per update, as many action targets as a window batch), through
``aaren_core.training.loop.fit`` (AdamW, linear warm-up then a constant rate, gradient clip, a time
budget ``max_minutes``; an "epoch" is ``steps_per_epoch`` updates, validated by the action MSE on
held-out episodes; the best weights are kept). Then it plays ``eval_episodes`` episodes
(``rollout``) from the target return (``target_return``, 0: DT's per environment) and writes
``<out_dir>/best`` (checkpoint), ``metrics.json`` and ``report.md``.

Recurrent backbones (Aaren, GRU) train like the Transformer, on random windows that each start
from a fresh state (DT's training), and are evaluated with one constant state over the whole episode
(what serving does). Training on windows from the episode's first step only (``windows=episode``)
is the literally consistent choice, but it sees only the first ``context`` timesteps of each
episode. Measured on HalfCheetah-v5 medium (1,000-step episodes, 45 s of training): the constant
state does not collapse (Aaren 5.4, the Transformer 4.6, the data 5.8), episode-start windows are
worse (4.4) and time decay is a tie (5.6), so ``random`` without decay is the default
(docs/tasks.md, "Policies", has the table).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np
import torch
from torch import nn

from aaren_core.checkpoint import load_checkpoint, save_checkpoint
from aaren_core.config import ConfigRecord, field_defaults, fields_of
from aaren_core.config import command_line as generic_command_line
from aaren_core.nn.backbones import BackboneConfig, BackboneSizes
from aaren_core.tasks.policy.data import WINDOWS, PolicyData, load_policy_data
from aaren_core.tasks.policy.model import BCModel, BCModelConfig, PolicyModel, PolicyModelConfig, PolicySteps
from aaren_core.tasks.policy.rollout import action_cost_us, default_target_return, rollout
from aaren_core.tasks.report import METRICS_FILE, write_report
from aaren_core.training.knobs import TrainKnobs
from aaren_core.training.loop import (
    BestInMemory,
    EpochEnd,
    LoopSettings,
    Schedule,
    StepLoss,
    Validation,
    fit,
)

if TYPE_CHECKING:
    from aaren_core.training.loop import LoopState

__all__ = [
    "MODELS",
    "SET_KEYS",
    "PolicyLoop",
    "PolicyRun",
    "PolicyTrainConfig",
    "build_policy_model",
    "evaluate_policy",
    "policy_summary",
    "train_policy",
]

MODELS = ("aaren", "transformer", "gru", "bc")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

SET_KEYS: dict[str, str] = {
    "backbone": "aaren, transformer, gru (Decision Transformer layout) or bc (an MLP, behaviour cloning)",
    "data": "a generated data set (hopper-v5-medium, halfcheetah-v5-medium-replay...) or a .npz file",
    "env": "gymnasium environment (default: the data set's, or its sidecar's env)",
    "d_model": "model width",
    "n_layers": "backbone layers",
    "n_heads": "attention heads",
    "d_ff": "feed-forward width (0: 4 d_model)",
    "dropout": "dropout rate",
    "time_decay": "aaren only: age the state by one per environment step (true/false)",
    "context": "window of K steps trained on (the Transformer's rollout window)",
    "windows": "random (windows anywhere in an episode, DT) or episode (windows from an episode's first step)",
    "rtg_scale": "returns-to-go are divided by it",
    "max_timestep": "rows of the timestep embedding less one",
    "bc_hidden": "bc: hidden width",
    "bc_layers": "bc: hidden layers",
    "batch_size": "windows per update",
    "lr": "AdamW learning rate",
    "weight_decay": "AdamW weight decay",
    "warmup_steps": "linear warm-up updates",
    "grad_clip": "gradient-norm clip (0: none)",
    "steps_per_epoch": "updates between validations",
    "epochs": "most epochs",
    "patience": "epochs without a better validation MSE before stopping early",
    "max_minutes": "training time budget in minutes (0: none); checked after each epoch",
    "val_fraction": "share of episodes held out for the validation MSE",
    "target_return": "rollout target return R_0 (0: DT's per environment: Hopper 3600, HalfCheetah 12000, "
    "Walker2d 5000)",
    "eval_episodes": "rollout episodes after training (0: none)",
    "eval_max_steps": "most steps per rollout episode",
    "parallel_rollouts": "step the rollout episodes together as one batch (true/false)",
    "seed": "seed of everything random (rollout episode i resets with seed + i)",
    "threads": "torch CPU threads (0: torch's default)",
    "out_dir": "run directory (best/, metrics.json, report.md)",
    "name": "served model name (default: aaren-policy-<data>-<backbone>)",
}


@dataclasses.dataclass(frozen=True)
@field_defaults(d_model=128, n_layers=3, n_heads=1, dropout=0.1)
@field_defaults(batch_size=64, lr=1e-4, weight_decay=1e-4, grad_clip=0.25, out_dir="runs/policy", threads=1)
@field_defaults(epochs=100_000, patience=100_000, max_minutes=1.0)
class PolicyTrainConfig(TrainKnobs, BackboneSizes, PolicySteps, ConfigRecord):
    """Everything a policy run depends on (``SET_KEYS``); Barhate's min-decision-transformer defaults.
    How it trains is ``TrainKnobs`` (a minute's budget, epochs and patience that do not stop it first),
    the backbone's sizes ``BackboneSizes``; the keys below them are the policy's own."""

    CONFIG_NAME: ClassVar[str] = "policy config"
    #: the keys the records of this config led with before it took the knobs and sizes from their bases
    RECORD_LEADS: ClassVar[tuple[str, ...]] = ("backbone", "data", "env")
    #: a key that records written before the knobs were shared hold: seconds, read as ``max_minutes``
    LEGACY_BUDGET_KEY: ClassVar[str] = "time_budget_s"

    backbone: str = "aaren"
    time_decay: bool = False
    bc_hidden: int = 256
    bc_layers: int = 2

    data: str = "hopper-v5-medium"
    env: str = ""
    windows: str = "random"
    val_fraction: float = 0.05
    warmup_steps: int = 50
    steps_per_epoch: int = 25

    parallel_rollouts: bool = False
    target_return: float = 0.0
    eval_episodes: int = 10
    eval_max_steps: int = 1000

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """A config from a record or ``--set`` strings (``ConfigRecord.from_dict``), an older record's
        ``time_budget_s`` (seconds) read as ``max_minutes``."""
        if cls.LEGACY_BUDGET_KEY in data:
            data = dict(data)
            data["max_minutes"] = float(data.pop(cls.LEGACY_BUDGET_KEY)) / 60
        return super().from_dict(data)

    def __post_init__(self) -> None:
        self.require(
            {
                **self.knob_checks(),
                f"backbone in {list(MODELS)}": self.backbone in MODELS,
                f"windows in {list(WINDOWS)}": self.windows in WINDOWS,
                "time_decay only with backbone aaren": not self.time_decay or self.backbone == "aaren",
                **self.step_checks(),
                "steps_per_epoch >= 1, warmup_steps >= 0": self.steps_per_epoch >= 1 and self.warmup_steps >= 0,
                "0 <= val_fraction < 1": 0 <= self.val_fraction < 1,
                "eval_episodes >= 0, eval_max_steps >= 1": self.eval_episodes >= 0 and self.eval_max_steps >= 1,
                "name empty or [A-Za-z0-9][A-Za-z0-9._-]{0,63}": not self.name
                or bool(NAME_PATTERN.fullmatch(self.name)),
            }
        )

    def run_name(self, data_name: str) -> str:
        if self.name:
            return self.name
        stem = re.sub(r"[^A-Za-z0-9._-]", "-", data_name).strip("-._") or "data"
        return f"aaren-policy-{stem}-{self.backbone}"[:64]

    def model_config(self, data: PolicyData) -> PolicyModelConfig | BCModelConfig:
        widths = {"obs_dim": data.dataset.obs_dim, "act_dim": data.dataset.act_dim}
        if self.backbone == "bc":
            return BCModelConfig(**widths, hidden=self.bc_hidden, n_hidden=self.bc_layers, dropout=self.dropout)
        backbone = BackboneConfig.sized_as(self, self.backbone, self.time_decay)
        return PolicyModelConfig(**widths, backbone=backbone, **fields_of(PolicySteps, self))


def build_policy_model(config: PolicyTrainConfig, data: PolicyData) -> nn.Module:
    """A fresh model for ``config`` with the data's observation statistics."""
    mc = config.model_config(data)
    model: nn.Module = BCModel(mc) if isinstance(mc, BCModelConfig) else PolicyModel(mc)
    model.set_normalization(torch.from_numpy(data.obs_mean), torch.from_numpy(data.obs_std))  # type: ignore[operator]
    return model


class PolicyLoop(BestInMemory):
    """The policy task's part of the loop: seeded batches of window starts (or transitions for BC),
    the masked action MSE, the validation MSE on held-out episodes' windows."""

    def __init__(self, config: PolicyTrainConfig, data: PolicyData, model: nn.Module) -> None:
        self.config, self.data, self.model = config, data, model
        self.bc = isinstance(model, BCModel)
        k = config.context
        if self.bc:
            self.pool = data.transitions(data.train_episodes)
        else:
            self.pool = data.starts(data.train_episodes, k, config.windows)
        val_eps = data.val_episodes if len(data.val_episodes) else data.train_episodes
        val_starts = data.starts(val_eps, k, "random")
        rng = np.random.default_rng(config.seed + 1)
        self.val = data.windows(rng.choice(val_starts, size=min(256, len(val_starts)), replace=False), k)
        self.train_seconds = 0.0
        self.updates = 0
        self.keep()

    def batches(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.config.seed, epoch])
        size = self.config.batch_size * (self.config.context if self.bc else 1)
        return [rng.choice(self.pool, size=size, replace=True) for _ in range(self.config.steps_per_epoch)]

    def step_loss(self, batch: np.ndarray) -> StepLoss:
        t0 = time.perf_counter()
        if self.bc:
            d = self.data.dataset
            pred = self.model(torch.from_numpy(d.observations[batch]))
            loss = (pred - torch.from_numpy(d.actions[batch])).square().mean()
        else:
            loss = self._window_loss(self.data.windows(batch, self.config.context))
        self.train_seconds += time.perf_counter() - t0
        self.updates += 1
        return StepLoss(loss, loss.item(), 1)

    def _window_loss(self, w: Any) -> torch.Tensor:
        pred = self.model(
            torch.from_numpy(w.returns_to_go),
            torch.from_numpy(w.observations),
            torch.from_numpy(w.actions),
            torch.from_numpy(w.timesteps),
        )
        mask = torch.from_numpy(w.mask).unsqueeze(-1).to(pred.dtype)
        err = (pred - torch.from_numpy(w.actions)).square() * mask
        return err.sum() / (mask.sum() * pred.shape[-1]).clamp_min(1)

    @torch.no_grad()
    def validate(self, train_loss: float) -> Validation:
        if self.bc:
            m = self.val.mask
            pred = self.model(torch.from_numpy(self.val.observations[m]))
            mse = float((pred - torch.from_numpy(self.val.actions[m])).square().mean())
        else:
            mse = float(self._window_loss(self.val))
        return Validation(mse, {"val_mse": mse})

    def record(self, end: EpochEnd) -> dict[str, Any]:
        return {"epoch": end.epoch - 1, "step": end.step, "train_loss": end.train_loss, "val_mse": end.validation.score}

    def summary(self, end: EpochEnd, record: dict[str, Any]) -> str:
        return (
            f"epoch {record['epoch']} (update {end.step}): train MSE {end.train_loss:.4f}, "
            f"val MSE {record['val_mse']:.4f}"
        )


@dataclasses.dataclass(frozen=True)
class PolicyRun:
    """The trained model (eval mode), its metrics and the run directory."""

    model: nn.Module
    metrics: dict[str, Any]
    out_dir: Path


def _costs(model: nn.Module) -> dict[str, float]:
    with torch.no_grad():
        return {
            "us_per_action_batch1": action_cost_us(model, 1, steps=100),
            "us_per_action_batch64": action_cost_us(model, 64, steps=30),
        }


def _evaluation(model: nn.Module, config: PolicyTrainConfig, env: str, target: float) -> dict[str, Any]:
    if not config.eval_episodes:
        return {}
    result = rollout(
        model, env, config.eval_episodes, target, seed=config.seed, max_steps=config.eval_max_steps,
        parallel=config.parallel_rollouts,
    )  # fmt: skip
    return {"rollout": {"episodes": config.eval_episodes, "max_steps": config.eval_max_steps, **result.summary()}}


def train_policy(config: PolicyTrainConfig, data: PolicyData | None = None, verbose: bool = True) -> PolicyRun:
    """Train, roll out and save a policy (module docstring)."""
    if config.threads:
        torch.set_num_threads(config.threads)

    def say(message: str) -> None:
        if verbose:
            print(message, flush=True)

    data = data if data is not None else load_policy_data(config.data, config.env, config.val_fraction, config.seed)
    env = config.env or data.env
    torch.manual_seed(config.seed)
    model = build_policy_model(config, data)
    task = PolicyLoop(config, data, model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = Schedule(config.lr, warmup_steps=config.warmup_steps)
    settings = LoopSettings.of(config, schedule, progress=verbose, unit="updates")
    t0 = time.perf_counter()
    state: LoopState = fit(model, optimizer, task, settings, say=say)
    wall = time.perf_counter() - t0
    model.load_state_dict(task.best)
    model.eval()
    target = config.target_return or default_target_return(env)
    name = config.run_name(data.name)
    metrics: dict[str, Any] = {
        "task": "policy",
        "name": name,
        "env": env,
        "data": config.data,
        "source": data.source,
        "config": config.to_dict(),
        "target_return": target,
        "episodes": {"train": len(data.train_episodes), "val": len(data.val_episodes)},
        "transitions": len(data.dataset.rewards),
        "data_returns": {
            "mean": float(data.dataset.episode_returns().mean()),
            "max": float(data.dataset.episode_returns().max()),
        },
        **task.selected(state, "val_mse", float(state.best_score)),
        "updates": state.step,
        "train_seconds": wall,
        "us_per_update": 1e6 * task.train_seconds / max(1, task.updates),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    metrics.update(_costs(model))
    metrics.update(_evaluation(model, config, env, target))
    out = Path(config.out_dir)
    meta = {
        "task": "policy",
        "name": name,
        "env": env,
        "target_return": target,
        "dataset": config.data,
        "context": config.context,
        "backbone": config.backbone,
        "train_config": config.to_dict(),
    }
    metrics["model_version"] = save_checkpoint(out / "best", model, meta)
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    write_report(out, policy_report_text(metrics))
    say(policy_summary(metrics))
    return PolicyRun(model, metrics, out)


def evaluate_policy(
    checkpoint: str | Path,
    *,
    out_dir: str | Path | None = None,
    episodes: int = 10,
    target_return: float | None = None,
    seed: int = 0,
    max_steps: int = 1000,
    parallel: bool = False,
) -> dict[str, Any]:
    """Roll out a policy checkpoint ``episodes`` times; with ``out_dir`` write ``metrics.json``
    (the run's, with this ``evaluation`` added) and ``report.md`` there."""
    ckpt = load_checkpoint(checkpoint)
    meta = ckpt.metadata
    if meta.get("task") != "policy":
        raise ValueError(f"{checkpoint}: not a policy checkpoint from `aaren train --task policy`")
    env = meta["env"]
    target = float(meta["target_return"] if target_return is None else target_return)
    result = rollout(ckpt.model, env, episodes, target, seed=seed, max_steps=max_steps, parallel=parallel)
    evaluation = {
        "env": env,
        "target_return": target,
        "seed": seed,
        "episodes": episodes,
        "max_steps": max_steps,
        **result.summary(),
        **_costs(ckpt.model),
        "model_version": ckpt.model_version,
        "checkpoint": str(checkpoint),
    }
    metrics: dict[str, Any] = {"task": "policy", "name": meta.get("name", ""), "env": env, "evaluation": evaluation}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / METRICS_FILE
        if path.is_file():
            with contextlib.suppress(ValueError):
                metrics = {**json.loads(path.read_text()), "evaluation": evaluation}
        path.write_text(json.dumps(metrics, indent=2) + "\n")
        if "config" in metrics:
            write_report(out, policy_report_text(metrics))
    return metrics


def policy_summary(metrics: dict[str, Any]) -> str:
    """One line: the rollout's normalised score (training's or ``aaren evaluate``'s)."""
    r = metrics.get("evaluation") or metrics.get("rollout")
    if not r:
        return f"{metrics['name']}: trained (no rollout)"
    return (
        f"{metrics['name']} on {metrics['env']}: return {r['return_mean']:.1f} ± {r['return_std']:.1f}, "
        f"normalised score {r['score_mean']:.1f} ± {r['score_std']:.1f} over {len(r['returns'])} episodes"
    )


def command_line(config: PolicyTrainConfig) -> str:
    """The ``aaren train --task policy`` command that runs ``config``."""
    text = generic_command_line(config, PolicyTrainConfig(), always=("data", "out_dir"), skip=())
    return text.replace("aaren train", "aaren train --task policy", 1)


def policy_report_text(metrics: dict[str, Any]) -> str:
    """``report.md`` of a policy run from its metrics."""
    config = PolicyTrainConfig.from_dict(metrics["config"])
    kind = "MLP behaviour cloning" if config.backbone == "bc" else "Decision Transformer layout"
    lines = [
        f"# Policy {metrics['name']}",
        "",
        f"{config.backbone} policy ({kind})"
        f" trained on `{metrics['data']}` ({metrics['transitions']} transitions, {sum(metrics['episodes'].values())}"
        f" episodes; data returns mean {metrics['data_returns']['mean']:.1f}, max {metrics['data_returns']['max']:.1f})"
        f" for {metrics['train_seconds']:.0f} s: {metrics['updates']} updates of {config.batch_size}"
        f" {'transitions x context' if config.backbone == 'bc' else f'windows of {config.context} steps'},"
        f" best validation action MSE {metrics['val_mse']:.4f}; {metrics['parameters']} parameters.",
        "",
        "| cost | µs |",
        "|---|---:|",
        f"| per update (batch {config.batch_size}) | {metrics['us_per_update']:.0f} |",
        f"| per action, batch 1 | {metrics['us_per_action_batch1']:.0f} |",
        f"| per batch of 64 actions | {metrics['us_per_action_batch64']:.0f} |",
        "",
    ]
    for key, title in (("rollout", "Rollout after training"), ("evaluation", "Evaluation (`aaren evaluate`)")):
        r = metrics.get(key)
        if not r:
            continue
        lines += [
            f"## {title}",
            "",
            f"{metrics['env']}, target return {metrics.get('target_return', r.get('target_return'))}, "
            f"{len(r['returns'])} episodes (episode i resets with seed {config.seed if key == 'rollout' else r['seed']}"
            " + i): "
            f"return {r['return_mean']:.1f} ± {r['return_std']:.1f}, D4RL normalised score "
            f"**{r['score_mean']:.1f} ± {r['score_std']:.1f}**.",
            "",
            "| episode | return | length | score |",
            "|---:|---:|---:|---:|",
            *(
                f"| {i} | {ret:.1f} | {n} | {s:.1f} |"
                for i, (ret, n, s) in enumerate(zip(r["returns"], r["lengths"], r["scores"], strict=True))
            ),
            "",
        ]
    lines += ["## Reproduce", "", "```", command_line(config), f"aaren evaluate {config.out_dir}/best", "```", ""]
    return "\n".join(lines)
