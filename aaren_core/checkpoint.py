"""Checkpoints: weights in safetensors beside a JSON config, with a content hash as the model version.

A checkpoint is a directory with two files:

- ``model.safetensors``: the state dict (no pickle);
- ``config.json``: ``format``, ``format_version``, ``model`` (a registered model kind and the
  config that rebuilds it), ``metadata`` (free-form JSON: task head, data schema, training run),
  ``weights_sha256`` and ``model_version``.

``model_version`` is ``"<kind>-<first 16 hex of sha256(config, weights)>"``: two checkpoints
share it exactly when they describe the same function. Loading rebuilds the model from the
config, checks the hash and loads the weights strictly; any mismatch raises ``CheckpointError``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from aaren_core.nn.backbones import Backbone, BackboneConfig, build_backbone
from aaren_core.tasks.classify.model import ClassModel, ClassModelConfig
from aaren_core.tasks.event.model import EventModel, EventModelConfig
from aaren_core.tasks.policy.model import BCModel, BCModelConfig, PolicyModel, PolicyModelConfig
from aaren_core.tasks.series.baselines import DLinear, DLinearConfig
from aaren_core.tasks.series.model import SeriesModel, SeriesModelConfig

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "Checkpoint",
    "CheckpointError",
    "load_checkpoint",
    "register_model",
    "save_checkpoint",
]

CHECKPOINT_FORMAT = "aaren-checkpoint"
CHECKPOINT_FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that is missing, damaged, or does not describe a model this library can build."""


@dataclasses.dataclass(frozen=True)
class _ModelKind:
    model_type: type[nn.Module]
    build: Callable[[dict[str, Any]], nn.Module]


_REGISTRY: dict[str, _ModelKind] = {}


def register_model(name: str, model_type: type[nn.Module], build: Callable[[dict[str, Any]], nn.Module]) -> None:
    """Make ``model_type`` savable: ``build(config_dict)`` must rebuild it from ``model.config.to_dict()``."""
    _REGISTRY[name] = _ModelKind(model_type, build)


def _kind_of(model: nn.Module) -> str:
    matches = [name for name, kind in _REGISTRY.items() if isinstance(model, kind.model_type)]
    if matches:
        # The most specific registered type wins (a subclass over its base).
        return max(matches, key=lambda name: len(_REGISTRY[name].model_type.__mro__))
    raise CheckpointError(f"{type(model).__name__} is not a registered model kind; registered: {sorted(_REGISTRY)}")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: the model (eval mode), its config and metadata, and its version."""

    model: nn.Module
    kind: str
    config: dict[str, Any]
    metadata: dict[str, Any]
    model_version: str


def _model_version(kind: str, config: dict[str, Any], weights_sha256: str) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps({"kind": kind, "config": config}, sort_keys=True).encode())
    digest.update(weights_sha256.encode())
    return f"{kind}-{digest.hexdigest()[:16]}"


def save_checkpoint(directory: str | Path, model: nn.Module, metadata: dict[str, Any] | None = None) -> str:
    """Write ``model`` (which has ``.config.to_dict()``) to ``directory``; returns its model version."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    kind = _kind_of(model)
    config = model.config.to_dict()  # type: ignore[union-attr, operator]
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    # One metadata entry: safetensors orders several in a hash map, which would change the bytes
    # (and so the version) from one save to the next.
    weights = st_save(tensors, metadata={"aaren": json.dumps({"format": CHECKPOINT_FORMAT, "kind": kind})})
    weights_sha256 = hashlib.sha256(weights).hexdigest()
    version = _model_version(kind, config, weights_sha256)
    record = {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "model": {"kind": kind, "config": config},
        "metadata": metadata or {},
        "weights_sha256": weights_sha256,
        "model_version": version,
    }
    # Weights first: a crash between the two writes leaves a config whose hash does not match.
    (directory / WEIGHTS_FILE).write_bytes(weights)
    (directory / CONFIG_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return version


def _read_record(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"no {CONFIG_FILE} in {directory}; expected a directory written by save_checkpoint")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(record, dict) or record.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not an {CHECKPOINT_FORMAT!r} config")
    if record.get("format_version") != CHECKPOINT_FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format_version {record.get('format_version')!r}; "
            f"this library reads {CHECKPOINT_FORMAT_VERSION}"
        )
    for key in ("model", "weights_sha256", "model_version"):
        if key not in record:
            raise CheckpointError(f"{path} lacks the key {key!r}")
    return record


def load_checkpoint(directory: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Rebuild the exact model saved in ``directory``; raise ``CheckpointError`` on any mismatch."""
    directory = Path(directory)
    record = _read_record(directory)
    kind, config = record["model"].get("kind"), record["model"].get("config")
    if kind not in _REGISTRY:
        raise CheckpointError(f"{directory}: unknown model kind {kind!r}; expected one of {sorted(_REGISTRY)}")
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise CheckpointError(f"no {WEIGHTS_FILE} in {directory}")
    weights = weights_path.read_bytes()
    sha = hashlib.sha256(weights).hexdigest()
    if sha != record["weights_sha256"]:
        raise CheckpointError(
            f"{weights_path} is damaged or was replaced: sha256 {sha[:16]}..., "
            f"expected {record['weights_sha256'][:16]}... from {CONFIG_FILE}"
        )
    version = _model_version(kind, config, sha)
    if version != record["model_version"]:
        raise CheckpointError(
            f"{directory}: model_version {record['model_version']!r} does not match its config and weights "
            f"({version!r}); the config was edited after saving"
        )
    try:
        model = _REGISTRY[kind].build(config)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot build a {kind!r} model from its config: {exc}") from exc
    try:
        tensors = st_load(weights)
    except SafetensorError as exc:
        raise CheckpointError(f"{weights_path} is not a readable safetensors file: {exc}") from exc
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{directory}: weights do not fit the {kind!r} model in the config: {exc}") from exc
    model.to(map_location).eval()
    return Checkpoint(model, kind, config, record.get("metadata", {}), version)


register_model("backbone", Backbone, lambda config: build_backbone(BackboneConfig.from_dict(config)))
register_model("event_model", EventModel, lambda config: EventModel(EventModelConfig.from_dict(config)))
register_model("series_model", SeriesModel, lambda config: SeriesModel(SeriesModelConfig.from_dict(config)))
register_model("class_model", ClassModel, lambda config: ClassModel(ClassModelConfig.from_dict(config)))
register_model("dlinear", DLinear, lambda config: DLinear(DLinearConfig.from_dict(config)))
register_model("policy_model", PolicyModel, lambda config: PolicyModel(PolicyModelConfig.from_dict(config)))
register_model("policy_bc_model", BCModel, lambda config: BCModel(BCModelConfig.from_dict(config)))
