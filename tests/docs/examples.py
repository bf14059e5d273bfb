"""The code blocks of the project's Markdown, read and run as the docs tests do.

A fenced ``python`` or ``bash`` block is an example a user copies, so a test runs it. A block that
cannot run in a test (it trains for minutes, needs Docker, installs into a new venv) carries a
marker on the line before its fence, with the reason, which the tests read::

    <!-- example: skip: needs a Docker engine; tests/deploy/test_container.py runs the image -->

In a bash block, an ``aaren serve`` command starts a server that runs until it is stopped, so it
is not run: its flags are parsed with the settings ``aaren serve`` parses them with (an unknown
flag or a bad value fails the test). Every other line runs, with ``bash -euo pipefail``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: the address every example is written for; the tests swap in their server's
DOC_TARGET = "127.0.0.1:50051"
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
SKIP = re.compile(r"<!--\s*example:\s*skip:\s*(?P<reason>.+?)\s*-->\s*$")
SERVE = re.compile(r"^(?:\.venv/bin/)?aaren serve(?:\s|$)")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its code (dedented), and why it is not run."""

    path: Path
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").splitlines()
        marker = SKIP.search(before[-1]) if before else None
        line = text.count("\n", 0, match.start()) + 1
        code = textwrap.dedent(match["body"])
        found.append(Block(path, line, match["lang"], code, marker["reason"] if marker else None))
    return found


def examples(path: Path) -> list[Block]:
    """The python and bash blocks of ``path``: what a user copies."""
    return [b for b in blocks(path) if b.lang in ("python", "bash")]


def commands(code: str) -> list[str]:
    """A bash block's commands, one per line, backslash continuations joined."""
    return code.replace("\\\n", " ").splitlines()


def serve_flags(command: str) -> list[str] | None:
    """The flags of an ``aaren serve`` command (its comment dropped), or None for another command."""
    if not SERVE.match(command.strip()):
        return None
    return shlex.split(command, comments=True)[2:]


def check_serve_flags(block: Block, flags: list[str]) -> None:
    """Parse ``flags`` as ``aaren serve`` does; an unknown flag or a bad value fails with the block's place."""
    from aaren.server.settings import ServerSettings

    try:
        ServerSettings(_cli_parse_args=flags)
    except SystemExit as exit_:  # argparse: an unknown flag or a value of the wrong type
        raise AssertionError(f"{block.where}: aaren serve {shlex.join(flags)}: rejected ({exit_})") from None
    except ValueError as error:  # pydantic: a value out of range
        raise AssertionError(f"{block.where}: aaren serve {shlex.join(flags)}: {error}") from None


def run_bash(block: Block, cwd: Path, target: str, replace: dict[str, str] | None = None) -> str:
    """Run a bash block's commands (``aaren serve`` ones parsed instead) in ``cwd`` against ``target``.

    ``cwd`` gets a ``.venv`` link to this test run's environment, so ``.venv/bin/aaren`` means what
    it means in a checkout; ``aaren`` alone is on the PATH as in a user's venv. ``replace`` maps
    text of the block, where it occurs, to what the test runs instead (the caller says why)."""
    lines = []
    for command in commands(block.code):
        flags = serve_flags(command)
        if flags is None:
            lines.append(command)
        else:
            check_serve_flags(block, flags)
    script = "\n".join(lines).replace(DOC_TARGET, target)
    for old, new in (replace or {}).items():
        script = script.replace(old, new)
    link = cwd / ".venv"
    if not link.exists():
        link.symlink_to(sys.prefix)
    env = {
        **os.environ,
        "AAREN_TARGET": target,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COLUMNS": "160",  # rich tables: one line per row, whatever the terminal
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{block.where} failed:\n{script}\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    return done.stdout


def run_python(block: Block, namespace: dict[str, Any], target: str) -> None:
    """Run a python block in ``namespace`` (a document's blocks share one, in order) against ``target``."""
    code = block.code.replace(DOC_TARGET, target)
    exec(compile(code, block.where, "exec"), namespace)
