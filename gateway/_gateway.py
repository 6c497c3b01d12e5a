"""The gateway: one order's MCP server in front of the real upstream servers.

A worker connects to :attr:`Gateway.server` as its only MCP server. ``tools/list`` shows
the upstream tools the order (and the worker's Delegation Pass, if any) allows, under
exposed names model APIs accept (:mod:`gateway._names`), plus the worker's desk tools
(:mod:`gateway._worker_tools`). Every ``tools/call`` of an upstream tool goes through the
same steps, and nothing is answered before its record is in the store:

1. Read the facts again: the order and its state (as last read; step 3 checks in its
   own transaction that the order's log has not grown since, and a refusal checks it
   first, else the call is decided again on the order read afresh), the pass (verified
   again, so a revoked or expired pass stops working at once), what has been spent.
2. Ask :func:`gateway._policy.decide`. A refusal is stored with
   :meth:`~awl.Store.record_call` (it never counts) and answered as a tool error
   ``CODE: message``.
3. Reserve the call with :meth:`~awl.Store.reserve_call`, which numbers it
   (``server/tool#N``) and checks the order's, every pass link's and (for a sub-order)
   every order above's ``tool_calls`` and ``usd`` limits in one transaction, charging the
   call to each order above: exact under concurrent calls, from any number of gateway
   processes on the same store.
4. A staged call is checked against the upstream's input schema, stored as ``held`` with
   its exact arguments (and its effect state ``held``), never forwarded, and answered
   ``pending:server/tool#N``; arguments that do not fit are answered
   ``AWL_INVALID_ARGUMENTS`` and stored as an ``error`` (the call still counts, as a
   forwarded call that failed would). Any other call is forwarded with ``_meta``
   ``awl/ref``, ``awl/order`` and ``awl/attempt`` (``awl/*`` keys the worker sent are
   replaced); its result, or the upstream fault as a tool error ``AWL_UPSTREAM_...``, is
   stored with :meth:`~awl.Store.finish_call` and then returned.

A name the table does not hold exactly (another case, whitespace, a look-alike letter, a
server that is not configured) resolves to nothing and is refused ``AWL_FORBIDDEN``; it
is recorded under :data:`UNRESOLVED_TOOL`, a name no configured server can have. A call
refused because its pass did not verify is recorded without a ``pass_jti``: an
unverified token names no one.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
import weakref
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
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
    CallRecord,
    Conflict,
    DocumentError,
    PassError,
    WorkOrder,
    check_json_value,
    debugging,
    format_time,
    matches_any,
    parse_ref,
    parse_time,
    print_debug,
    utc_now,
)
from awl.mcp import coded_error, identity_of
from awl.passes import DEFAULT_AUDIENCE, VerifiedPass, pass_scopes, verify_pass
from awl.store import OrderRecord, OverBudget, Scope, Store, stale_order
from gateway._authority import Authority
from gateway._config import GatewayConfig
from gateway._names import NameTable, server_of, split_canonical
from gateway._passthrough import Passthrough
from gateway._policy import (
    Decision,
    allowed,
    budget_refusal,
    decide,
    inactive_refusal,
    is_staged,
    refuse,
)
from gateway._relay import Relay, worker_is_modern
from gateway._results import OutputSchemas
from gateway._staging import check_arguments
from gateway._store_threads import store_threads
from gateway._telemetry import CallSpan, current
from gateway._unrecorded import Unrecorded, one_line
from gateway._upstream import (
    RESERVED_META_PREFIX,
    UpstreamError,
    UpstreamPool,
    UpstreamRejected,
    UpstreamUnavailable,
)
from gateway._worker_tools import WORKER_TOOL_NAMES, WorkerTools

__all__ = [
    "AWL_INVALID_ARGUMENTS",
    "AWL_UPSTREAM_ERROR",
    "UNRESOLVED_TOOL",
    "Gateway",
]

log = logging.getLogger("awl.gateway")

_STALE_RETRIES = 20
"""How many times a call is decided again because the order's log grew meanwhile."""


