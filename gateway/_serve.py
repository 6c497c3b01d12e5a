"""Running a gateway: in-process, over stdio, or over streamable HTTP.

:func:`open_gateway` is the library entry point: it opens the upstream connections,
builds and starts a :class:`~gateway._gateway.Gateway`, and closes everything on exit.
``mcp.Client(gateway.server)`` then talks to it in-process (frameworks, tests).
:func:`serve_stdio` and :func:`serve_http` serve it; :func:`run_gateway` does all of it
for the ``awl gateway`` command.

Over HTTP every request must carry a Delegation Pass for the order as a Bearer token; a
missing or invalid pass gets ``401`` before any MCP message is read. The pass is verified
again on every tool call, so revoking it stops a connected worker at once. Only loopback
addresses are served unless the caller explicitly allows remote workers.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TextIO

import anyio
import anyio.abc
import anyio.to_thread
from mcp.server.stdio import stdio_server
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from awl._errors import BadRequest
from awl._passes import DEFAULT_AUDIENCE, KeyStore
from awl._store import Store
from gateway._config import GatewayConfig, load_config
from gateway._gateway import Clock, Gateway
from gateway._upstream import UpstreamPool

__all__ = [
    "PASS_ENV",
    "is_loopback",
    "open_gateway",
    "parse_address",
    "run_gateway",
    "serve_http",
    "serve_stdio",
]

PASS_ENV = "AWL_PASS"
"""The environment variable ``awl gateway`` reads a Delegation Pass from."""

MCP_PATH = "/mcp"


@asynccontextmanager
async def open_gateway(
    order_id: str,
    config: GatewayConfig | str | os.PathLike[str] | Mapping[str, Any],
    *,
    store: Store | None = None,
    home: str | os.PathLike[str] | None = None,
    pass_token: str | None = None,
    jwks: Mapping[str, Any] | None = None,
    load_keys: bool = False,
    audience: str = DEFAULT_AUDIENCE,
    safe: bool | None = None,
    clock: Clock | None = None,
    errlog: TextIO | None = None,
) -> AsyncIterator[Gateway]:
    """Open the upstreams and run a started gateway for one order until the block ends.

    Enter and leave it in the same task (the MCP SDK needs that of its client connections).

    Args:
        order_id: The order the worker works on.
        config: The upstream configuration, or a path to it, or its parsed JSON.
        store: Where the order lives; default the SQLite store of the home folder (then
            closed on exit).
        home: The home folder (default ``AWL_HOME`` or ``./.awl``).
        pass_token: Run the worker under this Delegation Pass instead of the whole order.
        jwks: The desk's public key set; default read from the home folder's keys when a
            pass is given or ``load_keys`` is set.
        load_keys: Read the key set even without ``pass_token`` (serving HTTP needs it).
        audience: The audience passes must name.
        safe: Safe mode; default the config's ``gateway.safe_mode``.
        clock: The current time (tests pass a fake one).
        errlog: Where stdio upstreams' stderr goes (default this process's stderr).

    Yields:
        The started gateway; ``mcp.Client(gateway.server)`` connects to it in-process.

    Raises:
        ConfigError: The config cannot be used.
        NotFound: No such order.
        PassError: ``pass_token`` does not verify or is for another order.
    """
    if not isinstance(config, GatewayConfig):
        config = load_config(config)
    async with AsyncExitStack() as stack:
        if store is None:
            from awl._home import default_store

            store = default_store(home)
            stack.callback(store.close)
        if jwks is None and (pass_token is not None or load_keys):
            from awl._home import home_dir

            keys = KeyStore(home_dir(home))
            jwks = await anyio.to_thread.run_sync(keys.jwks)
        pool = await stack.enter_async_context(UpstreamPool(config, errlog=errlog))
        gateway = Gateway(order_id, store=store, pool=pool, pass_token=pass_token, jwks=jwks,
                          audience=audience, safe=safe, clock=clock)
        await gateway.start()
        yield gateway


async def serve_stdio(gateway: Gateway) -> None:
    """Serve the gateway to one worker over this process's stdin and stdout."""
    server = gateway.server
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; a bare ``PORT`` means 127.0.0.1).

    Raises:
        BadRequest: Not an address with a port from 0 to 65535.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise BadRequest(f"--http {text!r} is not HOST:PORT with a port from 0 to 65535 "
                         "(for example 127.0.0.1:8765; port 0 picks a free one)")
    return host, port


