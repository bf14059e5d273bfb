"""Errors of the service: each carries a status code, a stable reason and a message for people.

The codes are gRPC's status numbers, but this module does not import gRPC: the runtime raises and
returns these, and the servicer maps them onto ``grpc.StatusCode`` and ``aaren.v1.ErrorCode``
(both use the same numbers).
"""

from __future__ import annotations

import dataclasses
from enum import IntEnum

__all__ = ["Code", "ConfigError", "ErrorInfo", "ServiceError"]


class ConfigError(ValueError):
    """The settings cannot work (a missing TLS file, plaintext on a public address...): the server
    does not start, and the message says what to set."""


class Code(IntEnum):
    """gRPC status codes used by this service (same numbers as ``grpc.StatusCode``)."""

    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    INTERNAL = 13
    UNAVAILABLE = 14


@dataclasses.dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why one event or request was refused. ``reason`` is one of the snake_case reasons in the proto."""

    code: Code
    reason: str
    message: str
    #: For RESOURCE_EXHAUSTED: seconds after which a retry may pass (0: no hint).
    retry_after_s: float = 0.0


class ServiceError(Exception):
    """An error of a unary call or a whole request."""

    def __init__(self, code: Code, reason: str, message: str, *, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.info = ErrorInfo(code, reason, message, retry_after_s)

    @property
    def code(self) -> Code:
        return self.info.code

    @property
    def reason(self) -> str:
        return self.info.reason
