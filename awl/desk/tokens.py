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

from awl.documents.errors import BadRequest, NotFound
from awl.documents.lifecycle import is_desk_principal
from awl.store.protocol import Store, TokenRecord

__all__ = ["TOKEN_PREFIX", "check_principal", "issue_token", "principal_for_token",
           "revoke_tokens", "token_hash", "token_id"]

TOKEN_PREFIX = "awl_"
"""Every desk token starts with this, so one found in a log or a config is recognisable."""

_MAX_TOKEN = 512
_ID_LENGTH = 12
_MIN_ID = 6


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
    if is_desk_principal(principal):
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


def token_id(token_hash_: str) -> str:
    """A token's short public id: the first 12 hex digits of its hash (SEC-6).

    It names the token in listings and revocations without revealing anything that
    authenticates."""
    return token_hash_.removeprefix("sha256:")[:_ID_LENGTH]


def revoke_tokens(store: Store, *, id_prefix: str | None = None, token: str | None = None,
                  principal: str | None = None) -> list[TokenRecord]:
    """Revoke desk tokens: the one with this id (or a unique start of it, 6 digits or more),
    the one given itself, or every token of ``principal``. Returns what was revoked.

    Raises:
        BadRequest: Not exactly one of the three was given, or the id is too short or
            matches several tokens.
        NotFound: Nothing matches.
    """
    if sum(x is not None for x in (id_prefix, token, principal)) != 1:
        raise BadRequest("name the tokens to revoke by exactly one of: id, token, principal")
    known = store.tokens()
    if token is not None:
        wanted = token_hash(token)
        chosen = [t for t in known if t.token_hash == wanted]
        missing = "the desk does not know that token (was it revoked already?)"
    elif principal is not None:
        chosen = [t for t in known if t.principal == principal]
        missing = f"{principal} has no desk token; `awl token list` shows the desk's tokens"
    else:
        assert id_prefix is not None
        prefix = id_prefix.strip().lower()
        if len(prefix) < _MIN_ID:
            raise BadRequest(f"a token id has {_ID_LENGTH} hex digits; give at least "
                             f"{_MIN_ID} of them (`awl token list` shows them)")
        chosen = [t for t in known if token_id(t.token_hash).startswith(prefix)]
        if len(chosen) > 1:
            raise BadRequest(f"{id_prefix!r} starts the ids of {len(chosen)} tokens; give more "
                             "digits")
        missing = f"no desk token has id {id_prefix!r}; `awl token list` shows them"
    if not chosen:
        raise NotFound(missing)
    return [t for t in chosen if store.drop_token(t.token_hash)]
