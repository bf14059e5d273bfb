"""A model's description read from its checkpoint folder, without loading it (no torch).

A checkpoint folder (``aaren_core.checkpoint``) holds ``config.json``: the model kind and config
(sizes, marks, channels, horizon, quantile levels) and free-form ``metadata`` (the model's name and
data schema: mark names, value names, time unit). ``describe_model_folder`` turns it into the
``ModelInfoOut`` a server would describe for the same checkpoint, so a command that only needs the
model's schema (``aaren produce``, ``aaren replay --from-sink``) can do without a server. What only a
loaded model knows is left empty: ``state_bytes_per_session`` 0, ``device`` "", ``parameters`` the
metadata's count or 0.

``folder`` may also be a model repository (sub-folders holding checkpoints, as ``aaren serve
--models-dir`` serves): the model is then picked by name or folder name (``model``), else the folder
``default``, else the first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aaren.client.client import LimitsOut, ModelInfoOut
from aaren.formats.models import default_max_gap_steps

__all__ = ["CONFIG_FILE", "ModelFolderError", "checkpoint_folder", "describe_model_folder"]

#: The checkpoint's JSON file (``aaren_core.checkpoint.CONFIG_FILE``, not imported: it loads torch).
CONFIG_FILE = "config.json"
DEFAULT_FOLDER = "default"


class ModelFolderError(ValueError):
    """A folder that holds no readable checkpoint (or not the model asked for)."""


def checkpoint_folder(folder: Path | str, model: str = "") -> Path:
    """The checkpoint folder meant: ``folder`` itself when it holds ``config.json``, else its
    sub-folder of the model named ``model`` (by metadata name or folder name), ``default``, or the first."""
    folder = Path(folder)
    if (folder / CONFIG_FILE).is_file():
        return folder
    if not folder.is_dir():
        raise ModelFolderError(f"model folder {folder}: not found; expected a checkpoint folder (with {CONFIG_FILE})")
    children = sorted(p for p in folder.iterdir() if (p / CONFIG_FILE).is_file())
    if not children:
        raise ModelFolderError(f"model folder {folder}: holds no {CONFIG_FILE} and no sub-folder with one")
    if model:
        for child in children:
            if child.name == model or _read_config(child).get("metadata", {}).get("name") == model:
                return child
        raise ModelFolderError(
            f"model folder {folder}: no model named {model!r}; its folders: {', '.join(c.name for c in children)}"
        )
    return next((c for c in children if c.name == DEFAULT_FOLDER), children[0])


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"{path}: cannot be read as a checkpoint config ({exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise ModelFolderError(f"{path}: not a checkpoint config (expected an object with a 'model' entry)")
    return config


def describe_model_folder(
    folder: Path | str, *, model: str = "", quantiles: Sequence[float], limits: LimitsOut
) -> ModelInfoOut:
    """The description of the checkpoint at ``folder`` (module docstring). ``quantiles``: the gap
    quantile levels an event model's forecasts carry (a server setting; series models have their
    own); ``limits``: the limits to state (a server's defaults)."""
    path = checkpoint_folder(folder, model)
    config = _read_config(path)
    kind = str(config["model"].get("kind", ""))
    cfg: dict[str, Any] = config["model"].get("config") or {}
    metadata: dict[str, Any] = config.get("metadata") or {}
    backbone: dict[str, Any] = cfg.get("backbone") or {}
    common: dict[str, Any] = {
        "version": str(config.get("model_version", "")),
        "backbone": str(backbone.get("kind", "")),
        "d_model": int(backbone.get("d_model", 0)),
        "n_layers": int(backbone.get("n_layers", 0)),
        "n_heads": int(backbone.get("n_heads", 0)),
        "parameters": int(metadata.get("parameters", 0)),
        "state_bytes_per_session": 0,
        "device": "",
        "limits": limits,
    }
    try:
        if kind == "event_model":
            return _event(cfg, metadata, common, tuple(quantiles))
        if kind == "series_model":
            return _series(cfg, metadata, common)
        if kind == "class_model":
            return _class(cfg, metadata, common)
        if kind == "policy_model":
            return _policy(cfg, metadata, common)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFolderError(f"{path / CONFIG_FILE}: a {kind} config without what it needs ({exc})") from None
    raise ModelFolderError(
        f"{path / CONFIG_FILE}: model kind {kind!r}; expected event_model, series_model, class_model or policy_model"
    )


def _channels(cfg: dict[str, Any], metadata: dict[str, Any]) -> tuple[str, ...]:
    n = int(cfg["n_channels"])
    channels = tuple(str(c) for c in metadata.get("channels") or (f"value_{i}" for i in range(n)))
    if len(channels) != n:
        raise ValueError(f"the metadata names {len(channels)} channels; the model has {n}")
    return channels


def _event(
    cfg: dict[str, Any], metadata: dict[str, Any], common: dict[str, Any], quantiles: tuple[float, ...]
) -> ModelInfoOut:
    # As the server names and describes it (aaren.server.tasks.event.task).
    num_marks, width = int(cfg["num_marks"]), int(cfg["value_width"])
    schema: dict[str, Any] = metadata.get("schema") or {}
    marks = tuple(str(m) for m in schema.get("mark_names") or (str(i) for i in range(num_marks)))
    values = tuple(str(v) for v in schema.get("value_names") or (f"value_{i}" for i in range(width)))
    if len(marks) != num_marks or len(values) != width:
        raise ValueError(
            f"the schema names {len(marks)} marks and {len(values)} values; the model has {num_marks}, {width}"
        )
    return ModelInfoOut(
        name=str(metadata.get("name") or f"aaren-{common['backbone']}"),
        num_marks=num_marks,
        value_width=width,
        mark_names=marks,
        value_names=values,
        time_unit=str(schema.get("time_unit", "")),
        quantile_levels=quantiles,
        **common,
    )


def _channel_model(
    task: str, cfg: dict[str, Any], metadata: dict[str, Any], common: dict[str, Any], **facts: Any
) -> ModelInfoOut:
    """A series or class model: one mark, its ``channels`` as the values, named by task and data set."""
    channels = _channels(cfg, metadata)
    return ModelInfoOut(
        name=str(metadata.get("name") or f"aaren-{task}-{metadata.get('data', 'model')}"),
        num_marks=1,
        value_width=len(channels),
        value_names=channels,
        task=task,
        missing_values=True,
        **facts,
        **common,
    )


def _series(cfg: dict[str, Any], metadata: dict[str, Any], common: dict[str, Any]) -> ModelInfoOut:
    step_seconds = float(metadata.get("step_seconds", 0.0))
    return _channel_model(
        "series", cfg, metadata, common,
        mark_names=("observation",),
        time_unit="seconds",
        horizon=int(cfg["horizon"]),
        step_seconds=step_seconds,
        max_gap_steps=int(metadata.get("max_gap_steps") or 0) or default_max_gap_steps(step_seconds),
        quantile_levels=tuple(float(q) for q in cfg.get("quantiles") or ()),
    )  # fmt: skip


def _class(cfg: dict[str, Any], metadata: dict[str, Any], common: dict[str, Any]) -> ModelInfoOut:
    n = int(cfg["n_classes"])
    classes = tuple(str(c) for c in metadata.get("class_names") or range(n))
    if len(classes) != n:
        raise ValueError(f"the metadata names {len(classes)} classes; the model has {n}")
    return _channel_model(
        "class", cfg, metadata, common,
        mark_names=("step",),
        time_unit=str(metadata.get("time_unit", "steps")),
        class_names=classes,
        quantile_levels=(),
    )  # fmt: skip


def _policy(cfg: dict[str, Any], metadata: dict[str, Any], common: dict[str, Any]) -> ModelInfoOut:
    # As the server describes it (aaren.server.tasks.policy.task); a checkpoint that names no target
    # return states 0 here (the server falls back to the environment family's).
    n = int(cfg["obs_dim"])
    obs = tuple(str(o) for o in metadata.get("obs_names") or (f"obs_{i}" for i in range(n)))
    if len(obs) != n:
        raise ValueError(f"the metadata names {len(obs)} observations; the model has {n}")
    env = str(metadata.get("env") or "")
    return ModelInfoOut(
        name=str(metadata.get("name") or f"aaren-policy-{env or 'model'}"),
        num_marks=1,
        value_width=1 + n,
        mark_names=("step",),
        value_names=("reward", *obs),
        time_unit="steps",
        task="policy",
        action_width=int(cfg["act_dim"]),
        env=env,
        target_return=float(metadata.get("target_return") or 0.0),
        quantile_levels=(),
        **common,
    )
