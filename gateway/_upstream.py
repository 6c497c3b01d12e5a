"""Connections to the real MCP servers behind the gateway.

:class:`UpstreamPool` keeps one MCP client connection per configured server. Each
connection lives in its own task inside the pool's task group, because the MCP SDK needs a
client to be entered and exited in the same task; callers in any task share it (requests
are multiplexed by JSON-RPC id). Enter and exit the pool itself in one task.

What a call can end in, and what each means for someone who must not run a write twice:

=========================  ====================================================================
outcome                    meaning
=========================  ====================================================================
``CallToolResult``         the upstream answered (``is_error`` may still be true: a tool error)
:class:`UpstreamRejected`  the upstream answered with a JSON-RPC error, or an answer the SDK
                           cannot read; ``rpc_code`` is None for the latter
:class:`UpstreamTimeout`   no answer within the timeout; the request **was** sent, the outcome
                           is unknown; the pool never retries it
:class:`UpstreamUnavailable` cannot connect, or the connection was lost; ``sent`` tells
                           whether the request may have left (``False`` only when certain)
:class:`UpstreamNoSuchTool` the server is up and does not list the tool (even when listed
                           again): nothing was sent
=========================  ====================================================================

Entering the pool starts every server in the background and returns at once (SPEC GW-17):
:meth:`UpstreamPool.wait_started` waits (boundedly) for the first attempts, listeners added
with :meth:`UpstreamPool.on_tools_listed` hear each time a server lists its tools, and a
server that cannot be started is tried again after :data:`RETRY_FIRST` seconds, doubling up to
:data:`RETRY_MAX`. A crashed server is noticed when its output ends and restarted by the next
call that needs it (GW-8), never in a loop, never by a retry of the call that was lost.

Write-ahead for commits (CM-6): pass ``before_send`` to :meth:`UpstreamPool.call`. It is
awaited once the connection is known to be up, and the request is written only after it
returns; if it raises, nothing is sent and its exception propagates as is. So an
:class:`UpstreamUnavailable` with ``sent=False`` raised *before* it ran means nothing was
marked and nothing sent; one raised while it ran comes after the mark (marked, certainly not
sent); any other failure after it (``sent=True``, :class:`UpstreamTimeout`) is an unknown
outcome. Results over the server's ``max_result_bytes`` are cut, not refused (GW-12,
:func:`gateway._results.bound_result`).
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Literal, TextIO

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.session import ElicitationFnT, ListRootsFnT, LoggingFnT, SamplingFnT
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import TypeAdapter, ValidationError

from awl.documents import RELEASE, AWLError, NotFound, is_tool_name
from awl.mcp import bound_meta
from gateway._config import GatewayConfig, HttpTransport, ServerConfig
from gateway._results import bound_result
from gateway._stdio import StderrTail, stdio_transport

logger = logging.getLogger("awl.gateway.upstream")

CLIENT_INFO = types.Implementation(name="awl-gateway", version=RELEASE)
"""How the gateway introduces itself to upstream servers."""

RESERVED_META_PREFIX = "io.modelcontextprotocol/"
"""``_meta`` keys the protocol reserves for the connection they arrived on."""

RETRY_FIRST = 1.0
"""Seconds after a failed start before the next call may try to start the server again."""
RETRY_MAX = 30.0
"""The longest wait between starts of a server that keeps failing, in seconds."""

HTTP_TIMEOUT = 30.0
"""Seconds an HTTP upstream has to connect, take a request or free a pooled connection."""
HTTP_READ_TIMEOUT = 300.0
"""Seconds an HTTP upstream's response stream may stay silent (it may hold one open)."""

_LIST_PAGES = 100
_LISTENER_SECONDS = 5.0


def http_client(headers: Mapping[str, str]) -> httpx2.AsyncClient:
    """The HTTP client for a streamable HTTP upstream: its configured headers, and the MCP
    SDK's own default timeouts (:data:`HTTP_TIMEOUT`, :data:`HTTP_READ_TIMEOUT`). The SDK's
    transport takes it as given and follows redirects itself; close it after use."""
    return httpx2.AsyncClient(headers=dict(headers),
                              timeout=httpx2.Timeout(HTTP_TIMEOUT, read=HTTP_READ_TIMEOUT))

