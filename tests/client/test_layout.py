"""Import layout: one ``aaren`` namespace, and the client room's dependencies (docs/architecture.md section 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_client_imports_no_core_server_or_torch():
    code = (
        "import sys, aaren, aaren.client, aaren.client.cli, aaren.client.client, aaren.client.commands, "
        "aaren.client.events_file, aaren.client.replay, aaren.client.sync, aaren.client.frames\n"
        "print(sorted({m for m in sys.modules if m.split('.')[0] in ('torch', 'aaren_core', 'numpy', 'pandas')"
        " or m.startswith('aaren.server')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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
