"""A time-decay Aaren model served: saved and loaded, its history in one call equals its steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from generated import decay_model

from aaren.server.tasks.event.task import OUTPUT_NAMES, EventTask, RunColumns
from aaren_core.checkpoint import load_checkpoint, save_checkpoint


@pytest.mark.parametrize("fused", [True, False])
def test_engine_history_and_steps_of_a_saved_decay_model_agree(tmp_path, fused):
    """Saved and loaded, the model serves a history in one call as it serves it event by event."""
    model = decay_model(seed=2)
    save_checkpoint(tmp_path / "ckpt", model, {"name": "decay", "schema": {"time_unit": "minutes"}})
    loaded = load_checkpoint(tmp_path / "ckpt").model
    assert loaded.config.backbone.time_decay
    torch.testing.assert_close(loaded.backbone.layers[0].mixer.log_rate, model.backbone.layers[0].mixer.log_rate)
    engine = EventTask(loaded, version="v", name="decay", metadata={}, device=torch.device("cpu"), quantiles=(0.1, 0.9))
    engine.fused = fused
    rng = np.random.default_rng(0)
    n = 9
    dt = np.concatenate([[0.0], rng.exponential(5.0, n - 1)])
    marks, values = rng.integers(0, 5, n), rng.normal(size=(n, 2))
    rows = {k: t.unsqueeze(0) for k, t in engine.layout_rows().items()}
    history_rows, typed = engine.apply(
        rows, RunColumns(dt, marks, values.astype(np.float32), np.array([0]), np.array([n]), np.ones(n, dtype=bool)), 5
    )
    history = typed.to_columns()
    step_rows = rows
    for i in range(n):
        step_rows, one_typed = engine.apply(
            step_rows, RunColumns.single([dt[i]], [int(marks[i])], [values[i].tolist()]), 5
        )
        one = one_typed.to_columns()
    for name in OUTPUT_NAMES:
        if name != "top_marks":
            np.testing.assert_allclose(history[name][-1], one[name][0], rtol=1e-4, atol=1e-5, err_msg=name)
    for name, t in history_rows.items():
        torch.testing.assert_close(t, torch.as_tensor(step_rows[name]), rtol=1e-4, atol=1e-5, msg=name)
