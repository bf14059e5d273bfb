"""Training: a tiny run learns, resuming replays the same trajectory, 2 DDP processes equal one."""

from __future__ import annotations

import csv
import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aaren_core.checkpoint import load_checkpoint
from aaren_core.tasks.event.config import TrainConfig
from aaren_core.tasks.event.data import (
    DataError,
    EventData,
    EventSchema,
    EventSequence,
    dequantize,
    fit_standardization,
)
from aaren_core.tasks.event.train import (
    eval_jitter,
    fit_log_dt,
    load_data,
    lr_at,
    resolve_config,
    train,
)
from aaren_core.training.loop import EarlyStopping

ROOT = Path(__file__).resolve().parents[2]
NUM_MARKS = 4


def make_sessions(n: int, length: int, seed: int, start: float = 0.0) -> list[EventSequence]:
    """Sessions whose next mark and gap depend on the history: mark k is mostly followed by k + 1,
    and the gap after mark k is about 2^k whole minutes (so times tie, as on the flights task)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        marks = [int(rng.integers(NUM_MARKS))]
        for _ in range(length - 1):
            marks.append((marks[-1] + 1) % NUM_MARKS if rng.random() < 0.8 else int(rng.integers(NUM_MARKS)))
        marks_arr = np.array(marks)
        gaps = np.floor(rng.exponential(2.0 ** marks_arr[:-1]))
        times = start + i + np.concatenate([[0.0], np.cumsum(gaps)])
        values = np.stack([marks_arr * 10.0 + rng.normal(0, 1, length), rng.normal(5, 2, length)], axis=1)
        out.append(EventSequence(f"s{start:.0f}-{i}", times, marks_arr, values))
    return out


def make_tiny_data(n_train: int = 9, length: int = 24) -> EventData:
    train_seqs = make_sessions(n_train, length, seed=1)
    schema = EventSchema(tuple(f"m{k}" for k in range(NUM_MARKS)), ("a", "b"), "minutes", (0.0, 0.0), (1.0, 1.0))
    return EventData(
        train=train_seqs,
        val=make_sessions(4, length, seed=2, start=1000),
        test=make_sessions(4, length, seed=3, start=2000),
        schema=fit_standardization(train_seqs, schema),
    )


def tiny_config(out_dir: Path, **changes) -> TrainConfig:
    base = {
        "backbone": "aaren",
        "d_model": 8,
        "n_layers": 1,
        "n_heads": 2,
        "n_components": 2,
        "time_features": 2,
        "epochs": 3,
        "batch_size": 4,
        "eval_batch_size": 4,
        "lr": 1e-2,
        "warmup_steps": 2,
        "out_dir": str(out_dir),
        "progress": False,
        "threads": 1,
        "name": "tiny",
    }
    return TrainConfig.from_dict({**base, **changes})


def test_tiny_training_lowers_the_loss_and_saves_a_servable_checkpoint(tmp_path):
    data = make_tiny_data()
    result = train(tiny_config(tmp_path, epochs=6), data=data, log=lambda _: None)
    val = [r["val"]["total"] for r in result.history]
    assert val[-1] < val[0] - 0.3
    steps = len(result.step_losses) // 6
    assert np.mean(result.step_losses[-steps:]) < np.mean(result.step_losses[:steps]) - 0.3
    best = load_checkpoint(result.best_dir)
    meta = best.metadata
    assert meta["name"] == "tiny"
    assert EventSchema.from_dict(meta["schema"]) == data.schema
    # The jitter was derived (whole minutes that tie) and is stored as a plain value.
    assert TrainConfig.from_dict(meta["train_config"]) == tiny_config(tmp_path, epochs=6, jitter=1.0)
    assert meta["dequantization"]["jitter"] == 1.0 and meta["dequantization"]["source"] == "derived"
    assert meta["val_metrics"]["total"] == pytest.approx(min(val))
    # The model standardizes raw values with the training statistics it was given.
    assert best.model.heads.value_mean.tolist() == pytest.approx(list(data.schema.value_mean))


def test_same_seed_same_run_other_seed_other_run(tmp_path):
    data = make_tiny_data()
    a = train(tiny_config(tmp_path / "a", epochs=1), data=data, log=lambda _: None)
    b = train(tiny_config(tmp_path / "b", epochs=1), data=data, log=lambda _: None)
    c = train(tiny_config(tmp_path / "c", epochs=1, seed=1), data=data, log=lambda _: None)
    assert a.step_losses == b.step_losses
    assert a.step_losses != c.step_losses


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    data = make_tiny_data()
    whole = train(tiny_config(tmp_path / "whole"), data=data, log=lambda _: None)
    cut = tiny_config(tmp_path / "cut")
    first = train(cut, data=data, stop_after_epochs=1, log=lambda _: None)
    assert len(first.history) == 1
    rest = train(cut, data=data, resume=True, log=lambda _: None)
    assert rest.step_losses == whole.step_losses
    assert [r["val"] for r in rest.history] == [r["val"] for r in whole.history]
    for name in ("last", "best"):
        assert (
            load_file(str(tmp_path / "cut" / name / "model.safetensors")).keys()
            == load_file(str(tmp_path / "whole" / name / "model.safetensors")).keys()
        )
        assert (tmp_path / "cut" / name / "model.safetensors").read_bytes() == (
            tmp_path / "whole" / name / "model.safetensors"
        ).read_bytes()


def test_resume_refuses_another_config(tmp_path):
    data = make_tiny_data()
    train(tiny_config(tmp_path), data=data, stop_after_epochs=1, log=lambda _: None)
    with pytest.raises(ValueError, match="d_model"):
        train(tiny_config(tmp_path, d_model=16), data=data, resume=True, log=lambda _: None)
    with pytest.raises(FileNotFoundError):
        train(tiny_config(tmp_path / "none"), data=data, resume=True, log=lambda _: None)


def write_events_csv(path: Path, data: EventData) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["session_id", "time", "mark", "a", "b"])
        for seq in [*data.train, *data.val, *data.test]:
            for t, m, v in zip(seq.times, seq.marks, seq.values, strict=True):
                w.writerow([seq.session_id, repr(float(t)), int(m), repr(float(v[0])), repr(float(v[1]))])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_with_two_processes_matches_one_process(tmp_path):
    # 9 training sessions in batches of 4: the last batch has 1 session, so one rank gets none.
    data = make_tiny_data(n_train=9)
    csv_path = tmp_path / "events.csv"
    write_events_csv(csv_path, data)
    fractions = {"val_fraction": 4 / 17, "test_fraction": 4 / 17, "time_unit": "minutes"}
    single = tiny_config(tmp_path / "single", data=str(csv_path), **fractions)
    ddp = single.replace(out_dir=str(tmp_path / "ddp"))
    config_path = tmp_path / "ddp.json"
    config_path.write_text(json.dumps(ddp.to_dict()))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        "aaren_core.tasks.run",
        "--task",
        "event",
        "--config",
        str(config_path),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = train(single, log=lambda _: None)
    two = json.loads((tmp_path / "ddp" / "last" / "trainer.json").read_text())
    assert len(two["step_losses"]) == len(one.step_losses) == 9
    np.testing.assert_allclose(two["step_losses"], one.step_losses, rtol=1e-5)
    np.testing.assert_allclose(
        [r["val"]["total"] for r in two["history"]], [r["val"]["total"] for r in one.history], rtol=1e-5
    )
    w_one = load_file(str(tmp_path / "single" / "last" / "model.safetensors"))
    w_two = load_file(str(tmp_path / "ddp" / "last" / "model.safetensors"))
    for key, value in w_one.items():
        # A key bias adds the same amount to every score of a query: softmax ignores it, its true
        # gradient is 0, and Adam turns the float noise it gets instead into steps of size lr.
        if not key.endswith("k_proj.bias"):
            torch.testing.assert_close(w_two[key], value, rtol=1e-4, atol=1e-5, msg=key)
    model_one = load_checkpoint(tmp_path / "single" / "last").model
    model_two = load_checkpoint(tmp_path / "ddp" / "last").model
    seq = data.test[0]
    inputs = (
        torch.from_numpy(np.diff(seq.times, prepend=seq.times[0])).float()[None],
        torch.from_numpy(seq.marks)[None],
        torch.from_numpy(seq.values)[None],
    )
    with torch.no_grad():
        torch.testing.assert_close(model_two(*inputs), model_one(*inputs), rtol=1e-4, atol=1e-5)


def test_config_from_toml_json_and_strings(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('backbone = "gru"\nd_model = 32\nlr = 0.001\nvalue_columns = ["x", "y"]\nprogress = false\n')
    config = TrainConfig.from_file(toml)
    assert (config.backbone, config.d_model, config.lr, config.value_columns, config.progress) == (
        "gru",
        32,
        0.001,
        ["x", "y"],
        False,
    )
    js = tmp_path / "c.json"
    js.write_text(json.dumps(config.to_dict()))
    assert TrainConfig.from_file(js) == config
    assert config.replace(epochs="7", progress="true", value_columns="a,b").epochs == 7
    assert config.replace(value_columns="a,b").value_columns == ["a", "b"]
    with pytest.raises(ValueError, match="unknown keys"):
        TrainConfig.from_dict({"epoch": 3})
    with pytest.raises(ValueError, match="expected int"):
        config.replace(epochs="many")
    with pytest.raises(ValueError, match="backbone"):
        config.replace(backbone="lstm")
    with pytest.raises(ValueError, match=r"time_unit in \['days', 'hours', 'minutes', 'seconds'\]"):
        config.replace(time_unit="hour")
    with pytest.raises(ValueError, match="max_minutes >= 0"):
        config.replace(max_minutes="-1")
    assert config.replace(max_minutes="2.5").max_minutes == 2.5
    assert TrainConfig().run_name == "aaren-flights"


def test_dequantization_breaks_ties_keeps_raw_times_and_is_seeded():
    seqs = make_sessions(5, 40, seed=0)
    assert any((np.diff(s.times) == 0).any() for s in seqs)
    jittered, raw = dequantize(seqs, 1.0, np.random.default_rng(0))
    for s, j, r in zip(seqs, jittered, raw, strict=True):
        assert (np.diff(j.times) > 0).all()
        assert (np.floor(j.times) == r).all() and (np.diff(r) >= 0).all()
        assert sorted(zip(r, j.marks, strict=True)) == sorted(zip(s.times, s.marks, strict=True))
    again, _ = dequantize(seqs, 1.0, np.random.default_rng(0))
    assert all((a.times == b.times).all() for a, b in zip(jittered, again, strict=True))
    with pytest.raises(ValueError, match="resolve_config"):
        eval_jitter(seqs, TrainConfig(), "val")
    config = TrainConfig(jitter=1.0)
    val_a, _ = eval_jitter(seqs, config, "val")
    val_b, _ = eval_jitter(seqs, config, "val")
    test_a, _ = eval_jitter(seqs, config, "test")
    assert (val_a[0].times == val_b[0].times).all() and not (val_a[0].times == test_a[0].times).all()
    mean, std = fit_log_dt(jittered)
    gaps = np.concatenate([np.diff(s.times) for s in jittered])
    assert (mean, std) == pytest.approx((np.log(gaps).mean(), np.log(gaps).std()))
    with pytest.raises(ValueError, match="jitter"):
        fit_log_dt(seqs)


def test_learning_rate_warms_up_then_decays_to_the_floor():
    config = TrainConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    lrs = [lr_at(s, 20, config) for s in range(20)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert all(a >= b for a, b in itertools.pairwise(lrs[3:]))
    assert lr_at(20, 20, config) == pytest.approx(0.1)


def test_early_stopping_rides_out_noise_and_stops_on_a_plateau():
    rng = np.random.default_rng(0)
    # A slow real improvement under epoch-to-epoch noise ten times larger never stops...
    improving = EarlyStopping(patience=8, min_delta=0.002, smoothing=0.6)
    vals = 6.0 - 0.01 * np.arange(40) + rng.uniform(-0.03, 0.03, 40)
    assert not any(improving.update(float(v)) for v in vals)
    # ...a plateau with the same noise does (new lows of the smoothed noise grow rare).
    plateau = EarlyStopping(patience=8, min_delta=0.002, smoothing=0.6)
    stops = [plateau.update(float(v)) for v in 5.6 + rng.uniform(-0.03, 0.03, 40)]
    assert any(stops)
    resumed = EarlyStopping(patience=8, min_delta=0.002, smoothing=0.6)
    resumed.load(json.loads(json.dumps(plateau.state())))
    assert resumed == plateau


def test_length_buckets_batch_similar_lengths_and_keep_every_sequence_once():
    import numpy as np

    from aaren_core.tasks.event.train import batch_order

    lengths = [int(x) for x in np.random.default_rng(0).integers(2, 500, 203)]
    order = np.random.default_rng(1).permutation(203)
    plain = batch_order(order, lengths, TrainConfig(batch_size=8), np.random.default_rng(2))
    assert [b.tolist() for b in plain] == [order[i : i + 8].tolist() for i in range(0, 203, 8)]
    bucketed = batch_order(order, lengths, TrainConfig(batch_size=8, length_buckets=5), np.random.default_rng(2))
    assert len(bucketed) == len(plain) and sorted(np.concatenate(bucketed).tolist()) == list(range(203))
    padded = sum(len(b) * max(lengths[i] for i in b) for b in bucketed)
    padded_plain = sum(len(b) * max(lengths[i] for i in b) for b in plain)
    assert padded < 0.75 * padded_plain  # sorted pools: far less padding than random batches


def write_hours_csv(path: Path, *, sessions: int, length: int, span: float, grid: float | None, seed: int = 0) -> Path:
    """Sessions ``s0..`` starting a day apart, ``length`` events each over about ``span`` hours; times
    on a ``grid`` (hours) or continuous (None); two marks, one value."""
    rng = np.random.default_rng(seed)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["session_id", "time", "mark", "load"])
        for i in range(sessions):
            times = 24.0 * i + np.sort(rng.uniform(0, span, length))
            if grid is not None:
                times = np.round(times / grid) * grid
            for k, t in enumerate(times):
                w.writerow([f"s{i}", repr(float(t)), "up" if k % 2 else "down", round(float(rng.normal(5, 1)), 2)])
    return path


def test_jitter_is_derived_from_the_training_times_unless_given(tmp_path):
    grid = write_hours_csv(tmp_path / "grid.csv", sessions=30, length=12, span=10, grid=0.25)
    config = tiny_config(tmp_path / "run", data=str(grid), time_unit="hours", epochs=1)
    resolved, record = resolve_config(config, load_data(config))
    assert resolved.jitter == 0.25 and record["source"] == "derived" and "0.25 hours" in record["how"]
    resolved, record = resolve_config(config.replace(jitter="0.5"), load_data(config))
    assert resolved.jitter == 0.5 and record["source"] == "given" and record["derived"]["step"] == 0.25
    smooth = write_hours_csv(tmp_path / "smooth.csv", sessions=30, length=12, span=10, grid=None)
    continuous = config.replace(data=str(smooth))
    resolved, record = resolve_config(continuous, load_data(continuous))
    assert resolved.jitter == 0.0 and record["method"].startswith("none") and "no gap is 0" in record["how"]

    # A run stores what it derived and how, and says so in its log.
    lines: list[str] = []
    result = train(config, log=lines.append)
    meta = load_checkpoint(result.best_dir).metadata
    assert meta["dequantization"]["jitter"] == 0.25 and meta["dequantization"]["source"] == "derived"
    assert TrainConfig.from_dict(meta["train_config"]).jitter == 0.25
    assert any("dequantization: uniform jitter U(0, 0.25) hours; resolution derived" in line for line in lines)
    # Resuming with the same (auto) config matches the stored, resolved one.
    train(config.replace(epochs=2), resume=True, log=lambda _: None)


def test_long_sessions_default_to_a_time_split_with_history_as_context(tmp_path):
    long = write_hours_csv(tmp_path / "long.csv", sessions=12, length=60, span=24 * 40, grid=0.25)
    config = tiny_config(tmp_path / "run", data=str(long), time_unit="hours")
    data = load_data(config)
    assert data.split is not None and data.split.method == "time" and "chosen by default" in data.split.reason
    c1, c2 = data.split.cutoffs
    for part, (lo, hi) in zip((data.train, data.val, data.test), ((-np.inf, c1), (c1, c2), (c2, np.inf)), strict=True):
        assert part
        for s in part:
            scored = s.times[max(s.context, 1) :]
            assert ((scored >= lo) & (scored < hi)).all()  # no scored test event before the val cutoff c1
    assert all(s.context > 0 for s in data.test if s.times[0] < c2)  # the history is context
    scored_test = sum(s.predicted for s in data.test)
    assert scored_test == pytest.approx(0.1 * 12 * 60, rel=0.2)
    # The resolved config keeps the exact cutoffs, so the checkpoint rebuilds the same split.
    resolved, _ = resolve_config(config, data)
    assert resolved.split == "time" and [float(c) for c in resolved.split_at] == [c1, c2]
    again = load_data(resolved)
    assert [(s.session_id, len(s), s.context) for s in again.test] == [
        (s.session_id, len(s), s.context) for s in data.test
    ]

    short = write_hours_csv(tmp_path / "short.csv", sessions=40, length=8, span=6, grid=0.25)
    data = load_data(config.replace(data=str(short)))
    assert data.split.method == "sessions" and all(s.context == 0 for s in data.test)
    assert len(data.test) == 4 and min(s.times[0] for s in data.test) > max(s.times[0] for s in data.train)
    # Either can be asked for; cutoffs as numbers or ISO datetimes (hours since the epoch).
    assert load_data(config.replace(data=str(short), split="time")).split.method == "time"
    assert load_data(config.replace(split="sessions")).split.method == "sessions"
    given = load_data(config.replace(split_at="1970-01-11T00:00,480"))
    assert given.split.cutoffs == (240.0, 480.0) and given.split.reason == "cutoffs given (split_at)"
    with pytest.raises(ValueError, match="split_at=<c1>,<c2>"):
        config.replace(split="sessions", split_at="1,2")
    with pytest.raises(ValueError, match="split in"):
        config.replace(split="random")
    with pytest.raises(DataError, match="expected c1 < c2"):
        load_data(config.replace(split_at="480,240"))
    with pytest.raises(DataError, match="leave no test events"):
        load_data(config.replace(split_at="240,1e9"))
    with pytest.raises(DataError, match="fixed split"):
        load_data(config.replace(data="flights", split="time"))
