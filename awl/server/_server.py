"""The desk served over MCP, each connection bound to one principal.

:class:`DeskServer` wraps an :class:`~awl.desk.AsyncDesk` in a low-level MCP server whose
tools (:mod:`awl.server._tools`) act as the connection's principal: the one given at start
(stdio, in-process) or the one whose desk token authenticated the HTTP request. No tool
takes an actor argument, so an agent can neither approve its own work nor answer its own
questions by naming someone else (BIND-3, SEC-1). The desk decides what that principal may
do on each order; its refusals come back as tool errors with their code (BIND-4)::

    FORBIDDEN: agent:writer may not approve order 'wo_1': only its manager (human:ana) may

Reads are limited to the orders the principal is part of: as manager, worker or escalation
contact of the order or of an order it was split from.

What a write leaves dangling the desk itself tidies, whoever wrote: a rework drops the
held calls of the attempt it ends, an order that ends unapproved drops all its held calls
(CM-4), and every terminal state, approval included, revokes the order's Delegation Passes
(DP-8); the approved effects still commit, since the commit path refuses only a pass
revoked at or before the hold. The server adds nothing to that; it answers a write that
may have been followed by a ``drop`` event with the order as it stands after it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import cache
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import mcp_types as types
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from awl import __version__
from awl.desk import AsyncDesk, Desk, OrderView
from awl.desk.access import check_pass_deriver, check_pass_issuer
from awl.desk.access import roles as roles_of
from awl.desk.effects import list_effects
from awl.desk.settlement import settle
from awl.desk.tokens import check_principal, principal_for_token
from awl.documents.errors import (
    AWLError,
    BadRequest,
    Forbidden,
    debugging,
)
from awl.documents.lifecycle import TABLE, TERMINAL
from awl.documents.limits import INT64_MAX, check_integer, check_json_value
from awl.documents.models import Event, format_epoch, parse_time
from awl.documents.pointers import pointer
from awl.mcp.errors import ERROR_META, error_result, text_result, tool_error
from awl.mcp.frames import stdio_frames
from awl.mcp.transport import CannotAuthenticate, Unauthorized, identity_of, serve_http
from awl.passes import KeyStore, issue_recorded_pass, unverified_claims
from awl.server._tools import (
    INSTRUCTIONS,
    ORDER_TOOLS,
    TOOL_NAMES,
    TOOLS,
    argument_schema,
)
from awl.store.protocol import Store, Subscriptions

__all__ = ["ERROR_META", "WAIT_LIMIT", "DeskServer", "serve_desk_http", "serve_stdio",
           "tool_error"]

log = logging.getLogger("awl.server")

WAIT_LIMIT = 55.0
"""The longest ``wait_for_update`` holds a request, in seconds (BIND-2)."""
POLL_FIRST = 0.02
"""The first pause between store reads while waiting for news, in seconds."""
POLL_LIMIT = 0.25
"""The longest pause between store reads while waiting for news, in seconds."""
HEARD_WAITERS = 64
"""How many ``wait_for_update`` calls may wait at once on a store that hears every writer
(each holds a thread while it waits); more wait for a turn."""
HEARD_SLICE = 1.0
"""The longest one such wait lasts before reading the order again, in seconds (so a wait
given up leaves its thread within this)."""


Data = dict[str, Any]
Handler = Callable[[str, Data], Awaitable[tuple[Data, str]]]


def _internal_error(name: str, exc: Exception) -> types.CallToolResult:
    said = " ".join(str(exc).split())[:300]
    log.error("awl serve: tool %s failed unexpectedly: %s: %s", name, type(exc).__name__, said,
              exc_info=debugging())
    message = (f"the desk failed unexpectedly ({type(exc).__name__}); the operation may or "
               "may not have been written: read the order again before retrying")
    return error_result(f"INTERNAL: {message}", {"code": "INTERNAL", "message": message})


@cache
def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(argument_schema(name))


def _check_arguments(name: str, arguments: Mapping[str, Any]) -> None:
    errors = sorted(_validator(name).iter_errors(dict(arguments)),
                    key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        parts = [f"{pointer(*e.absolute_path) or 'arguments'}: {e.message}"
                 for e in errors[:5]]
        raise BadRequest(f"bad arguments for {name}: {'; '.join(parts)}; see the tool's "
                         "input schema")


@cache
def _integer_ranges(name: str) -> dict[str, tuple[int, int]]:
    properties = argument_schema(name).get("properties", {})
    return {key: (int(spec.get("minimum", -INT64_MAX - 1)),
                  min(int(spec.get("maximum", INT64_MAX)), INT64_MAX))
            for key, spec in properties.items() if spec.get("type") == "integer"}


def _whole_numbers(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments with each integer one an ``int`` within 64 bits (DOC-5, DOC-12):
    ``2.0`` is 2, and ``2**63`` is refused before it reaches the store."""
    out = dict(arguments)
    for key, (low, high) in _integer_ranges(name).items():
        if key in out:
            out[key] = check_integer(out[key], name=key, minimum=low, maximum=high)
    return out


