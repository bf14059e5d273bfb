"""bench.instructions tells its counted process (under valgrind, where the BLAS libraries see another CPU) the
library the server takes natively, or the one ``AAREN_KERNEL_BLAS`` names."""

from __future__ import annotations

import pytest

from aaren.server.settings import ServerSettings, bundled_checkpoint
from aaren.server.tasks.event.task import load_event_task, resolve_device
from bench import instructions


@pytest.fixture(autouse=True)
def fresh() -> None:
    instructions.native_blas.cache_clear()


def test_a_named_library_is_passed_as_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("openblas", "mkl", "0"):
        monkeypatch.setenv("AAREN_KERNEL_BLAS", name)
        instructions.native_blas.cache_clear()
        assert instructions.native_blas() == name


def test_auto_is_the_library_the_server_takes_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AAREN_KERNEL_BLAS", "auto")
    engine = load_event_task(str(bundled_checkpoint()), resolve_device("cpu"), ServerSettings().quantiles)
    served = engine.kernel_blas
    assert served in ("mkl", "openblas", "loops")
    assert instructions.native_blas() == ("0" if served == "loops" else served)
