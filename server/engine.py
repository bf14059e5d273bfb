"""The model side of the service: batched steps, history scans and forecasts as plain numbers.

Everything here is synchronous tensor work meant to run on the runtime's worker thread. Per
session the store keeps the backbone state's tensors plus ``features [d_model]``, the backbone
output after its last event, so a forecast needs no recomputation.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from aaren_core.checkpoint import load_checkpoint
from aaren_core.event_model import EventModel, EventModelConfig
from aaren_core.state import State

__all__ = ["Engine", "ForecastNumbers", "ModelDescription", "RunInput", "load_engine", "resolve_device"]

log = logging.getLogger(__name__)

FEATURES = "features"


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU; anything else as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclasses.dataclass(frozen=True)
class ModelDescription:
    name: str
    version: str
    backbone: str
    d_model: int
    n_layers: int
    n_heads: int
    num_marks: int
    value_width: int
    parameters: int
    state_bytes_per_session: int
    mark_names: tuple[str, ...]
    value_names: tuple[str, ...]
    time_unit: str
    device: str


@dataclasses.dataclass(frozen=True, slots=True)
class RunInput:
    """Consecutive events of one session to apply: gaps, marks, raw values; which positions want a forecast."""

    dt: list[float]
    marks: list[int]
    values: list[Sequence[float]]
    forecast_at: list[int]


@dataclasses.dataclass(frozen=True, slots=True)
class ForecastNumbers:
    """A forecast as Python numbers: gap mean and quantiles, top marks with probabilities, values (mean, std)."""

    time_mean: float
    time_quantiles: list[float]
    marks: list[tuple[int, float]]
    values: list[tuple[float, float]]


class Engine:
    """Wraps an ``EventModel`` with a constant-size state for serving."""

    def __init__(
        self,
        model: EventModel,
        *,
        version: str,
        name: str,
        metadata: dict[str, Any],
        device: torch.device,
        quantiles: Sequence[float],
    ) -> None:
        if model.backbone.state_type.growing:
            raise ValueError(
                f"the service keeps a constant-size state per session; the {model.config.backbone.kind!r} "
                "backbone's state grows with every event (use aaren or gru)"
            )
        self.model = model.to(device).eval()
        self.device = device
        self.version = version
        self.quantiles = tuple(quantiles)
        self._state_type = type(model.init_state(1))
        self._state_fields = list(model.init_state(1).tensors())
        schema = metadata.get("schema", {})
        config = model.config
        state_bytes = model.backbone.state_nbytes(model.init_state(1, device="cpu"))
        self.description = ModelDescription(
            name=name,
            version=version,
            backbone=config.backbone.kind,
            d_model=config.backbone.d_model,
            n_layers=config.backbone.n_layers,
            n_heads=config.backbone.n_heads,
            num_marks=config.num_marks,
            value_width=config.value_width,
            parameters=sum(p.numel() for p in model.parameters()),
            state_bytes_per_session=state_bytes,
            mark_names=tuple(schema.get("mark_names", [str(i) for i in range(config.num_marks)])),
            value_names=tuple(schema.get("value_names", [f"value_{i}" for i in range(config.value_width)])),
            time_unit=str(schema.get("time_unit", "")),
            device=str(device),
        )

    def layout_rows(self) -> dict[str, Tensor]:
        """The fresh row of every per-session tensor (state fields and features), on the device."""
        rows = {k: t[0] for k, t in self.model.init_state(1, device=self.device).tensors().items()}
        rows[FEATURES] = torch.zeros(self.model.config.backbone.d_model, device=self.device)
        return rows

    def state_of(self, rows: dict[str, Tensor]) -> State:
        return self._state_type(**{k: rows[k] for k in self._state_fields})

    @torch.inference_mode()
    def apply(
        self, rows: dict[str, Tensor], runs: Sequence[RunInput], top_k: Sequence[int]
    ) -> tuple[dict[str, Tensor], list[list[ForecastNumbers]]]:
        """Apply ``runs[i]`` to session row ``i`` of ``rows`` (``name -> [U, ...]``).

        Sessions with one event are stepped together in one batched ``step``; longer runs are
        ingested with the parallel scan (``prefill``). Returns the new rows and, per run, the
        forecasts at its ``forecast_at`` positions (``top_k[i]`` marks each).
        """
        n = len(runs)
        new_rows = rows  # freshly gathered by the store: updated in place
        wanted: list[Tensor] = []  # features rows to forecast, in (run, position) order
        feature_rows: dict[int, Tensor] = {}
        singles = [i for i, run in enumerate(runs) if len(run.dt) == 1]
        if singles:
            idx = torch.tensor(singles, device=self.device)
            state = self.state_of({k: t.index_select(0, idx) for k, t in rows.items()})
            dt, marks, values = self._inputs([runs[i] for i in singles])
            y, state = self.model.step(dt[:, 0], marks[:, 0], values[:, 0], state)
            for k, t in state.tensors().items():
                new_rows[k].index_copy_(0, idx, t)
            new_rows[FEATURES].index_copy_(0, idx, y)
            for j, i in enumerate(singles):
                feature_rows[i] = y[j : j + 1]
        for i in range(n):
            if len(runs[i].dt) <= 1:
                continue
            state = self.state_of({k: t[i : i + 1] for k, t in rows.items()})
            dt, marks, values = self._inputs([runs[i]])
            y, state = self.model.prefill(dt, marks, values, state)  # y [1, N, d]
            for k, t in state.tensors().items():
                new_rows[k][i] = t[0]
            new_rows[FEATURES][i] = y[0, -1]
            feature_rows[i] = y[0]
        counts = []
        for i, run in enumerate(runs):
            if run.forecast_at:
                wanted.append(feature_rows[i][run.forecast_at])
            counts.append(len(run.forecast_at))
        forecasts: list[list[ForecastNumbers]] = [[] for _ in runs]
        if wanted:
            flat_k = [top_k[i] for i, c in enumerate(counts) for _ in range(c)]
            numbers = self.forecast_numbers(torch.cat(wanted), flat_k)
            at = 0
            for i, c in enumerate(counts):
                forecasts[i] = numbers[at : at + c]
                at += c
        return new_rows, forecasts

    def _inputs(self, runs: Sequence[RunInput]) -> tuple[Tensor, Tensor, Tensor]:
        """Equal-length runs -> ``dt [R, N]``, ``marks [R, N]``, ``values [R, N, V]`` on the device."""
        v = self.model.config.value_width
        dt = torch.tensor([run.dt for run in runs], dtype=torch.float32, device=self.device)
        marks = torch.tensor([run.marks for run in runs], dtype=torch.long, device=self.device)
        values = torch.tensor([list(run.values) for run in runs], dtype=torch.float32, device=self.device)
        return dt, marks, values.view(len(runs), len(runs[0].dt), v)

    @torch.inference_mode()
    def forecast_numbers(self, features: Tensor, top_k: Sequence[int]) -> list[ForecastNumbers]:
        """Forecasts from ``features [R, d_model]`` as Python numbers (one ``tolist`` per field)."""
        k_max = max(top_k)
        f = self.model.forecast(features, self.quantiles, k_max)
        means = f.time_mean.tolist()
        quantiles = f.time_quantiles.tolist()
        top_marks = f.top_marks.tolist()
        top_probs = f.top_probs.tolist()
        value_pairs = torch.stack([f.value_mean, f.value_std], dim=-1).tolist()
        return [
            ForecastNumbers(
                time_mean=means[r],
                time_quantiles=quantiles[r],
                marks=list(zip(top_marks[r][: top_k[r]], top_probs[r][: top_k[r]], strict=True)),
                values=[(m, s) for m, s in value_pairs[r]],
            )
            for r in range(features.shape[0])
        ]

    @torch.inference_mode()
    def sample(
        self, rows: dict[str, Tensor], horizon: int, num_samples: int, seed: int | None
    ) -> tuple[list[list[float]], list[list[int]], list[list[list[float]]]]:
        """Sampled futures of one session (rows ``[1, ...]``): gaps, marks, values per path."""
        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        gaps, marks, values = self.model.sample_paths(
            rows[FEATURES], self.state_of(rows), horizon, num_samples, generator
        )
        return gaps.tolist(), marks.tolist(), values.tolist()


def load_engine(checkpoint: str | None, device: torch.device, quantiles: Sequence[float], *, seed: int = 0) -> Engine:
    """The engine for ``checkpoint``, or for a random tiny Aaren model when it is None."""
    if checkpoint is None:
        torch.manual_seed(seed)
        config = EventModelConfig(num_marks=16, value_width=2)
        model = EventModel(config)
        log.warning("no checkpoint given and none bundled: serving a RANDOMLY INITIALISED model")
        return Engine(
            model,
            version=f"random-seed{seed}",
            name="aaren-random",
            metadata={"schema": {"time_unit": "minutes"}},
            device=device,
            quantiles=quantiles,
        )
    ckpt = load_checkpoint(checkpoint, map_location=device)
    if not isinstance(ckpt.model, EventModel):
        raise ValueError(f"{checkpoint} holds a {ckpt.kind!r} model; the service needs an event_model checkpoint")
    name = str(ckpt.metadata.get("name", f"aaren-{ckpt.config['backbone']['kind']}"))
    return Engine(
        ckpt.model, version=ckpt.model_version, name=name, metadata=ckpt.metadata, device=device, quantiles=quantiles
    )
