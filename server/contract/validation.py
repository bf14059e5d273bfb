"""The check of a session id that needs no state, wherever one arrives (front ends and core).

The stateless checks of whole requests (``aaren.server.frontends.streams.EventChecker``) run in the
front ends, before anything reaches the engine core (docs/architecture.md section 3, "Validation");
the unary calls' session ids are checked here by the core too. The checks that need the session's
state (seq order, time order, model version) are the engine core's.
"""

from __future__ import annotations

from aaren.server.contract.errors import ErrorInfo, Reasons

__all__ = ["session_id_error"]


def session_id_error(sid: str, max_bytes: int) -> ErrorInfo | None:
    """Why ``sid`` is no session id (empty, or over ``max_bytes`` in UTF-8); None when it is one."""
    if not sid:
        return Reasons.session_id_empty()
    n_bytes = len(sid.encode("utf-8", "surrogatepass"))
    if n_bytes > max_bytes:
        return Reasons.session_id_too_long(n_bytes, max_bytes)
    return None
