"""The ``aaren`` command line: one typer app over every room of the product.

The command line sits above the other rooms (docs/architecture.md "Layout"): ``serve`` and ``token``
run the server (``aaren.cli.server``), ``train``, ``evaluate`` and ``split export`` the models
(``aaren.cli.training``, aaren_core), ``replay``, ``forecast``, ``session``, ``end``, ``model`` and
``health`` call a running server (``aaren.cli.client_commands``, the client library), ``produce``
writes a file's events to an event log (``aaren.cli.log_commands``). The server and
aaren_core are imported inside their commands only: loading the app, and running a client command,
loads neither (nor torch).
"""

from __future__ import annotations

import typer

from aaren.cli import client_commands, log_commands, server, training

app = typer.Typer(help="aaren: streaming event forecasting with Aaren (attention as an RNN).", no_args_is_help=True)


@app.callback()
def main() -> None:
    """aaren: streaming event forecasting with Aaren (attention as an RNN)."""


# The order of `aaren --help`.
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)(
    server.serve
)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)(
    server.consume
)
app.command()(log_commands.produce)
app.command(cls=training.TrainCommand)(training.train)
app.command()(training.evaluate)
app.add_typer(training.split_app, name="split")
for command in (
    client_commands.replay,
    client_commands.forecast,
    client_commands.session,
    client_commands.end,
    client_commands.model,
    client_commands.rollout,
):
    app.command()(command)
app.command()(server.token)
app.command()(client_commands.health)


if __name__ == "__main__":
    app()
