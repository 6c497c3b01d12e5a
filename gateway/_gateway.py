"""The gateway: one order's MCP server in front of the real upstream servers.

A worker connects to :attr:`Gateway.server` as its only MCP server. ``tools/list`` shows
the upstream tools the order (and the worker's Delegation Pass, if any) allows, under
exposed names model APIs accept (:mod:`gateway._names`), plus the worker's desk tools
(:mod:`gateway._worker_tools`). Every ``tools/call`` of an upstream tool runs the steps of
:mod:`gateway._callpath` (resolve, admit, forward, record, answer), and nothing is answered
before its record is in the store. What the gateway keeps between calls lives in one
:class:`~gateway._known.Known`; the store is reached from async code only through
:meth:`Gateway.run_store`.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
import weakref
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import datetime
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from awl.desk import Desk, acting_as, ancestors, first_ended, staging_ancestor
from awl.documents import (
    RELEASE,
    AWLError,
    DocumentError,
    PassError,
    WorkOrder,
    check_json_value,
    print_debug,
    utc_now,
)
from awl.mcp import identity_of
from awl.passes import DEFAULT_AUDIENCE, verify_pass
from awl.store import OrderRecord, Store
from gateway._authority import Authority
from gateway._callpath import (
    AWL_INVALID_ARGUMENTS,
    AWL_UPSTREAM_ERROR,
    UNRESOLVED_TOOL,
    Call,
    handle,
    held_note,
)
from gateway._config import GatewayConfig
from gateway._known import Known
from gateway._names import NameTable
from gateway._passthrough import Passthrough
from gateway._policy import (
    allowed,
    inactive_refusal,
    is_staged,
)
from gateway._relay import Relay
from gateway._store_threads import store_threads
from gateway._telemetry import CallSpan, current
from gateway._unrecorded import Unrecorded, one_line
from gateway._upstream import (
    UpstreamPool,
)
from gateway._worker_tools import WORKER_TOOL_NAMES, WorkerTools

__all__ = [
    "AWL_INVALID_ARGUMENTS",
    "AWL_UPSTREAM_ERROR",
    "UNRESOLVED_TOOL",
    "Gateway",
]

log = logging.getLogger("awl.gateway")

Clock = Callable[[], datetime]
_T = TypeVar("_T")


class _Server(Server[Any]):
    """The MCP server, declaring that it announces changes of its tool list."""

    def create_initialization_options(
        self, notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities, extensions)


class Gateway:
    """One order's gateway: an MCP server that enforces the order on every call.

    Build it inside an open :class:`~gateway._upstream.UpstreamPool`, call :meth:`start`,
    then serve :attr:`server` (over stdio, streamable HTTP, or in-process with
    ``mcp.Client(gateway.server)``). :func:`gateway.open_gateway` does all of this.

    Args:
        order_id: The order the worker works on.
        store: Where the order lives and calls are recorded.
        pool: The open upstream connections.
        pass_token: The Delegation Pass the worker runs under (stdio and in-process); over
            HTTP each request's Bearer pass is used instead. None: the order's worker.
        jwks: The desk's public key set, needed to verify passes: a JWKS document, or a
            callable (a :class:`~awl.KeySet`) asked for the current one at every check, so
            rotated and retired keys count from the next call (DP-13).
        audience: The audience passes must name.
        safe: Safe mode (hold every tool not marked read-only); default the config's.
        clock: Returns the current time, timezone-aware (tests pass a fake one).
        offload_store: Run the per-call store work in worker threads. None (the default)
            decides by the store: a store whose class says ``in_process = True`` (memory,
            SQLite: a few short local transactions, well under a millisecond, where each
            hand-off to a thread and back costs about as much again) runs on the event loop,
            which waits there only while another process holds the write lock; any other
            store (PostgreSQL: each call waits for round trips to a server) runs in worker
            threads, so the loop serves other calls meanwhile (GW-20).
        relay: Where what the upstreams send besides answers goes; the pool's connections
            must use its :meth:`~gateway._relay.Relay.handlers` (``open_gateway`` does so).
    """

    def __init__(
        self,
        order_id: str,
        *,
        store: Store,
        pool: UpstreamPool,
        pass_token: str | None = None,
        jwks: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        audience: str = DEFAULT_AUDIENCE,
        safe: bool | None = None,
        clock: Clock | None = None,
        offload_store: bool | None = None,
        relay: Relay | None = None,
    ) -> None:
        self.order_id = order_id
        self.relay = relay if relay is not None else Relay()
        self.offload_store = (not getattr(store, "in_process", False)
                              if offload_store is None else offload_store)
        self.store = store
        self.pool = pool
        self.config: GatewayConfig = pool.config
        self.safe = self.config.gateway.safe_mode if safe is None else safe
        self.audience = audience
        self._pass_token = pass_token
        self._jwks = jwks
        self._clock: Clock = clock or utc_now
        self.known = Known(self.config)
        """What the gateway keeps between calls: the order, the tools, kept decisions."""
        self.desk = Desk(store, clock=self._clock)
        self.unrecorded = Unrecorded(store, order_id)
        """Outcomes of forwarded calls the store could not take yet (GW-7)."""
        self._telemetry = current()
        self._worker = WorkerTools(self)
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._bus = InMemorySubscriptionBus()  # 2026-07-28 clients listen here
        pool.on_tools_listed(self._tools_listed)
        with warnings.catch_warnings():
            # The SDK marks logging deprecated in 2026-07-28; handshake-era workers use it.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            self.server: Server[Any] = _Server(
                "awl-gateway",
                version=RELEASE,
                title="AWL gateway",
                instructions=None,
                on_list_tools=self._on_list_tools,
                on_call_tool=self._on_call_tool,
                on_set_logging_level=self._on_set_logging_level,
                on_subscriptions_listen=ListenHandler(self._bus),
                **Passthrough(self).handlers(),
            )

    # ------------------------------------------------------------------ setup

    @property
    def order(self) -> WorkOrder:
        """The order (read by :meth:`start`; an order never changes once issued)."""
        return self.known.order

    def now(self) -> datetime:
        """The gateway's current time."""
        return self._clock()

    @property
    def checks_passes(self) -> bool:
        """Whether the gateway holds the desk's key set, so it can verify passes."""
        return self._jwks is not None

    async def start(self) -> None:
        """Read the order, check the configured pass, and learn the upstream tools.

        Raises:
            NotFound: No such order.
            PassError: The configured pass does not verify, or is for another order.
        """
        record = await anyio.to_thread.run_sync(self.store.load, self.order_id)
        above = await anyio.to_thread.run_sync(ancestors, self.store, record.order)
        self.known.learn_order(record.order, above)
        if self._pass_token is not None:
            authority = await anyio.to_thread.run_sync(self.verify, self._pass_token)
            if authority.error is not None:
                raise authority.error
        self.server.instructions = self._instructions()
        await self.catalog()
        self._telemetry.watch(self)

    def _instructions(self) -> str:
        order = self.order
        lines = [
            f"You are working on order {order.id}: {order.goal}",
            f"Deadline {order.deadline}; budget {json.dumps(order.budget.units())}.",
            "Upstream tools are named server__tool; their descriptions start with the "
            "canonical server/tool name that reports and evidence refs use.",
            "Every tool call is recorded as server/tool#N; cite those refs as evidence "
            "(awl_list_calls lists them).",
        ]
        if order.staged or self.safe or any(c.hold for c in self.config.servers.values()):
            lines.append(
                "Some tools are held for the manager's approval: they answer "
                "pending:server/tool#N and run only after approval; list each call of a "
                "tool the order stages in your report's effects (awl_list_held_calls gives "
                "them ready to copy). A held tool the order does not stage never runs: "
                "its description says so.")
        lines.append("Desk tools awl_get_order, awl_post_progress, awl_list_calls, "
                     "awl_list_held_calls and awl_submit_report cost nothing.")
        return "\n".join(lines)

    async def catalog(self) -> NameTable:
        """The name table, rebuilt when the upstreams' tool set changed (after a restart)."""
        # Without refresh, pool.tools() only reads what the connections last listed, and
        # answers with the same mapping until an upstream lists anew.
        return self.known.learn_tools(await self.pool.tools())

    # ------------------------------------------------------------------ authority

    def _token_for(self, ctx: ServerRequestContext[Any] | None) -> str | None:
        """The pass a request runs under (BIND-7).

        Over HTTP it is the pass the transport verified for this very request; the headers
        are never read again here, and an HTTP request without a verified pass is refused:
        it never runs as the order's worker. Other transports run under the configured pass
        (None: the order's worker).
        """
        request = getattr(ctx, "request", None) if ctx is not None else None
        if request is None:
            return self._pass_token
        identity = identity_of(ctx)
        if isinstance(identity, Authority) and identity.verified is not None:
            return identity.token
        raise MCPError(types.INVALID_REQUEST, "this HTTP request carries no verified "
                       "Delegation Pass; send yours as 'Authorization: Bearer <pass>'")

    async def authority(self, ctx: ServerRequestContext[Any] | None) -> Authority:
        """Who the request in ``ctx`` runs as, checked now."""
        return await anyio.to_thread.run_sync(self.verify, self._token_for(ctx))

    async def inactive_reason(self) -> str | None:
        """``CODE: why`` when the order, as stored now, is not active or is past its
        deadline; None while calls may run."""
        record = await self.run_store(self.reload)
        ended_above = await self.run_store(self.ended_above)
        refusal = inactive_refusal(record.order, record.state, self.now(),
                                   ended_above=ended_above)
        return None if refusal is None else refusal.text

    def ended_above(self) -> tuple[str, str] | None:
        """``(id, state)`` of the first order above this one that has ended (LC-16, the
        rule of :func:`awl.desk.first_ended`), or None; states change, so they are read
        anew each time, by the ids read at start (orders never change)."""
        above_ids = self.known.above_ids
        if not above_ids:  # no order above: none can have ended
            return None
        ended = first_ended(map(self.store.load, above_ids))
        return None if ended is None else (ended.order.id, ended.state)

    def verify(self, token: str | None) -> Authority:
        """Who ``token`` makes the caller, checked now (revocation and expiry included).

        Blocking (it reads the revocation list); call it from a worker thread.
        """
        if token is None:
            return Authority(None)
        if self._jwks is None:
            return Authority(token, error=PassError(
                "this gateway was started without the desk's key set, so it cannot check "
                "passes", reason="unknown_kid"))
        try:
            jwks = self._jwks() if callable(self._jwks) else self._jwks
            verified = verify_pass(token, jwks=jwks, revoked=self.store.revoked(),
                                   audience=self.audience, now=self.now())
        except PassError as exc:
            return Authority(token, error=exc)
        if verified.order_id != self.order_id:
            return Authority(token, error=PassError(
                f"the pass is for order {verified.order_id}, not {self.order_id}",
                reason="chain_broken"))
        return Authority(token, verified)

    def actor(self, authority: Authority) -> str:
        """Who the desk tools act as (:func:`awl.desk.access.acting_as`)."""
        verified = authority.verified
        return acting_as(self.order, verified.subject if verified is not None else None)

    # ------------------------------------------------------------------ tools/list

    def staged(self, canonical: str) -> bool:
        """Whether calls to ``canonical`` are held (order, operator's hold list, safe mode)."""
        _usd, hold, read_only = self.known.facts(canonical)
        return hold or is_staged(canonical, self.order, safe=self.safe, read_only=read_only)

    def visible(self, authority: Authority) -> list[tuple[str, str]]:
        """``(canonical, exposed)`` of every upstream tool this caller may call."""
        if authority.token is not None and authority.verified is None:
            return []
        grant = authority.verified.claims.grant if authority.verified else None
        known = self.known
        return [(c, e) for c, e in known.table.items() if allowed(c, self.order, grant)
                and staging_ancestor(c, known.staging_above) is None]

    def _exposed_tool(self, canonical: str, exposed: str) -> types.Tool:
        tool = self.known.tools[canonical]
        held = self.staged(canonical)
        description = f"[{canonical}] {tool.description or ''}".rstrip()
        if held:
            description += "\n" + held_note(canonical, self.order)
        # A held call answers with a placeholder, which the upstream's output schema would
        # reject on the worker's side; a schema that is not valid JSON Schema is not
        # advertised either (GW-12).
        schema = None if held else self.known.schemas.advertised(canonical, tool)
        update: dict[str, Any] = {"name": exposed, "description": description,
                                  "output_schema": schema}
        return tool.model_copy(update=update)

    async def _on_list_tools(self, ctx: ServerRequestContext[Any],
                             params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        try:
            return await self._list_tools(ctx)
        except (DocumentError, MCPError):
            raise
        except Exception as exc:  # the store's failure, or a bug's: one line too (SEC-4)
            raise _failed("tools/list", exc) from None

    async def _list_tools(self, ctx: ServerRequestContext[Any]) -> types.ListToolsResult:
        # The worker's connection, to tell it later when the tool set changes. The SDK's
        # per-request session names it only privately; a session without one is not told.
        connection = getattr(ctx.session, "_connection", None)
        if connection is not None and hasattr(connection, "send_tool_list_changed"):
            with suppress(TypeError):
                self._connections.add(connection)
        authority = await anyio.to_thread.run_sync(self.verify, self._token_for(ctx))
        # Upstreams start in the background: during the config's startup_wait after the
        # start, wait for those still starting; later, list at once what is up. Each server
        # that comes up afterwards sends the worker notifications/tools/list_changed.
        await self.pool.wait_started(self.config.gateway.startup_wait)
        await self.catalog()
        self.known.listed = frozenset(self.known.tools)
        tools = [self._exposed_tool(c, e) for c, e in self.visible(authority)]
        tools.extend(self._worker.tools())
        return types.ListToolsResult(tools=tools)

    async def _tools_listed(self) -> None:
        """An upstream listed its tools: when the set changed, tell the worker's connections
        (handshake era) and its ``subscriptions/listen`` streams (2026-07-28)."""
        await self.catalog()
        known = self.known
        if known.listed == known.tools.keys():
            return
        known.listed = frozenset(known.tools)
        await self._bus.publish(ToolsListChanged())
        for connection in list(self._connections):
            try:
                await connection.send_tool_list_changed()
            except Exception as exc:  # a connection that went away, or cannot be told
                log.debug("tools/list_changed not sent: %s", exc)

    # ------------------------------------------------------------------ tools/call

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams,
    ) -> types.CallToolResult | types.InputRequiredResult:
        token = self._token_for(ctx)
        try:
            # The wire refuses values JSON cannot carry (SEC-9); an in-process client can
            # still pass them, and a call that cannot be recorded gets a protocol error (GW-7).
            arguments = check_json_value(dict(params.arguments or {}), where="the arguments")
        except DocumentError as exc:
            raise MCPError(types.INVALID_PARAMS, f"Invalid params: {exc.message}") from None
        try:
            if params.name in WORKER_TOOL_NAMES:
                authority = await anyio.to_thread.run_sync(self.verify, token)
                return await self._worker.call(params.name, arguments, authority)
            meta = dict(params.meta or {})
            with self._telemetry.tool_call(params.name, self.order_id, meta,
                                           served=True) as span:
                # The arguments were checked above: not again.
                return await self._call(span, params.name, arguments, token, meta, ctx,
                                        params.input_responses, params.request_state)
        except (DocumentError, MCPError):
            raise
        except Exception as exc:  # the store failed before the call was forwarded, or a bug
            raise _failed(f"the call to {params.name}", exc) from None

    async def _on_set_logging_level(self, ctx: ServerRequestContext[Any],
                                    params: types.SetLevelRequestParams) -> types.EmptyResult:
        """A handshake-era worker's ``logging/setLevel``: the least severe upstream log
        message passed on to its connection from now on (GW-14)."""
        self.relay.set_level(ctx, params.level)
        return types.EmptyResult()

    async def call(self, name: str, arguments: Mapping[str, Any], *, token: str | None = None,
                   meta: Mapping[str, Any] | None = None,
                   ctx: ServerRequestContext[Any] | None = None,
                   input_responses: Mapping[str, Any] | None = None,
                   request_state: str | None = None,
                   ) -> types.CallToolResult | types.InputRequiredResult:
        """Handle one upstream tool call by its exposed ``name``; see the module docstring.

        Args:
            name: The exposed name the worker asked for, exactly.
            arguments: The call's arguments.
            token: The pass the call runs under (default: the gateway's configured pass).
            meta: The request's ``_meta``; forwarded cleaned.
            ctx: The worker's request, when there is one: progress, log messages and the
                upstream's own requests pass on to it (GW-13, GW-14).
            input_responses: The worker's answers to an ``input_required`` round, forwarded
                with ``request_state`` (GW-15).
            request_state: The state of that round, forwarded as received.

        Returns:
            The upstream's result or ``input_required`` round, a ``pending:`` placeholder,
            or a tool error.

        Raises:
            DocumentError: ``arguments`` hold what JSON cannot (NaN, a lone surrogate, ...);
                nothing was recorded or forwarded.
        """
        with self._telemetry.tool_call(name, self.order_id, meta, served=ctx is not None) as span:
            args = check_json_value(dict(arguments), where="the arguments")
            return await self._call(span, name, args, token, meta, ctx, input_responses,
                                    request_state)

    async def _call(self, span: CallSpan, name: str, args: dict[str, Any],
                    token: str | None, meta: Mapping[str, Any] | None,
                    ctx: ServerRequestContext[Any] | None,
                    input_responses: Mapping[str, Any] | None, request_state: str | None,
                    ) -> types.CallToolResult | types.InputRequiredResult:
        """:meth:`call` with ``args`` already checked (JSON values only, a copy of its own)."""
        return await handle(self, span, Call(
            name, args, token if token is not None else self._pass_token, caller=token,
            meta=meta, ctx=ctx, input_responses=input_responses, request_state=request_state))

    # ------------------------------------------------------------------ the store

    async def run_store(self, func: Callable[..., _T], *args: Any) -> _T:
        """Run blocking store work: on the loop, or in a store thread with ``offload_store``
        (shielded: a cancelled call still learns what its reservation or record wrote)."""
        if not self.offload_store:
            return func(*args)
        with anyio.CancelScope(shield=True):
            done: _T = await store_threads().run(self._bounded, func, *args)
        return done

    def _bounded(self, func: Callable[..., _T], *args: Any) -> _T:
        """``func(*args)`` with every wait on the store inside it bounded from now by the
        store's timeout, as one operation's are (a store without the bound: as it is)."""
        bounded = getattr(self.store, "bounded", None)
        if bounded is None:
            return func(*args)
        with bounded():
            return func(*args)

    def reload(self) -> OrderRecord:
        """The order as stored now, kept for the next calls."""
        record = self.store.load(self.order_id)
        self.known.record = record
        return record


def _failed(what: str, exc: Exception) -> MCPError:
    """The worker's protocol error for a request the desk's store (or another check before
    anything was forwarded) failed, or that failed in a way nobody foresaw; said in one line
    on the gateway's stderr too, with the traceback only under ``AWL_DEBUG=1``."""
    print_debug(exc, sys.stderr)  # with the driver's own error a store's line hides
    if isinstance(exc, AWLError):
        said = f"{exc.code}: {one_line(exc.message)}"
        log.warning("awl gateway: %s failed: %s", what, said)
    else:
        said = (f"INTERNAL: the gateway failed unexpectedly ({type(exc).__name__}: "
                f"{one_line(str(exc))}); the call may or may not have been recorded: check "
                "awl_list_calls before calling again")
        log.error("awl gateway: %s failed: %s", what, said)
    return MCPError(types.INTERNAL_ERROR, said)
