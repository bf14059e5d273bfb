"""README.md as a user reads it: every example that runs in seconds runs, in order, against a real
server with the bundled models (as ``aaren serve`` serves them after an install), and the settings
tables say what ``aaren serve --help`` says.

What the test changes, and why: the server's own free port for ``127.0.0.1:50051``; the quick
start's ``aaren replay flights`` gets ``--limit 2000`` (the whole replay is 54,145 events, minutes
on a loaded test machine; the first 2,000 are the morning of 2013-11-01 at all three airports,
``EWR/2013-11-01`` among them); ``meter.csv`` and ``trials.csv``, which the README calls files of
your own, are written small by the test. A block the test cannot run says why in the README
(``<!-- example: skip: ... -->``), and ``test_every_example_runs_or_says_why`` holds every
python or bash block of README.md and docs/ to that.
"""

from __future__ import annotations

import csv
import importlib
import json
import re
from pathlib import Path

import numpy as np
from examples import ROOT, Block, blocks, examples, run_bash, run_python

from aaren.server.settings import ServerSettings

README = ROOT / "README.md"
#: each document whose examples run, and the test that runs them
RUNNERS = {
    "README.md": "tests/docs/test_readme.py::test_the_readme_examples_run_against_the_bundled_models",
    "docs/notebook.md": "tests/docs/test_notebook_guide.py::test_the_notebook_guide_runs",
    "docs/tasks.md": "none: its commands train for minutes (tests/docs/test_tasks_guide.py checks them)",
}
REPLAY_LIMIT = 2000
#: what the test runs shorter than the README writes it (module docstring)
SHORTER = {"replay flights": f"replay flights --limit {REPLAY_LIMIT}"}


def bundled_config(folder: str) -> dict:
    return json.loads((ROOT / "models" / folder / "config.json").read_text())["metadata"]


