"""Open a session store by URL, as ``limits.storage_from_string`` does."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

from server.stores.base import SessionStore, StateLayout
from server.stores.memory import MemoryStore

__all__ = ["open_store"]


def open_store(url: str, layout: StateLayout, *, capacity: int, idle_ttl_s: float) -> SessionStore:
    """``memory://`` (options: ``?capacity=N``) -> a store. Unknown schemes are refused by name."""
    parsed = urlparse(url)
    if parsed.scheme == "memory":
        options = parse_qs(parsed.query)
        if "capacity" in options:
            raw = options["capacity"][0]
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"store URL {url!r}: capacity must be a whole number >= 1, got {raw!r}")
            capacity = int(raw)
        return MemoryStore(layout, capacity=capacity, idle_ttl_s=idle_ttl_s)
    raise ValueError(f"unsupported store URL {url!r}; expected memory://")