AWL_INVALID_ARGUMENTS = "AWL_INVALID_ARGUMENTS"
"""A held call's arguments do not fit the upstream's input schema, or a ``$ref`` is bad."""
AWL_UPSTREAM_ERROR = "AWL_UPSTREAM_ERROR"
"""Prefix of upstream faults: ``AWL_UPSTREAM_TIMEOUT``, ``AWL_UPSTREAM_UNAVAILABLE``, ..."""

UNRESOLVED_TOOL = "awl-gateway.unresolved-name.not-an-upstream/unknown"
"""The tool recorded for a refused call whose name resolves to no upstream tool.

Its server part is longer than the 40 characters a configured server name may have, so it
can never be mistaken for a real tool."""

META_REF = "awl/ref"
META_ORDER = "awl/order"
META_ATTEMPT = "awl/attempt"

INPUT_ROUNDS = 10
"""How many ``input_required`` rounds the gateway answers for a handshake-era worker in
one call before it gives up (the SDK clients' own default)."""

AWL_NOT_RECORDED = "AWL_NOT_RECORDED"
"""A forwarded call whose outcome the store could not record: it may have run."""

AWL_CANCELLED = "AWL_CANCELLED"
"""The error recorded for a call the worker cancelled before the upstream answered."""

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


def _wire(result: types.CallToolResult | types.InputRequiredResult) -> dict[str, Any]:
    """The result as the wire carries it (camelCase), which is how call records keep it."""
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


def forward_meta(meta: Mapping[str, Any] | None, *, ref: str, order_id: str,
                 attempt: int) -> dict[str, Any]:
    """The ``_meta`` sent upstream: the worker's own keys, then the gateway's ``awl/*``.

    Protocol-reserved keys and progress tokens describe the worker's connection and are
    dropped; ``awl/*`` keys the worker sent are dropped too, so a worker cannot pose as
    another call.
    """
    if not meta:
        return {META_REF: ref, META_ORDER: order_id, META_ATTEMPT: attempt}
    out = {k: v for k, v in meta.items()
           if not k.startswith((RESERVED_META_PREFIX, "awl/"))
           and k not in ("progressToken", "progress_token")}
    out.update({META_REF: ref, META_ORDER: order_id, META_ATTEMPT: attempt})
    return out


def held_note(tool: str, order: WorkOrder) -> str:
    """What the worker is told about a held tool: listed as an effect, or never run (GW-9)."""
    if matches_any(order.staged, tool):
        return ("Held for the manager's approval: the call is recorded, not run, and answers "
                "pending:server/tool#N for your report's effects.")
    return (f"Held, and never run: the gateway holds {tool} (safe mode or the operator's "
            "hold list) but the order does not stage it, so no report may list its calls as "
            "effects (rule R14) and no approval runs them. Leave them out of your report's "
            "effects; if the work needs this tool, say so in your report.")


def _answered(decision: Decision) -> str:
    """The recorded outcome of a call answered without being forwarded."""
    if decision.action == "hold":
        return "held"
    return "error" if decision.code == AWL_INVALID_ARGUMENTS else "refused"


