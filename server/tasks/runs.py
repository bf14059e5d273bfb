"""Runs of events applied to per-session rows: the one loop every task's ``apply`` is.

A batch holds ``A`` events of ``R`` sessions as flat columns (``RunColumns``), session ``r``'s run
being ``starts[r] : starts[r] + lengths[r]``. ``RunTask.apply`` groups the runs by length: runs of
one event go through one batched ``step`` (``[R_1]`` events), runs of equal length ``L > 1``
through one parallel ``prefill [R_L, L]``, the scan that gives the same numbers as stepping them one
by one (docs/architecture.md, invariant 2). Each group's end state and the row of what its last
event left (``FEATURES [R_L, W]``: a backbone output, or a class model's logits) are written back
into the new rows; the rows of the events ``want`` selects become the task's forecasts.

A task supplies its inputs and its step and prefill (``_event_inputs``, ``_step_events``,
``_prefill_events``) and, as a hook, ``_step_all``: a faster path for a batch of single events
only (the event task's fused step on the store's rows as they are, with no gather or scatter).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aaren.server.contract.columns import ModelDescription, OutputColumns
from aaren.server.stores.base import Rows, as_tensors
from aaren_core.attention.state import State

__all__ = ["FEATURES", "CheckedRows", "RunColumns", "RunTask"]

#: The row of what a session's last event left (the store's key: it stays "features" for every task).
FEATURES = "features"


@dataclasses.dataclass(slots=True)
class RunColumns:
    """The events a batch applies, as flat columns grouped by session (``A`` events, ``R`` sessions).

    ``dt [A]`` gaps since each event's previous one (0 for a session's first event), ``marks [A]``,
    ``values [A, V]`` raw values, ``want [A]`` which events get a forecast; session ``r``'s events are
    ``starts[r] : starts[r] + lengths[r]``. ``times [A]`` the events' own times (tasks whose inputs
    come from the clock, e.g. a series' calendar features; None when no task needs them).
    """

    dt: np.ndarray
    marks: np.ndarray
    values: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    want: np.ndarray
    times: np.ndarray | None = None

    @classmethod
    def single(
        cls,
        dt: Sequence[float],
        marks: Sequence[int],
        values: Sequence[Sequence[float]],
        times: Sequence[float] | None = None,
    ) -> RunColumns:
        """One event per session, every one forecast."""
        n = len(dt)
        return cls(
            np.asarray(dt, dtype=np.float64),
            np.asarray(marks, dtype=np.int64),
            np.asarray(values, dtype=np.float32).reshape(n, -1),
            np.arange(n),
            np.ones(n, dtype=np.int64),
            np.ones(n, dtype=bool),
            None if times is None else np.asarray(times, dtype=np.float64),
        )


class CheckedRows(dict[str, Tensor | np.ndarray]):
    """New rows (``name -> [R, ...]``) that their task has checked for finiteness as it made them:
    ``finite [R]``, which rows' every float is finite (None: all). A task's ``apply`` may return
    these instead of a plain dict; the batcher then does not check the rows again. Made as a dict is
    (``CheckedRows(rows)``), ``finite`` set after."""

    finite: np.ndarray | None = None


class RunTask:
    """What every task shares (``aaren.server.tasks.base.Task``): a model with a constant-size state
    per session, kept as rows (its state fields plus ``FEATURES``), and the one ``apply``."""

    description: ModelDescription
    #: Width ``W`` of the ``FEATURES`` row.
    last_width: int

    def __init__(self, model: Any, *, version: str, device: torch.device) -> None:
        """``model``: an ``nn.Module`` with ``init_state(batch, device) -> State`` (a constant-size one)."""
        fresh = model.init_state(1, device="cpu")
        if type(fresh).growing:
            kind = getattr(getattr(model.config, "backbone", None), "kind", type(model).__name__)
            raise ValueError(
                f"the service keeps a constant-size state per session; the {kind!r} "
                "backbone's state grows with every event (use aaren or gru)"
            )
        self.model = model.to(device).eval()
        self.version = version
        self.device = device
        self._state_type = type(fresh)
        self._state_fields = list(fresh.tensors())

    @staticmethod
    def checkpoint_names(given: Sequence[Any] | None, width: int, what: str, *, prefix: str = "") -> tuple[str, ...]:
        """The ``width`` names of the model's ``what`` (marks, value columns, channels, classes...)
        as the checkpoint's metadata gives them (``given``; absent or empty: ``prefix0, prefix1...``).
        ``ValueError`` when the checkpoint names another number than the model has."""
        names = tuple(str(x) for x in given) if given else tuple(f"{prefix}{i}" for i in range(width))
        if len(names) != width:
            raise ValueError(f"the checkpoint names {len(names)} {what}; its model has {width}")
        return names

    def describe(
        self, name: str, *, value_names: Sequence[str], state_bytes: int, task: str, **task_fields: Any
    ) -> ModelDescription:
        """The description every task shares (its name and version, the backbone's kind and sizes, the
        parameters, ``state_bytes`` a session, the values it takes, the device, ``task``) plus the task's
        own ``ModelDescription`` fields (marks, time unit, quantiles, horizon, classes...)."""
        b = self.model.config.backbone
        return ModelDescription(
            name=name,
            version=self.version,
            backbone=b.kind,
            d_model=b.d_model,
            n_layers=b.n_layers,
            n_heads=b.n_heads,
            value_width=len(value_names),
            value_names=tuple(value_names),
            parameters=sum(p.numel() for p in self.model.parameters()),
            state_bytes_per_session=state_bytes,
            device=str(self.device),
            task=task,
            **task_fields,
        )

    def layout_rows(self) -> dict[str, Tensor]:
        """The fresh row of every per-session tensor (state fields and ``FEATURES [W]``), on the device."""
        rows = {k: t[0] for k, t in self.model.init_state(1, device=self.device).tensors().items()}
        rows[FEATURES] = torch.zeros(self.last_width, device=self.device)
        return rows

    def state_of(self, rows: Rows) -> State:
        tensors = as_tensors({k: rows[k] for k in self._state_fields})
        return self._state_type(**tensors)

    # ------------------------------------------------------------------ what a task supplies

    def _event_inputs(self, runs: RunColumns) -> Any:
        """The batch's inputs on the device (indexed by flat event positions in the steps below)."""
        raise NotImplementedError

    def _step_events(self, inputs: Any, flat: Tensor, state: State) -> tuple[Tensor, State]:
        """One step of ``R`` sessions (their events at ``flat [R]``): ``FEATURES [R, W]`` and the new state."""
        raise NotImplementedError

    def _prefill_events(self, inputs: Any, flat: Tensor, shape: tuple[int, int], state: State) -> tuple[Tensor, State]:
        """``R`` runs of ``L`` events (``flat [R * L]``, ``shape (R, L)``): ``FEATURES [R, L, W]`` and the end state."""
        raise NotImplementedError

    #: The hook of a batch of single events only: ``(runs, rows) -> (new rows, FEATURES [A, W])``,
    #: or None for the general path (which gives the same numbers).
    _step_all: Any = None

    def empty_outputs(self, top_k: int) -> OutputColumns:
        raise NotImplementedError

    def forecast_outputs(self, features: Tensor, top_k: int) -> OutputColumns:
        raise NotImplementedError

    # ------------------------------------------------------------------ the loop

    @torch.inference_mode()
    def apply(self, rows: Rows, runs: RunColumns, top_k: int) -> tuple[Rows, OutputColumns]:
        """Apply session ``r``'s events ``runs.starts[r] : runs.starts[r] + runs.lengths[r]`` (flat
        columns, one session's events together and in order) to row ``r`` of ``rows`` (``name -> [R, ...]``,
        tensors or numpy arrays: ``Rows``).

        Returns new rows (``rows`` itself is not changed) and the outputs of the events where
        ``runs.want`` holds, in flat order (up to ``top_k`` ranked entries each; module docstring).
        """
        rows = as_tensors(rows)
        n_runs, n_events = len(runs.lengths), len(runs.dt)
        if n_events == n_runs and self._step_all is not None:
            new, features = self._step_all(runs, rows)
        else:
            inputs = self._event_inputs(runs)
            features = torch.empty(n_events, self.last_width, device=self.device)  # [A, W]
            lengths = np.unique(runs.lengths).tolist()
            # One length: every row is replaced whole below, so nothing needs the copy that several
            # lengths write into (row by row, leaving ``rows`` as it was).
            new = dict(rows) if len(lengths) == 1 else {k: t.clone() for k, t in rows.items()}
            for length in lengths:
                members_np = np.flatnonzero(runs.lengths == length)
                members = None if len(members_np) == n_runs else torch.from_numpy(members_np).to(self.device)
                state = self.state_of(
                    rows if members is None else {k: t.index_select(0, members) for k, t in rows.items()}
                )
                flat_np = (runs.starts[members_np][:, None] + np.arange(length)).reshape(-1)  # [R_L * L]
                flat = torch.from_numpy(flat_np).to(self.device)
                if length == 1:
                    out, state = self._step_events(inputs, flat, state)  # [R_L, W]
                    last = out
                    features.index_copy_(0, flat, out)
                else:
                    out, state = self._prefill_events(inputs, flat, (len(members_np), length), state)  # [R_L, L, W]
                    last = out[:, -1]
                    features.index_copy_(0, flat, out.reshape(-1, out.shape[-1]))
                for k, t in {**state.tensors(), FEATURES: last}.items():
                    if members is None:
                        new[k] = t
                    else:
                        new[k].index_copy_(0, members, t)
        if runs.want.all():
            wanted = features
        elif runs.want.any():
            wanted = features.index_select(0, torch.from_numpy(np.flatnonzero(runs.want)).to(self.device))
        else:
            return new, self.empty_outputs(top_k)
        return new, self.forecast_outputs(wanted, top_k)
