"""Desk access tokens: how an HTTP client proves which principal it acts as.

``awl token issue PRINCIPAL`` makes a token with 256 random bits and shows it once; the
store keeps only its SHA-256 digest (SEC-3), so a copy of the desk file gives nobody a
working token.

Checking a token is a lookup of its digest, never a comparison of the token itself. An
index lookup compares digests byte by byte, so its timing could tell a guesser how much of a
guessed *digest* matched a stored one; that is worth nothing, because nobody can steer a
digest without inverting SHA-256. This is what makes the check constant-time in the secret.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime

from awl._errors import BadRequest
from awl._store import Store

__all__ = ["TOKEN_PREFIX", "check_principal", "issue_token", "principal_for_token",
           "token_hash"]

TOKEN_PREFIX = "awl_"
"""Every desk token starts with this, so one found in a log or a config is recognisable."""

_MAX_TOKEN = 512


def token_hash(token: str) -> str:
    """What the store keeps of a token: ``sha256:`` and the hex digest of its UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_principal(principal: str) -> str:
    """``principal`` if it can act on the desk, else :class:`~awl.BadRequest`.

    A principal is 1 to 512 characters with no surrounding white space; ``awl:`` names
    belong to the desk itself.
    """
    if not principal or len(principal) > 512 or principal != principal.strip():
        raise BadRequest(f"{principal!r} is not a principal: write 1 to 512 characters, no "
                         "surrounding spaces, such as agent:researcher or human:ana")
    if principal.startswith("awl:"):
        raise BadRequest(f"{principal} is reserved for the desk itself; act as an agent or a "
                         "human, such as agent:researcher or human:ana")
    return principal


def issue_token(store: Store, principal: str, *, now: datetime | None = None) -> str:
    """Make a new token for ``principal``, keep its digest, and return the token.

    The token is not kept anywhere: whoever receives it must store it.

    Raises:
        BadRequest: ``principal`` cannot act on the desk.
    """
    check_principal(principal)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    at = (now or datetime.now(UTC)).astimezone(UTC)
    store.save_token(token_hash(token), principal,
                     created_at=at.isoformat(timespec="seconds").replace("+00:00", "Z"))
    return token


def principal_for_token(store: Store, token: str | None) -> str | None:
    """The principal ``token`` was issued to, or None when it is not a desk token.

    Blocking (a store read): call it from a worker thread in async code.
    """
    if not token or len(token) > _MAX_TOKEN or not token.startswith(TOKEN_PREFIX):
        return None
    return store.principal_for(token_hash(token))