@dataclass(frozen=True, slots=True)
class _Admission:
    """What the store-side half of a call decided, and the ref and attempt of the record it
    wrote (None: it wrote none)."""

    decision: Decision
    ref: str | None = None
    attempt: int | None = None
    answer: types.CallToolResult | None = None


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
        self._record: OrderRecord | None = None
        self.store = store
        self.pool = pool
        self.config: GatewayConfig = pool.config
        self.safe = self.config.gateway.safe_mode if safe is None else safe
        self.audience = audience
        self._pass_token = pass_token
        self._jwks = jwks
        self._clock: Clock = clock or utc_now
        self._tools: Mapping[str, types.Tool] = {}
        self._known_facts: dict[str, tuple[float, bool, bool | None]] = {}
        # Decisions kept per exposed name: (the order record it was made on, canonical,
        # decision, usd, deadline); see _kept_decision.
        self._decisions: dict[str, tuple[OrderRecord, str, Decision, float, datetime]] = {}
        self._schemas = OutputSchemas()
        self._table = NameTable((), reserved=WORKER_TOOL_NAMES)
        self._order: WorkOrder | None = None
        self._order_scope: Scope | None = None
        # The orders above this one with a seconds budget (LC-15): the store checks the
        # other units of every order above when it reserves a call.
        self._timed_above: tuple[WorkOrder, ...] = ()
        # The orders above this one that stage tools: those tools are never called here
        # (LC-14; C5 keeps them out of a sub-order the desk creates).
        self._staging_above: tuple[WorkOrder, ...] = ()
        # Every order above this one: its calls run only while they are all active (LC-16).
        self._above_ids: tuple[str, ...] = ()
        self.desk = Desk(store, clock=self._clock)
        self.unrecorded = Unrecorded(store, order_id)
        """Outcomes of forwarded calls the store could not take yet (GW-7)."""
        self._telemetry = current()
        self._worker = WorkerTools(self)
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._bus = InMemorySubscriptionBus()  # 2026-07-28 clients listen here
        self._listed: frozenset[str] = frozenset()  # the tools the worker last heard of
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
        if self._order is None:
            raise RuntimeError("call Gateway.start() first")
        return self._order

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
        self._order = record.order
        above = await anyio.to_thread.run_sync(ancestors, self.store, record.order)
        self._timed_above = tuple(o for o in above if o.budget.seconds is not None)
        self._staging_above = tuple(o for o in above if o.staged)
        self._above_ids = tuple(o.id for o in above)
        if self._pass_token is not None:
            authority = await anyio.to_thread.run_sync(self.verify, self._pass_token)
            if authority.error is not None:
                raise authority.error
        self.server.instructions = self._instructions()
        await self._catalog()
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

    async def _catalog(self) -> NameTable:
        """The name table, rebuilt when the upstreams' tool set changed (after a restart)."""
        # Without refresh, pool.tools() only reads what the connections last listed, and
        # answers with the same mapping until an upstream lists anew.
        tools = await self.pool.tools()
        if tools is not self._tools:
            if tools.keys() != self._tools.keys():
                self._table = NameTable(tools, reserved=WORKER_TOOL_NAMES)
            self._tools = tools
            self._known_facts.clear()  # a tool listed anew may have new annotations
            self._decisions = {}
        return self._table

    def _facts(self, canonical: str) -> tuple[float, bool, bool | None]:
        """``(usd, operator hold, readOnlyHint)`` of one upstream tool.

        Kept per tool until an upstream lists its tools anew (after a restart)."""
        known = self._known_facts.get(canonical)
        if known is not None:
            return known
        tool = self._tools.get(canonical)
        server, bare = split_canonical(canonical)
        config = self.config.servers.get(server)
        usd = config.cost_of(bare) if config is not None else 0.0
        hold = config.holds(bare) if config is not None else False
        read_only = tool.annotations.read_only_hint if tool and tool.annotations else None
        facts = (usd, hold, read_only)
        self._known_facts[canonical] = facts
        return facts

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
        record = await self._run(self._load_record)
        ended_above = await self._run(self._ended_above)
        refusal = inactive_refusal(record.order, record.state, self.now(),
                                   ended_above=ended_above)
        return None if refusal is None else refusal.text

    def _ended_above(self) -> tuple[str, str] | None:
        """``(id, state)`` of the first order above this one that has ended (LC-16, the
        rule of :func:`awl.desk.first_ended`), or None; states change, so they are read
        anew each time, by the ids read at start (orders never change)."""
        if not self._above_ids:  # no order above: none can have ended
            return None
        ended = first_ended(map(self.store.load, self._above_ids))
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
        _usd, hold, read_only = self._facts(canonical)
        return hold or is_staged(canonical, self.order, safe=self.safe, read_only=read_only)

    def visible(self, authority: Authority) -> list[tuple[str, str]]:
        """``(canonical, exposed)`` of every upstream tool this caller may call."""
        if authority.token is not None and authority.verified is None:
            return []
        grant = authority.verified.claims.grant if authority.verified else None
        return [(c, e) for c, e in self._table.items() if allowed(c, self.order, grant)
                and staging_ancestor(c, self._staging_above) is None]

    def _exposed_tool(self, canonical: str, exposed: str) -> types.Tool:
        tool = self._tools[canonical]
        held = self.staged(canonical)
        description = f"[{canonical}] {tool.description or ''}".rstrip()
        if held:
            description += "\n" + held_note(canonical, self.order)
        # A held call answers with a placeholder, which the upstream's output schema would
        # reject on the worker's side; a schema that is not valid JSON Schema is not
        # advertised either (GW-12).
        schema = None if held else self._schemas.advertised(canonical, tool)
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
        await self._catalog()
        self._listed = frozenset(self._tools)
        tools = [self._exposed_tool(c, e) for c, e in self.visible(authority)]
        tools.extend(self._worker.tools())
        return types.ListToolsResult(tools=tools)

    async def _tools_listed(self) -> None:
        """An upstream listed its tools: when the set changed, tell the worker's connections
        (handshake era) and its ``subscriptions/listen`` streams (2026-07-28)."""
        await self._catalog()
        if self._listed == self._tools.keys():
            return
        self._listed = frozenset(self._tools)
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
        table = await self._catalog()
        server = tool = canonical = unavailable = None
        meant = server_of(name, self.config.servers) if name not in table else None
        if meant is not None:
            # Meant for a server that may not have listed its tools yet: wait for its start,
            # or start it again after its backoff, then look again.
            try:
                await self.pool.connect(meant)
            except UpstreamUnavailable as exc:
                unavailable = exc.message
            table = await self._catalog()
        if name in table:
            canonical = table.canonical(name)
            server, tool = table.resolve(name)
        admission = await self._run(
            self._admit, name, canonical, args, token if token is not None else self._pass_token,
            unavailable)
        if admission.answer is not None:
            span.done(tool=canonical, ref=admission.ref, attempt=admission.attempt,
                      outcome=_answered(admission.decision), code=admission.decision.code)
            return admission.answer
        ref, attempt = admission.ref, admission.attempt
        assert ref is not None and attempt is not None
        assert server is not None and tool is not None
        assert canonical is not None
        outcome, result, error = "error", None, None
        answer: types.CallToolResult | types.InputRequiredResult
        try:
            with self.relay.forwarding(server, ctx, token):
                answer = await self._forward(
                    server, tool, args, ctx=ctx, input_responses=input_responses,
                    request_state=request_state,
                    meta=forward_meta(meta, ref=ref, order_id=self.order_id,
                                      attempt=attempt))
            outcome = "error" if getattr(answer, "is_error", False) else "ok"
            result = _wire(answer)  # what the upstream answered (bounded), as evidence
            if isinstance(answer, types.CallToolResult):
                answer = self._schemas.conform(canonical, self._tools.get(canonical), answer)
        except UpstreamError as exc:
            error = exc.refusal
            answer = coded_error(error)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._finish(ref, "error", None,
                                   f"{AWL_CANCELLED}: the worker cancelled the call before the "
                                   "upstream answered; the cancellation was passed on to the "
                                   "upstream, and the call may have run")
            raise
        except Exception as exc:  # the gateway must outlive any upstream surprise
            log.error("awl gateway: call %s failed unexpectedly: %s: %s", ref,
                      type(exc).__name__, one_line(str(exc)), exc_info=debugging())
            error = f"{AWL_UPSTREAM_ERROR}: the call to {canonical} failed: {exc}"[:1000]
            answer = coded_error(error)
        if not await self._finish(ref, outcome, result, error):
            # It was forwarded: it may have run, whatever the store says (GW-7).
            error = (f"{AWL_NOT_RECORDED}: the call {ref} was sent to {canonical} and may "
                     "have run, but the desk's store could not record its outcome; the "
                     "gateway keeps the outcome and records it as soon as the store is back. "
                     f"Do not call again to be sure: check {ref} with awl_list_calls once "
                     "the desk answers.")
            outcome, answer = "error", coded_error(error)
        span.done(tool=canonical, ref=ref, attempt=attempt, outcome=outcome,
                  code=error.split(":", 1)[0] if error else None)
        # The worker cites this ref as evidence; the answer is its only way to learn it.
        # (The answer was made for this call alone, by the upstream pool or above: setting
        # its _meta in place saves a model copy per call.)
        answer.meta = {**(answer.meta or {}), META_REF: ref}
        return answer

    async def _forward(self, server: str, tool: str, args: dict[str, Any], *,
                       meta: dict[str, Any], ctx: ServerRequestContext[Any] | None,
                       input_responses: Mapping[str, Any] | None, request_state: str | None,
                       ) -> types.CallToolResult | types.InputRequiredResult:
        """Send one call upstream, its progress passed on to ``ctx``.

        A 2026-07-28 worker gets an ``input_required`` round as the upstream sent it and
        answers it by calling again; for a handshake-era worker the gateway asks it each
        input request itself and retries the upstream with its answers (GW-15)."""
        progress = self.relay.progress(ctx)
        answer = await self.pool.call_round(
            server, tool, args, meta=meta, progress=progress,
            input_responses=input_responses, request_state=request_state)
        if ctx is None or worker_is_modern(ctx):
            return answer
        for _ in range(INPUT_ROUNDS):
            if not isinstance(answer, types.InputRequiredResult):
                return answer
            try:
                responses = await self.relay.answer_rounds(ctx, server, answer)
            except MCPError as exc:
                raise UpstreamRejected(
                    f"upstream {server!r} asked for input the worker did not give "
                    f"({exc.error.message}); the call to {tool!r} did not finish",
                    server=server, rpc_code=None) from None
            answer = await self.pool.call_round(
                server, tool, args, meta=meta, progress=progress, input_responses=responses,
                request_state=answer.request_state)
        if isinstance(answer, types.InputRequiredResult):
            raise UpstreamRejected(
                f"upstream {server!r} still asked for input after {INPUT_ROUNDS} rounds of "
                f"the call to {tool!r}; the gateway gave up", server=server, rpc_code=None)
        return answer

    async def _run(self, func: Callable[..., _T], *args: Any) -> _T:
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

    def _load_record(self) -> OrderRecord:
        """The order as stored now, kept for the next calls."""
        record = self.store.load(self.order_id)
        self._record = record
        return record

    def _check_fresh(self, record: OrderRecord) -> None:
        """Conflict (with ``expected_seq``) when the order's log has grown past ``record``."""
        if self.store.events(self.order_id, after=record.seq, limit=1):
            raise stale_order(self.order_id, record.seq, record.seq + 1)

    async def _finish(self, ref: str, outcome: str, result: dict[str, Any] | None,
                      error: str | None) -> bool:
        """Record the outcome of a forwarded call; False when the store could not take it
        (it is kept, to be written once the store is back: :mod:`gateway._unrecorded`)."""
        ended_at = format_time(self.now())

        def finish() -> None:
            self.store.finish_call(self.order_id, ref, outcome=outcome, result=result,
                                   error=error, ended_at=ended_at)

        try:
            await self._run(finish)
        except DocumentError:
            raise
        except AWLError as exc:
            if isinstance(exc, Conflict) and "already has outcome" in exc.message:
                # The desk read it as left behind (stale, may have run) meanwhile: that
                # record stands, and the worker is told the same.
                log.warning("awl gateway: the outcome of call %s was not recorded: %s", ref,
                            exc.message)
                return False
            why = exc.message
        except Exception as exc:  # a driver's own error: the store is away all the same
            why = f"{type(exc).__name__}: {exc}"
        else:
            return True
        self.unrecorded.keep(ref, outcome=outcome, result=result, error=error,
                             ended_at=ended_at, why=why)
        return False

    # ------------------------------------------------------------------ store side (thread)

    def _refused(self, decision: Decision, *, tool: str, arguments: dict[str, Any],
                 attempt: int, jti: str | None, started: str) -> _Admission:
        record = self.store.record_call({
            "order_id": self.order_id, "attempt": attempt, "pass_jti": jti, "tool": tool,
            "arguments": arguments, "outcome": "refused", "error": decision.text,
            "started_at": started, "ended_at": format_time(self.now()),
        })
        return _Admission(decision, record.ref, record.attempt, coded_error(decision.text))

    def _scopes(self, verified: VerifiedPass | None) -> list[Scope]:
        """The budget scopes of a call: the order's, then one per link of its pass chain
        (:func:`awl.passes.pass_scopes`)."""
        if self._order_scope is None:
            budget = self.order.budget
            self._order_scope = Scope(None, max_calls=budget.tool_calls, max_usd=budget.usd,
                                      name="order")
        if verified is None:
            return [self._order_scope]
        return [self._order_scope, *pass_scopes(self.store, verified)]

    def _admit(self, name: str, canonical: str | None, arguments: dict[str, Any],
               token: str | None, unavailable: str | None = None) -> _Admission:
        """Decide, and write what was decided, for one call.

        The decision is made on the order as last read, and never written on a stale one:
        the reservation checks in its own transaction that the order's log has not grown
        since (a refusal checks it first), and when it has, the order is read again and the
        call decided again.
        """
        now = self.now()
        started = format_time(now)
        record = self._record
        for _ in range(_STALE_RETRIES):
            if record is None:
                record = self._load_record()
            try:
                return self._decide(record, name, canonical, arguments, token, now, started,
                                    unavailable)
            except Conflict as exc:
                if exc.expected_seq is None:  # not a stale order (a busy store, say)
                    raise
                record = None
        # The log grew between every read and its reservation: answer with a protocol
        # error (nothing was written) rather than spin.
        raise Conflict(f"order {self.order_id} changed {_STALE_RETRIES} times while this call "
                       "was being decided; nothing was recorded, call again")

    def _decide(self, record: OrderRecord, name: str, canonical: str | None,
                arguments: dict[str, Any], token: str | None, now: datetime,
                started: str, unavailable: str | None = None) -> _Admission:
        """:meth:`_admit` on the order as of ``record`` at ``now`` (written as ``started``);
        Conflict if it is stale."""
        attempt = record.attempt
        kept = self._kept_decision(record, name, canonical, token, now, unavailable)
        if kept is not None:
            # Decided before on this very record: only the reservation is new.
            decision, usd = kept
            jti, scopes = None, self._scopes(None)
        else:
            authority = self.verify(token)
            verified = authority.verified
            # A pass that did not verify names no one: its claims are not recorded.
            jti = verified.jti if verified is not None else None
            usd, hold, read_only = self._facts(canonical) if canonical else (0.0, False, None)
            scopes = self._scopes(verified)
            grant = verified.claims.grant if verified is not None else None
            # tool_calls and usd are checked exactly by reserve_call below; reading the
            # usage here is needed only for a seconds budget (the time of the first call).
            usage = pass_usage = None
            if record.order.budget.seconds is not None:
                usage = self.store.usage(self.order_id)
            if grant is not None and grant.budget.seconds is not None:
                pass_usage = self.store.usage(self.order_id, scopes[-1].jtis)
            # Each pass above the caller's with a seconds budget: its clock runs from the
            # first call made under it or under any pass derived from it (a child issued
            # late must not outlast it).
            passes_above = [] if verified is None else [
                (link.jti, link.grant, self.store.usage(self.order_id, scope.jtis))
                for link, scope in zip(verified.chain[:-1], scopes[1:-1], strict=True)
                if link.grant.budget.seconds is not None]
            above = [(o, self.store.usage(o.id)) for o in self._timed_above]
            decision = decide(
                order=record.order, state=record.state, now=now, tool=canonical,
                requested=name, usage=usage, usd=usd, grant=grant, pass_usage=pass_usage,
                pass_problem=authority.problem, passes_above=passes_above,
                hold=[canonical] if hold and canonical else (),
                safe=self.safe, read_only=read_only, above=above,
                staging_above=self._staging_above, ended_above=self._ended_above(),
                unavailable=unavailable)
            if decision.action == "refuse":
                self._check_fresh(record)
                return self._refused(decision, tool=canonical or UNRESOLVED_TOOL,
                                     arguments=arguments, attempt=attempt, jti=jti,
                                     started=started)
            assert canonical is not None
            if verified is None and self._keeps_decisions(record, token, unavailable):
                self._keep_decision(record, name, canonical, decision, usd)
        assert canonical is not None
        reserved = self.store.reserve_call(
            self.order_id, attempt=attempt, tool=canonical, arguments=arguments, pass_jti=jti,
            usd=usd, started_at=started, scopes=scopes, seq=record.seq)
        if isinstance(reserved, OverBudget):
            hit = next((sc for sc in scopes if sc.name == reserved.scope), reserved.scope)
            return self._refused(budget_refusal(hit, self.order_id), tool=canonical,
                                 arguments=arguments, attempt=attempt, jti=jti, started=started)
        if decision.action == "hold":
            return self._hold(reserved.record, decision)
        return _Admission(decision, reserved.ref, reserved.attempt)

    # A decision to forward or hold depends on the order as read (its state, its log), the
    # catalog, the pass and the clock. Without a pass, a seconds budget, orders above or an
    # upstream that failed to start, the order's record and the catalog alone decide it
    # until the deadline: so it is kept per tool, for as long as that record is the one
    # read and the catalog is the one listed. (The budget's calls and usd are checked by
    # the store's reservation every time.)
    def _keeps_decisions(self, record: OrderRecord, token: str | None,
                         unavailable: str | None) -> bool:
        return (token is None and unavailable is None and not self._above_ids
                and record.order.budget.seconds is None)

    def _kept_decision(self, record: OrderRecord, name: str, canonical: str | None,
                       token: str | None, now: datetime,
                       unavailable: str | None) -> tuple[Decision, float] | None:
        """The decision kept for ``name`` on ``record`` that still holds at ``now``."""
        kept = self._decisions.get(name)
        if kept is None or kept[0] is not record or kept[1] != canonical or now >= kept[4]:
            return None
        if not self._keeps_decisions(record, token, unavailable):
            return None
        return kept[2], kept[3]

    def _keep_decision(self, record: OrderRecord, name: str, canonical: str,
                       decision: Decision, usd: float) -> None:
        self._decisions[name] = (record, canonical, decision, usd,
                                 parse_time(record.order.deadline))

    def _hold(self, record: CallRecord, decision: Decision) -> _Admission:
        """Check and store a held call. Runs in a worker thread."""
        mine = parse_ref(record.ref)
        assert mine is not None
        earlier: dict[str, CallRecord] = {}
        for call in self.store.calls(self.order_id, attempt=record.attempt):
            ref = parse_ref(call.ref)
            if call.outcome == "held" and ref is not None and ref.n < mine.n:
                earlier[str(ref)] = call
        tool = self._tools.get(record.tool)
        schema = tool.input_schema if tool is not None else None
        problems = check_arguments(record.arguments, schema, earlier=earlier)
        ended = format_time(self.now())
        if problems:
            text = (f"{AWL_INVALID_ARGUMENTS}: the call was not held because its arguments "
                    f"do not fit {record.tool}: " + "; ".join(problems)
                    + ". Fix them and call again.")
            self.store.finish_call(self.order_id, record.ref, outcome="error", result=None,
                                   error=text, ended_at=ended)
            # The call was made and counts, so it is answered with its ref like any other.
            answer = coded_error(text)
            answer.meta = {**(answer.meta or {}), META_REF: record.ref}
            return _Admission(refuse(AWL_INVALID_ARGUMENTS, text), record.ref, record.attempt,
                              answer)
        if matches_any(self.order.staged, record.tool):
            advice = (f"Held for the manager's approval, not run. List it in your report's "
                      f"effects as {{\"ref\": \"{record.ref}\", \"tool\": \"{record.tool}\", "
                      "\"arguments\": <exactly these arguments>}; a later held call may use "
                      f"{{\"$ref\": \"{record.ref}\", \"pointer\": \"/structuredContent/...\"}} "
                      "for a value from its future result.")
        else:
            advice = f"Recorded, not run. {held_note(record.tool, self.order)}"
        answer = types.CallToolResult(
            content=[
                types.TextContent(type="text", text=f"pending:{record.ref}"),
                types.TextContent(type="text", text=advice),
            ],
            structured_content={"pending": record.ref, "status": "held"},
            meta={META_REF: record.ref},
        )
        self.store.hold_call(self.order_id, record.ref, result=_wire(answer), ended_at=ended)
        return _Admission(decision, record.ref, record.attempt, answer)


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
