"""The server's commands: ``aaren serve`` and ``aaren token``.

Each imports ``aaren.server`` when it runs, so that the client commands never load it.
"""

from __future__ import annotations

from typing import Annotated

import typer


def serve(ctx: typer.Context) -> None:
    """Start the gRPC server. Every setting is a flag (see `aaren serve --help`) or an AAREN_* variable."""
    from aaren.server.app import run
    from aaren.server.settings import ServerSettings

    run(ServerSettings(_cli_parse_args=list(ctx.args)))  # type: ignore[call-arg]


def token(
    tenant: Annotated[str, typer.Argument(help="the tenant the token belongs to ([a-z0-9][a-z0-9_.-]*)")],
) -> None:
    """Make a bearer token: prints the token (give it to the client) and the line for the server's
    auth_tokens_file (only the token's SHA-256 digest is stored there)."""
    from aaren.server.security.auth import TENANT_PATTERN, hash_token, new_token

    if not TENANT_PATTERN.fullmatch(tenant):
        raise typer.BadParameter(f"{tenant!r}: expected {TENANT_PATTERN.pattern}", param_hint="TENANT")
    value = new_token()
    typer.echo(f"token:      {value}")
    typer.echo(f"token file: {tenant} {hash_token(value)}")
