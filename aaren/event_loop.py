"""The event loop the project's servers run on: uvloop where it is installed, asyncio's own otherwise.

``aaren serve`` (its engine core and its front-end processes) and ``aaren consume`` run their
``asyncio`` code through ``run``, on the loop the ``event_loop`` setting chooses (``--event-loop``,
``AAREN_EVENT_LOOP``): ``auto`` (the default) takes uvloop where it imports, ``uvloop`` insists on it,
``asyncio`` keeps the standard library's. uvloop (libuv's loop, as uvicorn's ``--loop auto``) makes a
turn of the loop, a callback and a future cheaper: at 16 and 64 streams of one event a message the
server took 4-12 % less CPU an event on it than on asyncio's, and served 3-12 % more events/s (two
runs side by side, ``bench/results/round_uvloop.md``). Nothing else changes: the same coroutines, the same
order of callbacks. uvloop has no Windows build; there ``auto`` is asyncio's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LOOPS", "loop_factory", "resolve", "run"]

T = TypeVar("T")

#: The ``event_loop`` setting's values.
LOOPS = ("auto", "uvloop", "asyncio")


def resolve(choice: str = "auto") -> str:
    """The loop ``choice`` runs on, ``"uvloop"`` or ``"asyncio"`` (``auto``: uvloop where it imports).

    Raises ``ValueError`` for a choice not in ``LOOPS``, and for ``uvloop`` where it is not installed."""
    if choice not in LOOPS:
        raise ValueError(f"event loop {choice!r}: expected one of {', '.join(LOOPS)}")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise ValueError(
                "event loop 'uvloop': uvloop is not installed (pip install uvloop; it has no Windows build), "
                "expected it or --event-loop auto/asyncio"
            ) from None
        return "asyncio"
    return "uvloop"


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop ``choice`` resolves to (None: asyncio's default), for ``asyncio.Runner``."""
    if resolve(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """``asyncio.run(main)`` on the loop ``choice`` resolves to (``resolve``'s errors raised before it
    starts, ``main`` closed unrun)."""
    try:
        factory = loop_factory(choice)
    except ValueError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
