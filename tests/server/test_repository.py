"""The model repository: which models a server loads, their names, the default, and clear refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from generated import tiny_class_model, write_checkpoint

from aaren.server.contract.errors import ConfigError
from aaren.server.tasks.repository import load_models

CPU = torch.device("cpu")
LEVELS = (0.1, 0.5, 0.9)


def _class_checkpoint(path: Path, name: str, kind: str = "aaren") -> None:
    write_checkpoint(path, tiny_class_model(kind), name, task="class", channels=["a", "b"], class_names=list("xyz"))


def _load(root: Path, default_model: str | None = None):
    return load_models(checkpoint=None, models_dir=root, default_model=default_model, device=CPU, quantiles=LEVELS)


def test_the_folder_default_comes_first_and_folders_are_aliases(tmp_path, tiny_checkpoint):
    shutil.copytree(tiny_checkpoint, tmp_path / "default")
    _class_checkpoint(tmp_path / "aa-first", "gestures")
    served = _load(tmp_path)
    assert [t.description.name for t in served.tasks] == ["tiny", "gestures"]
    assert served.aliases == {"default": "tiny", "aa-first": "gestures"}
    chosen = _load(tmp_path, default_model="aa-first")  # a folder name works as well as a model name
    assert [t.description.name for t in chosen.tasks] == ["gestures", "tiny"]
    assert chosen.default.description.task == "class"


def test_refusals_name_what_is_wrong(tmp_path, tiny_checkpoint):
    shutil.copytree(tiny_checkpoint, tmp_path / "one")
    shutil.copytree(tiny_checkpoint, tmp_path / "two")
    with pytest.raises(ConfigError, match="two models are named 'tiny'"):
        _load(tmp_path)
    shutil.rmtree(tmp_path / "two")
    with pytest.raises(ConfigError, match=r"default_model 'nope' is not among .*\['tiny'\]"):
        _load(tmp_path, default_model="nope")
    _class_checkpoint(tmp_path / "growing", "growing", kind="transformer")
    with pytest.raises(ConfigError, match="grows with every event"):
        _load(tmp_path)
    with pytest.raises(ConfigError, match="is not a directory"):
        _load(tmp_path / "missing")


def test_an_empty_repository_serves_a_random_tiny_event_model(tmp_path):
    served = _load(tmp_path)
    assert len(served.tasks) == 1 and served.default.description.name == "aaren-random"
    with pytest.raises(ConfigError, match="holds no model"):
        _load(tmp_path, default_model="x")


def test_model_names_must_be_safe_keys(tmp_path):
    _class_checkpoint(tmp_path / "odd", "gestures{all}")
    with pytest.raises(ConfigError, match=r"named 'gestures\{all\}'; expected letters, digits"):
        _load(tmp_path)


def test_the_default_folders_model_keeps_the_stores_own_keys_whichever_model_is_default(tmp_path, tiny_checkpoint):
    from aaren.server.stores import model_store_url

    shutil.copytree(tiny_checkpoint, tmp_path / "default")
    _class_checkpoint(tmp_path / "gestures", "gestures")
    for default_model in (None, "gestures"):
        served = _load(tmp_path, default_model)
        assert served.legacy_keys == "tiny"
    url = "redis://127.0.0.1:6379/0?prefix=app:&timeout_s=3"
    assert model_store_url(url, "tiny", default=True) == url
    assert (
        model_store_url(url, "gestures", default=False)
        == "redis://127.0.0.1:6379/0?timeout_s=3&prefix=app%3Agestures%3A"
    )
    assert model_store_url("memory://?capacity=5", "gestures", default=False) == "memory://?capacity=5"


def test_a_checkpoint_that_names_another_number_of_classes_or_channels_than_its_model_is_refused(tmp_path):
    model = tiny_class_model("aaren")
    write_checkpoint(tmp_path / "wrong", model, "wrong", task="class", channels=["a", "b"], class_names=["x", "y"])
    with pytest.raises(ConfigError, match="the checkpoint names 2 classes; its model has 3"):
        _load(tmp_path)
    shutil.rmtree(tmp_path / "wrong")
    write_checkpoint(tmp_path / "wrong", model, "wrong", task="class", channels=["a"], class_names=list("xyz"))
    with pytest.raises(ConfigError, match="the checkpoint names 1 channels; its model has 2"):
        _load(tmp_path)
