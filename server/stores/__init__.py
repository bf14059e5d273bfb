"""Session stores behind one interface, chosen by URL (``memory://``, ``redis://``...)."""

from aaren.server.stores.base import (
    LoadedBatch,
    SaveBatch,
    SessionMeta,
    SessionStore,
    StateLayout,
    StoreUnavailableError,
)
from aaren.server.stores.factory import model_store_url, open_store

__all__ = [
    "LoadedBatch",
    "SaveBatch",
    "SessionMeta",
    "SessionStore",
    "StateLayout",
    "StoreUnavailableError",
    "model_store_url",
    "open_store",
]
