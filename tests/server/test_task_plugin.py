"""A task added as a plug-in only (issue 20): ``plugins/aaren_count_task`` (its folder) and one entry
point line of group ``aaren.tasks`` (written here as ``pip install`` of a distribution would leave it)
make a ``count`` task that real servers, in both process layouts, serve over aaren.v1 and OIP beside
the event model, with nothing of the server edited."""

from __future__ import annotations

import os
import queue
import re
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton
from server_helpers import CALL_TIMEOUT_S, OpenStream, layouts_of, outcome, stub_for

from aaren.server.tasks import registry
from aaren.v1 import aaren_pb2 as pb
from aaren_core.checkpoint import save_checkpoint

PLUGINS = Path(__file__).parent / "plugins"
SCALE = (1.0, 2.0)


def install(site: Path, monkeypatch: pytest.MonkeyPatch, line: str) -> None:
    """The plug-in's folder on the path and ``line`` as an entry point of group ``aaren.tasks`` (a
    distribution's metadata in ``site``), for this process and the front-end processes it starts."""
    dist = site / "aaren_count_task-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: aaren-count-task\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[aaren.tasks]\n{line}\n")
    for path in (PLUGINS, site):
        monkeypatch.syspath_prepend(str(path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGINS), str(site), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The count task's one registry line."""
    install(tmp_path / "site", monkeypatch, "count = aaren_count_task.spec:SPEC")


@pytest.fixture
def repository(tmp_path: Path, installed: None, tiny_checkpoint: Path) -> Path:
    from aaren_count_task.task import CountConfig, CountModel

    root = tmp_path / "models"
    shutil.copytree(tiny_checkpoint, root / "default")
    model = CountModel(CountConfig(value_width=2))
    with torch.no_grad():
        model.scale.copy_(torch.tensor(SCALE))
    save_checkpoint(root / "count", model, {"name": "tiny-count", "value_names": ["a", "b"]})
    return root


def _expected(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Running mean and std after each event, times the scale: ``[N, V]`` each (float64)."""
    n = np.arange(1, len(values) + 1)[:, None]
    mean = np.cumsum(values, 0) / n
    std = np.sqrt(np.maximum(np.cumsum(values**2, 0) / n - mean**2, 0))
    return mean * SCALE, std * SCALE


def _events(session: str, values: np.ndarray) -> list[pb.Event]:
    return [pb.Event(session_id=session, seq=i + 1, time=float(i), values=v.tolist()) for i, v in enumerate(values)]


def test_the_registry_reads_the_entry_point(installed):
    spec = registry.spec_of("count")
    assert (spec.task, spec.checkpoint_kind) == ("count", "count_model")
    assert registry.spec_of_kind("count_model") == spec
    assert sorted(registry.task_specs()) == ["class", "count", "event", "policy", "series"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("event = aaren_count_task.spec:SPEC", "must load to a TaskSpec whose task is 'event'"),
        ("count = aaren_count_task.spec:NOPE", "task plug-in 'count' (aaren_count_task.spec:NOPE) cannot be loaded"),
        ("count = aaren_count_task.spec:CLASH", "clashes with task 'event': names and checkpoint kinds must be unique"),
    ],
    ids=["misnamed", "missing", "clashing"],
)
def test_a_bad_plugin_line_stops_the_registry_saying_why(tmp_path, monkeypatch, line, expected):
    from aaren.server.contract.errors import ConfigError

    install(tmp_path / "site", monkeypatch, line)
    with pytest.raises(ConfigError, match=re.escape(expected)):
        registry.task_specs()
    with pytest.raises(ConfigError, match=re.escape("no task 'nope' is registered")):
        monkeypatch.setattr(registry, "task_specs", lambda: {s.task: s for s in registry.BUILT_IN})
        registry.spec_of("nope")


def test_a_plugin_task_is_served_over_aaren_v1_and_oip(start_server, frontends, repository):
    srv = layouts_of(start_server, frontends)(checkpoint=None, models_dir=repository)
    values = np.random.default_rng(3).normal(size=(7, 2)).astype(np.float32)
    mean, std = _expected(values.astype(np.float64))
    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        described = stub.DescribeModel(pb.DescribeModelRequest(model="tiny-count"), timeout=CALL_TIMEOUT_S)
        assert (described.task, list(described.value_names)) == ("count", ["a", "b"])
        assert list(described.served_models) == ["tiny", "tiny-count"]
        stream = OpenStream(stub)
        events = _events("v1", values)
        for i in range(3):  # event by event (the batched step), rows layout
            (result,) = stream.send([events[i]], model="tiny-count").results
            assert outcome(result) == "forecast" and result.forecast.model.name == "tiny-count"
            np.testing.assert_allclose([v.mean for v in result.forecast.values], mean[i], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose([v.std for v in result.forecast.values], std[i], rtol=1e-4, atol=1e-5)
        # The rest as one history (the prefill), columns layout.
        block = stream.send(events[3:], model="tiny-count", layout=pb.RESPONSE_LAYOUT_COLUMNS).forecast_columns
        assert list(block.seq) == [4, 5, 6, 7] and block.model.name == "tiny-count"
        np.testing.assert_allclose(np.array(block.value_means).reshape(4, 2), mean[3:], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.array(block.value_stds).reshape(4, 2), std[3:], rtol=1e-4, atol=1e-5)
        # The event model beside it is untouched.
        (event,) = stream.send([pb.Event(session_id="v1", seq=1, time=1.0, values=[0.0, 0.0])]).results
        assert event.forecast.HasField("next_time")
        stream.close()

    with triton.InferenceServerClient(srv.address) as client:
        meta = client.get_model_metadata("tiny-count")
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
            ("SEQ", "INT64", [1]), ("COUNT", "INT64", [1]), ("MEAN", "FP32", [2]), ("STD", "FP32", [2]),
        ]  # fmt: skip
        assert client.get_model_config("tiny-count").config.parameters["task"].string_value == "count"
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for i, v in enumerate(values):
            t = triton.InferInput("TIME", [1], "FP64")
            t.set_data_from_numpy(np.array([float(i)]))
            x = triton.InferInput("VALUES", [2], "FP32")
            x.set_data_from_numpy(v)
            client.async_stream_infer("tiny-count", [t, x], sequence_id="oip", sequence_start=i == 0)
        got = [answers.get(timeout=CALL_TIMEOUT_S) for _ in values]
        client.stop_stream()
    assert [e for _, e in got] == [None] * len(values)
    assert (
        [int(r.as_numpy("COUNT")[0]) for r, _ in got]
        == [int(r.as_numpy("SEQ")[0]) for r, _ in got]
        == [1, 2, 3, 4, 5, 6, 7]
    )
    np.testing.assert_allclose(np.stack([r.as_numpy("MEAN") for r, _ in got]), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack([r.as_numpy("STD") for r, _ in got]), std, rtol=1e-4, atol=1e-5)
