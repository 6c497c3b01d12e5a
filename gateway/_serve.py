"""Running a gateway: in-process, over stdio, or over streamable HTTP.

:func:`open_gateway` is the library entry point: it opens the upstream connections,
builds and starts a :class:`~gateway._gateway.Gateway`, and closes everything on exit.
``mcp.Client(gateway.server)`` then talks to it in-process (frameworks, tests).
:func:`serve_stdio` and :func:`serve_http` serve it; :func:`run_gateway` does all of it
for the ``awl gateway`` command.

Over HTTP every request must carry a Delegation Pass for the order as a Bearer token; a
missing or invalid pass gets ``401`` before any MCP message is read. The pass is verified
again on every tool call, so revoking it stops a connected worker at once. Only loopback
addresses are served unless the caller explicitly allows remote workers. The HTTP serving
itself (listening, the 401, loopback rules) is the desk server's transport,
:func:`awl.mcp.transport.serve_http`; this module only says how a pass authenticates.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TextIO

import anyio
import anyio.abc
import anyio.to_thread

from awl.desk import default_store, home_dir
from awl.documents import BadRequest
from awl.mcp import Unauthorized, is_loopback, parse_address, stdio_frames
from awl.mcp import serve_http as _serve_mcp_http
from awl.passes import DEFAULT_AUDIENCE
from awl.store import KeyDirectory, Store
from gateway._authority import Authority
from gateway._config import GatewayConfig, load_config
from gateway._gateway import Clock, Gateway
from gateway._relay import Relay
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

CHECKPOINT_SECONDS = 1.0
"""How often the gateway's own store checkpoints the SQLite log, off the event loop (GW-18)."""


@asynccontextmanager
async def open_gateway(
    order_id: str,
    config: GatewayConfig | str | os.PathLike[str] | Mapping[str, Any],
    *,
    store: Store | None = None,
    home: str | os.PathLike[str] | None = None,
    pass_token: str | None = None,
    jwks: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    load_keys: bool = False,
    audience: str = DEFAULT_AUDIENCE,
    safe: bool | None = None,
    clock: Clock | None = None,
    errlog: TextIO | None = None,
    offload_store: bool | None = None,
) -> AsyncIterator[Gateway]:
    """Open the upstreams and run a started gateway for one order until the block ends.

    Enter and leave it in the same task (the MCP SDK needs that of its client connections).

    Args:
        order_id: The order the worker works on.
        config: The upstream configuration, or a path to it, or its parsed JSON.
        store: Where the order lives; default the store ``AWL_STORE`` names, else the SQLite
            store of the home folder (then closed on exit).
        home: The home folder (default ``AWL_HOME`` or ``./.awl``).
        pass_token: Run the worker under this Delegation Pass instead of the whole order.
        jwks: The desk's public key set (a JWKS document, or a callable giving the current
            one); default the home folder's keys, read again whenever a key is rotated in or
            retired, when a pass is given or ``load_keys`` is set.
        load_keys: Read the key set even without ``pass_token`` (serving HTTP needs it).
        audience: The audience passes must name.
        safe: Safe mode; default the config's ``gateway.safe_mode``.
        clock: The current time (tests pass a fake one).
        errlog: Where stdio upstreams' stderr goes (default this process's stderr).
        offload_store: Run the per-call store work in worker threads; None: decided by the
            store (see :class:`Gateway`).

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
            # No call pays for a WAL checkpoint: a thread runs them (GW-18).
            store = default_store(home, checkpoint_every=CHECKPOINT_SECONDS)
            stack.callback(store.close)
        if jwks is None and (pass_token is not None or load_keys):
            # Read again whenever a key is rotated in or retired (DP-13); read once now so
            # an unusable key folder is an error before anything starts. A home without
            # keys, on another host than the desk's, verifies with the public keys the
            # desk published in the store instead (never making a key of its own). Keys
            # need PyJWT and cryptography: they load only here, when passes are checked.
            from awl.passes import KeySet, KeyStore, PublishedKeySet

            keys = KeyStore(home_dir(home))
            jwks = KeySet(keys)
            if not keys.key_files() and isinstance(store, KeyDirectory):
                jwks = PublishedKeySet(store)
            await anyio.to_thread.run_sync(jwks)
        # A missing order is the likeliest mistake; say so before starting any upstream.
        await anyio.to_thread.run_sync(store.load, order_id)
        # Started in the background: a slow or hanging upstream holds up no one (the
        # config's startup_wait says how long tools/list waits for them).
        relay = Relay()
        pool = await stack.enter_async_context(
            UpstreamPool(config, errlog=errlog, handlers=relay.handlers, wait=False))
        gateway = Gateway(order_id, store=store, pool=pool, pass_token=pass_token, jwks=jwks,
                          audience=audience, safe=safe, clock=clock,
                          offload_store=offload_store, relay=relay)
        # Outcomes the store could not take are tried once more, and named, at the end.
        unrecorded = gateway.unrecorded

        async def last_try() -> None:
            await anyio.to_thread.run_sync(unrecorded.close)

        stack.push_async_callback(last_try)
        await gateway.start()
        yield gateway


async def serve_stdio(gateway: Gateway) -> None:
    """Serve the gateway to one worker over this process's stdin and stdout."""
    server = gateway.server
    async with stdio_frames() as (read, write):
        await server.run(read, write, server.create_initialization_options())


class _Announced:
    """Passes the URL on to ``task_status`` after printing where the gateway serves."""

    def __init__(self, task_status: anyio.abc.TaskStatus[str], order_id: str,
                 announce: TextIO | None) -> None:
        self._task_status = task_status
        self._order_id = order_id
        self._announce = announce

    def started(self, value: str | None = None) -> None:
        if self._announce is not None:
            print(f"awl gateway: serving order {self._order_id} on {value}",
                  file=self._announce, flush=True)
        self._task_status.started(value or "")


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
        BadRequest: A non-loopback host without ``allow_remote``, no key set, the port
            cannot be had, or the HTTP server fails to start.
    """
    if not is_loopback(host) and not allow_remote:
        raise BadRequest(f"refusing to serve on {host}: it is not a loopback address; pass "
                         "--allow-remote to let remote workers connect with their pass")
    if not gateway.checks_passes:
        raise BadRequest("serving HTTP needs the desk's key set to check workers' passes")

    async def authenticate(token: str | None) -> Authority:
        if token is None:
            raise Unauthorized("send your Delegation Pass for this order as "
                               "'Authorization: Bearer <pass>'")
        authority = await anyio.to_thread.run_sync(gateway.verify, token)
        if authority.error is not None:
            raise Unauthorized(f"{authority.error.reason}: {authority.error.message}")
        return authority

    await _serve_mcp_http(gateway.server, host, port, authenticate, allow_remote=allow_remote,
                          task_status=_Announced(task_status, gateway.order_id, announce))


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
        store: The store; default as :func:`open_gateway` chooses it.
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
        # Everything loaded so far (modules, the order, the upstreams' catalog) lives as long
        # as the process: leave it out of the collector's full passes, which otherwise pause
        # a call for tens of milliseconds now and then.
        gc.collect()
        gc.freeze()
        if http is None:
            await serve_stdio(gateway)
        else:
            await serve_http(gateway, http[0], http[1], allow_remote=allow_remote,
                             announce=announce if announce is not None else sys.stderr)
