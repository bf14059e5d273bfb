"""Typed Python client of the aaren service, and the ``aaren`` command line.

``AarenClient`` (``client.client``) is the async client; ``client.events_file`` reads event files and
the built-in ``flights`` data; ``client.replay`` streams events through a server at scale.
"""

from client.client import (
    AarenClient,
    AarenError,
    AckOut,
    EndSessionOut,
    EventErrorOut,
    EventIn,
    EventStream,
    ForecastOut,
    ForecastResult,
    ModelInfoOut,
    Outcome,
    SessionOut,
    StreamClosedError,
    StreamResult,
)

__all__ = [
    "AarenClient",
    "AarenError",
    "AckOut",
    "EndSessionOut",
    "EventErrorOut",
    "EventIn",
    "EventStream",
    "ForecastOut",
    "ForecastResult",
    "ModelInfoOut",
    "Outcome",
    "SessionOut",
    "StreamClosedError",
    "StreamResult",
]
