"""Regenerate, or check, the Python code generated from the .proto files under proto/.

    python proto/generate.py           # rewrite the generated files that changed
    python proto/generate.py --check   # exit 1, naming them, if any generated file is stale

The generated modules (``*_pb2.py``, ``*_pb2.pyi``, ``*_pb2_grpc.py``) sit next to their
.proto source and are committed, so that ``from aaren.v1 import aaren_pb2, aaren_pb2_grpc``
works with ``proto/`` on the import path and without grpcio-tools installed. The output
depends on the grpcio-tools version, so the check is only meaningful with the version that
generated the committed files (reported when it differs): pyproject's dev extra pins exactly
that one. It is the oldest grpcio-tools whose gencode runs on protobuf 6.30, because the
generated code refuses older runtimes than its generator's; pinning the generator low is what
lets aaren install beside clients that need protobuf 6 (tritonclient), while protobuf 7 still
loads the same code.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
_GRPC_VERSION_LINE = re.compile(r"^GRPC_GENERATED_VERSION = '([^']+)'$", re.MULTILINE)


class GenerationError(RuntimeError):
    """protoc failed (its diagnostics went to stderr)."""


def proto_sources(root: Path = PROTO_ROOT) -> list[Path]:
    """The .proto files under ``root``, as paths relative to it, sorted."""
    return sorted(p.relative_to(root) for p in root.rglob("*.proto"))


def generated_names(sources: list[Path]) -> list[Path]:
    """The generated files the given .proto sources produce, relative to the proto root."""
    return [src.with_name(src.stem + suffix) for src in sources for suffix in GENERATED_SUFFIXES]


def committed_generated(root: Path = PROTO_ROOT) -> list[Path]:
    """Generated-looking files present under ``root``, relative to it, sorted."""
    found = {p.relative_to(root) for suffix in GENERATED_SUFFIXES for p in root.rglob("*" + suffix)}
    return sorted(found)


def generate(out_dir: Path, root: Path = PROTO_ROOT) -> list[Path]:
    """Run protoc on every .proto under ``root``, writing the Python code into ``out_dir``.

    Returns the generated files, relative to ``out_dir``.
    """
    from grpc_tools import protoc

    sources = proto_sources(root)
    if not sources:
        raise GenerationError(f"no .proto files under {root}")
    well_known = resources.files("grpc_tools") / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"--proto_path={root}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(root / src) for src in sources),
    ]
    if protoc.main(args) != 0:
        raise GenerationError("protoc failed; see the messages above")
    produced = generated_names(sources)
    missing = [str(p) for p in produced if not (out_dir / p).is_file()]
    if missing:
        raise GenerationError(f"protoc did not produce {', '.join(missing)}")
    return produced


def _generated_grpc_version(path: Path) -> str | None:
    match = _GRPC_VERSION_LINE.search(path.read_text()) if path.is_file() else None
    return match.group(1) if match else None


def stale_files(root: Path = PROTO_ROOT) -> list[str]:
    """Compare the committed generated files under ``root`` with a fresh generation.

    Returns one line per problem (``path: why``), paths relative to ``root``; empty when the
    committed files are exactly what protoc generates now.
    """
    problems = []
    with tempfile.TemporaryDirectory(prefix="aaren-proto-") as tmp:
        fresh_dir = Path(tmp)
        fresh = generate(fresh_dir, root)
        for rel in fresh:
            committed = root / rel
            if not committed.is_file():
                problems.append(f"{rel}: missing")
            elif not filecmp.cmp(committed, fresh_dir / rel, shallow=False):
                problems.append(f"{rel}: differs from what its .proto generates")
        for rel in sorted(set(committed_generated(root)) - set(fresh)):
            problems.append(f"{rel}: no .proto generates it any more")
    return problems


def write(root: Path = PROTO_ROOT) -> list[Path]:
    """Regenerate into ``root``, touching only the files whose content changed.

    Returns the files written, relative to ``root``. Generated files whose .proto is gone are
    removed.
    """
    written = []
    with tempfile.TemporaryDirectory(prefix="aaren-proto-") as tmp:
        fresh_dir = Path(tmp)
        fresh = generate(fresh_dir, root)
        for rel in fresh:
            target = root / rel
            new = (fresh_dir / rel).read_bytes()
            if not target.is_file() or target.read_bytes() != new:
                target.write_bytes(new)
                written.append(rel)
    for rel in sorted(set(committed_generated(root)) - set(fresh)):
        (root / rel).unlink()
        written.append(rel)
    return written


def _version_hint(root: Path) -> str:
    from grpc_tools import grpc_version

    installed = grpc_version.VERSION
    committed = {
        v
        for p in committed_generated(root)
        if p.name.endswith("_pb2_grpc.py") and (v := _generated_grpc_version(root / p)) is not None
    }
    others = sorted(committed - {installed})
    if not others:
        return ""
    return (
        f"note: the committed files were generated by grpcio-tools {', '.join(others)}, this is "
        f"grpcio-tools {installed}; a different version alone changes the output.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if any committed generated file is stale",
    )
    args = parser.parse_args(argv)
    shown = PROTO_ROOT.relative_to(Path.cwd()) if PROTO_ROOT.is_relative_to(Path.cwd()) else PROTO_ROOT
    try:
        if args.check:
            problems = stale_files()
            if problems:
                sys.stderr.write(
                    "stale generated protobuf code:\n"
                    + "".join(f"  {shown / line}\n" for line in problems)
                    + _version_hint(PROTO_ROOT)
                    + f"run `python {shown / 'generate.py'}` and commit the result.\n"
                )
                return 1
            print(f"generated protobuf code under {shown} is up to date")
            return 0
        written = write()
    except GenerationError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    for rel in written:
        print(f"wrote {shown / rel}")
    if not written:
        print(f"generated protobuf code under {shown} was already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
