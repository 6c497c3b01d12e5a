"""Serving a low-level MCP server over streamable HTTP, every request authenticated.

:func:`serve_http` is transport only: it knows nothing of desks or gateways. The caller
passes an ``authenticate`` coroutine that turns the request's Bearer token into an identity
(any object: a principal, a verified pass) or raises :class:`Unauthorized`. A request that
does not authenticate gets ``401`` before the MCP layer reads a byte of it; one that does
carries its identity into the tool handlers, which read it back with :func:`identity_of`.
Identity is decided per request, never per session, so a session id learned by someone
else is worth nothing without the token.

Loopback by default (SEC-2): a non-loopback host needs ``allow_remote=True``, and on
loopback a request whose ``Host`` header is not a loopback name is refused (the SDK's
DNS-rebinding check), so a web page cannot reach the server through a hostile DNS name.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Container
from typing import Any

import anyio
import anyio.abc
import uvicorn
from mcp.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from awl.documents.errors import AWLError, BadRequest
from awl.mcp.frames import MAX_FRAME_BYTES, FrameGuard

__all__ = [
    "HEAD_SECONDS",
    "IDENTITY_KEY",
    "LOOPBACK_NAMES",
    "MCP_PATH",
    "Authenticate",
    "BearerAuth",
    "CannotAuthenticate",
    "CannotListen",
    "HeadDeadline",
    "Unauthorized",
    "bearer_token",
    "identity_of",
    "is_loopback",
    "listen",
    "parse_address",
    "serve_http",
]

log = logging.getLogger("awl.server")

MCP_PATH = "/mcp"
"""Where the MCP endpoint is served."""

IDENTITY_KEY = "awl.identity"
"""The ASGI scope key under which an authenticated request carries its identity."""

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
"""The host names a loopback listener answers to (with its address, as the ``Host`` header)."""


class Unauthorized(AWLError):
    """The request's credentials are missing or wrong; the message says what to send."""

    code = "UNAUTHORIZED"


class CannotListen(BadRequest):
    """The address cannot be listened on: the port is taken, or this machine does not have
    the address. The message names the address; a command line adds its flag."""


class CannotAuthenticate(AWLError):
    """The credentials could not be checked just now (the store behind them failed): the
    request is refused with ``503``, fail closed, and may be tried again."""

    code = "UNAVAILABLE"


Authenticate = Callable[[str | None], Awaitable[Any]]
"""``authenticate(token)``: the identity a Bearer token (None when absent) stands for.

Raises :class:`Unauthorized` to refuse the request (401), or :class:`CannotAuthenticate`
when the token cannot be checked just now (503). Runs on the event loop: do blocking work (a
store read) in a worker thread."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` as a pair; ``[::1]:PORT`` for IPv6, a bare ``PORT`` means 127.0.0.1.

    Raises:
        BadRequest: Not an address with a port from 0 to 65535.
    """
    host, colon, port_text = text.rpartition(":")
    if not colon:
        host, port_text = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    port = int(port_text) if port_text.isdigit() else -1
    if not 0 <= port <= 65535:
        raise BadRequest(f"{text!r} is not HOST:PORT with a port from 0 to 65535; write for "
                         "example 127.0.0.1:8765 (port 0 picks a free one)")
    return host, port


# RFC 6750: the scheme (any case), one or more spaces, then one b64token and nothing else.
_BEARER = re.compile(r"(?i:bearer) +([A-Za-z0-9._~+/-]+=*)")


def bearer_token(scope: Scope) -> str | None:
    """The one Bearer token of an HTTP request; None when it has no ``Authorization`` header.

    A request presents its credential exactly one way (SEC-7): a second ``Authorization``
    header, or one that is not ``Bearer <token>`` (``Basic ...``, a bare ``Bearer``,
    ``Token ...``), is refused, never read as "no credential" nor skipped for another one.

    Raises:
        Unauthorized: more than one ``Authorization`` header, or a malformed one.
    """
    values = [value for key, value in scope.get("headers", ())
              if key.lower() == b"authorization"]
    if not values:
        return None
    if len(values) > 1:
        raise Unauthorized(f"the request has {len(values)} Authorization headers; send exactly "
                           "one: 'Authorization: Bearer <token>'")
    found = _BEARER.fullmatch(values[0].decode("latin-1"))
    if found is None:
        raise Unauthorized("the Authorization header is not 'Bearer <token>'; send your token "
                           "that way and no other credential")
    return found.group(1)


