"""The count task's registry line (loaded by the entry point; torch-free)."""

from __future__ import annotations

import dataclasses

from aaren.server.tasks.registry import TaskSpec

SPEC = TaskSpec(
    task="count",
    checkpoint_kind="count_model",
    executor="aaren_count_task.task:from_checkpoint",
    aaren_v1="aaren_count_task.aaren_v1:CountEncoder",
    oip="aaren_count_task.oip:CountCodec",
    outputs="aaren_count_task.outputs:CountOutputs",
)

#: A line that claims the event task's checkpoint kind (tests/server/test_task_plugin.py: refused).
CLASH = dataclasses.replace(SPEC, checkpoint_kind="event_model")
