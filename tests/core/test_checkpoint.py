"""Checkpoints rebuild the exact model and refuse damaged or mismatched files."""

from __future__ import annotations

import json

import pytest
import torch

from aaren_core import BackboneConfig, build_backbone
from aaren_core.checkpoint import CONFIG_FILE, WEIGHTS_FILE, CheckpointError, load_checkpoint, save_checkpoint


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model = build_backbone(BackboneConfig(kind="aaren", d_model=16, n_layers=2, n_heads=4)).eval()
    version = save_checkpoint(tmp_path, model, metadata={"schema": {"num_marks": 3}})
    return tmp_path, model, version


@pytest.mark.parametrize("kind", ["aaren", "transformer", "gru"])
def test_round_trip_recreates_the_exact_model(tmp_path, kind):
    torch.manual_seed(1)
    model = build_backbone(BackboneConfig(kind=kind, d_model=16, n_layers=2, n_heads=4)).eval()
    version = save_checkpoint(tmp_path, model, metadata={"note": "x"})
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.model_version == version and version.startswith("backbone-")
    assert ckpt.metadata == {"note": "x"} and ckpt.config["kind"] == kind
    assert type(ckpt.model) is type(model) and not ckpt.model.training
    for (name, a), b in zip(model.state_dict().items(), ckpt.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        assert torch.equal(model(x), ckpt.model(x))


def test_version_depends_on_weights_and_config(saved, tmp_path_factory):
    _, model, version = saved
    for _ in range(5):  # the same model always gives the same bytes, hence the same version
        assert save_checkpoint(tmp_path_factory.mktemp("same"), model) == version
    with torch.no_grad():
        model.norm.bias.add_(1e-3)
    assert save_checkpoint(tmp_path_factory.mktemp("changed"), model) != version


def test_damaged_weights_are_refused(saved):
    path, _, _ = saved
    data = bytearray((path / WEIGHTS_FILE).read_bytes())
    data[-3] ^= 0x01
    (path / WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="damaged or was replaced"):
        load_checkpoint(path)


def test_truncated_weights_are_refused(saved):
    path, _, _ = saved
    data = (path / WEIGHTS_FILE).read_bytes()
    (path / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="damaged or was replaced"):
        load_checkpoint(path)


def test_edited_config_is_refused(saved):
    path, _, _ = saved
    record = json.loads((path / CONFIG_FILE).read_text())
    record["model"]["config"]["d_model"] = 32
    (path / CONFIG_FILE).write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="config was edited after saving"):
        load_checkpoint(path)


def test_config_and_weights_of_different_models_are_refused(saved, tmp_path_factory):
    path, _, _ = saved
    other = build_backbone(BackboneConfig(kind="aaren", d_model=32, n_layers=2, n_heads=4))
    other_dir = tmp_path_factory.mktemp("other")
    save_checkpoint(other_dir, other)
    # A consistent record (hash and version recomputed) that points at weights of another size.
    record = json.loads((path / CONFIG_FILE).read_text())
    other_record = json.loads((other_dir / CONFIG_FILE).read_text())
    from aaren_core.checkpoint import _model_version

    record["weights_sha256"] = other_record["weights_sha256"]
    record["model_version"] = _model_version("backbone", record["model"]["config"], record["weights_sha256"])
    (path / CONFIG_FILE).write_text(json.dumps(record))
    (path / WEIGHTS_FILE).write_bytes((other_dir / WEIGHTS_FILE).read_bytes())
    with pytest.raises(CheckpointError, match="weights do not fit"):
        load_checkpoint(path)


def test_missing_and_malformed_files_are_refused(saved, tmp_path_factory):
    path, _, _ = saved
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_checkpoint(tmp_path_factory.mktemp("empty"))
    (path / CONFIG_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(path)
    (path / CONFIG_FILE).write_text(json.dumps({"format": "aaren-checkpoint", "format_version": 99}))
    with pytest.raises(CheckpointError, match="format_version 99"):
        load_checkpoint(path)


def test_missing_weights_are_refused(saved):
    path, _, _ = saved
    (path / WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        load_checkpoint(path)


def test_unknown_model_kind_is_refused(saved):
    path, _, _ = saved
    record = json.loads((path / CONFIG_FILE).read_text())
    record["model"]["kind"] = "mystery"
    (path / CONFIG_FILE).write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="unknown model kind 'mystery'"):
        load_checkpoint(path)
