"""Session stores behind one interface, chosen by URL (``memory://``, ``redis://``...): the interface
(``base``, re-exported whole) and ``open_store``."""

from aaren.server.stores import base
from aaren.server.stores.base import *  # noqa: F403 (the interface, by its own __all__)
from aaren.server.stores.factory import model_store_url, open_store

__all__ = [*base.__all__, "model_store_url", "open_store"]
