"""The layers of docs/architecture.md section 2, enforced over the source (parsed with ``ast``, never imported).

Every ``import`` counts, a lazy one inside a function too (it still loads the module when it runs), except
one under ``if TYPE_CHECKING:``, which never runs. Importing ``a.b.c`` also runs ``a/__init__.py`` and
``a/b/__init__.py``, so a module's imports include its parent packages'. A rule about what a room may
reach is checked over the project's own import graph transitively: a front end that imports a contract
module that imports torch imports torch.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _rooms_of_setup() -> dict[str, str]:
    """setup.py's ``ROOMS`` (import name -> folder of the checkout), read from its source: the test
    checks the packages the wheel installs, under the names they install as."""
    for node in ast.parse((REPO / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["ROOMS"]:
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no ROOMS")


ROOMS = _rooms_of_setup()

#: third-party modules that load torch
TORCH = ("torch", "safetensors.torch", "stable_baselines3")


def _matches(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@dataclass(frozen=True)
class Import:
    """One import statement's module, where it stands (1-based line) in which project module; ``lazy``:
    inside a function (it runs when the function is called, not when the module loads)."""

    importer: str
    module: str
    line: int
    lazy: bool = False


def modules_of(root: Path, rooms: Mapping[str, str]) -> dict[str, Path]:
    """Every project module by its import name (a package by its own name, for its ``__init__.py``)."""
    found: dict[str, Path] = {}
    for name, folder in rooms.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = path
    return found


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, path: Path, known: Iterable[str]) -> list[Import]:
    """The modules ``name`` (at ``path``) imports: ``from x import y`` counts ``x`` and, when ``x.y`` is a
    project module, ``x.y`` too; relative imports are resolved against the package."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[Import] = []

    def visit(node: ast.AST, lazy: bool = False) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child, lazy)
            return
        if isinstance(node, ast.Import):
            out.extend(Import(name, alias.name, node.lineno, lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            out.append(Import(name, module, node.lineno, lazy))
            out.extend(
                Import(name, f"{module}.{alias.name}", node.lineno, lazy)
                for alias in node.names
                if f"{module}.{alias.name}" in known
            )
        inside = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree)
    return out


def parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


class ImportGraph:
    """The project's modules and what each imports, with the paths that reach a module."""

    def __init__(self, root: Path, rooms: Mapping[str, str] = ROOMS, skip: Iterable[tuple[str, str]] = ()) -> None:
        """``skip``: (importer, imported prefix) pairs whose imports are left out of the graph."""
        self.root = root
        self.paths = modules_of(root, rooms)
        skip = tuple(skip)
        self.skipped: set[tuple[str, str]] = set()
        self.imports: dict[str, list[Import]] = {}
        for name, path in self.paths.items():
            kept = []
            for imp in imports_of(name, path, self.paths):
                hit = [(i, p) for i, p in skip if i == imp.importer and _matches(imp.module, (p,))]
                self.skipped.update(hit)
                if not hit:
                    kept.append(imp)
            self.imports[name] = kept

    def where(self, imp: Import) -> str:
        return f"{self.paths[imp.importer].relative_to(self.root)}:{imp.line}"

    def _edges(self, name: str) -> list[Import]:
        """Imports that run when ``name`` loads: its own and its parent packages'."""
        edges = list(self.imports.get(name, []))
        for parent in parents(name):
            edges += self.imports.get(parent, [])
        return edges

    def reach(self, start: str) -> dict[str, list[Import]]:
        """Every module (project or not) that loading ``start`` loads, each with one chain of imports
        from ``start`` to it."""
        chains: dict[str, list[Import]] = {start: []}
        todo = deque([start])  # breadth first: each chain is a shortest one
        while todo:
            current = todo.popleft()
            for imp in self._edges(current):
                if imp.module in chains:
                    continue
                chains[imp.module] = [*chains[current], imp]
                if imp.module in self.paths:
                    todo.append(imp.module)
        return chains

    def under(self, *prefixes: str) -> list[str]:
        return sorted(m for m in self.paths if any(m == p or m.startswith(p + ".") for p in prefixes))


def violations(
    graph: ImportGraph, importers: Iterable[str], forbidden: Iterable[str], allowed: Iterable[str] = ()
) -> list[str]:
    """For each importer that reaches a forbidden module, the shortest chain of imports that does it
    (``file:line (module)`` per hop): one line per importer."""
    forbidden, allowed = tuple(forbidden), tuple(allowed)
    found = []
    for start in importers:
        bad = [(len(chain), m, chain) for m, chain in graph.reach(start).items() if chain and _matches(m, forbidden)]
        bad = [b for b in bad if not _matches(b[1], allowed)]
        if bad:
            _, module, chain = min(bad)
            hops = " -> ".join(f"{graph.where(imp)} ({imp.module})" for imp in chain)
            found.append(f"{start} reaches {module}: {hops}")
    return found


# ----------------------------------------------------------------- the rules

#: Known breaches, each an (importer, imported prefix) whose imports the rules skip, with why and whose
#: slice removes it. The list may only shrink: an entry that no longer matches an import fails
#: ``test_every_exception_is_still_needed``, so it is deleted with the fix.
EXCEPTIONS: dict[tuple[str, str], str] = {}


#: The IPC modules of the front-end processes' side of the socket (the package's ``__init__`` too).
IPC_TORCH_FREE = ("client_side", "framing", "packing")


def _torch_free_rooms(graph: ImportGraph) -> list[str]:
    """Front ends, the IPC client (the front-end processes' side of the socket), the top-level package
    with its formats, the client."""
    ipc = ["aaren.server.ipc", *(f"aaren.server.ipc.{name}" for name in IPC_TORCH_FREE)]
    top = ["aaren", *graph.under("aaren.formats")]
    return [*graph.under("aaren.server.frontends"), *ipc, *top, *graph.under("aaren.client")]


#: The modules of ``aaren.server.tasks`` (and of each task's folder) that front ends load (the registry
#: names each task's by dotted path, so the graph cannot follow them from a front end).
TASK_FRONT_DOOR = ("registry", "outputs", "aaren_v1", "oip")

RULES = {
    "front ends, the IPC client, aaren, aaren.formats and the client never import torch": (
        _torch_free_rooms,
        TORCH,
        (),
    ),
    "a front end never imports the core, a task or a store (it reaches them through the contract)": (
        lambda g: g.under("aaren.server.frontends"),
        ("aaren.server.core", "aaren.server.tasks", "aaren.server.stores", "aaren_core"),
        # The tasks' torch-free door: the registry (which names each task's codecs by dotted path,
        # imported when a model of that task is served) and the interfaces of those codecs.
        ("aaren.server.tasks.registry", "aaren.server.tasks.aaren_v1", "aaren.server.tasks.oip"),
    ),
    "the contract, observability and settings import no other server room (so that every room may import them)": (
        lambda g: g.under("aaren.server.contract", "aaren.server.observability", "aaren.server.settings"),
        ("aaren.server",),
        ("aaren.server.contract", "aaren.server.observability", "aaren.server.settings"),
    ),
    "the core never imports a front end": (
        lambda g: g.under("aaren.server.core"),
        ("aaren.server.frontends",),
        (),
    ),
    "a task's outputs, codecs and the registry never import torch (front-end processes load them)": (
        lambda g: [m for m in g.under("aaren.server.tasks") if m.rpartition(".")[2] in TASK_FRONT_DOOR],
        TORCH,
        (),
    ),
    "a task never imports a front end or the core": (
        lambda g: g.under("aaren.server.tasks"),
        ("aaren.server.frontends", "aaren.server.core"),
        (),
    ),
    "a store imports no other server room but contract": (
        lambda g: g.under("aaren.server.stores"),
        ("aaren.server",),
        ("aaren.server.stores", "aaren.server.contract"),
    ),
    "aaren_core never imports the server, the client or grpc": (
        lambda g: g.under("aaren_core"),
        ("aaren.server", "aaren.client", "grpc"),
        (),
    ),
    "the client never imports the server or aaren_core": (
        lambda g: g.under("aaren.client"),
        ("aaren.server", "aaren_core"),
        (),
    ),
    # The command line is the top of the stack: it may import every room (the server and aaren_core
    # inside its commands only, test_the_command_line_loads_its_rooms_inside_its_commands), and no
    # room imports it.
    "nothing but the command line imports aaren.cli": (
        lambda g: [m for m in g.paths if not _matches(m, ("aaren.cli",))],
        ("aaren.cli",),
        (),
    ),
}


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return ImportGraph(REPO, skip=EXCEPTIONS)


def test_the_graph_sees_the_whole_tree(graph):
    """The rules cover something: every room is found, and known imports are seen."""
    for room in ROOMS:
        assert graph.under(room), f"no module under {room}"
    assert "aaren.server.contract.errors" in graph.reach("aaren.server.frontends.aaren_v1.servicer")
    assert "torch" in graph.reach("aaren_core.attention.state")
    for name in IPC_TORCH_FREE:
        assert f"aaren.server.ipc.{name}" in graph.paths, f"no IPC module {name}"
    assert "aaren.server.app" in graph.reach("aaren.cli.server")  # its lazy imports count


def test_the_command_line_loads_its_rooms_inside_its_commands(graph):
    """``aaren.cli`` loads the server, aaren_core and torch only when a command that needs them runs:
    its modules import them inside functions (so ``aaren --help`` and the client commands stay light)."""
    heavy = ("aaren.server", "aaren_core", *TORCH)
    eager = [
        f"{graph.where(imp)} ({imp.module})"
        for name in graph.under("aaren.cli")
        for imp in graph.imports[name]
        if not imp.lazy and _matches(imp.module, heavy)
    ]
    assert not eager, "imported when aaren.cli loads: " + ", ".join(eager)
    lazy = {imp.module.split(".")[0] for name in graph.under("aaren.cli") for imp in graph.imports[name] if imp.lazy}
    assert "aaren_core" in lazy  # the check sees the imports it allows


@pytest.mark.parametrize("rule", list(RULES))
def test_layer_rule(graph, rule):
    importers, forbidden, allowed = RULES[rule]
    found = violations(graph, importers(graph), forbidden, allowed)
    assert not found, f"{rule}:\n" + "\n".join(found)


def test_every_exception_is_still_needed(graph):
    stale = [f"{importer} -> {prefix}" for importer, prefix in EXCEPTIONS if (importer, prefix) not in graph.skipped]
    assert not stale, "exceptions that match no import any more (delete them): " + ", ".join(stale)


# ----------------------------------------------------------------- the checker itself


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_finds_direct_lazy_relative_and_transitive_imports(tmp_path):
    _write(
        tmp_path,
        {
            "server/__init__.py": "",
            "server/frontends/__init__.py": "",
            "server/frontends/front.py": "from aaren.server.contract import helper\n",
            "server/frontends/lazy.py": "def f():\n    import torch\n",
            "server/frontends/typed.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\nelse:\n    import json\n"
            ),
            "server/contract/__init__.py": "",
            "server/contract/helper.py": "from . import deep\n",
            "server/contract/deep.py": "import safetensors.torch\n",
            "server/core/__init__.py": "",
            "server/core/engine.py": "from ..frontends.front import x\n",
            "server/stores/__init__.py": "from aaren.server.contract import helper\n",
            "server/stores/memory.py": "import aaren.server.observability.metrics\n",
        },
    )
    rooms = {"aaren.server": "server"}
    graph = ImportGraph(tmp_path, rooms)

    torch_free = violations(graph, graph.under("aaren.server.frontends"), TORCH)
    starts = sorted({v.split(" reaches ")[0] for v in torch_free})
    assert starts == ["aaren.server.frontends.front", "aaren.server.frontends.lazy"], torch_free
    (chain,) = [v for v in torch_free if v.startswith("aaren.server.frontends.front ")]
    for hop in ("server/frontends/front.py:1", "server/contract/helper.py:1", "server/contract/deep.py:1"):
        assert hop in chain, chain
    (lazy,) = [v for v in torch_free if v.startswith("aaren.server.frontends.lazy ")]
    assert "server/frontends/lazy.py:2" in lazy

    (core,) = violations(graph, graph.under("aaren.server.core"), ("aaren.server.frontends",))
    assert "server/core/engine.py:1" in core  # a relative import resolved

    stores = violations(
        graph, graph.under("aaren.server.stores"), ("aaren.server",), ("aaren.server.stores", "aaren.server.contract")
    )
    assert [v.split(" reaches ")[1].split(":")[0] for v in stores] == ["aaren.server.observability.metrics"]


def test_checker_passes_a_clean_tree(tmp_path):
    _write(tmp_path, {"client/__init__.py": "import json\n", "client/tool.py": "from aaren.client import x\n"})
    graph = ImportGraph(tmp_path, {"aaren.client": "client"})
    assert graph.under("aaren.client") == ["aaren.client", "aaren.client.tool"]
    assert violations(graph, graph.under("aaren.client"), (*TORCH, "aaren.server")) == []


def test_an_exception_skips_only_its_own_imports(tmp_path):
    _write(tmp_path, {"client/__init__.py": "", "client/tool.py": "import aaren.server.app\nimport torch\n"})
    rooms = {"aaren.client": "client"}
    graph = ImportGraph(tmp_path, rooms, skip=[("aaren.client.tool", "aaren.server"), ("aaren.client.tool", "grpc")])
    assert graph.skipped == {("aaren.client.tool", "aaren.server")}
    assert violations(graph, ["aaren.client.tool"], ("aaren.server",)) == []
    (left,) = violations(graph, ["aaren.client.tool"], TORCH)
    assert "client/tool.py:2 (torch)" in left
