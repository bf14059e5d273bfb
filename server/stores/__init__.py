"""Session stores behind one interface, chosen by URL (``memory://``, ``redis://``...): the interface
(``base``, re-exported whole) and ``open_store``.

``open_store`` and ``model_store_url`` load the stores themselves (the memory store's compiled passes
need numba) on first use: a task imports ``base``'s row type without them (``Rows``)."""

from typing import Any

from aaren.server.stores import base
from aaren.server.stores.base import *  # noqa: F403 (the interface, by its own __all__)

__all__ = [*base.__all__, "model_store_url", "open_store"]  # noqa: F405 (the last two by __getattr__)


def __getattr__(name: str) -> Any:
    if name in ("model_store_url", "open_store"):
        from aaren.server.stores import factory

        return getattr(factory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
