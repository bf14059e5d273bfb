"""Aaren vs Transformer vs GRU (Decision Transformer layout) vs BC on D4RL-style data sets (issue 23).

Every (data set, model, seed) is one run of ``aaren_core.tasks.policy.train.train_policy`` on one
thread: ``--time-budget`` seconds of training (min-decision-transformer's defaults otherwise), then
``--episodes`` rollout episodes in the environment from DT's target return (episode ``i`` resets
with ``seed + i``). Runs go set by set, seed by seed, so a cut campaign leaves complete rows with
fewer seeds. A run whose ``metrics.json`` exists is skipped (resumable); ``--worker I/N`` takes
every N-th planned run from the I-th, so N processes (one core each) share a campaign.

    python -m bench.policy_compare --envs Hopper-v5,HalfCheetah-v5 --kinds medium,medium-replay,medium-expert \\
        --models aaren,transformer,gru,bc --seeds 0,1,2 --time-budget 45 --episodes 10 --worker 0/4 --out DIR \
        --set lr=1e-3
    python -m bench.policy_compare --report --out DIR ...    # the same keys; writes bench/results/policy_d4rl.md

``--set lr=1e-3``: a 45 s budget holds only ~125-400 updates on one core, and 1e-3 trains further
there than min-decision-transformer's 1e-4 (measured: docs/tasks.md, "Policies").

The report: per data set the D4RL normalised score (mean ± std over seeds of each seed's mean over
its episodes) of every model, the reference returns the score uses, the data sets' own returns,
per-update and per-action µs per model, and whether Aaren is within the Transformer's seed spread.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aaren.formats.errors import DataError
from aaren.formats.policy import REFERENCE_RETURNS, dataset_path
from aaren_core.config import parse_sets
from aaren_core.tasks.policy.train import MODELS, PolicyTrainConfig, train_policy
from aaren_core.tasks.report import METRICS_FILE

TITLES = {"aaren": "Aaren", "transformer": "Transformer", "gru": "GRU", "bc": "BC"}
DEFAULT_REPORT = "bench/results/policy_d4rl.md"


@dataclasses.dataclass(frozen=True)
class Job:
    """One (data set, model, seed) run."""

    env: str
    kind: str
    model: str
    seed: int
    root: Path

    @property
    def set_name(self) -> str:
        return f"{self.env.lower()}-{self.kind}"

    @property
    def out_dir(self) -> Path:
        return self.root / self.set_name / self.model / f"seed{self.seed}"

    @property
    def done(self) -> bool:
        return (self.out_dir / METRICS_FILE).is_file()


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def plan(args: argparse.Namespace) -> list[Job]:
    """All runs in campaign order: set by set, seed by seed, model by model."""
    root = Path(args.out)
    return [
        Job(env, kind, model, int(seed), root)
        for env in _list(args.envs)
        for kind in _list(args.kinds)
        for seed in _list(args.seeds)
        for model in _list(args.models)
    ]


def run_config(job: Job, args: argparse.Namespace) -> PolicyTrainConfig:
    """The train config of ``job``: the campaign's budget, episodes and ``--set`` keys."""
    data = dataset_path(job.env, job.kind, args.data_dir)
    base = PolicyTrainConfig(
        backbone=job.model,
        data=str(data),
        env=job.env,
        seed=job.seed,
        max_minutes=args.time_budget / 60,
        eval_episodes=args.episodes,
        eval_max_steps=args.max_steps,
        parallel_rollouts=args.parallel,
        threads=1,
        out_dir=str(job.out_dir),
        name=f"{job.set_name}-{job.model}-s{job.seed}",
    )
    return base.replace(**parse_sets(args.set))


