"""aaren: streaming forecasts from one O(1) Aaren state per session.

One import namespace for everything the distribution installs:

- ``aaren.v1``: the generated gRPC/protobuf code of the wire contract (source: ``proto/aaren/v1``);
- ``aaren.client``: the typed Python client;
- ``aaren.cli``: the ``aaren`` command line (above every other room);
- ``aaren.server``: the service;
- ``aaren_core`` (its own top-level package): the model library.

The client's names are re-exported here, imported on first use, so ``import aaren`` stays cheap
and pulls in neither the server nor torch::

    import aaren
    async with aaren.AarenClient("127.0.0.1:50051") as client:
        ...

    with aaren.Client("127.0.0.1:50051") as client:  # blocking: scripts and notebooks
        forecasts = client.apply_frame(events)  # a pandas DataFrame in, one out
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

try:
    __version__ = metadata.version("aaren")
except metadata.PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0+unknown"

#: Names served lazily from ``aaren.client``.
_CLIENT_NAMES = (
    "AarenClient",
    "AarenError",
    "AckOut",
    "Client",
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
    "SyncClient",
    "apply_frame",
)

__all__ = ["__version__", *_CLIENT_NAMES]


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        value = getattr(importlib.import_module("aaren.client"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'aaren' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_CLIENT_NAMES})
