"""The report writing every task shares: ``report.md`` and ``metrics.json`` file names, matplotlib
(``Agg``, imported only when drawing), number formats, and the frame of a series or class report.

A task's own part lives in its folder: ``tasks/event/report.py``, ``tasks/series/report.py``,
``tasks/classify/report.py``. A report's numbers are formatted from its metrics dict, nothing is
recomputed for the text.

The frame of a series or class ``report.md`` (``task_report_text``): a title, the model and its
selection, the task's data and score sections, the config, the command that reproduces the run
(``aaren train ...`` then ``aaren evaluate``), and the plots.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from aaren_core.tasks.config import SET_KEYS, TaskTrainConfig, command_line

__all__ = [
    "METRICS_FILE",
    "REPORT_FILE",
    "duration",
    "f3",
    "f4",
    "pyplot",
    "save_figure",
    "task_report_text",
    "write_report",
]

REPORT_FILE = "report.md"
METRICS_FILE = "metrics.json"


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the ``Agg`` backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> str:
    """Write ``fig`` as a PNG at ``path`` (72 dpi), close it; returns the file name."""
    plt = pyplot()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path.name


def write_report(out_dir: Path, text: str) -> Path:
    """Write ``report.md`` into ``out_dir``."""
    path = out_dir / REPORT_FILE
    path.write_text(text)
    return path


def f4(x: float) -> str:
    return f"{x:.4f}"


def f3(x: float) -> str:
    return f"{x:.3f}"


def duration(seconds: float) -> str:
    for unit, size in (("day", 86_400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size and math.isclose(seconds / size, round(seconds / size)):
            n = round(seconds / size)
            return f"{n} {unit}{'s' if unit == 'day' and n != 1 else ''}"
    return f"{seconds:g} s"


def _model_text(metrics: dict[str, Any], config: TaskTrainConfig) -> str:
    if config.model == "dlinear":
        what = f"DLinear (TSLib, kernel 25) on the last {config.lookback} steps"
    else:
        decay = " with time decay" if config.time_decay and config.model == "aaren" else ""
        what = (
            f"{config.model} backbone{decay}, d_model {config.d_model}, {config.n_layers} layers, "
            f"{config.n_heads} heads"
        )
    selection = ""
    if "best_epoch" in metrics:
        val = (
            f"val MSE {f4(metrics['val_mse'])}"
            if config.task == "series"
            else f"val accuracy {f3(metrics['val_accuracy'])}"
        )
        selection = f"; selected after epoch {metrics['best_epoch'] + 1} of {metrics['epochs_run']} run ({val})"
    rule = (
        f"the lowest validation MSE of the forecast from the last {config.lookback} steps"
        if config.task == "series"
        else "the highest validation accuracy, ties going to the lower training loss"
    )
    return (
        f"Model `{metrics['model_version']}`: {what}, {metrics['parameters']:,} parameters{selection}. "
        f"Selection: {rule}, early stopping after {config.patience} epochs without a better one."
    )


def _cell(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float | int) else str(x)


def config_table(config: TaskTrainConfig) -> list[str]:
    """Every key that matters for the task (not the other task's keys, nor the wheel cache)."""
    other = "class:" if config.task == "series" else "series:"
    shown = {k: v for k, v in config.to_dict().items() if k != "cache" and not SET_KEYS.get(k, "").startswith(other)}
    cells = [f"`{k}={','.join(_cell(x) for x in v) if isinstance(v, list) else v}`" for k, v in shown.items()]
    return ["## Config", "", ", ".join(cells), ""]


def task_report_text(metrics: dict[str, Any], what: str, body: list[str], figures: list[str]) -> str:
    """A series or class ``report.md``: the title says ``what`` the task does, ``body`` holds its
    data and score sections (the config table goes after the data)."""
    config = TaskTrainConfig.from_dict(metrics["config"])
    lines = [
        f"# {metrics['name']}: {what}",
        "",
        _model_text(metrics, config),
        "",
        *body,
        "## Reproduce",
        "",
        "```",
        command_line(config),
        f"aaren evaluate {config.out_dir}/best",
        "```",
        "",
        f"`aaren train` writes `best/` (the checkpoint), `{METRICS_FILE}` and this report into the out dir; "
        "`aaren evaluate CHECKPOINT` re-scores the test split from the checkpoint's stored config and writes "
        "the report again.",
        "",
    ]
    if figures:
        lines += ["## Plots", "", *(f"![{name}]({name})" for name in figures), ""]
    return "\n".join(lines)
