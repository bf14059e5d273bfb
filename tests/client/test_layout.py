"""Import layout: one ``aaren`` namespace, and the client room's dependencies (docs/architecture.md section 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _loaded_by(modules: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules under ``prefixes`` that importing ``modules`` (comma-separated) loads, in a fresh interpreter."""
    code = (
        f"import json, sys, {modules}\n"
        f"loaded = sorted(m for m in sys.modules if any(m == p or m.startswith(p + '.') for p in {prefixes!r}))\n"
        "print(json.dumps(loaded))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_client_imports_no_core_server_or_torch():
    client = (
        "aaren, aaren.client, aaren.client.client, aaren.client.events_file, aaren.client.replay, "
        "aaren.client.sync, aaren.client.frames, aaren.client.task_scores"
    )
    assert _loaded_by(client, ("torch", "aaren_core", "numpy", "pandas", "aaren.server", "aaren.cli")) == []


def test_the_command_line_loads_the_server_and_torch_only_when_a_command_runs():
    """``aaren --help`` and the client commands stay as light as the client: serve, train... import
    their room inside the command."""
    cli = "aaren.cli, aaren.cli.app, aaren.cli.client_commands, aaren.cli.server, aaren.cli.training, aaren.cli.tables"
    assert _loaded_by(cli, ("torch", "aaren_core", "numpy", "pandas", "aaren.server")) == []
    # The check can fail: the same probe sees the server once a module that imports it is loaded.
    assert "aaren.server.settings" in _loaded_by("aaren.cli.app, aaren.server.settings", ("aaren.server",))


def test_users_own_client_and_server_modules_do_not_shadow_ours(tmp_path: Path):
    """A user's script folder with its own ``client.py`` and ``server.py`` (a common pair of names)
    imports both of them and aaren's client side by side."""
    (tmp_path / "client.py").write_text(
        "from aaren import AarenClient\n\nclass MyClient:\n    inner = AarenClient\n", encoding="utf-8"
    )
    (tmp_path / "server.py").write_text("NAME = 'users own server'\n", encoding="utf-8")
    (tmp_path / "main.py").write_text(
        "import client, server\n"
        "import aaren, aaren.client, aaren.server.settings\n"
        "assert client.MyClient.inner is aaren.client.AarenClient\n"
        "assert server.NAME == 'users own server'\n"
        "print(aaren.__version__, aaren.AarenClient.__module__, aaren.server.settings.__name__)\n",
        encoding="utf-8",
    )
    out = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    version, module, settings = out.stdout.split()
    assert module == "aaren.client.client" and settings == "aaren.server.settings"
    assert version[0].isdigit()


def test_import_aaren_exposes_the_client_lazily():
    code = "import sys, aaren; print('aaren.client' in sys.modules, 'AarenClient' in dir(aaren))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
