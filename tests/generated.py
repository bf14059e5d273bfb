"""Generated test data, one module for every suite: tiny models and their checkpoints, events.

Everything is made here from a seed (nothing is downloaded), small enough for a test to build in
milliseconds: the tiny event model the servers run (``tiny_event_model``, ``TINY_SCHEMA``), its
time-decay and adversarial variants, tiny classification and series models, and event builders
(``ev`` for one aaren.v1 event, ``random_events`` for a session of them).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aaren.formats.times import iso_utc
from aaren.v1 import aaren_pb2 as pb
from aaren_core.checkpoint import save_checkpoint
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.classify.model import ClassModel, ClassModelConfig
from aaren_core.tasks.event.model import EventModel, EventModelConfig

# ---------------------------------------------------------------- the tiny event model

TINY_SCHEMA = {
    "mark_names": [f"m{i}" for i in range(5)],
    "value_names": ["a", "b"],
    "time_unit": "minutes",
}


def tiny_event_model(seed: int = 0, num_marks: int = 5, value_width: int = 2) -> EventModel:
    """d_model 16, 2 Aaren layers, 2 heads, 3 mixture components, normalization set; eval mode.
    With the defaults: the model of ``TINY_SCHEMA`` (5 marks, 2 values) that the test servers run."""
    torch.manual_seed(seed)
    config = EventModelConfig(
        backbone=BackboneConfig(kind="aaren", d_model=16, n_layers=2, n_heads=2),
        num_marks=num_marks,
        value_width=value_width,
        n_components=3,
    )
    model = EventModel(config).eval()
    model.set_normalization(1.0, 1.2, torch.tensor([1.0, -2.0][:value_width]), torch.tensor([3.0, 0.5][:value_width]))
    return model


def write_checkpoint(path: Path, model: torch.nn.Module, name: str, **metadata: Any) -> Path:
    """``model`` saved at ``path`` as the servers load it (metadata ``name`` and the rest); returns ``path``."""
    save_checkpoint(path, model, metadata={"name": name, **metadata})
    return path


def tiny_checkpoint_at(path: Path) -> Path:
    """The tiny event model's checkpoint ("tiny", ``TINY_SCHEMA``) at ``path``."""
    return write_checkpoint(path, tiny_event_model(), "tiny", schema=TINY_SCHEMA)


# ---------------------------------------------------------------- variants


def decay_model(seed: int = 0, value_width: int = 2) -> EventModel:
    """d_model 16, 2 layers, 4 heads, 5 marks, 3 mixture components, normalization set; eval mode."""
    torch.manual_seed(seed)
    cfg = EventModelConfig(
        backbone=BackboneConfig(d_model=16, n_layers=2, n_heads=4, time_decay=True),
        num_marks=5,
        value_width=value_width,
        n_components=3,
    )
    model = EventModel(cfg).eval()
    model.set_normalization(1.5, 0.8, torch.tensor([3.0, -1.0][:value_width]), torch.tensor([2.0, 0.5][:value_width]))
    return model


GAP_MAX = 500.0
RESOLUTION = 1 / 60


def adversarial_model(seed: int, *, gap_max: float = GAP_MAX, resolution: float = RESOLUTION) -> EventModel:
    """A tiny model whose time head is set so that one component has a negligible weight and the
    largest location and log scale the clamps allow, with a wide log-gap std, plus random nastiness:
    huge or tiny logits, locations and scales pinned at either clamp, large weights."""
    g = torch.Generator().manual_seed(seed)
    config = EventModelConfig(
        backbone=BackboneConfig(kind="aaren", d_model=8, n_layers=1, n_heads=2),
        num_marks=3,
        value_width=1,
        n_components=4,
        gap_max=gap_max,
        time_resolution=resolution,
    )
    torch.manual_seed(seed)
    model = EventModel(config).eval()
    log_dt_std = float(torch.empty(()).uniform_(0.5, 3.0, generator=g))
    model.set_normalization(
        float(torch.empty(()).uniform_(-2, 4, generator=g)), log_dt_std, torch.zeros(1), torch.ones(1)
    )
    k = config.n_components
    with torch.no_grad():
        time = model.heads.time
        time.weight.mul_(torch.empty(()).uniform_(0, 20, generator=g))
        bias = torch.randn(3 * k, generator=g) * 30  # far past every clamp, either way
        bias[0] = -float(torch.empty(()).uniform_(15, 60, generator=g))  # the negligible weight...
        bias[k] = 1e3  # ...at the largest location
        bias[2 * k] = 1e3  # ...and the largest spread
        time.bias.copy_(bias)
    return model


def tiny_class_model(kind: str = "aaren", channels: int = 2, classes: int = 3, seed: int = 0) -> ClassModel:
    """A classification model of ``channels`` inputs and ``classes`` outputs: d_model 8, 1 layer, 2 heads."""
    torch.manual_seed(seed)
    return ClassModel(ClassModelConfig(BackboneConfig(kind=kind, d_model=8, n_layers=1, n_heads=2), channels, classes))


# ---------------------------------------------------------------- events


def ev(session_id: str, seq: int, time: float, mark: int = 0, values: Sequence[float] = (0.0, 0.0)) -> pb.Event:
    """One aaren.v1 event (two values by default: the tiny model's width)."""
    return pb.Event(session_id=session_id, seq=seq, time=time, mark=mark, values=list(values))


def random_events(
    session_id: str, n: int, seed: int = 0, start: int = 1, t0: float = 0.0, num_marks: int = 5
) -> list[pb.Event]:
    """``n`` events of one session from seq ``start``: exponential gaps (mean 2) after ``t0``, uniform
    marks, two standard normal values; the same for the same arguments."""
    rng = random.Random(seed)
    out, t = [], t0
    for seq in range(start, start + n):
        t += rng.expovariate(0.5)
        out.append(ev(session_id, seq, t, rng.randrange(num_marks), [rng.gauss(0, 1), rng.gauss(0, 1)]))
    return out


# --- series files (issue 22) ----------------------------------------------------------------

T0 = 1_577_836_800.0  # 2020-01-01T00:00:00Z


def write_csv(path: Path, times: list[str], columns: dict[str, list[str]]) -> Path:
    lines = [",".join(["time", *columns])]
    lines += [",".join([t, *(c[i] for c in columns.values())]) for i, t in enumerate(times)]
    path.write_text("\n".join(lines) + "\n")
    return path


def gappy_file(path: Path, n: int = 400, seed: int = 0) -> tuple[Path, np.ndarray, np.ndarray]:
    """``daily_file``'s series less 3% of its rows (never the first or last) and with 5% NA in
    channel ``b`` (the first rows' ``b`` too, so it starts with a train-mean fill); returns the
    file, ``real [n]`` and ``observed [n, 2]`` as written."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    a, b = 10 + 3 * np.sin(2 * np.pi * t / 24), 5 + np.cos(2 * np.pi * t / 24) + 0.1 * rng.standard_normal(n)
    real = np.ones(n, dtype=bool)
    real[rng.choice(np.arange(1, n - 1), n * 3 // 100, replace=False)] = False
    observed = np.stack([real, real & (rng.random(n) > 0.05)], axis=1)
    observed[:3, 1] = False
    rows = np.flatnonzero(real)
    cells = {
        "a": [f"{x:.6f}" for x in a[rows]],
        "b": [f"{x:.6f}" if o else "" for x, o in zip(b[rows], observed[rows, 1], strict=True)],
    }
    return write_csv(path, [iso_utc(T0 + 3600 * i) for i in rows], cells), real, observed