_ROUND = TypeAdapter(types.CallToolResult | types.InputRequiredResult)
"""A ``tools/call`` answer: a result, or a 2026-07-28 ``input_required`` round."""


@dataclass(frozen=True, slots=True)
class UpstreamHandlers:
    """What a connection does with what its server sends besides answers.

    Each is given to the SDK client of one server (see ``handlers`` of
    :class:`UpstreamPool`); None keeps the SDK's default (refuse requests, drop logs).
    """

    sampling: SamplingFnT | None = None
    elicitation: ElicitationFnT | None = None
    list_roots: ListRootsFnT | None = None
    logging: LoggingFnT | None = None


# ---------------------------------------------------------------------------- errors


class UpstreamError(AWLError):
    """A call to an upstream server did not produce a result. ``server`` names it."""

    code = "UPSTREAM_ERROR"

    def __init__(self, message: str, *, server: str) -> None:
        super().__init__(message)
        self.server = server

    @property
    def refusal(self) -> str:
        """The error as the gateway says it to the worker: ``AWL_<code>: message``."""
        return f"AWL_{self.code}: {self.message}"


class UpstreamUnavailable(UpstreamError):
    """The server cannot be reached, or the connection was lost during the call.

    ``sent`` is False only when the request certainly did not leave the gateway; True
    means it may have reached the server (treat the outcome as unknown).
    """

    code = "UPSTREAM_UNAVAILABLE"

    def __init__(self, message: str, *, server: str, sent: bool) -> None:
        super().__init__(message, server=server)
        self.sent = sent


class UpstreamTimeout(UpstreamError):
    """The request was sent and no answer came within ``timeout`` seconds; outcome unknown."""

    code = "UPSTREAM_TIMEOUT"

    def __init__(self, message: str, *, server: str, timeout: float) -> None:
        super().__init__(message, server=server)
        self.timeout = timeout
        self.sent = True


class UpstreamNoSuchTool(UpstreamUnavailable):
    """The server is up and does not list the tool (a configuration mistake, most likely):
    the request was not sent (``sent`` is False)."""

    code = "UPSTREAM_NO_SUCH_TOOL"

    def __init__(self, message: str, *, server: str) -> None:
        super().__init__(message, server=server, sent=False)


class UpstreamRejected(UpstreamError):
    """The server answered, but not with a tool result.

    ``rpc_code`` is the JSON-RPC error code (for example -32602 for bad arguments), or None
    when the answer could not be read as a tool result. Over HTTP, a 5xx response without a
    JSON-RPC body arrives as -32603 made up by the SDK.
    """

    code = "UPSTREAM_REJECTED"

    def __init__(self, message: str, *, server: str, rpc_code: int | None,
                 rpc_message: str | None = None, rpc_data: Any = None) -> None:
        super().__init__(message, server=server)
        self.rpc_code = rpc_code
        self.rpc_message = rpc_message
        """The server's own error message, when it answered with a JSON-RPC error."""
        self.rpc_data = rpc_data
        """The ``data`` of that error, as the server sent it."""
        self.sent = True


# ---------------------------------------------------------------------------- helpers