class _PassAuth:
    """ASGI middleware: every HTTP request needs a valid pass for the order, else 401."""

    def __init__(self, gateway: Gateway, app: ASGIApp) -> None:
        self.gateway = gateway
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = None
        problem: str | None
        for key, value in scope.get("headers", ()):
            if key.lower() == b"authorization":
                scheme, _, rest = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer" and rest.strip():
                    token = rest.strip()
        if token is None:
            problem = ("send your Delegation Pass for this order as "
                       "'Authorization: Bearer <pass>'")
        else:
            authority = await anyio.to_thread.run_sync(self.gateway.verify, token)
            problem = None if authority.error is None else (
                f"{authority.error.reason}: {authority.error.message}")
        if problem is not None:
            description = problem.replace('"', "'")[:300]
            response = JSONResponse(
                {"error": "invalid_token", "error_description": description},
                status_code=401,
                headers={"WWW-Authenticate":
                         f'Bearer error="invalid_token", error_description="{description}"'},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def serve_http(
    gateway: Gateway,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    allow_remote: bool = False,
    announce: TextIO | None = None,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway over streamable HTTP until cancelled.

    Args:
        gateway: A started gateway; it needs the desk's key set to check passes.
        host: The address to listen on; loopback unless ``allow_remote``.
        port: The port; 0 picks a free one.
        allow_remote: Listen on a non-loopback address (workers still need a pass).
        announce: Where to print ``serving ... on URL`` (default nowhere).
        task_status: Started with the endpoint URL (``tg.start(serve_http, ...)``).

    Raises:
        BadRequest: A non-loopback host without ``allow_remote``, or the port is taken.
    """
    import uvicorn

    if not is_loopback(host) and not allow_remote:
        raise BadRequest(f"refusing to serve on {host}: it is not a loopback address; pass "
                         "--allow-remote to let remote workers connect with their pass")
    if not gateway.checks_passes:
        raise BadRequest("serving HTTP needs the desk's key set to check workers' passes")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BadRequest(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    app = _PassAuth(gateway, gateway.server.streamable_http_app(
        streamable_http_path=MCP_PATH, host=host))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=2)
    http = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}{MCP_PATH}"
    done = anyio.Event()

    async def run() -> None:
        # Shielded so that cancelling serve_http shuts uvicorn down in order (below) rather
        # than tearing it mid-request.
        try:
            with anyio.CancelScope(shield=True):
                await http.serve(sockets=[sock])
        finally:
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        while not http.started and not done.is_set():
            await anyio.sleep(0.01)
        if announce is not None:
            print(f"awl gateway: serving order {gateway.order_id} on {url}", file=announce,
                  flush=True)
        task_status.started(url)
        try:
            await done.wait()
        finally:
            http.should_exit = True
            with anyio.CancelScope(shield=True):
                await done.wait()
            sock.close()


async def run_gateway(
    order_id: str,
    config: GatewayConfig | str | os.PathLike[str] | Mapping[str, Any],
    *,
    http: tuple[str, int] | None = None,
    allow_remote: bool = False,
    store: Store | None = None,
    home: str | os.PathLike[str] | None = None,
    pass_token: str | None = None,
    safe: bool | None = None,
    audience: str = DEFAULT_AUDIENCE,
    announce: TextIO | None = None,
) -> None:
    """Run a gateway until its worker disconnects (stdio) or it is cancelled (HTTP).

    Args:
        order_id: The order.
        config: The upstream configuration or its path.
        http: ``(host, port)`` to serve streamable HTTP; None serves stdio.
        allow_remote: Allow a non-loopback HTTP host.
        store: The store; default the home folder's SQLite store.
        home: The home folder.
        pass_token: Run under this pass (stdio; over HTTP each request brings its own).
        safe: Safe mode; default the config's.
        audience: The audience passes must name.
        announce: Where to print the HTTP address once listening (default stderr).
    """
    if http is not None and not is_loopback(http[0]) and not allow_remote:
        raise BadRequest(f"refusing to serve on {http[0]}: it is not a loopback address; "
                         "pass --allow-remote to let remote workers connect with their pass")
    async with open_gateway(order_id, config, store=store, home=home, pass_token=pass_token,
                            load_keys=http is not None, audience=audience, safe=safe) as gateway:
        if http is None:
            await serve_stdio(gateway)
        else:
            await serve_http(gateway, http[0], http[1], allow_remote=allow_remote,
                             announce=announce if announce is not None else sys.stderr)
