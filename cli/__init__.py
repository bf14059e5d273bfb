"""The product's command line, ``aaren`` (``aaren.cli.app``): the one room that spans every other
(serve, train, replay), so that the client library stays importable without the server or torch."""
