"""The count task's registry line (loaded by the entry point; torch-free)."""

from __future__ import annotations

from aaren.server.tasks.registry import TaskSpec

SPEC = TaskSpec(
    task="count",
    checkpoint_kind="count_model",
    executor="aaren_count_task.task:from_checkpoint",
    aaren_v1="aaren_count_task.aaren_v1:CountEncoder",
    oip="aaren_count_task.oip:CountCodec",
)
