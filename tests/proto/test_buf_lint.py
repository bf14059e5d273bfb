"""The wire contract passes buf lint, the protobuf ecosystem's own style check, with the real buf."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
HOW_TO_GET_BUF = (
    "`make tools` installs it into .tools/ (npm install --prefix .tools @bufbuild/buf; Node and npm come from "
    "Debian's nodejs and npm packages), or point $BUF at a buf binary"
)


def buf_binary() -> str:
    """$BUF, else the one `make tools` installed, else buf on PATH; the test fails (not skips) without one."""
    candidates = [os.environ.get("BUF"), str(REPO / ".tools" / "node_modules" / ".bin" / "buf"), shutil.which("buf")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(f"buf is not installed: {HOW_TO_GET_BUF}")


def buf_lint(root: Path, config: dict | None = None) -> subprocess.CompletedProcess[str]:
    """`buf lint` of the module at ``root`` (its own buf.yaml, or ``config`` instead)."""
    args = [buf_binary(), "lint", "--error-format", "json"]
    if config is not None:
        args += ["--config", json.dumps(config)]
    return subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=120)


def rules_broken(done: subprocess.CompletedProcess[str]) -> list[str]:
    """``path:line: RULE`` for each finding buf printed."""
    findings = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return [f"{f['path']}:{f['start_line']}: {f['type']}" for f in findings]


@pytest.mark.parametrize(
    "config",
    [
        None,  # proto/buf.yaml, what a person running `buf lint` in proto/ gets
        # Spelled out too, so that weakening buf.yaml (an `except:`) cannot make this pass. DEFAULT is
        # STANDARD's old name; buf still accepts it, and some projects' CI still says DEFAULT. Only the
        # copy of Triton's contract is ignored (proto/buf.yaml says why; the test below pins that).
        {"version": "v2", "lint": {"use": ["STANDARD"], "ignore": ["aaren/oip"]}},
        {"version": "v2", "lint": {"use": ["DEFAULT"], "ignore": ["aaren/oip"]}},
    ],
    ids=["buf.yaml", "STANDARD", "DEFAULT"],
)
def test_buf_lint_passes(config):
    done = buf_lint(PROTO_ROOT, config)
    assert done.returncode == 0, "buf lint:\n" + "\n".join(rules_broken(done) or [done.stderr])


def test_buf_yaml_ignores_only_the_copy_of_tritons_contract():
    import yaml

    lint = yaml.safe_load((PROTO_ROOT / "buf.yaml").read_text())["lint"]
    assert lint.get("ignore") == ["aaren/oip"]
    assert not lint.get("except") and not lint.get("ignore_only")
    assert sorted(p.name for p in (PROTO_ROOT / "aaren" / "oip").rglob("*.proto")) == [
        "grpc_service.proto",
        "model_config.proto",
    ]


def test_buf_lint_catches_an_old_name(tmp_path):
    # The check above is only worth something if buf really reads our files: put back one name it
    # once rejected and watch it fail on exactly that.
    root = tmp_path / "proto"
    shutil.copytree(PROTO_ROOT, root, ignore=shutil.ignore_patterns("__pycache__", "*.py", "*.pyi"))
    contract = root / "aaren" / "v1" / "aaren.proto"
    contract.write_text(contract.read_text().replace("RESPONSE_LAYOUT_UNSPECIFIED = 0", "RESPONSE_LAYOUT_DEFAULT = 0"))
    done = buf_lint(root)
    assert done.returncode != 0
    assert [r.split(": ")[1] for r in rules_broken(done)] == ["ENUM_ZERO_VALUE_SUFFIX"]
