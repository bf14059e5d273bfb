"""Typed Python client of the aaren service (the ``aaren`` command line is ``aaren.cli``).

``AarenClient`` (``aaren.client.client``) is the async client, ``SyncClient`` (alias ``Client``;
``aaren.client.sync``) the blocking one for scripts and notebooks; ``aaren.client.frames`` sends pandas
DataFrames of events (or of a series or class model's steps) and returns DataFrames of forecasts;
``aaren.client.events_file`` reads event files and the built-in ``flights`` data;
``aaren.client.replay`` streams events through a server at scale.
"""

from aaren.client import client as _client
from aaren.client.client import *  # noqa: F403  (the names of aaren.client.client.__all__)
from aaren.client.frames import apply_frame, events_from_frame, forecasts_frame
from aaren.client.sync import SyncClient

#: The blocking client under a short name (``aaren.Client``).
Client = SyncClient

__all__ = ["Client", "SyncClient", "apply_frame", "events_from_frame", "forecasts_frame"]
__all__ += _client.__all__
