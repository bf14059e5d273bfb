"""The cost of a served action: µs per action of the ``policy`` task at 1 and 64 concurrent episodes.

An in-process server (one process, memory store) serves a policy checkpoint (``--checkpoint``; by
default an untrained ``PolicyModel`` at the Decision Transformer's size, d_model 128 x 3 layers, for
Hopper-v5's 11 observations and 3 actions: the arithmetic does not depend on the weights). A client
steps ``E`` episodes in lock-step on one aaren.v1 stream: each round is one request holding one event
per episode (the first carries the target return, later ones a reward), so the server steps the ``E``
sessions as one batch. Observations and rewards are generated (the environment's own cost is not the
server's). Per ``E`` it reports:

- ``events_per_s``: actions answered per wall-clock second (round trips included);
- ``us_per_action``: wall-clock µs per action (a round's latency / E);
- ``server_cpu_us_per_action``: the process's CPU time less the client thread's, per action (the
  server's loop, its workers and gRPC, all in this process).

Run from the repository root::

    python bench/policy_serving.py                         # E = 1 and 64, 300 rounds each
    python bench/policy_serving.py --checkpoint RUN/model --episodes 1 8 64 --rounds 500 --json

It is a benchmark: no test asserts its times (``tests/bench/test_policy_serving_bench.py`` runs it tiny).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main", "measure"]


def _default_checkpoint(folder: Path) -> Path:
    """An untrained DT-sized policy for Hopper-v5's sizes, saved under ``folder``."""
    import torch

    from aaren_core.checkpoint import save_checkpoint
    from aaren_core.nn.backbones import BackboneConfig
    from aaren_core.tasks.policy.model import PolicyModel, PolicyModelConfig

    torch.manual_seed(0)
    backbone = BackboneConfig(kind="aaren", d_model=128, n_layers=3, n_heads=1, dropout=0.1)
    model = PolicyModel(PolicyModelConfig(backbone=backbone, obs_dim=11, act_dim=3)).eval()
    path = folder / "policy"
    save_checkpoint(path, model, {"name": "bench-policy", "env": "Hopper-v5", "target_return": 3600.0})
    return path


class _Server:
    """An ``AarenServer`` of one process on its own event loop thread."""

    def __init__(self, checkpoint: Path) -> None:
        from aaren.server.app import AarenServer
        from aaren.server.settings import ServerSettings

        settings = ServerSettings(
            address="127.0.0.1:0", metrics_port=-1, device="cpu", frontends=0, torch_threads=1, checkpoint=checkpoint
        )
        self.server = AarenServer(settings)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(300)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(1.0), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"


def measure(address: str, episodes: int, rounds: int, warmup: int = 10, seed: int = 0) -> dict[str, Any]:
    """Step ``episodes`` sessions in lock-step for ``warmup + rounds`` rounds; the module docstring's numbers."""
    from aaren.client.client import EventErrorOut, EventIn
    from aaren.client.sync import SyncClient

    rng = np.random.default_rng(seed)
    with SyncClient(address) as client:
        info = client.describe_model()
        if info.task != "policy":
            raise SystemExit(f"the model {info.name!r} serves task {info.task!r}; this benchmark needs a policy")
        width = info.value_width - 1
        run = f"bench-{time.time_ns()}"
        sessions = [f"{run}-{i}" for i in range(episodes)]
        total = warmup + rounds
        obs = rng.normal(size=(total, episodes, width)).astype(np.float32)
        rewards = rng.uniform(0, 3, size=(total, episodes)).astype(np.float32)
        rewards[0] = info.target_return or 3600.0
        cpu0 = wall0 = thread0 = 0.0
        for t in range(total):
            if t == warmup:
                cpu0, thread0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
            events = [
                EventIn(s, t + 1, float(t), 0, [float(rewards[t, i]), *obs[t, i].tolist()])
                for i, s in enumerate(sessions)
            ]
            result = client.apply(events)
            errors = [r for r in result.results if isinstance(r, EventErrorOut)]
            if errors or result.request_error:
                raise SystemExit(f"round {t}: {(errors or [result.request_error])[0]}")
        wall = time.perf_counter() - wall0
        server_cpu = (time.process_time() - cpu0) - (time.thread_time() - thread0)
        for s in sessions:
            client.end_session(s)
    actions = rounds * episodes
    return {
        "model": info.name,
        "backbone": f"{info.backbone} d_model {info.d_model} x {info.n_layers}",
        "episodes": episodes,
        "rounds": rounds,
        "events_per_s": actions / wall,
        "us_per_action": 1e6 * wall / actions,
        "us_per_round": 1e6 * wall / rounds,
        "server_cpu_us_per_action": 1e6 * server_cpu / actions,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=None, help="a policy checkpoint folder [default: untrained]")
    p.add_argument("--episodes", type=int, nargs="+", default=[1, 64], help="concurrent episodes (each a run)")
    p.add_argument("--rounds", type=int, default=300, help="lock-step rounds measured per run")
    p.add_argument("--warmup", type=int, default=10, help="rounds before the measurement")
    p.add_argument("--json", action="store_true", help="one JSON object per run instead of a table")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import torch

    a = parse(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = a.checkpoint or _default_checkpoint(Path(tmp))
        with _Server(checkpoint) as server:
            rows = [measure(server.address, e, a.rounds, a.warmup) for e in a.episodes]
    if a.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"{rows[0]['model']} ({rows[0]['backbone']}), {a.rounds} lock-step rounds per run")
    print(f"{'episodes':>8} {'events/s':>10} {'µs/action':>10} {'µs/round':>10} {'server CPU µs/action':>21}")
    for r in rows:
        print(
            f"{r['episodes']:>8} {r['events_per_s']:>10,.0f} {r['us_per_action']:>10,.0f} {r['us_per_round']:>10,.0f} "
            f"{r['server_cpu_us_per_action']:>21,.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
