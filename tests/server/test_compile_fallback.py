"""``compile_model`` where torch.compile cannot work (here: no C++ compiler): the server still
serves, uncompiled, and says why. The compiled path itself is checked end to end in test_e2e."""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch._inductor.config as inductor_config

from aaren.server.tasks.event.task import RunColumns, load_event_task


def test_compile_without_a_compiler_falls_back_to_the_eager_model(caplog):
    no_compiler = {"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False, "autotune_local_cache": False}
    with inductor_config.patch(no_compiler), caplog.at_level(logging.WARNING, logger="aaren.server.tasks.event.task"):
        torch._dynamo.reset()  # forget graphs compiled by earlier tests
        engine = load_event_task(None, torch.device("cpu"), (0.1, 0.5, 0.9), compile_model=True)
    torch._dynamo.reset()
    messages = [r.getMessage() for r in caplog.records]
    assert any("torch.compile failed" in m and "serving the model uncompiled" in m for m in messages), messages

    eager = load_event_task(None, torch.device("cpu"), (0.1, 0.5, 0.9))
    eager.kernel = False  # the torch eager path: --compile-model falls back to it, not to the numba kernel
    runs = RunColumns.single([1.5], [3], [[0.2, -1.0]])
    got = engine.apply({k: t.unsqueeze(0).clone() for k, t in engine.layout_rows().items()}, runs, 3)[1].to_columns()
    want = eager.apply({k: t.unsqueeze(0).clone() for k, t in eager.layout_rows().items()}, runs, 3)[1].to_columns()
    assert got.keys() == want.keys()
    for name in want:  # the fallback is the eager model, bit for bit
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
