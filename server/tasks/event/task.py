"""The model side of the service: batched steps, history scans and forecasts as plain numbers.

Everything here is synchronous tensor work, run by the engine core's batcher. Per
session the store keeps the backbone state's tensors plus ``features [d_model]``, the backbone
output after its last event, so a forecast needs no recomputation.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from aaren.server.stores.base import Rows, as_arrays
from aaren.server.tasks.event.outputs import OUTPUT_NAMES, EventOutputs
from aaren.server.tasks.runs import FEATURES, CheckedRows, RunColumns, RunTask
from aaren_core.attention.state import State
from aaren_core.checkpoint import Checkpoint, load_checkpoint
from aaren_core.tasks.event.fused import FusedEventModel
from aaren_core.tasks.event.model import EventModel, EventModelConfig

if TYPE_CHECKING:
    from aaren_core.tasks.event.kernel import EventKernel

__all__ = [
    "FEATURES",
    "OUTPUT_NAMES",
    "EventTask",
    "RunColumns",
    "from_checkpoint",
    "load_event_task",
    "resolve_device",
]

log = logging.getLogger(__name__)

COMPILE_WARMUP_TOP_K = 3


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU; anything else as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class EventTask(RunTask):
    """The event task (``aaren.server.tasks.base.Task``): an ``EventModel`` with a constant-size state
    per session, stepped and scanned in batches (``RunTask.apply``, with the fused batched step of
    every row at once as its ``_step_all`` hook); outputs ``EventOutputs``.

    On CPU, an Aaren model's batch of single events that all want a forecast (the common batch of a
    stream) is one call of the compiled step + forecast (``aaren_core.tasks.event.kernel``): ``apply``
    takes it before ``RunTask.apply``'s loop, which serves every other batch with the same numbers."""

    #: Step and forecast eagerly with ``aaren_core.tasks.event.fused`` (the weights folded once; the engine never
    #: changes them); False runs the module-by-module reference, ``EventModel.step`` and ``forecast``.
    fused: bool = True
    #: Serve batches of single events with the compiled kernel where it applies (CPU, Aaren, fused, not
    #: ``--compile-model``); False: the torch paths only.
    kernel: bool = True

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
        super().__init__(model, version=version, device=device)
        self.last_width = model.config.backbone.d_model
        self.quantiles = tuple(quantiles)
        schema = metadata.get("schema", {})
        config = model.config
        state_bytes = model.backbone.state_nbytes(model.init_state(1, device="cpu"))
        mark_names = self.checkpoint_names(schema.get("mark_names"), config.num_marks, "marks")
        value_names = self.checkpoint_names(schema.get("value_names"), config.value_width, "values", prefix="value_")
        self.description = self.describe(
            name,
            value_names=value_names,
            state_bytes=state_bytes,
            task="event",
            num_marks=config.num_marks,
            mark_names=tuple(mark_names),
            time_unit=str(schema.get("time_unit", "")),
            quantiles=self.quantiles,
        )
        self._step = self._step_tensors
        self._forecast = self._forecast_tensors
        self._kernel: EventKernel | None = None
        if compile_model:
            self._compile()
        elif self.kernel and self.fused and device.type == "cpu" and self._fused_model.has_step:
            self._kernel = self._build_kernel()

    def _build_kernel(self) -> EventKernel | None:
        """The compiled step + forecast of this model, called once now so that no request pays for
        compiling it (numba caches the machine code next to its module: later starts load it). None,
        with a warning, where numba cannot be imported (an environment without aaren's dependencies
        installed): the torch paths serve, with the same numbers within float32 rounding."""
        started = time.perf_counter()
        try:
            from aaren_core.tasks.event.kernel import EventKernel
        except ImportError as exc:
            log.warning("the compiled kernel is off (%s): serving the model's torch path", exc)
            return None
        kernel = EventKernel.from_fused(self._fused_model, self.quantiles)
        rows = {k: t.unsqueeze(0).numpy() for k, t in self.layout_rows().items()}
        kernel.prepare(rows["m"], rows["u"], rows["w"], rows["n_events"], self.description.ranked)
        log.info(
            "the compiled step and forecast are ready in %.1f s (layers' products: %s)",
            time.perf_counter() - started,
            kernel.blas_name,
        )
        return kernel

    @property
    def kernel_blas(self) -> str | None:
        """What computes the compiled kernel's layer products (``EventKernel.blas_name``: ``mkl``, ``openblas`` or
        ``loops``); None where the kernel does not serve (a GPU, ``--compile-model``, another backbone)."""
        return None if self._kernel is None else self._kernel.blas_name

    def apply(self, rows: Rows, runs: RunColumns, top_k: int) -> tuple[Rows, EventOutputs]:
        """``RunTask.apply``; a batch of single events that all want a forecast goes through the
        compiled kernel in one call: rows ``m, u [R, L, H]``, ``w [R, L, H, Dh]``, ``n_events [R]``,
        ``features [R, d]`` -> new rows and ``EventOutputs`` (the kernel's numbers equal the fused
        path's within float32 rounding, tests/core/test_kernel.py), the rows ``CheckedRows`` (the kernel
        says which are finite)."""
        kernel = self._kernel
        singles = len(runs.dt) == len(runs.lengths) and np.count_nonzero(runs.want) == len(runs.want)
        if kernel is None or not (singles and self.kernel and self.fused):
            return super().apply(rows, runs, top_k)  # type: ignore[return-value]
        host = as_arrays(rows)
        out = kernel.step_forecast(
            runs.dt,  # float64: a gap past float32 becomes inf there, its session's step overflows (refused)
            runs.marks,
            runs.values.reshape(len(runs.dt), self.description.value_width),
            *(host[k] for k in ("m", "u", "w", "n_events")),
            top_k,
        )
        # numpy rows as the kernel made them: the memory store writes them as they are (Rows)
        new = CheckedRows({"m": out.m, "u": out.u, "w": out.w, "n_events": out.n_events, FEATURES: out.y})
        if out.finite is not None:  # some row overflowed
            new.finite = out.finite
        return new, EventOutputs(*out.forecast)

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
                time_mean, quantiles, marks, probs, value_mean, value_std = forecast(features, every_mark)
            except Exception as exc:
                self._uncompile(exc)
                return self._forecast_tensors(features, top_k)
            return time_mean, quantiles, marks[:, :top_k], probs[:, :top_k], value_mean, value_std

        self._step, self._forecast = compiled_step, compiled_forecast
        rows = self.layout_rows()
        for batch in (1, 2, 3):
            self.apply(
                {k: torch.stack([t] * batch) for k, t in rows.items()},  # strides as a store's rows have
                RunColumns.single([1.0] * batch, [0] * batch, [[0.0] * self.description.value_width] * batch),
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

    @functools.cached_property
    def _fused_model(self) -> FusedEventModel:
        return FusedEventModel.from_model(self.model)

    def _step_tensors(self, dt: Tensor, marks: Tensor, values: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        """``model.step`` on plain tensors: ``(y [B, d_model], *new state tensors)``."""
        # torch.compile traces the modules instead: the fused path is the eager one.
        if self.fused and not torch.compiler.is_compiling() and self._fused_model.has_step:
            return self._fused_model.step(dt, marks, values, *state)
        old = self._state_type(**dict(zip(self._state_fields, state, strict=True)))
        y, new = self.model.step(dt, marks, values, old)
        return (y, *new.tensors().values())

    def _forecast_tensors(self, features: Tensor, top_k: int) -> tuple[Tensor, ...]:
        """``model.forecast`` on plain tensors: gap mean, gap quantiles, top marks and probabilities,
        value means and stds."""
        if self.fused and not torch.compiler.is_compiling():
            return self._fused_model.forecast(features, self.quantiles, top_k)
        f = self.model.forecast(features, self.quantiles, top_k)
        return f.time_mean, f.time_quantiles, f.top_marks, f.top_probs, f.value_mean, f.value_std

    def _event_inputs(self, runs: RunColumns) -> tuple[Tensor, Tensor, Tensor]:
        """Flat event columns -> ``dt [A]``, ``marks [A]``, ``values [A, V]`` tensors on the device."""
        dt = torch.from_numpy(runs.dt).to(self.device, torch.float32)
        marks = torch.from_numpy(runs.marks).to(self.device, torch.long)
        values = torch.from_numpy(runs.values).to(self.device, torch.float32)
        return dt, marks, values.view(len(runs.dt), self.description.value_width)

    def _step_all(self, runs: RunColumns, rows: dict[str, Tensor]) -> tuple[dict[str, Tensor], Tensor]:
        """Every run is one event: one batched step on the rows as they are, no gather or scatter."""
        y, *stepped = self._step(*self._event_inputs(runs), *(rows[k] for k in self._state_fields))  # y [R, d]
        new = dict(zip(self._state_fields, stepped, strict=True))
        new[FEATURES] = y
        return new, y

    def _step_events(self, inputs: tuple[Tensor, Tensor, Tensor], flat: Tensor, state: State) -> tuple[Tensor, State]:
        dt, marks, values = inputs
        y, *stepped = self._step(dt[flat], marks[flat], values[flat], *state.tensors().values())
        return y, self._state_type(**dict(zip(self._state_fields, stepped, strict=True)))

    def _prefill_events(
        self, inputs: tuple[Tensor, Tensor, Tensor], flat: Tensor, shape: tuple[int, int], state: State
    ) -> tuple[Tensor, State]:
        dt, marks, values = inputs
        return self.model.prefill(dt[flat].view(shape), marks[flat].view(shape), values[flat].view(*shape, -1), state)

    def empty_outputs(self, top_k: int) -> EventOutputs:
        k = min(top_k, self.description.num_marks)
        return EventOutputs.empty(k, len(self.quantiles), self.description.value_width)

    @torch.inference_mode()
    def forecast_outputs(self, features: Tensor, top_k: int) -> EventOutputs:
        """Forecasts from ``features [F, d_model]`` (``EventOutputs``): gap mean ``[F]`` and quantiles
        ``[F, Q]``, top marks and probabilities ``[F, k]``, value means and stds ``[F, V]``. With the
        kernel on, its forecast: a session's forecast is then the same numbers whichever call made
        it (a stream's step, a run's prefill, the unary ``Forecast``)."""
        if self._kernel is not None and self.kernel and self.fused:
            y = np.ascontiguousarray(features.numpy(), dtype=np.float32)
            return EventOutputs(*self._kernel.forecast(y, top_k))
        return EventOutputs(*(t.cpu().numpy() for t in self._forecast(features, top_k)))

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


def load_event_task(
    checkpoint: str | None,
    device: torch.device,
    quantiles: Sequence[float],
    *,
    seed: int = 0,
    compile_model: bool = False,
) -> EventTask:
    """The engine for ``checkpoint``, or for a random tiny Aaren model when it is None."""
    if checkpoint is None:
        torch.manual_seed(seed)
        config = EventModelConfig(num_marks=16, value_width=2)
        model = EventModel(config)
        log.warning("no checkpoint given and none bundled: serving a RANDOMLY INITIALISED model")
        return EventTask(
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
    return from_checkpoint(ckpt, device, quantiles, compile_model=compile_model)


def from_checkpoint(
    ckpt: Checkpoint, device: torch.device, quantiles: Sequence[float], *, compile_model: bool = False
) -> EventTask:
    """The task of a loaded event-model checkpoint (its registry entry's executor)."""
    assert isinstance(ckpt.model, EventModel)
    name = str(ckpt.metadata.get("name", f"aaren-{ckpt.config['backbone']['kind']}"))
    return EventTask(
        ckpt.model,
        version=ckpt.model_version,
        name=name,
        metadata=ckpt.metadata,
        device=device,
        quantiles=quantiles,
        compile_model=compile_model,
    )
