"""Open a session store by URL, as ``limits.storage_from_string`` does."""

from __future__ import annotations

from urllib.parse import parse_qs, parse_qsl, urlencode, urlparse

from aaren.server.stores.base import SessionStore, StateLayout
from aaren.server.stores.memory import MemoryStore

__all__ = ["REDIS_SCHEMES", "model_store_url", "open_store", "redact_url"]

REDIS_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster")


def redact_url(url: str) -> str:
    """The URL with its password (and any query, which may hold key files' paths) hidden, for logs."""
    parsed = urlparse(url)
    netloc = parsed.netloc
    if parsed.password is not None:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{host}"
    return f"{parsed.scheme}://{netloc}{parsed.path}" + ("?***" if parsed.query else "")


def model_store_url(url: str, model: str, *, default: bool) -> str:
    """The store URL of a served model's sessions: a session belongs to one model, so each model has
    its own key space. With ``default`` (the repository's ``default`` folder's model,
    ``aaren.server.tasks.repository.ServedModels.legacy_keys``) ``url`` stays as it is: its keys stay
    where a one-model server put them; in Redis every other model's keys get ``<prefix><model>:``
    as their prefix. A memory store is one per model anyway."""
    parsed = urlparse(url)
    if default or parsed.scheme not in REDIS_SCHEMES:
        return url
    from aaren.server.stores.redis_store import DEFAULT_PREFIX

    query = parse_qsl(parsed.query, keep_blank_values=True)
    prefix = next((v for k, v in query if k == "prefix"), DEFAULT_PREFIX)
    query = [(k, v) for k, v in query if k != "prefix"] + [("prefix", f"{prefix}{model}:")]
    return parsed._replace(query=urlencode(query)).geturl()


def open_store(url: str, layout: StateLayout, *, capacity: int, idle_ttl_s: float) -> SessionStore:
    """``memory://`` (options: ``?capacity=N``), ``redis://``, ``rediss://``, ``redis+cluster://``,
    ``rediss+cluster://`` (options: see ``open_redis_store``) -> a store. Unknown schemes are refused
    by name. ``capacity`` bounds the memory store only: Redis is bounded by its own ``maxmemory``."""
    parsed = urlparse(url)
    if parsed.scheme == "memory":
        options = parse_qs(parsed.query)
        if "capacity" in options:
            raw = options["capacity"][0]
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"store URL {url!r}: capacity must be a whole number >= 1, got {raw!r}")
            capacity = int(raw)
        return MemoryStore(layout, capacity=capacity, idle_ttl_s=idle_ttl_s)
    if parsed.scheme in REDIS_SCHEMES:
        from aaren.server.stores.redis_store import open_redis_store

        return open_redis_store(url, layout, idle_ttl_s=idle_ttl_s)
    raise ValueError(
        f"unsupported store URL {url!r}; expected memory:// or one of {', '.join(s + '://' for s in REDIS_SCHEMES)}"
    )
