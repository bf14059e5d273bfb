"""docs/tasks.md's training commands are the commands the bundled task models were trained with:
each equals the "Reproduce" command that training wrote into the model's report.md (the same
flags and ``--set`` keys, in any order). They train for minutes on the data sets' wheels, so no
test runs them; tests/core/test_task_report.py checks each report against its checkpoint."""

from __future__ import annotations

import re
import shlex

import pytest
from examples import ROOT, commands, examples

GUIDE = ROOT / "docs" / "tasks.md"


def train_commands(text: str) -> dict[str, list[str]]:
    """``--out-dir`` -> the arguments of each ``aaren train`` command in ``text``."""
    found = {}
    for command in commands(text):
        argv = shlex.split(command, comments=True)
        if argv[:2] == ["aaren", "train"]:
            found[argv[argv.index("--out-dir") + 1]] = argv[2:]
    return found


def options(argv: list[str]) -> set[tuple[str, str]]:
    """(flag, value) pairs: ``--set`` may repeat, so its pairs are told apart by their key."""
    assert len(argv) % 2 == 0, argv
    return {(flag, value) for flag, value in zip(argv[::2], argv[1::2], strict=True)}


@pytest.mark.parametrize("folder", ["series-power", "class-vowels"])
def test_the_guide_trains_each_bundled_task_model_as_its_report_says(folder):
    (block,) = [b for b in examples(GUIDE) if "aaren train" in b.code]
    assert block.skip, "the training block says why no test runs it"
    guide = train_commands(block.code)
    report = (ROOT / "models" / folder / "report.md").read_text()
    section = re.search(r"^## Reproduce\n+```\n(.*?)^```", report, re.S | re.M)
    assert section, f"models/{folder}/report.md has no Reproduce section"
    ((out_dir, reproduce),) = train_commands(section[1]).items()
    assert out_dir == f"runs/{folder}" and out_dir in guide
    assert options(guide[out_dir]) == options(reproduce), (guide[out_dir], reproduce)
