"""The class task's report: data and score sections of ``report.md``, the accuracy plot, a summary line.

``accuracy_by_fraction.png``: test accuracy against the fraction of each sequence seen, beside
the majority-class baseline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aaren_core.datasets import CLASS_DATASETS
from aaren_core.tasks.classify.data import ClassData
from aaren_core.tasks.classify.files import TEST_FRACTION
from aaren_core.tasks.config import TaskTrainConfig
from aaren_core.tasks.report import config_table, f3, pyplot, save_figure, task_report_text

__all__ = ["ACCURACY_PLOT", "class_figures", "class_report_text", "class_summary"]

ACCURACY_PLOT = "accuracy_by_fraction.png"


def class_report_text(metrics: dict[str, Any], data: ClassData, figures: list[str]) -> str:
    """``report.md`` of a class run: model, data, config, test scores beside the majority class,
    the command that reproduces the run, and the plots."""
    config = TaskTrainConfig.from_dict(metrics["config"])
    what = "sequence classification, class probabilities after every step"
    body = [*_class_data_text(metrics, data), *config_table(config), *_class_scores(metrics)]
    return task_report_text(metrics, what, body, figures)


def class_figures(metrics: dict[str, Any], out: Path) -> list[str]:
    """The class report's plots, written into ``out``: accuracy by fraction seen."""
    return [_accuracy_plot(metrics, out / ACCURACY_PLOT)]


def class_summary(metrics: dict[str, Any]) -> str:
    """One line of a class run's test scores (``aaren train``, ``aaren evaluate``)."""
    test, base = metrics["test"], metrics["baselines"]
    by = test["accuracy_by_fraction"]
    return (
        f"{metrics['name']} on test: accuracy {test['accuracy']:.3f} (majority class "
        f"{base['majority_class']['accuracy']:.3f}); after 10% / 50% of each sequence {by['0.1']:.3f} / {by['0.5']:.3f}"
    )


def _class_data_text(metrics: dict[str, Any], data: ClassData) -> list[str]:
    lengths = np.concatenate([data.train.lengths, data.test.lengths])
    official = metrics["data"] in CLASS_DATASETS
    lines = [
        f"Data `{metrics['data']}`: {len(data.train):,} train and {len(data.test):,} test sequences of "
        f"{len(data.channels)} channels, {lengths.min()}-{lengths.max()} steps, {data.n_classes} classes "
        f"({', '.join(data.class_names)}). Source: {metrics['source']}"
        + (" (the UEA archive's own files and train / test split)." if official else "."),
        "",
        *([] if official else _files_text(metrics)),
        f"{'The archive' if official else 'The data'} has no validation part: model selection used a stratified "
        f"{metrics['config']['val_fraction']:.0%} of train, never the test part.",
        "",
    ]
    return lines


def _files_text(metrics: dict[str, Any]) -> list[str]:
    """Which files a run read and how its test part was chosen (``aaren_core.tasks.classify.files``)."""
    config = metrics["config"]
    if config.get("test_data"):
        return [f"Files: train `{config['data']}`, test `{config['test_data']}` (given with --test-data).", ""]
    return [
        f"Files: train `{config['data']}`. No test file was given: a stratified {TEST_FRACTION:.0%} of its "
        f"sequences (per class, seed {config['seed']}) was held out as the test part before training.",
        "",
    ]


def _class_scores(metrics: dict[str, Any]) -> list[str]:
    test, majority = metrics["test"], metrics["baselines"]["majority_class"]
    by = test["accuracy_by_fraction"]
    return [
        "## Test scores",
        "",
        "| | accuracy |",
        "|---|---:|",
        f"| model, after the whole sequence | {f3(test['accuracy'])} |",
        f"| most frequent class of train (`{majority['class']}`; ties go to the first) | {f3(majority['accuracy'])} |",
        "",
        "Accuracy after a fraction f of each sequence (the prediction after ceil(f n) of its n steps):",
        "",
        "| fraction seen | " + " | ".join(by) + " |",
        "|---|" + "---:|" * len(by),
        "| accuracy | " + " | ".join(f3(v) for v in by.values()) + " |",
        "",
    ]


def _accuracy_plot(metrics: dict[str, Any], path: Path) -> str:
    plt = pyplot()
    by = metrics["test"]["accuracy_by_fraction"]
    majority = metrics["baselines"]["majority_class"]
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    ax.plot([float(f) for f in by], list(by.values()), marker="o", ms=4, label="model")
    ax.axhline(majority["accuracy"], color="0.5", ls="--", lw=1, label=f"majority class ({majority['class']})")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("fraction of the sequence seen")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{Path(metrics['data']).name}: accuracy against fraction seen", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)