def identity_of(ctx: Any) -> Any:
    """The identity :class:`BearerAuth` attached to the request a handler is serving.

    ``ctx`` is the handler's ``ServerRequestContext``. Returns None on transports without
    HTTP requests (stdio, in-process).
    """
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    return scope.get(IDENTITY_KEY) if isinstance(scope, dict) else None


class BearerAuth:
    """ASGI middleware: authenticate every HTTP request, answer ``401`` when it fails.

    A handshake-era session (``Mcp-Session-Id``) belongs to the token that opened it: a
    request naming it with another token (another principal, or another pass) is answered
    ``404`` as a session that does not exist, so it can neither read the session's stream,
    cancel its calls nor end it, whoever learned its id.
    """

    def __init__(self, app: ASGIApp, authenticate: Authenticate, *,
                 sessions: Callable[[], Container[str]] | None = None) -> None:
        self.app = app
        self.authenticate = authenticate
        self._sessions = sessions
        """The ids of the sessions still open (the SDK's own view), when known: the owner
        of a session that has ended (closed, expired) is forgotten, that of an open one
        never."""
        self._owners: dict[str, str] = {}
        """Each session's id: the hash of the token that opened it. Sessions that ended are
        swept out whenever it has doubled since the last sweep; without ``sessions`` it
        holds at most :data:`MAX_SESSIONS`, the oldest forgotten first."""
        self._sweep_at = SWEEP_FIRST

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan messages carry no request
            await self.app(scope, receive, send)
            return
        try:
            token = bearer_token(scope)
            identity = await self.authenticate(token)
        except Unauthorized as exc:
            # Header values must stay one quoted line of ASCII (Latin-1 at most on the wire).
            text = " ".join(exc.message.replace('"', "'").split())[:300]
            text = text.encode("ascii", "backslashreplace").decode("ascii")
            response = JSONResponse(
                {"error": "invalid_token", "error_description": text}, status_code=401,
                headers={"WWW-Authenticate": f'Bearer error="invalid_token", '
                                             f'error_description="{text}"'})
            await response(scope, receive, send)
            return
        except CannotAuthenticate as exc:
            await JSONResponse(
                {"error": "temporarily_unavailable", "error_description": exc.message},
                status_code=503, headers={"Retry-After": "5"})(scope, receive, send)
            return
        scope[IDENTITY_KEY] = identity
        holder = hashlib.sha256((token or "").encode()).hexdigest()
        session = _header(scope, b"mcp-session-id")
        if session is not None:
            owner = self._owners.get(session)
            if owner is not None and owner != holder:
                await JSONResponse(
                    {"jsonrpc": "2.0", "id": None, "error": {
                        "code": -32600, "message": "Session not found: it was opened with "
                        "another token; open a session of your own (initialize)"}},
                    status_code=404)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return

        async def noting_the_session(message: Message) -> None:
            if message["type"] == "http.response.start":
                opened = next((v.decode("latin-1") for k, v in message.get("headers", ())
                               if k.lower() == b"mcp-session-id"), None)
                if opened is not None:
                    self._remember(opened, holder)
            await send(message)

        await self.app(scope, receive, noting_the_session)

    def _remember(self, session: str, holder: str) -> None:
        """Note who opened ``session``, first forgetting the owners of sessions that ended.

        A server that runs for days opens far more sessions than are ever open at once:
        kept forever, their owners grew without end, and once evicted by age alone a
        session still open lost its owner, and answered any token (BIND-3)."""
        owners = self._owners
        if len(owners) >= self._sweep_at and self._sessions is not None:
            alive = self._sessions()
            for ended in [s for s in owners if s not in alive]:
                del owners[ended]
            self._sweep_at = max(SWEEP_FIRST, 2 * len(owners))
        if self._sessions is None and len(owners) >= MAX_SESSIONS:
            del owners[next(iter(owners))]
        owners[session] = holder


MAX_SESSIONS = 100_000
"""Sessions whose token :class:`BearerAuth` remembers when it cannot tell which sessions
are still open (about 20 MB at most)."""

SWEEP_FIRST = 256
"""How many owners :class:`BearerAuth` notes before it first sweeps out those of sessions
that ended."""

HEAD_SECONDS = 30.0
"""How long a connection may take to send a request's head (its request line and headers),
in seconds from when it opened or from the end of the answer before; then it is closed."""


class HeadDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection that has not sent a request's head
    within :data:`HEAD_SECONDS` (of opening, or of its previous answer).

    uvicorn itself times out only a connection that is idle after an answer: one that
    connects and sends nothing, or stops halfway through its headers, held its socket and
    its buffers for as long as the server ran. Such connections pile up from clients that
    crash or lose their network mid-request (and anyone who can reach the port, token or
    not, could open them by the thousand) until the process runs out of file descriptors
    and accepts no one. A request whose head has arrived is not timed here: its body is
    (:class:`~awl.mcp.frames.FrameGuard`), and an answer, an event stream, may last."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = None
        if not self.transport.is_closing():
            self._head_timer = self.loop.call_later(HEAD_SECONDS, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and not self.transport.is_closing():
            self.transport.close()


def _open_sessions(server: Server[Any]) -> Callable[[], Container[str]] | None:
    """The ids of the sessions the SDK's session manager holds open, when it says (it
    keeps them privately; None when it no longer does)."""
    open_now = getattr(server.session_manager, "_server_instances", None)
    if not isinstance(open_now, dict):
        return None
    return lambda: open_now


def _header(scope: Scope, name: bytes) -> str | None:
    """The value of header ``name`` (lower case), or None."""
    for key, value in scope["headers"]:
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def _security(host: str) -> TransportSecuritySettings:
    if not is_loopback(host):
        # Reached from other machines under names we cannot list; the token is the guard.
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    shown = f"[{host}]" if ":" in host else host
    hosts = sorted({*LOOPBACK_NAMES, shown})
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:*" for h in hosts],
        allowed_origins=[f"http://{h}:*" for h in hosts],
    )


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, listening (:class:`CannotListen`, one line, when
    it cannot be: a taken port, an address this machine does not have)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on connections
    # whose socket says TCP. Without it each streamed answer (headers, then the event) met
    # Nagle and the client's delayed ACK, and took 40 ms more on loopback.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listen now, before anyone is told the address: a client that connects between the
        # bind and the server's own listen would be refused.
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise CannotListen(f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick "
                         "another port, or 0 for a free one") from None
    return sock


async def serve_http(
    server: Server[Any],
    host: str,
    port: int,
    authenticate: Authenticate,
    *,
    allow_remote: bool = False,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``server`` over streamable HTTP at ``http://host:port/mcp`` until cancelled.

    Args:
        server: The low-level MCP server (one serve per server object: the SDK binds its
            HTTP session manager to it).
        host: The address to listen on; must be loopback unless ``allow_remote``.
        port: The port; 0 picks a free one.
        authenticate: Turns each request's Bearer token into an identity, or raises
            :class:`Unauthorized` (the request then gets 401).
        allow_remote: Allow a non-loopback address.
        task_status: Started with the endpoint's URL, so ``await tg.start(serve_http, ...)``
            returns once requests are being accepted.

    Raises:
        BadRequest: A non-loopback host without ``allow_remote``; :class:`CannotListen`, a
            subclass, when the address cannot be listened on.
    """
    if not is_loopback(host) and not allow_remote:
        raise BadRequest(f"refusing to serve on {host}: it is not a loopback address; pass "
                         "--allow-remote to accept connections from other machines")
    sock = listen(host, port)
    mcp_app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host,
                                         transport_security=_security(host),
                                         max_request_body_size=MAX_FRAME_BYTES)
    app = BearerAuth(FrameGuard(mcp_app), authenticate,
                     sessions=_open_sessions(server))
    # log_config=None leaves the process's logging alone (uvicorn would reconfigure it).
    config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=2, http=HeadDeadline)
    http = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}{MCP_PATH}"
    stopped = anyio.Event()

    async def run() -> None:
        # Shielded: a cancelled caller asks uvicorn to stop (below) and waits for it, so
        # open requests end in order instead of being torn off mid-response.
        try:
            with anyio.CancelScope(shield=True):
                await http.serve(sockets=[sock])
        finally:
            stopped.set()

    started = False
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            while not http.started and not stopped.is_set():
                await anyio.sleep(0.01)
            started = http.started
            if started:
                log.info("serving MCP on %s", url)
                task_status.started(url)
                try:
                    await stopped.wait()
                finally:
                    http.should_exit = True
                    with anyio.CancelScope(shield=True):
                        await stopped.wait()
    finally:
        sock.close()
    if not started:
        # Raised outside the task group, so callers get this error and not a group.
        raise BadRequest(f"the HTTP server for {url} failed to start; see the log above")
