"""The ``aaren`` command line.

``serve`` (and, with the forecasting work, ``train``/``evaluate``) import their room lazily, so the
client commands run with the client's dependencies only.
"""

from __future__ import annotations

import typer

app = typer.Typer(help="aaren: streaming event forecasting with Aaren (attention as an RNN).", no_args_is_help=True)


@app.callback()
def main() -> None:
    """aaren: streaming event forecasting with Aaren (attention as an RNN)."""


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def serve(ctx: typer.Context) -> None:
    """Start the gRPC server. Every setting is a flag (see `aaren serve --help`) or an AAREN_* variable."""
    from server.app import run
    from server.settings import ServerSettings

    run(ServerSettings(_cli_parse_args=list(ctx.args)))  # type: ignore[call-arg]


if __name__ == "__main__":
    app()
