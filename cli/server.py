"""The server's commands: ``aaren serve``, ``aaren consume`` and ``aaren token``.

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


#: ``aaren consume``'s own flags, and the server settings they set.
CONSUME_FLAGS = {
    "--source": "--consume-source",
    "--sink": "--consume-sink",
    "--target": "--consume-target",
    "--member": "--consume-member",
    "--batch": "--consume-batch",
    "--gap-wait-s": "--consume-gap-wait-s",
    "--format": "--consume-format",
}


def consume_args(args: list[str]) -> list[str]:
    """``aaren consume``'s flags as the server settings' (``--source URL`` -> ``--consume-source URL``)."""
    out = []
    for arg in args:
        flag, eq, value = arg.partition("=")
        out.append(CONSUME_FLAGS.get(flag, flag) + eq + value if flag in CONSUME_FLAGS else arg)
    return out


def consume(ctx: typer.Context) -> None:
    """Forecast straight from an event log: --source URL --sink URL (redis-stream://host:port/STREAM,
    nats://host:port/SUBJECT); each event applied once, each forecast published once. Loads the model
    as `aaren serve` does (every serve flag works, gRPC is served too) or, with --target HOST:PORT,
    sends the events to that server. Also --member i/n, --batch N, --gap-wait-s S, --format
    same|json|protobuf."""
    from aaren.server.app import run
    from aaren.server.settings import ServerSettings

    settings = ServerSettings(_cli_parse_args=consume_args(list(ctx.args)))  # type: ignore[call-arg]
    if not settings.consume_source or not settings.consume_sink:
        raise SystemExit("aaren consume: give both --source URL and --sink URL (redis-stream://... or nats://...)")
    if settings.consume_target:
        from aaren.server.frontends.eventlog.service import run_remote

        run_remote(settings)
    else:
        run(settings)


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
