"""The model repository: which models one server serves, each by name, each with its task.

As in Triton's model repository, a folder holds one sub-folder per model; here each sub-folder is
a checkpoint (``aaren_core.checkpoint``: ``config.json`` + ``model.safetensors``) and its task
comes from the model kind it holds, through the task registry (``aaren.server.tasks.registry``:
``event_model`` -> the event task, ``series_model`` -> series, ``class_model`` -> class, and the
kinds of plug-in tasks). A model is named by its checkpoint's ``name`` (what ``ModelRef.name`` shows);
requests may also use its folder's name. Names are unique within a server.

The default model (requests that name none) is ``default_model`` when set, else the folder
``default``, else the first folder in name order. Sessions of the folder ``default``'s model keep
the store's own key space (where a one-model server kept them); every other model's live under
its name (``aaren.server.stores.model_store_url``), so choosing another default moves no session.
``checkpoint`` serves that one checkpoint alone; no repository and no checkpoint serves a random
tiny event model (said loudly).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import torch

from aaren.server.contract.errors import ConfigError
from aaren.server.tasks import registry
from aaren.server.tasks.base import Task
from aaren.server.tasks.event.task import load_event_task
from aaren_core.checkpoint import CONFIG_FILE, CheckpointError, load_checkpoint

__all__ = ["ServedModels", "load_models", "load_task", "model_folders"]

log = logging.getLogger(__name__)

DEFAULT_FOLDER = "default"


#: Model names: they name metrics, store key spaces (Redis key prefixes) and requests' models.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclasses.dataclass(frozen=True)
class ServedModels:
    """The loaded models, the default first; ``aliases`` maps folder names to model names;
    ``legacy_keys`` names the model whose sessions keep the store's own key space (the folder
    ``default``'s, or the one ``checkpoint``'s: where a one-model server kept them), whichever
    model is the default; every other model's sessions live under its name."""

    tasks: list[Task]
    aliases: dict[str, str]
    legacy_keys: str | None = None

    @property
    def default(self) -> Task:
        return self.tasks[0]


def load_task(
    checkpoint: str | Path,
    device: torch.device,
    quantiles: Sequence[float],
    *,
    compile_model: bool = False,
) -> Task:
    """The task for one checkpoint, chosen by the kind of model it holds (``registry.spec_of_kind``).
    The executor is imported before the checkpoint loads: a plug-in's module registers its model kind."""
    spec = registry.spec_of_kind(_declared_kind(Path(checkpoint)))
    executor = spec.load("executor") if spec is not None else None
    try:
        ckpt = load_checkpoint(checkpoint, map_location=device)
    except CheckpointError as exc:
        raise ConfigError(f"model {checkpoint}: {exc}") from None
    if executor is None:
        kinds = sorted(s.checkpoint_kind for s in registry.task_specs().values())
        raise ConfigError(
            f"model {checkpoint} holds a {ckpt.kind!r} model; the service serves {', '.join(kinds)} checkpoints"
        )
    try:
        task: Task = executor(ckpt, device, quantiles, compile_model=compile_model)
    except ValueError as exc:
        raise ConfigError(f"model {checkpoint}: {exc}") from None
    name = task.description.name
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"model {checkpoint} is named {name!r}; expected letters, digits, '.', '_' or '-' (at most 128, "
            "starting with a letter or digit): the name keys its sessions and metrics"
        )
    return task


def _declared_kind(checkpoint: Path) -> str:
    """The model kind a checkpoint's config names ("" when it cannot be read: loading it says why)."""
    try:
        return str(json.loads((checkpoint / CONFIG_FILE).read_text())["model"]["kind"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def model_folders(root: Path) -> list[Path]:
    """The sub-folders of ``root`` that hold a checkpoint, by name."""
    if not root.is_dir():
        raise ConfigError(f"models_dir {root} is not a directory")
    return sorted(p for p in root.iterdir() if (p / CONFIG_FILE).is_file())


def load_models(
    *,
    checkpoint: Path | None,
    models_dir: Path,
    default_model: str | None,
    device: torch.device,
    quantiles: Sequence[float],
    compile_model: bool = False,
) -> ServedModels:
    """Every model to serve (module docstring), the default first."""
    if checkpoint is not None:
        task = load_task(checkpoint, device, quantiles, compile_model=compile_model)
        return ServedModels([task], {Path(checkpoint).name: task.description.name}, task.description.name)
    folders = model_folders(models_dir)
    if not folders:
        if default_model is not None:
            raise ConfigError(f"default_model {default_model!r}: {models_dir} holds no model")
        random = load_event_task(None, device, quantiles, compile_model=compile_model)
        return ServedModels([random], {}, random.description.name)
    tasks: list[Task] = []
    aliases: dict[str, str] = {}
    by_name: dict[str, Path] = {}
    for folder in folders:
        task = load_task(folder, device, quantiles, compile_model=compile_model)
        name = task.description.name
        if name in by_name:
            raise ConfigError(f"two models are named {name!r}: {by_name[name]} and {folder}; names must be unique")
        by_name[name] = folder
        aliases[folder.name] = name
        tasks.append(task)
    names = [t.description.name for t in tasks]
    if default_model is not None:
        wanted = aliases.get(default_model, default_model)
        if wanted not in names:
            raise ConfigError(
                f"default_model {default_model!r} is not among the models of {models_dir}: {sorted(names)} "
                f"(folders {sorted(aliases)})"
            )
    else:
        wanted = aliases.get(DEFAULT_FOLDER, names[0])
    first = names.index(wanted)
    tasks.insert(0, tasks.pop(first))
    for task in tasks:
        d = task.description
        log.info("model %s: task %s, version %s, %d parameters", d.name, d.task, d.version, d.parameters)
    legacy = aliases.get(DEFAULT_FOLDER)
    # Folder names that are also another model's name would be ambiguous: the model name wins.
    aliases = {k: v for k, v in aliases.items() if k not in by_name or k == v}
    return ServedModels(tasks, aliases, legacy)
