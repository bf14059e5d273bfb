"""The model side of the service: batched steps, history scans and forecasts as plain numbers.

Everything here is synchronous tensor work meant to run on the runtime's worker thread. Per
session the store keeps the backbone state's tensors plus ``features [d_model]``, the backbone
output after its last event, so a forecast needs no recomputation.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from aaren_core.checkpoint import load_checkpoint
from aaren_core.event_model import EventModel, EventModelConfig
from aaren_core.state import State

__all__ = [
    "Engine",
    "ForecastColumns",
    "ForecastNumbers",
    "ModelDescription",
    "RunInput",
    "load_engine",
    "resolve_device",
]

log = logging.getLogger(__name__)

FEATURES = "features"
COMPILE_WARMUP_TOP_K = 3


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


@dataclasses.dataclass(frozen=True, slots=True)
class ForecastColumns:
    """Forecasts of ``F`` rows as Python lists, one ``tolist`` per field (row ``r`` is one forecast).

    ``time_mean [F]``, ``time_quantiles [F][Q]``, ``top_marks``/``top_probs [F][k]`` (most likely
    first; rows may want fewer than ``k``), ``values [F][V]`` of ``(mean, std)``.
    """

    time_mean: list[float]
    time_quantiles: list[list[float]]
    top_marks: list[list[int]]
    top_probs: list[list[float]]
    values: list[list[tuple[float, float]]]

    def numbers(self, row: int, top_k: int) -> ForecastNumbers:
        return ForecastNumbers(
            self.time_mean[row],
            self.time_quantiles[row],
            list(zip(self.top_marks[row][:top_k], self.top_probs[row][:top_k], strict=True)),
            [tuple(v) for v in self.values[row]],  # type: ignore[misc]
        )


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
        compile_model: bool = False,
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
        mark_names = schema.get("mark_names", [str(i) for i in range(config.num_marks)])
        value_names = schema.get("value_names", [f"value_{i}" for i in range(config.value_width)])
        if len(mark_names) != config.num_marks or len(value_names) != config.value_width:
            raise ValueError(
                f"the checkpoint's schema names {len(mark_names)} marks and {len(value_names)} value columns; "
                f"its model has {config.num_marks} marks and {config.value_width} values"
            )
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
            mark_names=tuple(mark_names),
            value_names=tuple(value_names),
            time_unit=str(schema.get("time_unit", "")),
            device=str(device),
        )
        self._step = self._step_tensors
        self._forecast = self._forecast_tensors
        if compile_model:
            self._compile()

    def _compile(self) -> None:
        """Swap the batched step and the forecast for ``torch.compile``d versions (inductor; the batch
        dimension dynamic) and build their graphs now, for batches of 1 (specialized) and 2+, so that
        no request pays for compiling. The compiled forecast always ranks every mark (``top_k`` is
        cut afterwards), so no request's ``top_k`` recompiles it. Where compiling fails, now or on a
        later call, the eager model serves from then on."""
        started = time.perf_counter()
        step = torch.compile(self._step_tensors, dynamic=True)
        forecast = torch.compile(self._forecast_tensors, dynamic=True)
        every_mark = self.description.num_marks

        def compiled_step(*args: Tensor) -> tuple[Tensor, ...]:
            try:
                return step(*args)
            except Exception as exc:
                self._uncompile(exc)
                return self._step_tensors(*args)

        def compiled_forecast(features: Tensor, top_k: int) -> tuple[Tensor, ...]:
            try:
                time_mean, quantiles, marks, probs, values = forecast(features, every_mark)
            except Exception as exc:
                self._uncompile(exc)
                return self._forecast_tensors(features, top_k)
            return time_mean, quantiles, marks[:, :top_k], probs[:, :top_k], values

        self._step, self._forecast = compiled_step, compiled_forecast
        rows = self.layout_rows()
        for batch in (1, 2, 3):
            self.apply(
                {k: torch.stack([t] * batch) for k, t in rows.items()},  # strides as a store's rows have
                [RunInput([1.0], [0], [[0.0] * self.description.value_width], [0])] * batch,
                COMPILE_WARMUP_TOP_K,
            )
            if self._step == self._step_tensors:
                return  # compiling failed; _uncompile said why
        log.info("compiled the model's step and forecast in %.1f s", time.perf_counter() - started)

    def _uncompile(self, exc: Exception) -> None:
        """Serve the eager model from now on (e.g. no C++ compiler in a slim image: only slower)."""
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        log.warning("torch.compile failed (%s: %s); serving the model uncompiled", type(exc).__name__, reason)
        self._step, self._forecast = self._step_tensors, self._forecast_tensors

    def _step_tensors(self, dt: Tensor, marks: Tensor, values: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        """``model.step`` on plain tensors: ``(y [B, d_model], *new state tensors)``."""
        old = self._state_type(**dict(zip(self._state_fields, state, strict=True)))
        y, new = self.model.step(dt, marks, values, old)
        return (y, *new.tensors().values())

    def _forecast_tensors(self, features: Tensor, top_k: int) -> tuple[Tensor, ...]:
        """``model.forecast`` on plain tensors: gap mean, gap quantiles, top marks and probabilities, values."""
        f = self.model.forecast(features, self.quantiles, top_k)
        return f.time_mean, f.time_quantiles, f.top_marks, f.top_probs, torch.stack([f.value_mean, f.value_std], dim=-1)

    def layout_rows(self) -> dict[str, Tensor]:
        """The fresh row of every per-session tensor (state fields and features), on the device."""
        rows = {k: t[0] for k, t in self.model.init_state(1, device=self.device).tensors().items()}
        rows[FEATURES] = torch.zeros(self.model.config.backbone.d_model, device=self.device)
        return rows

    def state_of(self, rows: dict[str, Tensor]) -> State:
        return self._state_type(**{k: rows[k] for k in self._state_fields})

    @torch.inference_mode()
    def apply(
        self, rows: dict[str, Tensor], runs: Sequence[RunInput], top_k: int
    ) -> tuple[dict[str, Tensor], ForecastColumns | None, list[int]]:
        """Apply ``runs[i]`` to session row ``i`` of ``rows`` (``name -> [U, ...]``; the dict is updated
        with the new rows, as new tensors or in place).

        Sessions with one event are stepped together in one batched ``step``; runs of equal length
        ``L > 1`` are ingested together with one parallel scan (``prefill [R, L]``). Returns the rows,
        the forecasts at every run's ``forecast_at`` positions (run order, then position order; up
        to ``top_k`` marks each) and, per run, the index of its first forecast row.
        """
        by_length: dict[int, list[int]] = {}
        for i, run in enumerate(runs):
            by_length.setdefault(len(run.dt), []).append(i)
        feature_sources: list[tuple[Tensor, list[int]]] = []  # (features [R*L, d], flat row per forecast)
        order: list[tuple[int, int]] = []  # (run, position) of each forecast, in the order gathered
        for length, members in by_length.items():
            whole = len(members) == len(runs)  # one group: every row, in order; no gather or scatter
            idx = None if whole else torch.tensor(members, device=self.device)
            group = runs if whole else [runs[i] for i in members]
            state = self.state_of(rows if idx is None else {k: t.index_select(0, idx) for k, t in rows.items()})
            dt, marks, values = self._inputs(group, length)
            if length == 1:
                y, *stepped = self._step(dt[:, 0], marks[:, 0], values[:, 0], *state.tensors().values())  # y [R, d]
                state = self._state_type(**dict(zip(self._state_fields, stepped, strict=True)))
                last = y
            else:
                y, state = self.model.prefill(dt, marks, values, state)  # y [R, L, d]
                last = y[:, -1]
                y = y.reshape(-1, y.shape[-1])
            if idx is None:
                rows.update(state.tensors())
                rows[FEATURES] = last
            else:
                for k, t in state.tensors().items():
                    rows[k].index_copy_(0, idx, t)
                rows[FEATURES].index_copy_(0, idx, last)
            flat = []
            for r, i in enumerate(members):
                for pos in runs[i].forecast_at:
                    flat.append(r * length + pos)
                    order.append((i, pos))
            if flat:
                feature_sources.append((y, flat))
        if not order:
            return rows, None, [0] * len(runs)
        if len(feature_sources) == 1 and len(feature_sources[0][1]) == feature_sources[0][0].shape[0]:
            wanted = feature_sources[0][0]  # every row, in run order (e.g. a batch of single events)
        else:
            wanted = torch.cat(
                [y.index_select(0, torch.tensor(flat, device=self.device)) for y, flat in feature_sources]
            )
        if len(feature_sources) > 1:
            # Gathered by length group; put them back in run order so each run's forecasts are contiguous.
            permutation = sorted(range(len(order)), key=order.__getitem__)
            if permutation != list(range(len(order))):
                wanted = wanted.index_select(0, torch.tensor(permutation, device=self.device))
        starts, at = [], 0
        for run in runs:
            starts.append(at)
            at += len(run.forecast_at)
        return rows, self.forecast_columns(wanted, top_k), starts

    def _inputs(self, runs: Sequence[RunInput], length: int) -> tuple[Tensor, Tensor, Tensor]:
        """Runs of ``length`` events -> ``dt [R, L]``, ``marks [R, L]``, ``values [R, L, V]`` on the device."""
        v = self.model.config.value_width
        if length == 1:  # flat lists convert several times faster than nested ones
            dt = torch.tensor([run.dt[0] for run in runs], dtype=torch.float32, device=self.device)
            marks = torch.tensor([run.marks[0] for run in runs], dtype=torch.long, device=self.device)
            values = torch.tensor([x for run in runs for x in run.values[0]], dtype=torch.float32, device=self.device)
            return dt.unsqueeze(1), marks.unsqueeze(1), values.view(len(runs), 1, v)
        dt = torch.tensor([run.dt for run in runs], dtype=torch.float32, device=self.device)
        marks = torch.tensor([run.marks for run in runs], dtype=torch.long, device=self.device)
        values = torch.tensor([run.values for run in runs], dtype=torch.float32, device=self.device)
        return dt, marks, values.view(len(runs), length, v)

    @torch.inference_mode()
    def forecast_columns(self, features: Tensor, top_k: int) -> ForecastColumns:
        """Forecasts from ``features [F, d_model]`` as Python lists (one ``tolist`` per field)."""
        time_mean, time_quantiles, top_marks, top_probs, values = self._forecast(features, top_k)
        return ForecastColumns(
            time_mean=time_mean.tolist(),
            time_quantiles=time_quantiles.tolist(),
            top_marks=top_marks.tolist(),
            top_probs=top_probs.tolist(),
            values=values.tolist(),
        )

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


def load_engine(
    checkpoint: str | None,
    device: torch.device,
    quantiles: Sequence[float],
    *,
    seed: int = 0,
    compile_model: bool = False,
) -> Engine:
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
            compile_model=compile_model,
        )
    ckpt = load_checkpoint(checkpoint, map_location=device)
    if not isinstance(ckpt.model, EventModel):
        raise ValueError(f"{checkpoint} holds a {ckpt.kind!r} model; the service needs an event_model checkpoint")
    name = str(ckpt.metadata.get("name", f"aaren-{ckpt.config['backbone']['kind']}"))
    return Engine(
        ckpt.model,
        version=ckpt.model_version,
        name=name,
        metadata=ckpt.metadata,
        device=device,
        quantiles=quantiles,
        compile_model=compile_model,
    )
