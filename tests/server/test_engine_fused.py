"""The engine's compiled kernel (the default on CPU) and its fused torch step and forecast
(``EventTask.kernel = False``) equal its module-by-module reference (``EventTask.fused = False``):
output columns and new rows, over a session's events and batch sizes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from aaren.server.stores.base import as_tensors
from aaren.server.tasks.event.task import OUTPUT_NAMES, RunColumns, load_event_task


@pytest.mark.parametrize("path", ["kernel", "fused"])
@pytest.mark.parametrize("batch", [1, 5, 33])
def test_fused_engine_equals_reference_engine(batch, path):
    fused = load_event_task(None, torch.device("cpu"), (0.1, 0.5, 0.9))
    assert fused._kernel is not None  # built for a CPU Aaren model
    fused.kernel = path == "kernel"
    reference = load_event_task(None, torch.device("cpu"), (0.1, 0.5, 0.9))
    reference.fused = False
    width = fused.description.value_width
    rows = {k: torch.stack([t] * batch) for k, t in fused.layout_rows().items()}
    rows_ref = dict(rows)
    rng = np.random.default_rng(batch)
    for event in range(8):
        dt = rng.exponential(10.0, batch) if event else np.zeros(batch)
        runs = RunColumns.single(
            dt.tolist(), rng.integers(0, 16, batch).tolist(), rng.normal(size=(batch, width)).tolist()
        )
        rows, typed = fused.apply(rows, runs, 16)
        rows_ref, typed_ref = reference.apply(rows_ref, runs, 16)
        got, want = typed.to_columns(), typed_ref.to_columns()
        assert got.keys() == want.keys() == set(OUTPUT_NAMES)
        for name in OUTPUT_NAMES:
            assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, name
            if name != "top_marks":
                np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    rows = as_tensors(rows)  # the kernel hands numpy rows (Rows), the torch path tensors
    for name, t in rows.items():
        torch.testing.assert_close(t, rows_ref[name], rtol=1e-5, atol=1e-6, msg=name)
    assert fused.forecast_outputs(rows["features"], 3).top_marks.shape == (batch, 3)


def test_without_numba_the_torch_path_serves():
    """An environment where numba cannot be imported (a GPU image with its own torch, say) serves
    the model's torch path, with a warning, instead of failing to start."""
    script = (
        "import sys, logging; sys.modules['numba'] = None\n"  # any `import numba` now raises ImportError
        "logging.basicConfig(level=logging.WARNING)\n"
        "import torch\n"
        "from aaren.server.tasks.event.task import RunColumns, load_event_task\n"
        "task = load_event_task(None, torch.device('cpu'), (0.1, 0.5, 0.9))\n"
        "assert task._kernel is None\n"
        "rows = {k: t.unsqueeze(0).clone() for k, t in task.layout_rows().items()}\n"
        "new, out = task.apply(rows, RunColumns.single([1.0], [2], [[0.5, -1.0]]), 3)\n"
        "print('served', out.top_marks.shape, bool(torch.isfinite(new['features']).all()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "served (1, 3) True" in done.stdout
    assert "the compiled kernel is off" in done.stderr and "numba" in done.stderr