def run_job(job: Job, args: argparse.Namespace) -> dict[str, Any]:
    config = run_config(job, args)
    t0 = time.perf_counter()
    result = train_policy(config, verbose=False)
    metrics = result.metrics
    metrics["wall_seconds"] = time.perf_counter() - t0
    (job.out_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def read_metrics(job: Job) -> dict[str, Any] | None:
    try:
        return json.loads((job.out_dir / METRICS_FILE).read_text())
    except (OSError, ValueError):
        return None


def mean_std(values: Sequence[float], digits: int = 1) -> str:
    if not values:
        return "n/a"
    a = np.asarray(values, dtype=np.float64)
    return f"{a.mean():.{digits}f} ± {a.std():.{digits}f}" if len(a) > 1 else f"{a.mean():.{digits}f}"


def _seed_scores(records: Sequence[dict[str, Any]]) -> list[float]:
    return [float(r["rollout"]["score_mean"]) for r in records if r.get("rollout")]


def _within(aaren: Sequence[float], transformer: Sequence[float]) -> str:
    """Whether Aaren's mean is within one seed std of the Transformer's mean (or above it)."""
    if not aaren or not transformer:
        return "n/a"
    if len(transformer) < 2:
        return f"n/a: 1 seed ({float(np.mean(aaren)) - float(np.mean(transformer)):+.1f})"
    a, t = float(np.mean(aaren)), float(np.mean(transformer))
    spread = float(np.std(transformer))
    verdict = "yes" if a >= t - spread else "no"
    return f"{verdict} ({a - t:+.1f}; spread {spread:.1f})"


def report(args: argparse.Namespace, jobs: Sequence[Job]) -> str:
    """The Markdown report of the finished runs among ``jobs``."""
    models = _list(args.models)
    sets: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for job in jobs:
        record = read_metrics(job)
        if record is not None:
            sets.setdefault(job.set_name, {}).setdefault(job.model, []).append(record)
    first = next((r for s in sets.values() for rs in s.values() for r in rs), None)
    lines = [
        "# Policies: Aaren vs Transformer vs GRU vs BC on D4RL-style data (issue 23)",
        "",
        "D4RL normalised score `100 (R - R_random) / (R_expert - R_random)` of online rollouts in gymnasium "
        "MuJoCo v5, mean ± std over seeds of each seed's mean over its episodes (higher is better). "
        "Data sets generated here (`aaren_core.tasks.policy.generate`), not D4RL's own files, so the scores "
        "compare the models with each other, not with published tables to the decimal.",
        "",
    ]
    if first is not None:
        c = first["config"]
        budget_s = c["max_minutes"] * 60 if "max_minutes" in c else c["time_budget_s"]  # records before the knobs
        lines += [
            f"Each run: {budget_s:g} s of training on one CPU thread (AdamW lr {c['lr']:g}, wd "
            f"{c['weight_decay']:g}, warm-up {c['warmup_steps']} updates, clip {c['grad_clip']:g}, batch "
            f"{c['batch_size']}, context {c['context']}, d_model {c['d_model']}, {c['n_layers']} layers, "
            f"{c['n_heads']} head, dropout {c['dropout']:g}; BC: MLP {c['bc_layers']} x {c['bc_hidden']}), then "
            f"{args.episodes} episodes of at most {args.max_steps} steps from the target return of the table "
            "(DT's unless the campaign set one: Hopper 3600, HalfCheetah 12000, Walker2d 5000; episode i "
            "resets with seed + i). Aaren and the "
            "GRU act with one constant state over the whole episode (as served); the Transformer re-runs its "
            f"last {c['context']} steps per action (DT's evaluation).",
            "",
        ]
    header = ["data set", *(TITLES[m] for m in models), "seeds", "data return (mean / max)", "target return"]
    if "aaren" in models and "transformer" in models:
        header.append("Aaren within the Transformer's spread")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, by_model in sets.items():
        scores = {m: _seed_scores(by_model.get(m, [])) for m in models}
        any_record = next(r for rs in by_model.values() for r in rs)
        dr = any_record["data_returns"]
        seeds = max(len(v) for v in scores.values())
        targets = sorted({float(r["target_return"]) for rs in by_model.values() for r in rs})
        row = [
            f"`{name}`",
            *(mean_std(scores[m]) for m in models),
            str(seeds),
            f"{dr['mean']:.0f} / {dr['max']:.0f}",
            ", ".join(f"{t:g}" for t in targets),
        ]
        if "aaren" in models and "transformer" in models:
            row.append(_within(scores["aaren"], scores["transformer"]))
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Reference returns of the normalised score (D4RL's v2 `REF_MIN_SCORE` / `REF_MAX_SCORE`): "
        + "; ".join(f"{env} random {lo:g}, expert {hi:g}" for env, (lo, hi) in REFERENCE_RETURNS.items())
        + ".",
        "",
        "'Within the spread': Aaren's mean is at least the Transformer's mean less one seed std of the "
        "Transformer (the difference and that std in brackets).",
        "",
        "## Cost per model (mean over runs)",
        "",
        "| model | µs per update | µs per action, batch 1 | µs per 64 actions (batch 64) | updates in the budget "
        "| parameters |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in models:
        rs = [r for by_model in sets.values() for r in by_model.get(m, [])]
        if not rs:
            continue

        def avg(key: str, rs: list[dict[str, Any]] = rs) -> float:
            return float(np.mean([r[key] for r in rs]))

        lines.append(
            f"| {TITLES[m]} | {avg('us_per_update'):.0f} | {avg('us_per_action_batch1'):.0f} | "
            f"{avg('us_per_action_batch64'):.0f} | {avg('updates'):.0f} | {avg('parameters'):.0f} |"
        )
    lines += [
        "",
        "Per action: the model's computation for one environment step without the environment, on random "
        "observations (Aaren/GRU: `PolicyModel.step`; Transformer: a forward over its last K steps; BC: the "
        "MLP), one CPU thread.",
        "",
        *_served_costs(),
        "## Per seed",
        "",
        "| data set | model | seed | score (mean over episodes) | return | updates | best val MSE |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, by_model in sets.items():
        for m in models:
            for r in sorted(by_model.get(m, []), key=lambda r: r["config"]["seed"]):
                ro = r.get("rollout") or {}
                lines.append(
                    f"| `{name}` | {TITLES[m]} | {r['config']['seed']} | {ro.get('score_mean', float('nan')):.1f} | "
                    f"{ro.get('return_mean', float('nan')):.0f} | {r['updates']} | {r['val_mse']:.4f} |"
                )
    lines += [
        "",
        "## Commands",
        "",
        "The campaign of bench/results/policy_d4rl.md ran as `bench/policy_campaign.sh 0 & bench/policy_campaign.sh 1`",
        "(one invocation per set and seed, each with `--set target_return=` its set's best episode return); "
        "the report:",
        "",
        "```",
        *args.commands,
        "```",
        "",
    ]
    return "\n".join(lines)


def _served_costs() -> list[str]:
    """The served cost per action (bench/results/policy_serving.md's table), beside the offline one."""
    path = Path(__file__).parent / "results" / "policy_serving.md"
    if not path.is_file():
        return []
    table = [line for line in path.read_text().splitlines() if line.startswith("|")]
    return [
        "Served through the whole service (an in-process server, Aaren at this size, E episodes in lock-step on",
        "one aaren.v1 stream; bench/results/policy_serving.md, `python bench/policy_serving.py --rounds 300`):",
        "",
        *table,
        "",
    ]


def _commands(argv: Sequence[str]) -> list[str]:
    """The campaign's command (without the worker) and the report's."""
    keep, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--worker":
            skip = True
            continue
        if a.startswith("--worker=") or a == "--report":
            continue
        keep.append(a)
    run = "python -m bench.policy_compare " + " ".join(shlex.quote(a) for a in keep)
    return [run + " --worker I/N   # for I in 0..N-1, side by side", run + " --report"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.policy_compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--envs", default="Hopper-v5,HalfCheetah-v5", help="comma-separated gymnasium ids")
    parser.add_argument("--kinds", default="medium,medium-replay,medium-expert", help="comma-separated data kinds")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--time-budget", type=float, default=45.0, help="training seconds per run")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument(
        "--parallel",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="step a run's rollout episodes together as one batch (the per-row arithmetic of batch 1)",
    )
    parser.add_argument("--data-dir", default=None, help="the data sets' folder [default: the policy cache]")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any policy train key")
    parser.add_argument("--worker", default="0/1", help="I/N: every N-th planned run from the I-th")
    parser.add_argument("--out", default="runs/policy-compare", help="runs directory")
    parser.add_argument("--report", action="store_true", help="write the report from finished runs; train nothing")
    parser.add_argument("--report-out", default=DEFAULT_REPORT)
    args = parser.parse_args(argv)
    unknown = [m for m in _list(args.models) if m not in MODELS]
    if unknown:
        parser.error(f"--models {unknown}: expected some of {', '.join(MODELS)}")
    args.commands = _commands(list(sys.argv[1:] if argv is None else argv))
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    jobs = plan(args)
    if args.report:
        out = Path(args.report_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report(args, jobs))
        print(f"wrote {out} ({sum(j.done for j in jobs)} of {len(jobs)} runs finished)")
        return
    index, workers = (int(x) for x in args.worker.split("/"))
    if not 0 <= index < workers:
        raise SystemExit(f"--worker {args.worker}: expected I/N with 0 <= I < N")
    mine = [j for i, j in enumerate(jobs) if i % workers == index]
    for n, job in enumerate(mine):
        if job.done:
            print(f"[{n + 1}/{len(mine)}] {job.set_name} {job.model} seed {job.seed}: done, skipped", flush=True)
            continue
        try:
            metrics = run_job(job, args)
        except DataError as exc:
            print(f"[{n + 1}/{len(mine)}] {job.set_name} {job.model} seed {job.seed}: skipped: {exc}", flush=True)
            continue
        ro = metrics.get("rollout") or {}
        print(
            f"[{n + 1}/{len(mine)}] {job.set_name} {job.model} seed {job.seed}: score "
            f"{ro.get('score_mean', float('nan')):.1f} ± {ro.get('score_std', float('nan')):.1f}, "
            f"{metrics['updates']} updates, {metrics['wall_seconds']:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