def _next_tools(state: str, roles: Sequence[str]) -> list[str]:
    out: list[str] = []
    for (from_, action, _to), role in TABLE.items():
        tool = ORDER_TOOLS.get(action)
        if from_ == state and tool is not None and role in roles and tool not in out:
            out.append(tool)
    return out


def _view(view: OrderView, principal: str) -> Data:
    roles = roles_of(view.order, principal)
    data = view.to_json()
    data.update(open_questions=list(view.open_questions), your_roles=roles,
                next_tools=_next_tools(view.state, roles))
    return data


def _summary(view: OrderView, principal: str) -> Data:
    order = view.order
    roles = roles_of(order, principal)
    return {"id": order.id, "goal": order.goal, "from": order.manager, "to": order.to,
            "state": view.state, "seq": view.seq, "attempt": view.attempt,
            "deadline": order.deadline, "updated_at": view.updated_at,
            "open_questions": list(view.open_questions), "your_roles": roles,
            "next_tools": _next_tools(view.state, roles)}


class DeskServer:
    """The desk's MCP server; serve :attr:`server` over stdio, HTTP or in-process.

    Args:
        desk: The desk (an :class:`~awl.desk.AsyncDesk`, a :class:`~awl.desk.Desk`, or
            a store to open one on).
        principal: Who every request acts as; None when each request brings its own
            identity (HTTP with desk tokens, see :func:`awl.server.serve_desk_http`).
        keys: The desk's signing keys, for ``issue_delegation_pass``; None refuses passes.

    Raises:
        BadRequest: ``principal`` cannot act on the desk (empty, or an ``awl:`` name).
    """

    def __init__(self, desk: AsyncDesk | Desk | Store, *, principal: str | None = None,
                 keys: KeyStore | None = None) -> None:
        if isinstance(desk, AsyncDesk):
            self.desk = desk
        elif isinstance(desk, Desk):
            self.desk = AsyncDesk.of(desk)
        else:
            self.desk = AsyncDesk(desk)
        self.principal = None if principal is None else check_principal(principal)
        self.keys = keys
        self._handlers: dict[str, Handler] = {
            "create_work_order": self._create,
            "list_work_orders": self._list,
            "get_work_order": self._get,
            "accept_work_order": self._accept,
            "decline_work_order": self._decline,
            "start_work_order": self._start,
            "post_progress": self._progress,
            "submit_work_report": self._report,
            "answer_question": self._answer,
            "review_work_report": self._review,
            "cancel_work_order": self._cancel,
            "wait_for_update": self._wait,
            "issue_delegation_pass": self._issue_pass,
            "get_track_record": self._track,
            "get_handoff": self._handoff,
            "list_effects": self._list_effects,
            "settle_effect": self._settle,
        }
        assert tuple(self._handlers) == TOOL_NAMES, "every published tool has a handler"
        self._tools = [spec.tool() for spec in TOOLS]
        self._changed = anyio.Event()
        self._heard: anyio.CapacityLimiter | None = None
        schemas = {spec.name: spec.input_schema for spec in TOOLS}
        self.server: Server[Any] = Server(
            "awl-desk", version=__version__, title="AWL work-order desk",
            instructions=INSTRUCTIONS, on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool, get_tool_input_schema=schemas.get)

    @property
    def store(self) -> Store:
        """The desk's store."""
        return self.desk.store

    # ------------------------------------------------------------------ MCP handlers

    async def _on_list_tools(self, ctx: ServerRequestContext[Any],
                             params: types.PaginatedRequestParams | None
                             ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(self._tools))

    async def _on_call_tool(self, ctx: ServerRequestContext[Any],
                            params: types.CallToolRequestParams) -> types.CallToolResult:
        return await self.call(params.name, dict(params.arguments or {}),
                               actor=self._actor(ctx))

    def _actor(self, ctx: ServerRequestContext[Any]) -> str | None:
        identity = identity_of(ctx)
        return identity if isinstance(identity, str) else self.principal

    async def call(self, name: str, arguments: Mapping[str, Any], *,
                   actor: str | None) -> types.CallToolResult:
        """Run one tool as ``actor``; refusals come back as tool errors with their code.

        Args:
            name: The tool.
            arguments: Its arguments.
            actor: The connection's principal (None: refused, nobody to act as).
        """
        handler = self._handlers.get(name)
        try:
            if handler is None:
                raise BadRequest(f"the desk has no tool {name!r}; its tools are "
                                 f"{', '.join(TOOL_NAMES)}")
            if actor is None:
                raise Forbidden("this connection is bound to no principal; start the server "
                                "with --as PRINCIPAL or send a desk token",
                                actor="", action=name)
            # Values JSON cannot carry (NaN, a lone surrogate) never reach a tool: the wire
            # refuses them (SEC-9), and so does this, for in-process callers.
            plain = check_json_value(dict(arguments), where=f"the arguments of {name}")
            _check_arguments(name, plain)
            data, summary = await handler(actor, _whole_numbers(name, plain))
        except AWLError as exc:
            return tool_error(exc)
        except Exception as exc:  # a bug must reach the model as an error, not kill the server
            return _internal_error(name, exc)
        finally:
            # Reads may write too (an order found past its deadline expires), so every call
            # wakes the waiters; a needless wake-up costs one store read.
            self._notify()
        text = f"{summary}\n{json.dumps(data, ensure_ascii=False)}"
        return text_result(text, structured=data)

    # ------------------------------------------------------------------ helpers

    async def _visible(self, order_id: str, actor: str) -> OrderView:
        """The order, if ``actor`` is part of it or of an order it was split from."""
        return await self.desk.get(order_id, viewer=actor)

    async def _written(self, view: OrderView, actor: str, *,
                       ended_attempt: bool = False) -> tuple[Data, str]:
        """The answer to a write.

        A write that ended an attempt, or ended the order unapproved, may be followed by
        the desk's ``drop`` event, so the answer reads the order again to show its latest
        event.
        """
        if ended_attempt or (view.state in TERMINAL and view.state != "approved"):
            view = await self.desk.get(view.id)
        return _view(view, actor), f"order {view.id} is {view.state} (event {view.seq})"

    # ------------------------------------------------------------------ tools

    async def _create(self, actor: str, args: Data) -> tuple[Data, str]:
        order: Data = args["order"]
        view = await self.desk.create(order, actor,
                                      copy_handoff=bool(args.get("copy_handoff", False)))
        return _view(view, actor), f"order {view.id} offered to {view.order.to}"

    async def _list(self, actor: str, args: Data) -> tuple[Data, str]:
        role = args.get("role", "any")
        state = args.get("state")
        limit, offset = args.get("limit", 50), args.get("offset", 0)
        before = args.get("before")
        wanted = None if state is None else {state} if isinstance(state, str) else set(state)
        orders: list[Data]
        more: dict[str, str] = {}
        if role == "answerer":
            # The queue's own page, read by its key however deep (BIND-20).
            if before is not None or offset:
                raise BadRequest("role=answerer pages by after= (the next of the page "
                                 "before), not by before or offset")
            page = await self.desk.questions(actor, limit=limit, after=args.get("after"))
            orders = []
            for q in page.questions:
                view = await self.desk.get(q.order_id)
                if wanted is None or view.state in wanted:
                    orders.append({**_summary(view, actor), "blocking": q.blocking})
            if page.next is not None:
                more["next"] = page.next
        else:
            if args.get("after") is not None:
                raise BadRequest("after= pages role=answerer; other roles page by before= "
                                 "(the last order_id of the page before)")
            # The desk's own page, found by index however deep the offset or cursor
            # (BIND-18), rather than every order up to it read in full.
            found = await self.desk.list(
                state=state, limit=limit, offset=offset, before=before,
                manager=actor if role == "manager" else None,
                worker=actor if role == "worker" else None,
                party=actor if role == "any" else None)
            orders = [_summary(v, actor) for v in found]
        return ({"role": role, "orders": orders, "count": len(orders), **more},
                f"{len(orders)} order(s)" + ("; more: give after=next" if more else ""))

    async def _get(self, actor: str, args: Data) -> tuple[Data, str]:
        view = await self._visible(args["order_id"], actor)
        data = _view(view, actor)
        data["open_questions"] = list(await self.desk.open_questions(view))
        if args.get("include_events"):
            data["events"] = [e.to_json() for e in await self.desk.events(view.id)]
        return data, f"order {view.id} is {view.state} (event {view.seq})"

    async def _accept(self, actor: str, args: Data) -> tuple[Data, str]:
        return await self._written(await self.desk.accept(args["order_id"], actor), actor)

    async def _decline(self, actor: str, args: Data) -> tuple[Data, str]:
        view = await self.desk.decline(args["order_id"], actor, args.get("reason"))
        return await self._written(view, actor)

    async def _start(self, actor: str, args: Data) -> tuple[Data, str]:
        return await self._written(await self.desk.start(args["order_id"], actor), actor)

    async def _progress(self, actor: str, args: Data) -> tuple[Data, str]:
        view = await self.desk.progress(args["order_id"], actor, args["note"],
                                        args.get("percent"))
        return await self._written(view, actor)

    async def _report(self, actor: str, args: Data) -> tuple[Data, str]:
        view = await self.desk.report(args["order_id"], actor, args["report"])
        return await self._written(view, actor)

    async def _answer(self, actor: str, args: Data) -> tuple[Data, str]:
        view = await self.desk.answer(args["order_id"], actor, args["answer"])
        return await self._written(view, actor)

    async def _review(self, actor: str, args: Data) -> tuple[Data, str]:
        decision = args["decision"]
        effects = args.get("effects")
        if decision == "rework" and effects is not None:
            raise BadRequest("a rework runs no effects; leave effects out, or approve instead")
        view = await self.desk.review(args["order_id"], actor, decision, args.get("reason"),
                                      effects=effects, attempt=args.get("attempt"))
        return await self._written(view, actor, ended_attempt=decision == "rework")

    async def _cancel(self, actor: str, args: Data) -> tuple[Data, str]:
        view = await self.desk.cancel(args["order_id"], actor, args["reason"])
        return await self._written(view, actor)

    async def _wait(self, actor: str, args: Data) -> tuple[Data, str]:
        order_id = args["order_id"]
        after = args.get("after_seq", 0)
        await self._visible(order_id, actor)
        timeout = min(float(args.get("timeout_seconds", 25)), WAIT_LIMIT)
        events = await self._events_after(order_id, after, timeout)
        view = await self.desk.get(order_id)
        data = {"order_id": order_id, "state": view.state, "seq": view.seq,
                "events": [e.to_json() for e in events], "timed_out": not events}
        summary = (f"{len(events)} new event(s); order {order_id} is {view.state}" if events
                   else f"no news after event {after} within {timeout:g} s")
        return data, summary

    async def _events_after(self, order_id: str, after: int, timeout: float) -> list[Event]:
        """The order's events after ``after``, waiting up to ``timeout`` s for the first.

        Writes through this server wake the wait at once. Writes by other processes (the
        other side's ``awl serve``, a gateway, the CLI) wake it at once too when the store
        has :class:`~awl.store.protocol.Subscriptions` (the PostgreSQL store hears them by
        ``LISTEN``), which it then waits on in a thread; with any other store they are
        found by polling it with a pause that grows to :data:`POLL_LIMIT`, and no thread
        is held while waiting.
        """
        pause = POLL_FIRST
        heard = self.store if isinstance(self.store, Subscriptions) else None
        if heard is not None and self._heard is None:
            self._heard = anyio.CapacityLimiter(HEARD_WAITERS)
        with anyio.move_on_after(timeout):
            while True:
                changed = self._changed  # taken before reading, so no wake-up is lost
                view = await self.desk.get(order_id)
                if view.seq > after:
                    return await self.desk.events(order_id, after)
                nap = pause if heard is None else HEARD_SLICE
                if view.active:  # wake at the deadline, when reading expires the order
                    left = (parse_time(view.order.deadline) - self.desk.desk.now())
                    nap = min(nap, max(left.total_seconds(), 0.0) + 0.001)
                if heard is not None:
                    await anyio.to_thread.run_sync(heard.wait_for_events, order_id, after, nap,
                                                   limiter=self._heard, abandon_on_cancel=True)
                    continue
                with anyio.move_on_after(nap):
                    await changed.wait()
                pause = min(pause * 2, POLL_LIMIT)
        return []

    def _notify(self) -> None:
        """Wake every ``wait_for_update`` of this server: something was written."""
        self._changed.set()
        self._changed = anyio.Event()

    async def _issue_pass(self, actor: str, args: Data) -> tuple[Data, str]:
        if self.keys is None:
            raise BadRequest("this desk server has no signing keys; start it with a home "
                             "folder (awl serve --home DIR) to issue passes")
        view = await self._visible(args["order_id"], actor)
        order = view.order
        parent = args.get("parent_token")
        subject = args.get("subject")
        if parent is None:
            check_pass_issuer(order, actor)
            subject = subject or order.to
        else:
            check_pass_deriver(actor, unverified_claims(parent)[1].get("sub"))
            if subject is None:
                raise BadRequest("name the sub-agent who will hold the derived pass (subject)")
        keys = self.keys
        token = await anyio.to_thread.run_sync(lambda: issue_recorded_pass(
            self.store, order.id, keys=keys, subject=subject, audience=args.get("audience"),
            tools=args.get("tools"), budget=args.get("budget"),
            expires_in=args.get("expires_in_seconds"), parent_token=parent,
            now=self.desk.desk.now()))
        claims = unverified_claims(token)[1]
        grant = claims["grant"]
        data: Data = {
            "token": token, "jti": claims["jti"], "order_id": grant["order_id"],
            "subject": claims["sub"], "audience": claims["aud"], "issued_at": claims["iat"],
            "expires_at": claims["exp"], "expires": format_epoch(claims["exp"]),
            "tools": list(grant["tools"]), "budget": dict(grant["budget"]),
        }
        if grant.get("parent_jti"):
            data["parent_jti"] = grant["parent_jti"]
        return data, f"pass {data['jti']} for {data['subject']}, until {data['expires']}"

    async def _track(self, actor: str, args: Data) -> tuple[Data, str]:
        worker = args.get("worker", actor)
        record = await self.desk.track(worker, viewer=actor)
        data = record.to_json()
        return data, f"{worker}: {record.orders} order(s), {record.approved} approved"

    async def _handoff(self, actor: str, args: Data) -> tuple[Data, str]:
        view = await self._visible(args["order_id"], actor)
        markdown = await self.desk.handoff(view.id)
        return ({"order_id": view.id, "state": view.state, "markdown": markdown},
                f"handoff briefing of order {view.id}")

    async def _list_effects(self, actor: str, args: Data) -> tuple[Data, str]:
        view = await self._visible(args["order_id"], actor)
        effects = await anyio.to_thread.run_sync(
            lambda: list_effects(view.id, store=self.store))
        data = {"order_id": view.id, "effects": [e.to_json() for e in effects]}
        return data, f"{len(effects)} effect(s) of order {view.id}"

    async def _settle(self, actor: str, args: Data) -> tuple[Data, str]:
        order_id = args["order_id"]
        effect = await anyio.to_thread.run_sync(lambda: settle(
            order_id, args["ref"], args["verdict"], args["evidence"], actor,
            store=self.store, desk=self.desk.desk))
        return ({"order_id": order_id, "effect": effect.to_json()},
                f"effect {effect.ref} settled as {args['verdict']}")


