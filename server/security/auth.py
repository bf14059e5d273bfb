"""Bearer tokens with tenants: the token file, hashing, and the tenant of the call being served.

Tokens live in a file, one per line: ``<tenant> sha256:<hex digest of the token>`` (blank lines
and ``#`` comments allowed). Only digests are kept, in the file and in memory; a presented token
is hashed and compared with every digest in constant time (``hmac.compare_digest``), so neither
the file nor the timing tells a token. ``aaren token TENANT`` makes a token and its line.

``aaren.server.security.interceptors.TokenAuthInterceptor`` checks ``authorization: Bearer <token>`` on every call
except the health service, answers UNAUTHENTICATED when it is missing or unknown, and hands the
tenant to the servicer in ``current_tenant``. Tenant names are ``[a-z0-9][a-z0-9_.-]{0,62}``:
never a ``/``, which separates the tenant from the session id in the store's keys.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import hmac
import re
import secrets
from pathlib import Path

__all__ = ["AuthError", "TokenTable", "current_tenant", "hash_token", "new_token"]

#: The tenant of the call being served ("" when authentication is off).
current_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("aaren_tenant", default="")

TENANT_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
DIGEST_PATTERN = re.compile(r"sha256:([0-9a-f]{64})")


class AuthError(ValueError):
    """The token file is malformed (the message names the line, never a token)."""


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits)."""
    return "aaren_" + secrets.token_urlsafe(32)


@dataclasses.dataclass(frozen=True)
class TokenTable:
    """Digest -> tenant, from a token file."""

    digests: tuple[tuple[bytes, str], ...]

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        entries: list[tuple[bytes, str]] = []
        for number, raw in enumerate(path.read_text().splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise AuthError(f"{path}:{number}: expected '<tenant> sha256:<64 hex digits>', got {len(parts)} fields")
            tenant, digest = parts
            if not TENANT_PATTERN.fullmatch(tenant):
                raise AuthError(f"{path}:{number}: tenant {tenant!r} must match {TENANT_PATTERN.pattern}")
            match = DIGEST_PATTERN.fullmatch(digest)
            if match is None:
                raise AuthError(
                    f"{path}:{number}: expected a token digest 'sha256:<64 hex digits>' (tokens themselves are never "
                    "stored; `aaren token TENANT` prints the line)"
                )
            entries.append((bytes.fromhex(match.group(1)), tenant))
        if not entries:
            raise AuthError(f"{path}: no tokens; expected lines '<tenant> sha256:<64 hex digits>'")
        return cls(tuple(entries))

    def tenant_of(self, token: str) -> str | None:
        """The token's tenant, or None. Compares with every digest, in constant time each."""
        presented = hashlib.sha256(token.encode()).digest()
        found = None
        for digest, tenant in self.digests:
            if hmac.compare_digest(presented, digest):
                found = tenant
        return found

    @property
    def tenants(self) -> set[str]:
        return {tenant for _, tenant in self.digests}
