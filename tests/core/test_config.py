"""The one config I/O (aaren_core.config): one conversion rule for every config, records that read
back unchanged, and written commands that parse back to the same config."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from aaren_core.config import field_defaults, parse_sets
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.classify.model import ClassModelConfig
from aaren_core.tasks.config import TaskTrainConfig
from aaren_core.tasks.config import command_line as task_command_line
from aaren_core.tasks.event.config import TrainConfig
from aaren_core.tasks.event.config import command_line as event_command_line
from aaren_core.tasks.event.model import EventModelConfig
from aaren_core.tasks.series.baselines import DLinearConfig
from aaren_core.tasks.series.model import SeriesModelConfig
from aaren_core.training.knobs import TrainKnobs


@pytest.mark.parametrize(("text", "value"), [("true", True), ("YES", True), ("1", True), ("no", False), ("0", False)])
def test_one_boolean_rule_for_the_event_and_the_task_configs(text, value):
    assert TrainConfig().replace(progress=text).progress is value
    assert TaskTrainConfig().replace(time_features=text).time_features is value
    assert TaskTrainConfig().replace(time_decay=text).time_decay is value


def test_a_bad_boolean_a_bad_number_and_an_unknown_key_say_what_was_expected():
    for config, owner in ((TrainConfig(), "train config"), (TaskTrainConfig(), "task config")):
        with pytest.raises(ValueError, match=rf"{owner}: epochs='many'; expected int"):
            config.replace(epochs="many")
        with pytest.raises(ValueError, match=rf"{owner}: seed=1.5; expected int"):
            config.replace(seed=1.5)
        with pytest.raises(ValueError, match=rf"{owner}: unknown keys \['nope'\]"):
            config.replace(nope=1)
    with pytest.raises(ValueError, match="expected true or false"):
        TaskTrainConfig().replace(window_offsets="maybe")
    with pytest.raises(ValueError, match=r"backbone config: unknown keys \['width'\]"):
        BackboneConfig.from_dict({"width": 3})


def test_lists_tuples_and_none_from_strings():
    config = TaskTrainConfig().replace(quantiles="0.05, 0.5,0.95", time_decay="auto")
    assert config.quantiles == (0.05, 0.5, 0.95) and config.time_decay is None
    event = TrainConfig().replace(value_columns="a,b", jitter="none", split_at="2013-10-01,2013-11-01")
    assert event.value_columns == ["a", "b"] and event.jitter is None
    assert event.split_at == ["2013-10-01", "2013-11-01"]


@pytest.mark.parametrize(
    "config",
    [
        BackboneConfig(kind="gru", d_model=16, n_layers=1, n_heads=2, d_ff=0, dropout=0.1, time_decay=False),
        EventModelConfig(
            backbone=BackboneConfig(kind="aaren", d_model=8, n_layers=1, n_heads=2, time_decay=True),
            num_marks=3,
            value_width=2,
            gap_max=4.5,
        ),
        SeriesModelConfig(
            BackboneConfig(kind="transformer", d_model=8, n_layers=1, n_heads=2), 3, 12, (0.2, 0.8), 4, "gaussian"
        ),
        ClassModelConfig(BackboneConfig(), 2, 5),
        DLinearConfig(24, 6, 5),
    ],
)
def test_model_configs_read_back_equal_from_their_records(config):
    record = config.to_dict()
    assert type(config).from_dict(record) == config
    assert all(not isinstance(v, tuple) for v in record.values())  # JSON values: tuples are lists


def test_records_lead_with_their_own_keys_then_follow_field_order():
    """The sizes come from shared bases (``BackboneSizes``, ``EventSizes``: first in field order),
    yet each model record still leads with its own keys (``RECORD_LEADS``), a nested one too, so a
    checkpoint's model config is written as it always was. A train config leads with its own keys,
    then its bases' fields (the sizes, then the ``TrainKnobs`` both train configs share), then the
    rest: metrics.json, reports and written commands show them in this order (it carries no meaning)."""
    sizes = ["d_model", "n_layers", "n_heads", "d_ff", "dropout"]
    assert list(BackboneConfig().to_dict()) == ["kind", *sizes, "time_decay"]
    event_model = EventModelConfig().to_dict()
    assert list(event_model["backbone"]) == ["kind", *sizes, "time_decay"]
    heads = ["n_components", "time_features"]
    assert list(event_model) == ["backbone", "num_marks", "value_width", *heads, "gap_max", "time_resolution"]
    knobs = [f.name for f in dataclasses.fields(TrainKnobs)]
    event = ["backbone", *sizes, *heads, *knobs, "time_decay", "data"]
    assert list(TrainConfig().to_dict())[: len(event)] == event
    task = ["task", "model", "data", *sizes, *knobs, "time_decay", "horizon"]
    assert list(TaskTrainConfig().to_dict())[: len(task)] == task


def test_written_commands_parse_back_to_the_same_config():
    event = TrainConfig(d_model=32, time_decay=False, jitter=1.0, split="time", value_columns=["x"], patience=3)
    words = shlex.split(event_command_line(event))
    flags = {words[i][2:].replace("-", "_"): words[i + 1] for i in range(2, len(words), 2) if words[i] != "--set"}
    sets = parse_sets(words[i + 1] for i in range(2, len(words), 2) if words[i] == "--set")
    assert TrainConfig().replace(**flags, **sets) == event

    task = TaskTrainConfig(task="series", horizon=24, quantiles=(0.05, 0.5, 0.95), window_offsets=False, name="x")
    words = shlex.split(task_command_line(task))
    pairs = dict(zip(words[2::2], words[3::2], strict=True))
    assert pairs["--task"] == "series" and pairs["--name"] == "x"
    sets = parse_sets(words[i + 1] for i in range(2, len(words), 2) if words[i] == "--set")
    rebuilt = TaskTrainConfig(task="series").replace(
        data=pairs["--data"], name=pairs["--name"], out_dir=pairs["--out-dir"], **sets
    )
    assert rebuilt == task


def test_set_items_need_an_equals_sign():
    assert parse_sets(["max-minutes=2", "name=a=b"]) == {"max_minutes": "2", "name": "a=b"}
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_sets(["epochs"])


MODELS = Path(__file__).resolve().parents[2] / "models"
MODEL_CONFIGS = {"event_model": EventModelConfig, "series_model": SeriesModelConfig, "class_model": ClassModelConfig}
#: Keys added since the bundled models were trained, with the values that reproduce their runs.
ADDED = {
    "head": "quantile",
    "window_offsets": False,
    "time_column": "time",
    "channels": [],
    "step_seconds": 0.0,
    "split": "",
    "split_at": "",
    "max_gap_steps": 0,
    "test_data": "",
}


@pytest.mark.parametrize(
    ("folder", "model_added", "train_added"),
    [
        ("default", {}, {}),
        ("series-power", {"head": "quantile"}, ADDED),
        ("class-vowels", {}, {**ADDED, "window_offsets": True}),
    ],
)
def test_the_bundled_models_stored_configs_read_back_to_the_same_records(folder, model_added, train_added):
    """A bundled checkpoint's model config and train config read back to the very records stored,
    plus only the keys added since; a task model's metrics.json holds that stored train config (its
    keys in the order they were written then: the order of a JSON object carries no meaning)."""
    stored = json.loads((MODELS / folder / "config.json").read_text())
    model = stored["model"]
    assert MODEL_CONFIGS[model["kind"]].from_dict(model["config"]).to_dict() == {**model["config"], **model_added}
    train = stored["metadata"]["train_config"]
    if model["kind"] == "event_model":
        assert TrainConfig.from_record(train).to_dict() == {**train, **train_added}
        return
    record = TaskTrainConfig.from_dict(train).to_dict()
    assert record == {**train, **train_added}
    assert json.loads((MODELS / folder / "metrics.json").read_text())["config"] == train


def test_field_defaults_change_a_base_fields_default_in_its_place_and_refuse_unknown_or_own_names():
    @dataclasses.dataclass(frozen=True)
    class Base:
        a: int = 1
        b: str = "x"

    @dataclasses.dataclass(frozen=True)
    @field_defaults(b="y")
    class Child(Base):
        c: float = 0.5

    assert [(f.name, f.default) for f in dataclasses.fields(Child)] == [("a", 1), ("b", "y"), ("c", 0.5)]
    assert Base().b == "x" and Child().b == "y" and Child(b="z").b == "z"
    with pytest.raises(TypeError, match=r"names \['d'\], which no dataclass base declares"):

        @field_defaults(d=1)
        class Unknown(Base):
            pass

    with pytest.raises(TypeError, match=r"names \['c'\], which the class declares itself"):

        @field_defaults(c=1.0)
        class Own(Child):
            c: float = 0.5
