"""The ASGI middleware in front of the approval page: what holds before any route runs.

:class:`Guard` enforces, on every HTTP request:

- the ``Host`` check: on loopback a foreign ``Host`` is refused (421) before anything else
  runs, against DNS rebinding (SEC-2);
- the body limits: an unsafe request's body is read here, whole, at most :data:`MAX_BODY`
  bytes (413) and within :data:`BODY_SECONDS` (408), before the page parses it (BIND-12);
- the security headers on every response: the :data:`CSP`, ``nosniff``, no framing, no
  caching, same-origin referrers (BIND-12).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BODY_SECONDS", "CSP", "MAX_BODY", "UNSAFE", "Guard"]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
"""The page's Content-Security-Policy: no inline script or style, nothing from elsewhere."""

UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""The methods whose requests carry a body the guard reads (and that change something)."""

MAX_BODY = 1024 * 1024
"""The largest request body the page reads, in bytes: a form of the page is far smaller, and
no field of a form may be longer anyway (the form parser's own limit)."""
BODY_SECONDS = 30.0
"""How long a request's body may take to arrive, in seconds, before it is refused."""


class Guard:
    """Every response gets the security headers; on loopback a foreign ``Host`` is refused
    before anything else runs (DNS rebinding, SEC-2); a request body is read here, whole,
    before the page sees it: at most ``max_body`` bytes (413), arriving within
    ``body_seconds`` (408), so no one, signed in or not, can make the page parse or spool
    more, or hold it waiting for a body that never comes."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None, *,
                 max_body: int = MAX_BODY, body_seconds: float = BODY_SECONDS) -> None:
        self.app = app
        self.hosts = hosts
        self.max_body = max_body
        self.body_seconds = body_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(b"content-security-policy", CSP.encode()),
                            (b"x-content-type-options", b"nosniff"),
                            (b"referrer-policy", b"same-origin"),
                            (b"x-frame-options", b"DENY"),
                            (b"cache-control", b"no-store")]
                message = {**message, "headers": headers}
            await send(message)

        async def refuse(status: int, line: str) -> None:
            await PlainTextResponse(line, status_code=status)(scope, receive, send_with_headers)

        if self.hosts is not None:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
            if host not in self.hosts:
                await refuse(421, f"refused: Host {host!r} is not this page's address; open "
                                  f"http://{min(self.hosts)}/ instead")
                return
        if scope["method"] in UNSAFE:
            body = await self._body(scope, receive, refuse)
            if body is None:
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send_with_headers)

    async def _body(self, scope: Scope, receive: Receive,
                    refuse: Callable[[int, str], Awaitable[None]]) -> bytes | None:
        """The request's whole body, or None once it was refused (or the client left)."""
        limit = _size(self.max_body)
        too_large = (f"refused: the request's body is larger than {limit}, more than any form "
                     "of this page sends")
        sent = dict(scope["headers"]).get(b"content-length")
        if sent is not None:
            if not sent.isdigit():
                await refuse(400, "refused: the request's Content-Length is not a whole number")
                return None
            if int(sent) > self.max_body:
                await refuse(413, too_large)
                return None
        chunks: list[bytes] = []
        size, whole, gone = 0, False, False
        with anyio.move_on_after(self.body_seconds):
            while not (whole or gone or size > self.max_body):
                message = await receive()
                gone = message["type"] != "http.request"
                chunk = message.get("body", b"")
                size += len(chunk)
                chunks.append(chunk)
                whole = not message.get("more_body", False)
        if gone:
            return None  # the client went away: there is no one to answer
        if size > self.max_body:
            await refuse(413, too_large)
            return None
        if not whole:
            await refuse(408, f"refused: the request's body did not arrive within "
                              f"{self.body_seconds:g} seconds")
            return None
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` whole, then what the client sends next (its
    disconnect)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"
