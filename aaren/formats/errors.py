"""The one error type of data that cannot be used, raised by every reader of ``aaren.formats``.

``aaren_core`` raises the same class for its own data checks (the event, series and class
data import it from here), so one ``except DataError`` catches a bad file
and a bad split alike; the client's ``EventsFileError`` is this class too.
"""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """Data that cannot be used: the message says what was wrong, where, and what was expected."""
