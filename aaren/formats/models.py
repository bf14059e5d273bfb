"""A served model's description: the facts the server states and the client reads back.

``ModelFacts`` is the one list of them: the server's ``ModelDescription``
(``aaren.server.contract.columns``) and the client's ``ModelInfoOut`` (``aaren.client.client``)
each add their side's own fields; the wire message (``aaren.v1.DescribeModelResponse``) carries
these under the same names.
"""

from __future__ import annotations

import dataclasses

__all__ = ["ModelFacts"]


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """A model's name and version, its backbone and sizes, its schema (marks and value columns by
    name, the data's time unit), its size in parameters and in state bytes per session, where it runs."""

    name: str
    version: str
    backbone: str
    d_model: int
    n_layers: int
    n_heads: int
    num_marks: int
    value_width: int
    parameters: int
    state_bytes_per_session: int
    mark_names: tuple[str, ...]
    value_names: tuple[str, ...]
    time_unit: str
    device: str
    #: The task the model serves (docs/architecture.md "Tasks"): "event", "series" or "class"; it
    #: names the output columns' meaning.
    task: str = "event"
    #: Series models: forecast steps H (0 for other tasks).
    horizon: int = 0
    #: Series models: the regular step in seconds (event times are Unix seconds).
    step_seconds: float = 0.0
    #: Class models: the class names by index (empty for other tasks).
    class_names: tuple[str, ...] = ()
