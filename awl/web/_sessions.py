"""Who is signed in to the approval page: one-time sign-in codes and sessions (BIND-9, BIND-10).

Sessions are kept in the desk's store (:class:`~awl.store.protocol.WebSessions`), by the
hash of their id only, so a restart of ``awl web`` signs nobody out and every ``awl web`` in
front of one store (on any host) knows the same sessions; a store that keeps none (not one of
this package's) leaves them in this process. A session id and its CSRF token are each 256
random bits; the cookie carries only the id, which the store never sees. Expiry is wall-clock
time, the same on every host.

Sign-in codes stay in memory: a code is printed by one ``awl web`` and works once, on it,
and a code printed by an earlier run never works again.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from awl.desk.tokens import token_hash
from awl.store.memory import MemoryStore
from awl.store.protocol import WebSession, WebSessions

__all__ = ["Session", "Sessions"]

DEFAULT_TTL = 8 * 3600.0
"""How long a session lasts, in seconds, from sign-in."""

CODE_TTL = 24 * 3600.0
"""How long a printed sign-in code may wait to be used."""


@dataclass(frozen=True, slots=True)
class Session:
    """One signed-in browser."""

    id: str
    """The session id, as the cookie carries it (the store keeps only its hash)."""
    principal: str
    csrf: str
    expires: float
    """When it ends, in seconds since the epoch."""
    token_hash: str | None = None
    """The hash of the desk token it signed in with (None for a one-time code)."""

    def csrf_ok(self, sent: str | None) -> bool:
        """Whether a form sent this session's CSRF token (compared in constant time)."""
        return sent is not None and hmac.compare_digest(sent.encode(), self.csrf.encode())


class Sessions:
    """The page's sign-in codes, and its sessions as ``keeper`` keeps them.

    The store methods block; async callers run them in a worker thread."""

    def __init__(self, keeper: WebSessions | None = None, *, ttl: float = DEFAULT_TTL,
                 clock: Callable[[], float] = time.time) -> None:
        self.keeper: WebSessions = keeper if keeper is not None else MemoryStore()
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._codes: dict[str, tuple[str, float]] = {}

    def new_code(self, principal: str) -> str:
        """A code that signs ``principal`` in once."""
        code = secrets.token_urlsafe(32)
        with self._lock:
            self._codes[code] = (principal, self._clock() + CODE_TTL)
        return code

    def use_code(self, code: str) -> str | None:
        """The principal of a fresh code, which is used up; None for any other text."""
        with self._lock:
            found = self._codes.pop(code, None)
        if found is None or found[1] < self._clock():
            return None
        return found[0]

    def start(self, principal: str, token_hash_: str | None = None) -> Session:
        """A new session for ``principal`` (signed in with the desk token of this hash)."""
        now = self._clock()
        session = Session(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32),
                          now + self.ttl, token_hash_)
        self.keeper.start_web_session(WebSession(
            token_hash(session.id), principal, session.csrf, session.expires, token_hash_),
            now=now)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id; None for an unknown, ended or expired one."""
        if not session_id:
            return None
        kept = self.keeper.web_session(token_hash(session_id), now=self._clock())
        if kept is None:
            return None
        return Session(session_id, kept.principal, kept.csrf, kept.expires_at, kept.token_hash)

    def end(self, session_id: str) -> None:
        """Sign the session out, on every ``awl web`` that shares the store."""
        self.keeper.end_web_session(token_hash(session_id))
