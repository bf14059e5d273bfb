"""The policy data sets' table, from their sidecars: ``python -m bench.policy_datasets [--out FILE]``.

Reads every ``<env>-<kind>.json`` that ``aaren_core.tasks.policy.generate`` wrote into the cache
(``aaren.formats.policy.policy_cache_dir``) and writes ``bench/results/policy_datasets.md``: per set
its size, its episodes' returns and normalised scores, the behaviour policies' returns, the D4RL
reference returns the scores use, the command that made it, and the file's sha256.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from aaren.formats.policy import DATASET_KINDS, POLICY_ENVS, dataset_path

OUT = Path(__file__).parent / "results" / "policy_datasets.md"


def render(cache: str | None = None) -> str:
    rows, policies, commands, refs = [], [], [], []
    for env in POLICY_ENVS:
        sides = {}
        for kind in DATASET_KINDS:
            path = dataset_path(env, kind, cache).with_suffix(".json")
            if path.is_file():
                sides[kind] = json.loads(path.read_text())
        if not sides:
            continue
        first = next(iter(sides.values()))
        for kind, s in sides.items():
            d = s["data"]
            rows.append(
                f"| {env} | {kind} | {d['steps']:,} | {d['episodes']:,} | "
                f"{d['return_mean']:.0f} ± {d['return_std']:.0f} "
                f"({d['return_min']:.0f}..{d['return_max']:.0f}) | {d['score_mean']:.1f} ± {d['score_std']:.1f} | "
                f"`{s['sha256'][:16]}` |"
            )
        m, f = first["medium_policy"], first["final_policy"]
        policies.append(
            f"| {env} | {first['algorithm']} | {first['timesteps']:,} | {first['train_seconds']:.0f} s | "
            f"{m['timesteps']:,} | {m['return']:.0f} ({m['score']:.1f}) | {f['return']:.0f} ({f['score']:.1f}) | "
            f"{first.get('wall_seconds', '?')} s |"
        )
        r = first["reference_returns"]
        refs.append(f"| {env} | {r['random']} | {r['expert']} |")
        commands.append(f"    {first['command']}")
        versions = ", ".join(f"{k} {v}" for k, v in first["versions"].items())
    if not rows:
        return "No policy data sets in the cache: run `python -m aaren_core.tasks.policy.generate --env Hopper-v5`.\n"
    return "\n".join(
        [
            "# Policy data sets (generated here; D4RL's layout and kinds)",
            "",
            "Made by `aaren_core.tasks.policy.generate` (its docstring says how each kind is made), one process",
            "per environment on one core of this 2-core machine. The files stay in the cache",
            "(`~/.cache/aaren/policy`, or `$AAREN_POLICY_CACHE`); the commands below regenerate them, and the",
            "sha256 says whether a regeneration gave the same bytes. Rendered by `python -m bench.policy_datasets`.",
            "",
            "Normalised score = 100 (R - R_random) / (R_expert - R_random), with D4RL's reference returns:",
            "",
            "| environment | R_random | R_expert |",
            "|---|---:|---:|",
            *refs,
            "",
            "## The sets",
            "",
            "| environment | kind | steps | episodes | return mean ± std (min..max) | normalised score | sha256 |",
            "|---|---|---:|---:|---|---:|---|",
            *rows,
            "",
            "## The behaviour policies",
            "",
            "| environment | algorithm | PPO steps | training | medium snapshot at | medium return (score) | "
            "final return (score) | whole generation |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
            *policies,
            "",
            "Policy returns: 10 stochastic episodes each. A 600k-step PPO run is far from D4RL's SAC experts",
            '(score about 100 by definition): here "expert" is this budget\'s final policy and "medium" a third',
            "of it, so every set scores lower than D4RL's set of the same name, and the scores of policies",
            "trained on them are to be read against the data's own scores above, not against D4RL's tables.",
            "The medium-replay set is the whole recording up to the medium snapshot when that is under 100k steps.",
            "",
            "Sizes: 100k steps per set (200k for medium-expert):",
            "a tenth of D4RL's million, so that a set is made in minutes and a training run reads it in memory;",
            "the campaign's training budget (about a minute per run) sees each window a few times at most.",
            "",
            "Commands:",
            "",
            *commands,
            "",
            f"Versions: {versions}.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", default=None)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    Path(args.out).write_text(render(args.cache))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
