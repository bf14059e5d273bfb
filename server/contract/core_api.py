"""What a front end may call on the engine core: one typed interface for both process layouts.

The in-process ``EngineCore`` (``aaren.server.core.engine_core``, ``--frontends 0``) and the IPC
client of a core in another process (``aaren.server.ipc.client_side.CoreClient``) both implement
``CoreAPI``; front ends hold a ``CoreAPI`` and nothing else of the core (tests/server/test_core_api.py
checks both against it, signatures included).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from aaren.server.contract.columns import CoreRequest, ModelDescription, Outcomes, SampledFuture, SessionView
from aaren.server.contract.errors import ErrorInfo

__all__ = ["CoreAPI", "ForecastOptions", "OnDone"]

#: Called once with a request's answer, on the core's side of the loop (it must not block).
OnDone = Callable[[Outcomes], None]


@dataclasses.dataclass(frozen=True, slots=True)
class ForecastOptions:
    """What a unary forecast asks for beyond the next event: ``horizon`` future events, summarized
    over ``num_samples`` sampled futures (0: the server's default) drawn with ``seed`` (None: any);
    ``top_k`` ranked marks or classes (0: the default); ``include_paths``: the sampled paths too."""

    horizon: int = 1
    num_samples: int = 0
    seed: int | None = None
    top_k: int = 0
    include_paths: bool = False


@runtime_checkable
class CoreAPI(Protocol):
    """The engine core as every front end sees it.

    ``descriptions``: every served model, the default first; ``aliases``: folder names -> model
    names. ``draining``: new events are refused (``shutting_down``). ``lost``: the core is gone
    (only an IPC client's core can be); every call then fails with ``core_unavailable``.
    ``pending``: how much submitted work is unanswered (0 once every answer is out).
    """

    @property
    def descriptions(self) -> tuple[ModelDescription, ...]: ...

    @property
    def aliases(self) -> dict[str, str]: ...

    @property
    def draining(self) -> bool: ...

    @property
    def lost(self) -> bool: ...

    @property
    def pending(self) -> int: ...

    def submit(self, request: CoreRequest, on_done: OnDone) -> None:
        """Accept ``request``; ``on_done(outcomes)`` is called once, after its applied events are
        stored (a request refused whole is answered at once, ``Outcomes.request_error``)."""
        ...

    def submitter(self, model: str) -> Callable[[CoreRequest, OnDone], None]:
        """``submit`` for the requests of ``model`` (a served model's name), found once: a front end
        holds one per served model (raises ``ServiceError`` for a model not served)."""
        ...

    def count_rejection(self, error: ErrorInfo, n: int = 1, model: str = "") -> None:
        """Count ``n`` events a front end refused whole before submitting them."""
        ...

    async def open_stream(self, tenant: str) -> ErrorInfo | None:
        """Admit one more stream of ``tenant``, or say why not."""
        ...

    async def close_stream(self, tenant: str) -> None: ...

    async def forecast(
        self, session_id: str, options: ForecastOptions, tenant: str = "", model: str = ""
    ) -> SampledFuture:
        """The session's next forecast (and, ``horizon > 1``, sampled futures); raises ``ServiceError``."""
        ...

    async def get_session(
        self, session_id: str, include_state: bool = False, tenant: str = "", model: str = ""
    ) -> SessionView:
        """The stored session; raises ``ServiceError`` (e.g. ``session_not_found``)."""
        ...

    async def end_session(self, session_id: str, tenant: str = "", model: str = "") -> int | None:
        """End the session: its last seq, None when there was none."""
        ...

    async def front_end_reports(self, what: str) -> list[Any]:
        """Every front-end process's report ``what``, the asker's included (``"metrics"``: its metric
        families; ``"oip_statistics"``: its OIP ModelStatistics). Empty in one process, where the
        front end is the only one and its own numbers are the service's."""
        ...
