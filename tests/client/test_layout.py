"""The client room imports only the generated proto package and its own dependencies (DESIGN.md section 2)."""

from __future__ import annotations

import subprocess
import sys


def test_client_imports_no_core_server_or_torch():
    code = (
        "import sys, client, client.cli, client.client, client.commands, client.events_file, client.replay\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'aaren_core', 'server', 'numpy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
