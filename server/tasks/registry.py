"""The task registry: one line per task naming where its executor and its codecs live.

A task is one plug-in: a folder (``aaren.server.tasks.<task>``) with its execution (torch: a
``aaren.server.tasks.runs.RunTask``), its typed output columns (``outputs.py``), its aaren.v1
encoder (``aaren_v1.py``) and its OIP codec (``oip.py``); the last three are torch-free. A
``TaskSpec`` names them by dotted path (``module:attribute``) and nothing is imported until asked
for, so a front-end process that only encodes never imports torch. The engine core picks a
checkpoint's executor by the checkpoint's model kind (``TaskSpec.checkpoint_kind``); front ends
pick a model's codecs by its ``ModelDescription.task``. Nothing else names a task.

Adding a task: its folder and one line. Built-in tasks are the lines of ``BUILT_IN``. A task from
another distribution (or a test) adds its line without editing this file, as a Python entry point
of the group ``aaren.tasks`` (``ENTRY_POINT_GROUP``), the standard plug-in mechanism: the entry
point's name is the task's name and it loads to its ``TaskSpec`` (in a module that does not import
torch), e.g. in ``pyproject.toml``::

    [project.entry-points."aaren.tasks"]
    count = "my_package.count.spec:SPEC"

Entry points are read every time the tasks are listed (once per model load and per front-end
attach), so a plug-in installed into the environment is served by the next server that starts. A
plug-in cannot replace a built-in task or kind (refused at start: two executors for one name would
make a served model's meaning depend on what else is installed).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
from typing import Any

from aaren.server.contract.errors import ConfigError

__all__ = ["BUILT_IN", "ENTRY_POINT_GROUP", "TaskSpec", "spec_of", "spec_of_kind", "task_specs"]

ENTRY_POINT_GROUP = "aaren.tasks"


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task's registry line. ``task``: what ``ModelDescription.task`` says; ``checkpoint_kind``:
    the ``aaren_core.checkpoint`` model kind it serves; ``executor``: ``(checkpoint, device,
    quantiles, *, compile_model) -> Task`` (imports torch); ``aaren_v1`` and ``oip``: the codec
    classes, built with ``(description, default_top_k)``; ``outputs``: the task's
    ``OutputColumns`` class (the IPC rebuilds its outputs with it); the last three torch-free."""

    task: str
    checkpoint_kind: str
    executor: str
    aaren_v1: str
    oip: str
    outputs: str

    def load(self, what: str) -> Any:
        """The object one of the dotted paths above names (imported now)."""
        path = getattr(self, what)
        module, _, attribute = path.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"task {self.task!r}: its {what} {path!r} cannot be imported: {exc}") from exc


def _built_in(task: str, kind: str, folder: str, aaren_v1: str, oip: str, outputs: str) -> TaskSpec:
    package = f"aaren.server.tasks.{folder}"
    return TaskSpec(
        task,
        kind,
        f"{package}.task:from_checkpoint",
        f"{package}.aaren_v1:{aaren_v1}",
        f"{package}.oip:{oip}",
        f"{package}.outputs:{outputs}",
    )


BUILT_IN: tuple[TaskSpec, ...] = (
    _built_in("event", "event_model", "event", "EventEncoder", "EventCodec", "EventOutputs"),
    _built_in("series", "series_model", "series", "SeriesEncoder", "SeriesCodec", "SeriesOutputs"),
    _built_in("class", "class_model", "classify", "ClassEncoder", "ClassCodec", "ClassOutputs"),
    _built_in("policy", "policy_model", "policy", "PolicyEncoder", "PolicyCodec", "PolicyOutputs"),
)


def task_specs() -> dict[str, TaskSpec]:
    """Every task by name: the built-in ones, then the entry points of ``ENTRY_POINT_GROUP``."""
    specs = {s.task: s for s in BUILT_IN}
    kinds = {s.checkpoint_kind: s.task for s in BUILT_IN}
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = point.load()
        except Exception as exc:
            raise ConfigError(f"task plug-in {point.name!r} ({point.value}) cannot be loaded: {exc}") from exc
        if not isinstance(spec, TaskSpec) or spec.task != point.name:
            raise ConfigError(
                f"task plug-in {point.name!r} ({point.value}) must load to a TaskSpec whose task is {point.name!r}; "
                f"got {spec!r}"
            )
        clash = spec.task if spec.task in specs else kinds.get(spec.checkpoint_kind)
        if clash is not None and specs[clash] != spec:
            raise ConfigError(
                f"task plug-in {point.name!r} ({point.value}) clashes with task {clash!r}: names and checkpoint "
                "kinds must be unique"
            )
        specs[spec.task] = spec
        kinds[spec.checkpoint_kind] = spec.task
    return specs


def spec_of(task: str) -> TaskSpec:
    """The registry line of ``task`` (a ``ModelDescription.task``)."""
    specs = task_specs()
    if task not in specs:
        raise ConfigError(f"no task {task!r} is registered; registered: {sorted(specs)}")
    return specs[task]


def spec_of_kind(kind: str) -> TaskSpec | None:
    """The task that serves checkpoints of model kind ``kind``, None when none does."""
    return next((s for s in task_specs().values() if s.checkpoint_kind == kind), None)
