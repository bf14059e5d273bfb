"""A served model's description: the facts the server states and the client reads back.

``ModelFacts`` is the one list of them: the server's ``ModelDescription``
(``aaren.server.contract.columns``) and the client's ``ModelInfoOut`` (``aaren.client.client``)
each add their side's own fields; the wire message (``aaren.v1.DescribeModelResponse``) carries
these under the same names.
"""

from __future__ import annotations

import dataclasses

__all__ = ["ModelFacts", "default_max_gap_steps"]

#: The longest gap a series checkpoint that names none fills: one week.
DEFAULT_MAX_GAP_S = 7 * 86_400.0


def default_max_gap_steps(step_seconds: float) -> int:
    """The ``max_gap_steps`` of a series model that names none: a week of steps, ``round(7 * 86400 / D)``
    (0 without a step)."""
    return round(DEFAULT_MAX_GAP_S / step_seconds) if step_seconds > 0 else 0


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
    #: The task the model serves (docs/architecture.md "Tasks"): "event", "series", "class" or "policy"; it
    #: names the output columns' meaning.
    task: str = "event"
    #: Series models: forecast steps H (0 for other tasks).
    horizon: int = 0
    #: Series models: the regular step in seconds (event times are Unix seconds).
    step_seconds: float = 0.0
    #: Class models: the class names by index (empty for other tasks).
    class_names: tuple[str, ...] = ()
    #: The model takes missing values: a NaN value is allowed (the task fills it, or its model reads
    #: it as it does offline); +-inf is still refused. Series and class models set it.
    missing_values: bool = False
    #: Models with ``step_seconds > 0``: the most missing steps between two events of a session (an
    #: event ``k + 1`` steps after the last one has ``k`` missing steps, which the task fills); more
    #: is refused (``gap_too_long``).
    max_gap_steps: int = 0
    #: Policy models: action entries per step (A; 0 for other tasks).
    action_width: int = 0
    #: Policy models: the environment the policy was trained for (a gymnasium id, "" for other tasks).
    env: str = ""
    #: Policy models: the default target return of an episode (its first event's ``values[0]``).
    target_return: float = 0.0