# --------------------------------------------------------------------------- serving


async def serve_stdio(desk_server: DeskServer) -> None:
    """Serve the desk to one client over this process's stdin and stdout.

    Stdout is then the protocol stream: nothing else may be printed there.
    """
    server = desk_server.server
    async with stdio_frames() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_desk_http(
    desk_server: DeskServer,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    allow_remote: bool = False,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the desk over streamable HTTP until cancelled; each request acts as the
    principal its desk token (``Authorization: Bearer awl_...``) was issued to.

    Args:
        desk_server: A server built without a fixed principal.
        host: Loopback unless ``allow_remote``.
        port: 0 picks a free one.
        allow_remote: Allow a non-loopback address.
        task_status: Started with the endpoint URL.

    Raises:
        BadRequest: The server has a fixed principal, or the address cannot be served.
    """
    if desk_server.principal is not None:
        raise BadRequest("over HTTP each request acts as its token's principal; build the "
                         "server without a principal")
    store = desk_server.store

    async def authenticate(token: str | None) -> str:
        if token is None:
            raise Unauthorized("send a desk token as 'Authorization: Bearer <token>'; "
                               "`awl token issue PRINCIPAL` makes one")
        try:
            principal = await anyio.to_thread.run_sync(principal_for_token, store, token)
        except Exception as exc:
            # A store that fails (a database gone, a damaged desk file) must not turn every
            # request into a traceback and a bare 500: it fails closed, in one line each way.
            log.warning("cannot check a desk token: the store failed (%s: %s)",
                        type(exc).__name__, exc)
            raise CannotAuthenticate(
                "the desk could not check this token just now: its store failed "
                f"({type(exc).__name__}); try again, and tell the desk's operator if it goes "
                "on") from None
        if principal is None:
            raise Unauthorized("this token was not issued by this desk; ask for a new one "
                               "with `awl token issue PRINCIPAL`")
        return principal

    await serve_http(desk_server.server, host, port, authenticate, allow_remote=allow_remote,
                     task_status=task_status)
