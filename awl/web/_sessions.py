"""Who is signed in to the approval page: one-time sign-in codes and sessions (BIND-9, BIND-10).

Everything here lives in memory: a restart of ``awl web`` signs everybody out, and a code
printed by an earlier run never works again. A session id and its CSRF token are each 256
random bits; the cookie carries only the id.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Session", "Sessions"]

DEFAULT_TTL = 8 * 3600.0
"""How long a session lasts, in seconds, from sign-in."""

CODE_TTL = 24 * 3600.0
"""How long a printed sign-in code may wait to be used."""


@dataclass(frozen=True, slots=True)
class Session:
    """One signed-in browser."""

    id: str
    principal: str
    csrf: str
    expires: float
    token_hash: str | None = None
    """The hash of the desk token it signed in with (None for a one-time code)."""

    def csrf_ok(self, sent: str | None) -> bool:
        """Whether a form sent this session's CSRF token (compared in constant time)."""
        return sent is not None and hmac.compare_digest(sent.encode(), self.csrf.encode())


class Sessions:
    """The page's sign-in codes and live sessions."""

    def __init__(self, *, ttl: float = DEFAULT_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._codes: dict[str, tuple[str, float]] = {}
        self._live: dict[str, Session] = {}

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

    def start(self, principal: str, token_hash: str | None = None) -> Session:
        """A new session for ``principal`` (signed in with the desk token of this hash)."""
        session = Session(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32),
                          self._clock() + self.ttl, token_hash)
        with self._lock:
            self._live[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id; an expired one is forgotten."""
        if not session_id:
            return None
        with self._lock:
            session = self._live.get(session_id)
            if session is not None and session.expires < self._clock():
                del self._live[session_id]
                session = None
        return session

    def end(self, session_id: str) -> None:
        """Sign the session out."""
        with self._lock:
            self._live.pop(session_id, None)
