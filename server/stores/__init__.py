"""Session stores behind one interface, chosen by URL (``memory://``, ``redis://``...)."""

from server.stores.base import LoadedBatch, SessionMeta, SessionStore, StateLayout, StoreUnavailableError
from server.stores.factory import open_store

__all__ = ["LoadedBatch", "SessionMeta", "SessionStore", "StateLayout", "StoreUnavailableError", "open_store"]