def write_user_files(cwd: Path) -> None:
    """The README's ``meter.csv`` (series: hourly, Unix seconds, one column per channel) and
    ``trials.csv`` (class: two sequences of 12-coefficient frames with their label)."""
    rng = np.random.default_rng(0)
    channels = bundled_config("series-power")["channels"]
    with (cwd / "meter.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time", *channels])
        for step in range(60):
            daily = np.sin(2 * np.pi * step / 24)
            writer.writerow([1_700_000_000 + 3600 * step, *np.round(1 + daily + rng.normal(0, 0.1, len(channels)), 3)])
    vowels = bundled_config("class-vowels")
    with (cwd / "trials.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["session_id", "time", *vowels["channels"], "label"])
        for trial, label in enumerate(vowels["class_names"][:2]):
            for frame in range(12):
                frame_values = np.round(rng.normal(0, 1, len(vowels["channels"])), 3)
                writer.writerow([f"trial-{trial}", frame, *frame_values, label])


def runnable(path: Path) -> list[Block]:
    return [b for b in examples(path) if b.skip is None]


def test_every_example_runs_or_says_why():
    documents = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for path in documents:
        name = str(path.relative_to(ROOT))
        found = examples(path)
        if name not in RUNNERS:  # a new document: its examples need a runner, or each a reason
            assert all(b.skip for b in found), f"{name}: blocks {[b.where for b in found if not b.skip]} run nowhere"
        for block in found:
            assert block.skip is None or len(block.skip) > 10, f"{block.where}: say why it is not run"
    # Every fenced block of README.md is an example (python or bash), so none escapes the runner.
    assert [b.where for b in blocks(README) if b.lang not in ("python", "bash")] == []
    assert runnable(ROOT / "docs" / "tasks.md") == []


def test_the_readme_examples_run_against_the_bundled_models(start_server, tmp_path, monkeypatch, capsys):
    srv = start_server(checkpoint=None)  # no checkpoint, no models_dir: the bundled repository
    monkeypatch.chdir(tmp_path)
    write_user_files(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    outputs: dict[str, str] = {}
    ran = 0
    for block in runnable(README):
        if block.lang == "bash":
            outputs[block.code] = run_bash(block, tmp_path, srv.address, SHORTER)
        elif "apply_frame" in block.code:
            # The notebook example, twice: the README says the cell runs again (restart=True).
            for _ in range(2):
                run_python(block, namespace, srv.address)
                forecasts = namespace["forecasts"]
                assert (forecasts["outcome"] == "forecast").all(), forecasts[["seq", "outcome", "error"]]
                assert forecasts["seq"].tolist() == [1, 2, 3]
        else:
            run_python(block, namespace, srv.address)
        ran += 1
    assert ran >= 8

    # The quick start's replay: every event forecast, one row each in forecasts.csv.
    (replay_output,) = [out for code, out in outputs.items() if "replay flights" in code]
    assert re.search(r"errors\s+0\b", replay_output) and re.search(rf"forecasts\s+{REPLAY_LIMIT:,}\b", replay_output)
    assert len((tmp_path / "forecasts.csv").read_text().splitlines()) == REPLAY_LIMIT + 1
    (session_output,) = [out for code, out in outputs.items() if "aaren session" in code]
    assert "ended session 'EWR/2013-11-01'" in session_output
    (series_output,) = [out for code, out in outputs.items() if "aaren-series-power" in code]
    assert "series" in series_output and (tmp_path / "fc.csv").is_file()
    assert "dep_delay_mean" in capsys.readouterr().out
    assert type(namespace["forecast"]).__name__ == "SeriesForecastOut"  # the series example
    assert len(namespace["forecast"].means) == bundled_config("series-power")["horizon"]
    answers = namespace["answers"]  # the OIP example: three events of one sequence, seqs 1, 2, 3
    assert [result.as_numpy("SEQ").tolist() for result, _ in answers] == [[1], [2], [3]]


# ---------------------------------------------------------------- the settings tables


def shown_default(name: str) -> str:
    """A setting's default as the README writes it, from the field ``--help`` shows it from."""
    field = ServerSettings.model_fields[name]
    value = field.default
    if value is None:  # the description says what not setting it means ("...; default: X (...)")
        said = re.search(r"default: ([^(;]+)", field.description or "")
        return said[1].strip() if said else "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and name.endswith("_bytes") and value >= 2**20 and value % 2**20 == 0:
        return f"{value // 2**20} MiB"
    if isinstance(value, tuple):
        return ", ".join(f"{v:g}" for v in value)
    return str(value)


def table_defaults() -> dict[str, list[str]]:
    """flag -> the default cells that name it, over every settings table of the README."""
    found: dict[str, list[str]] = {}
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `--") or len(cells) < 3:
            continue
        flags = re.findall(r"`(--[a-z0-9-]+)`", cells[0])
        values = [v.strip() for v in cells[1].split(", ")] if len(flags) > 1 else [cells[1]]
        assert len(values) == len(flags), f"README row {cells[0]}: {len(flags)} flags, defaults {values}"
        for flag, value in zip(flags, values, strict=True):
            found.setdefault(flag, []).append(value)
    return found


def normal(text: str) -> str:
    return re.sub(r"[`']", "", text)


def test_every_serve_flag_is_in_the_readme_once_with_the_default_help_shows():
    tables = table_defaults()
    flags = {f"--{name.replace('_', '-')}": name for name in ServerSettings.model_fields}
    assert sorted(set(tables) - set(flags)) == [], "README rows for flags aaren serve does not have"
    missing = sorted(set(flags) - set(tables))
    assert missing == [], f"flags of aaren serve that no README table names: {missing}"
    for flag, cells in tables.items():
        assert len(cells) == 1, f"{flag} is in {len(cells)} rows: one place says it"
        assert normal(cells[0]) == normal(shown_default(flags[flag])), (flag, cells[0], shown_default(flags[flag]))


def test_help_and_readme_give_the_same_figures():
    """Where a README row or the --help text of a flag measures something ("about 1.4x"), both say it."""
    rows = {line.split("|")[1].strip(): line for line in README.read_text().splitlines() if line.startswith("| `--")}
    for name, field in ServerSettings.model_fields.items():
        flag = f"`--{name.replace('_', '-')}`"
        (row,) = [line for cell, line in rows.items() if flag in cell]
        figures = {"README": set(re.findall(r"\b\d+(?:\.\d+)?x\b", row))}
        figures["--help"] = set(re.findall(r"\b\d+(?:\.\d+)?x\b", field.description or ""))
        assert figures["README"] == figures["--help"], (flag, figures)


# ---------------------------------------------------------------- names the docs give


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute path below the longest module prefix of it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_every_module_and_function_the_docs_name_exists():
    """A `aaren...` or `aaren_core...` name in README.md or docs/ is something a reader can import."""
    stale = []
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for dotted in sorted(set(re.findall(r"`((?:aaren|aaren_core)(?:\.[A-Za-z_]\w*)+)`", path.read_text()))):
            if not resolves(dotted):
                stale.append(f"{path.relative_to(ROOT)}: {dotted}")
    assert stale == []