def clean_meta(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``_meta`` to forward: without protocol-reserved keys and progress tokens.

    Reserved keys (``io.modelcontextprotocol/...``) describe the worker's connection, not
    ours, and a handshake-era upstream refuses a request carrying them; a progress token
    belongs to the worker's request id space. The worker's trace context goes on bounded
    to the W3C limits (:func:`awl.mcp.trace_context.bound_meta`: a malformed
    ``traceparent`` dropped with its ``tracestate``, which keeps at most 32 members and 512
    characters).
    """
    if not meta:
        return None
    out = {
        k: v
        for k, v in meta.items()
        if not k.startswith(RESERVED_META_PREFIX) and k not in ("progressToken", "progress_token")
    }
    return bound_meta(out) or None


def _without_reserved(result: types.CallToolResult) -> types.CallToolResult:
    """Drop the upstream connection's protocol stamps from the result's ``_meta``."""
    meta = result.meta
    if not meta or not any(k.startswith(RESERVED_META_PREFIX) for k in meta):
        return result
    kept = {k: v for k, v in meta.items() if not k.startswith(RESERVED_META_PREFIX)}
    return result.model_copy(update={"meta": kept or None})


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return exc.error.message
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


def _shutting_down(server: str) -> UpstreamUnavailable:
    return UpstreamUnavailable(
        f"upstream {server!r} is not available: the gateway is shutting down",
        server=server, sent=False)


# ---------------------------------------------------------------------------- connections


_NOT_PARSED = "Failed to parse JSONRPC message from server"
"""What the SDK's stdio client logs, with a traceback, for a line that is not JSON-RPC."""


class _OneLineForUnreadLines(logging.Filter):
    """Drops the SDK's traceback for an upstream line it cannot read (its stdio client runs
    stdio upstreams on Windows, see :mod:`gateway._stdio`): the connection's
    :class:`_WatchedReadStream` logs one line instead, naming the server (SEC-4)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _NOT_PARSED


logging.getLogger("mcp.client.stdio").addFilter(_OneLineForUnreadLines())


class _WatchedReadStream:
    """The transport's read side, telling us when the server's output has ended.

    Closing is the first sign of a crashed stdio server; noticing it lets the next call
    restart the server instead of failing on a dead connection. A line the server wrote
    that is not a JSON-RPC message is logged here in one line, and ignored.
    """

    def __init__(self, inner: Any, on_end: Callable[[], None], server: str) -> None:
        self._inner = inner
        self._on_end = on_end
        self._server = server

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise
        if isinstance(item, Exception):
            logger.warning("upstream %r wrote a line that is not a JSON-RPC message; it was "
                           "ignored (an MCP server's stdout carries only protocol messages: "
                           "its logs belong on stderr)", self._server)
        return item

    async def aclose(self) -> None:
        self._on_end()
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


@dataclass(eq=False)
class _Connection:
    """One live (or dying) client connection to a server."""

    client: Client | None = None
    stop: anyio.Event = field(default_factory=anyio.Event)
    """Set to end the connection: by the pool, or when the server's output ends."""
    starting: anyio.CancelScope | None = None
    """Its start, while under way (None once connected)."""
    transport_open: bool = False
    """Whether its transport is open: only then may its start be cancelled (cancelling while
    a process is being spawned could leave it running)."""

    @property
    def live(self) -> bool:
        return self.client is not None and not self.stop.is_set()

    def end(self) -> None:
        self.stop.set()


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """How one upstream server is doing."""

    server: str
    """Its configured name."""
    state: Literal["connected", "down"]
    """``connected``: a live connection exists; ``down``: none (the next call tries to start it,
    after the backoff if its last start failed)."""
    starts: int
    """How many times a connection was made (1 on a healthy run; more after restarts)."""
    attempts: int
    """How many times a connection was tried (failed tries count; waiting callers share one)."""
    tools: int
    """How many tools it listed last time."""
    error: str | None
    """Why the last connection attempt failed or the last connection ended, if it did."""


class _Upstream:
    def __init__(self, config: ServerConfig, errlog: TextIO,
                 listeners: list[Callable[[], Awaitable[None]]],
                 handlers: UpstreamHandlers | None = None) -> None:
        self.config = config
        self.errlog = errlog
        self.said: StderrTail | None = None
        """The end of what a stdio server wrote on its stderr during its last start."""
        self.listeners = listeners
        self.handlers = handlers or UpstreamHandlers()
        self.conn: _Connection | None = None
        self.lock = anyio.Lock()
        self.tools: dict[str, types.Tool] = {}
        self.skipped: list[str] = []
        self.starts = 0
        self.attempts = 0
        self.last_start_failed = False
        self.error: str | None = None
        self.failures = 0
        """Failed starts in a row; sets the backoff before the next."""
        self.retry_at = -math.inf
        """When (anyio clock) the next start may be tried, after a failed one."""
        self.first_done = anyio.Event()
        """Set once the pool's first attempt to start the server has ended, either way."""
        self.closing = False
        """Set by :meth:`close`: no start begins any more."""

    def close(self) -> None:
        """The pool is closing: end the connection, and abandon its start if one is under
        way, at once if its transport is open, else as soon as it is (:meth:`_abandon`)."""
        self.closing = True
        if self.conn is not None:
            self.conn.end()
            self._abandon(self.conn)

    def _abandon(self, conn: _Connection) -> None:
        """Cancel the start of ``conn`` if the pool is closing and that is safe: a start the
        pool cannot cancel yet must end by itself once it can, for no one will ask again."""
        if self.closing and conn.transport_open and conn.starting is not None:
            conn.starting.cancel()

    def _opened(self, conn: _Connection) -> None:
        conn.transport_open = True
        self._abandon(conn)

    def failed_start(self, message: str) -> None:
        self.error = message
        self.last_start_failed = True
        self.failures += 1
        backoff = min(RETRY_FIRST * 2 ** (self.failures - 1), RETRY_MAX)
        self.retry_at = anyio.current_time() + backoff

    async def tell_listeners(self) -> None:
        for listener in list(self.listeners):
            with anyio.move_on_after(_LISTENER_SECONDS):
                try:
                    await listener()
                except Exception as exc:  # a listener's fault is not the connection's
                    logger.warning("upstream %s: a tools listener failed: %s",
                                   self.config.name, _describe(exc))

    def _transport(self, conn: _Connection) -> AbstractAsyncContextManager[Any]:
        transport = self.config.transport

        @asynccontextmanager
        async def watched() -> AsyncIterator[Any]:
            if isinstance(transport, HttpTransport):
                http = http_client(transport.headers)
                async with http, streamable_http_client(transport.url, http_client=http) as (r, w):
                    self._opened(conn)
                    yield _WatchedReadStream(r, conn.end, self.config.name), w
            else:
                self.said = StderrTail()  # this start's own
                async with stdio_transport(transport, self.errlog, self.said) as (r, w):
                    self._opened(conn)
                    yield _WatchedReadStream(r, conn.end, self.config.name), w

        return watched()

    async def run(self, *, task_status: anyio.abc.TaskStatus[_Connection]) -> None:
        """Own one connection from start to end, in this task (the SDK requires one task).

        The connection is the server's from the outset, so that :meth:`close` reaches it
        however far its start has come."""
        name = self.config.name
        if self.closing:  # the pool closed before this start began: begin none
            raise _shutting_down(name)
        self.conn = conn = _Connection()
        started = False
        try:
            deadline = anyio.current_time() + self.config.connect_timeout
            # The handshake is bounded by the connect timeout only; the scope's deadline is
            # lifted once connected so calls are bounded by their own timeouts.
            with anyio.CancelScope(deadline=deadline) as scope:
                conn.starting = scope
                handlers = self.handlers
                # log_level opts in to a 2026-07-28 server's log messages (the handshake
                # era sends them unasked); the handler decides what reaches the worker.
                async with Client(
                    self._transport(conn), mode="auto", cache=None, client_info=CLIENT_INFO,
                    sampling_callback=handlers.sampling,
                    elicitation_callback=handlers.elicitation,
                    list_roots_callback=handlers.list_roots,
                    logging_callback=handlers.logging,
                    log_level="debug" if handlers.logging is not None else None,
                ) as client:
                    self.tools, self.skipped = await self._list(client)
                    scope.deadline = math.inf
                    conn.starting = None
                    conn.client = client
                    self.starts += 1
                    self.error = None
                    self.last_start_failed = False
                    self.failures = 0
                    started = True
                    task_status.started(conn)
                    await self.tell_listeners()
                    await conn.stop.wait()
            if not started:
                stopped = scope.cancel_called and anyio.current_time() < deadline
                raise UpstreamUnavailable(
                    f"upstream {name!r} was still starting when the gateway closed" if stopped
                    else f"upstream {name!r} did not finish starting within "
                    f"{self.config.connect_timeout:g} s (its connect_timeout); check its "
                    "command or URL, or raise connect_timeout",
                    server=name, sent=False,
                )
        except UpstreamUnavailable as exc:
            self.failed_start(exc.message)
            raise
        except Exception as exc:
            if not started:
                last = self.said.last_line() if self.said is not None else None
                said = "" if last is None else f" (its last words on stderr: {last})"
                self.failed_start(f"cannot connect to upstream {name!r}: {_describe(exc)}"
                                  f"{said}")
                assert self.error is not None
                raise UpstreamUnavailable(self.error, server=name, sent=False) from exc
            self.error = f"the connection to upstream {name!r} ended: {_describe(exc)}"
            logger.warning("%s", self.error)
        finally:
            conn.starting = None
            conn.end()
            conn.client = None

    async def _list(self, client: Client) -> tuple[dict[str, types.Tool], list[str]]:
        tools: dict[str, types.Tool] = {}
        skipped: list[str] = []
        cursor: str | None = None
        for _ in range(_LIST_PAGES):
            page = await client.session.list_tools(
                params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
            )
            for tool in page.tools:
                canonical = f"{self.config.name}/{tool.name}"
                if is_tool_name(canonical):
                    tools[canonical] = tool
                else:
                    # AWL names tools server/tool with [A-Za-z0-9_.-] parts only.
                    skipped.append(tool.name)
            cursor = page.next_cursor
            if not cursor:
                break
        for tool_name in skipped:
            logger.warning("upstream %s: tool %r skipped: its name is not [A-Za-z0-9_.-]+",
                           self.config.name, tool_name)
        return tools, skipped

    def status(self) -> UpstreamStatus:
        live = self.conn is not None and self.conn.live
        return UpstreamStatus(
            server=self.config.name,
            state="connected" if live else "down",
            starts=self.starts,
            attempts=self.attempts,
            tools=len(self.tools),
            error=self.error,
        )


# ---------------------------------------------------------------------------- the pool


class UpstreamPool:
    """All upstream connections of one gateway. An async context manager.

    Entering starts every server at once and waits until each has connected or failed (or,
    with ``wait=False``, returns at once and lets them start in the background); a server
    that fails to start is reported by :meth:`status` and retried by the next call to it
    after the backoff. Exiting closes them all, stops stdio servers, and abandons starts
    still under way.

    Args:
        config: The loaded upstream configuration.
        errlog: Where stdio servers' stderr goes (default: the gateway's stderr). Never
            stdout: in stdio mode that is the worker's protocol stream.
        require_all: Fail on entry, with :class:`UpstreamUnavailable`, if any server cannot
            be started (implies ``wait``).
        wait: Wait on entry for every server's first start; False returns at once (the
            gateway does, so that one slow server cannot hold up its worker).
        handlers: Given a server's name, what its connection does with the sampling,
            elicitation and roots requests and the log messages that server sends.
    """

    def __init__(self, config: GatewayConfig, *, errlog: TextIO | None = None,
                 require_all: bool = False, wait: bool = True,
                 handlers: Callable[[str], UpstreamHandlers] | None = None) -> None:
        self.config = config
        log = errlog if errlog is not None else sys.stderr
        self._listeners: list[Callable[[], Awaitable[None]]] = []
        self._upstreams = {
            name: _Upstream(cfg, log, self._listeners,
                            handlers(name) if handlers is not None else None)
            for name, cfg in config.servers.items()}
        self._require_all = require_all
        self._wait = wait or require_all
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._entered_at = -math.inf
        # What tools() last merged: each upstream's listing (a new dict per listing) and the
        # read-only view of their union, reused until one upstream lists anew.
        self._merged_from: tuple[dict[str, types.Tool], ...] = ()
        self._merged: Mapping[str, types.Tool] = MappingProxyType({})

    async def __aenter__(self) -> UpstreamPool:
        self._entered_at = anyio.current_time()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            for up in self._upstreams.values():
                tg.start_soon(self._first, up)
            for up in self._upstreams.values() if self._wait else ():
                await up.first_done.wait()
            for up in self._upstreams.values() if self._require_all else ():
                if up.last_start_failed and up.error is not None:
                    raise UpstreamUnavailable(up.error, server=up.config.name, sent=False)
        except BaseException:
            # Close the connections already made, then report the original error alone.
            await self._shutdown(None, None, None)
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._shutdown(exc_type, exc, tb)

    async def _first(self, up: _Upstream) -> None:
        try:
            await self._connection(up)
        except UpstreamUnavailable as exc:
            if not self._closing:
                logger.warning("%s", exc.message)
        finally:
            up.first_done.set()

    async def wait_started(self, seconds: float) -> None:
        """Wait until every server's first start has ended (either way), but not past
        ``seconds`` after the pool was entered."""
        with anyio.CancelScope(deadline=self._entered_at + seconds):
            for up in self._upstreams.values():
                await up.first_done.wait()

    def on_tools_listed(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Await ``listener()`` each time a server has connected and listed its tools.

        It runs in that server's connection task, bounded to a few seconds; its errors are
        logged, never raised."""
        self._listeners.append(listener)

    async def _shutdown(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._closing = True
        for up in self._upstreams.values():
            up.close()
        tg, self._tg = self._tg, None
        if tg is not None:
            # The body's own exception is not the connections' business: passing it in would
            # wrap it in an exception group. The connection tasks end because of `end()`.
            await tg.__aexit__(None, None, None)

    # -- tools

    @property
    def servers(self) -> tuple[str, ...]:
        """Configured server names, in config order."""
        return tuple(self._upstreams)

    async def tools(self, *, refresh: bool = False) -> Mapping[str, types.Tool]:
        """Every upstream tool, by canonical ``server/tool`` name.

        Tools are listed when a server connects (and again after each restart). With
        ``refresh``, servers that are down are started and every connected server is
        listed again. A server that is down contributes the tools it listed last.
        Tools whose names AWL cannot write as ``server/tool`` are left out (see
        :meth:`skipped`).

        The answer is a read-only view, and the same object until an upstream lists its
        tools anew, so a caller on every tool call can tell "unchanged" by identity.
        """
        if refresh:
            async with anyio.create_task_group() as tg:
                for up in self._upstreams.values():
                    tg.start_soon(self._refresh, up)
        listings = tuple(up.tools for up in self._upstreams.values())
        if len(listings) != len(self._merged_from) or any(
                a is not b for a, b in zip(listings, self._merged_from, strict=True)):
            out: dict[str, types.Tool] = {}
            for listing in listings:
                out.update(listing)
            self._merged_from, self._merged = listings, MappingProxyType(out)
        return self._merged

    async def _refresh(self, up: _Upstream) -> None:
        try:
            conn = await self._connection(up)
            assert conn.client is not None
            with anyio.fail_after(up.config.timeout):
                up.tools, up.skipped = await up._list(conn.client)
        except (UpstreamUnavailable, TimeoutError, MCPError, ValidationError) as exc:
            logger.warning("upstream %s: cannot list tools: %s", up.config.name, _describe(exc))

    def skipped(self) -> dict[str, tuple[str, ...]]:
        """Tool names each server listed that AWL cannot name (not ``[A-Za-z0-9_.-]+``)."""
        return {name: tuple(up.skipped) for name, up in self._upstreams.items() if up.skipped}

    def status(self) -> dict[str, UpstreamStatus]:
        """How each server is doing, by name."""
        return {name: up.status() for name, up in self._upstreams.items()}

    async def connect(self, server: str) -> None:
        """Make sure ``server`` is connected: wait for a start under way, or start it now
        unless it failed to start within its backoff.

        Raises:
            NotFound: ``server`` is not configured.
            UpstreamUnavailable: It cannot be reached; the message says why.
        """
        await self._connection(self._upstream(server))

    def server_config(self, server: str) -> ServerConfig:
        """The configuration of ``server``.

        Raises:
            NotFound: No such server.
        """
        return self._upstream(server).config

    # -- calls

    def _upstream(self, server: str) -> _Upstream:
        try:
            return self._upstreams[server]
        except (KeyError, TypeError):
            raise NotFound(f"no upstream server is called {server!r}") from None

    async def _connection(self, up: _Upstream) -> _Connection:
        conn = up.conn
        if conn is not None and conn.live:
            return conn
        attempts = up.attempts
        async with up.lock:
            conn = up.conn
            if conn is not None and conn.live:
                return conn
            name = up.config.name
            if self._closing or self._tg is None:
                raise _shutting_down(name)
            if up.attempts != attempts and up.last_start_failed and up.error is not None:
                # Someone else tried while we waited, and failed: share that answer rather
                # than start the server again once per waiting caller.
                raise UpstreamUnavailable(up.error, server=name, sent=False)
            wait = up.retry_at - anyio.current_time()
            if up.last_start_failed and up.error is not None and wait > 0:
                raise UpstreamUnavailable(
                    f"{up.error} (the gateway tries to start it again on a call after "
                    f"{math.ceil(wait)} s)", server=name, sent=False)
            up.attempts += 1
            conn = await self._tg.start(up.run)
            assert isinstance(conn, _Connection)
            return conn

    async def call(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        before_send: Callable[[], Awaitable[None]] | None = None,
    ) -> types.CallToolResult:
        """Call ``tool`` on ``server`` once, never retrying.

        Args:
            server: The configured server name.
            tool: The tool's name on that server (not the canonical name).
            arguments: The tool arguments, sent as they are.
            meta: ``_meta`` for the request, cleaned by :func:`clean_meta` first.
            timeout: Seconds to wait for the answer once sent (default: the server's
                ``timeout``). Starting a server that is down has its own
                ``connect_timeout``.
            before_send: Awaited after the connection is up and before the request is
                written (see the module docstring on write-ahead).

        Returns:
            The upstream's result, without protocol-reserved ``_meta`` keys, bounded to the
            server's ``max_result_bytes`` (see :func:`gateway._results.bound_result`).

        Raises:
            NotFound: ``server`` is not configured.
            UpstreamNoSuchTool: The server does not list ``tool``; nothing was sent.
            UpstreamUnavailable: Cannot connect, or the connection was lost (``sent``).
            UpstreamTimeout: Sent, and no answer in time.
            UpstreamRejected: The server answered with a protocol error, or asked for
                input (an ``input_required`` round), which this caller cannot give.
        """
        result = await self.call_round(server, tool, arguments, meta=meta, timeout=timeout,
                                       before_send=before_send)
        if isinstance(result, types.InputRequiredResult):
            raise UpstreamRejected(
                f"upstream {server!r} asked for input (input_required) in answer to the call "
                f"to {tool!r}; no one is there to give it", server=server, rpc_code=None)
        return result

    async def call_round(
        self,
        server: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        before_send: Callable[[], Awaitable[None]] | None = None,
        progress: ProgressFnT | None = None,
        input_responses: Mapping[str, Any] | None = None,
        request_state: str | None = None,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """:meth:`call`, for a caller that can answer a 2026-07-28 ``input_required`` round.

        ``progress`` receives the server's progress notifications for this request;
        ``input_responses`` and ``request_state`` retry an earlier round (sent as given).
        An :class:`~mcp_types.InputRequiredResult` is returned as the server sent it.
        """
        up = self._upstream(server)
        limit = timeout if timeout is not None else up.config.timeout
        conn = await self._connection(up)
        if f"{server}/{tool}" not in up.tools:
            await self._refresh(up)  # it may have added the tool since it was listed
            if f"{server}/{tool}" not in up.tools:
                raise UpstreamNoSuchTool(
                    f"upstream {server!r} does not offer a tool {tool!r}, so the call was not "
                    "sent; check that server's entry in the upstream config", server=server)
        if before_send is not None:
            await before_send()
        client = conn.client
        if client is None or not conn.live:
            raise UpstreamUnavailable(
                f"upstream {server!r} went away before the call to {tool!r} was sent; "
                "it was not sent", server=server, sent=False,
            )
        params: dict[str, Any] = {
            "name": tool, "arguments": dict(arguments) if arguments is not None else None,
            "_meta": clean_meta(meta)}
        if input_responses is not None:
            params["inputResponses"] = dict(input_responses)
        if request_state is not None:
            params["requestState"] = request_state
        request = types.CallToolRequest(
            params=types.CallToolRequestParams.model_validate(params, by_alias=True))
        result: types.CallToolResult | types.InputRequiredResult | None = None
        what = f"the call to {tool!r}"
        with self._faults(server, what, conn):
            with anyio.move_on_after(limit):
                result = await client.session.send_request(request, _ROUND,
                                                           progress_callback=progress)
        if result is None:
            raise UpstreamTimeout(
                f"upstream {server!r} did not answer the call to {tool!r} within {limit:g} s; "
                "it may still have run", server=server, timeout=limit,
            )
        if isinstance(result, types.InputRequiredResult):
            return result
        return bound_result(
            _without_reserved(result), up.config.max_result_bytes, label=f"{server}/{tool}"
        )

    @contextmanager
    def _faults(self, server: str, what: str, conn: _Connection) -> Iterator[None]:
        """Turn the SDK's failures of one request into :class:`UpstreamError` s."""
        try:
            yield
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                conn.end()
                up = self._upstream(server)
                up.error = f"upstream {server!r} closed the connection during {what}"
                raise UpstreamUnavailable(
                    f"upstream {server!r} closed the connection during {what}; "
                    "it may have run (it will be restarted on the next call)",
                    server=server, sent=True,
                ) from None
            raise UpstreamRejected(
                f"upstream {server!r} refused {what}: {exc.error.message} "
                f"(JSON-RPC {exc.code})", server=server, rpc_code=exc.code,
                rpc_message=exc.error.message, rpc_data=exc.error.data,
            ) from None
        except ValidationError:
            raise UpstreamRejected(
                f"upstream {server!r} answered {what} with something that is not its result",
                server=server, rpc_code=None,
            ) from None

    async def request(self, server: str, request: Any, result_type: Any, *,
                      what: str) -> Any:
        """Send one request other than ``tools/call`` (``resources/read``, ``prompts/get``, ...)
        to ``server`` and return its validated result (``result_type``: a model or adapter).

        ``what`` names the request in error messages. Bounded by the server's ``timeout``;
        raises as :meth:`call` does.
        """
        up = self._upstream(server)
        conn = await self._connection(up)
        client = conn.client
        if client is None or not conn.live:
            raise UpstreamUnavailable(f"upstream {server!r} went away before {what} was sent",
                                      server=server, sent=False)
        result: Any = None
        with self._faults(server, what, conn):
            with anyio.move_on_after(up.config.timeout):
                result = await client.session.send_request(request, result_type)
        if result is None:
            raise UpstreamTimeout(
                f"upstream {server!r} did not answer {what} within {up.config.timeout:g} s",
                server=server, timeout=up.config.timeout)
        return result

    def capabilities(self, server: str) -> types.ServerCapabilities | None:
        """What ``server`` said it can do, when it is connected (None when it is down)."""
        conn = self._upstream(server).conn
        if conn is None or conn.client is None or not conn.live:
            return None
        return conn.client.session.server_capabilities

    def protocol_version(self, server: str) -> str | None:
        """The protocol version spoken with ``server``, when it is connected."""
        conn = self._upstream(server).conn
        if conn is None or conn.client is None or not conn.live:
            return None
        return conn.client.session.protocol_version
