"""The command line against a server with TLS and tokens: credentials come from AAREN_* variables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from certificates import CertificateAuthority

from aaren.server.security.auth import hash_token, new_token

AAREN = str(Path(sys.executable).parent / "aaren")


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AAREN_")}
    return subprocess.run([AAREN, *args], capture_output=True, text=True, timeout=60, env={**clean, **env})


def test_cli_uses_tls_and_token_from_the_environment(start_server, tmp_path):
    ca = CertificateAuthority(tmp_path)
    cert, key = ca.issue("server")
    token = new_token()
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"acme {hash_token(token)}\n")
    srv = start_server(tls_cert_file=cert, tls_key_file=key, auth_tokens_file=tokens)
    target = f"localhost:{srv.server.grpc_port}"

    ok = run("model", "-t", target, "--json", AAREN_CA_FILE=str(ca.path), AAREN_TOKEN=token)
    assert ok.returncode == 0, ok.stderr
    assert '"num_marks": 5' in ok.stdout

    no_token = run("model", "-t", target, AAREN_CA_FILE=str(ca.path))
    assert no_token.returncode != 0 and "UNAUTHENTICATED" in no_token.stdout + no_token.stderr

    health = run("health", "-t", target, AAREN_CA_FILE=str(ca.path))  # the health service needs no token
    assert health.returncode == 0 and "SERVING" in health.stdout, health.stdout + health.stderr

    plaintext = run("health", "-t", target, "--timeout", "2")
    assert plaintext.returncode == 1
    assert token not in ok.stdout + ok.stderr + no_token.stdout + no_token.stderr
