"""What passes between an upstream and the worker besides requests and answers (GW-13..GW-15).

During a forwarded call the upstream may send progress, log messages, and requests of its
own (sampling, elicitation, roots); a 2026-07-28 upstream asks for the same input by
answering ``input_required``. The gateway governs none of it, so it passes it on:

- Progress of a forwarded request reaches the worker's request as progress of that request.
- Log messages, and the upstream's own requests, carry no call of their own on the wire. They
  go to the worker whose forwarded calls to that server are in flight, on the oldest such
  call. When no call to that server is in flight, or calls of more than one caller (worker
  or pass holder) are, a request is refused with an error that says so and a log message
  goes to the gateway's log only: nothing reaches a worker it may not belong to.
- A request the worker's connection cannot carry (a 2026-07-28 connection carries none) or
  whose capability the worker did not declare is refused with a JSON-RPC error saying so.

:class:`Relay` keeps the calls in flight and makes the handlers each upstream connection
uses (:class:`~gateway._upstream.UpstreamHandlers`).
"""

from __future__ import annotations

import logging
import warnings
import weakref
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.client.session import ClientRequestContext
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway._upstream import UpstreamHandlers

__all__ = ["LOG_LEVELS", "InFlight", "Relay", "worker_is_modern"]

log = logging.getLogger("awl.gateway.relay")

LOG_LEVELS: tuple[types.LoggingLevel, ...] = (
    "debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""Log levels from least to most severe."""

InputRequest = types.CreateMessageRequest | types.ElicitRequest | types.ListRootsRequest


def worker_is_modern(ctx: ServerRequestContext[Any] | None) -> bool:
    """Whether the worker's request came over a 2026-07-28 (stateless) connection."""
    return ctx is not None and ctx.session.protocol_version in MODERN_PROTOCOL_VERSIONS


@dataclass(eq=False)
class InFlight:
    """One forwarded call waiting for its upstream's answer."""

    server: str
    ctx: ServerRequestContext[Any]
    caller: str | None
    """Who the call runs as (the pass token, None for the order's worker)."""


class _Forwarding:
    """A call in flight in ``calls`` while the block runs (a plain class: it is entered on
    every forwarded call, and a generator-based context manager costs several times more)."""

    __slots__ = ("call", "calls")

    def __init__(self, calls: list[InFlight], call: InFlight) -> None:
        self.calls = calls
        self.call = call

    def __enter__(self) -> None:
        self.calls.append(self.call)

    def __exit__(self, *exc: object) -> None:
        self.calls.remove(self.call)


_NOT_IN_FLIGHT: AbstractContextManager[None] = nullcontext()
"""A call with no worker request behind it (an in-process caller) has nothing to relay to."""


@dataclass
class Relay:
    """The calls in flight per upstream server, and where what an upstream sends goes."""

    level: types.LoggingLevel = "debug"
    """The least severe log level a handshake-era worker gets until it sends
    ``logging/setLevel``."""
    _calls: dict[str, list[InFlight]] = field(default_factory=dict)
    _levels: weakref.WeakKeyDictionary[Any, types.LoggingLevel] = field(
        default_factory=weakref.WeakKeyDictionary)
    """Each worker connection's own ``logging/setLevel`` (over HTTP, each session's): one
    worker's level never changes what another gets (GW-14)."""

    @staticmethod
    def _connection(ctx: ServerRequestContext[Any]) -> Any:
        # The SDK's per-request session names its connection only privately; a session
        # without one stands for itself.
        return getattr(ctx.session, "_connection", ctx.session)

    def set_level(self, ctx: ServerRequestContext[Any], level: types.LoggingLevel) -> None:
        """The worker connection of ``ctx`` asked for log messages at ``level`` and above."""
        try:
            self._levels[self._connection(ctx)] = level
        except TypeError:  # a connection that cannot be weakly referenced
            self.level = level

    def level_of(self, ctx: ServerRequestContext[Any]) -> types.LoggingLevel:
        """The least severe log level the worker connection of ``ctx`` gets."""
        try:
            return self._levels.get(self._connection(ctx), self.level)
        except TypeError:
            return self.level

    def forwarding(self, server: str, ctx: ServerRequestContext[Any] | None,
                   caller: str | None) -> AbstractContextManager[None]:
        """Mark a call to ``server`` in flight for as long as the block runs."""
        if ctx is None:
            return _NOT_IN_FLIGHT
        return _Forwarding(self._calls.setdefault(server, []), InFlight(server, ctx, caller))

    def _target(self, server: str) -> tuple[InFlight | None, str]:
        """The call something from ``server`` belongs to, or None and why there is none."""
        calls = self._calls.get(server) or []
        if not calls:
            return None, f"no call to upstream {server!r} is in flight"
        if len({c.caller for c in calls}) > 1:
            return None, (f"calls of more than one caller to upstream {server!r} are in "
                          "flight, so the gateway cannot tell whose this is")
        return calls[0], ""

    # ------------------------------------------------------------------ progress

    @staticmethod
    def progress(ctx: ServerRequestContext[Any] | None) -> Any:
        """A progress callback for one forwarded request: passes each report on to the
        worker's request (a no-op when the worker asked for no progress)."""
        if ctx is None:
            return None

        async def report(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

        return report

    # ------------------------------------------------------------------ requests

    async def ask_worker(self, ctx: ServerRequestContext[Any], request: InputRequest,
                         *, server: str) -> Any:
        """Send one of an upstream's input requests to the worker; its result, or
        :class:`~mcp_types.ErrorData` saying why the worker cannot be asked."""
        method = request.method
        if not ctx.session.can_send_request:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message=f"upstream {server!r} sent {method}, but the worker's connection "
                        f"({ctx.session.protocol_version}) cannot carry requests to the "
                        "worker; the gateway refused it")
        capability = {
            "sampling/createMessage": types.ClientCapabilities(sampling=types.SamplingCapability()),
            "elicitation/create": types.ClientCapabilities(
                elicitation=types.ElicitationCapability()),
            "roots/list": types.ClientCapabilities(roots=types.RootsCapability()),
        }[method]
        if not ctx.session.check_client_capability(capability):
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message=f"upstream {server!r} sent {method}, which the worker did not declare "
                        "it can answer; the gateway refused it")
        result_type: Any = {
            "sampling/createMessage": types.CreateMessageResult,
            "elicitation/create": types.ElicitResult,
            "roots/list": types.ListRootsResult,
        }[method]
        try:
            return await ctx.session.send_request(
                request, result_type,
                metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
        except MCPError as exc:
            return exc.error

    async def _relay(self, server: str, request: InputRequest) -> Any:
        call, why = self._target(server)
        if call is None:
            return types.ErrorData(code=types.INVALID_REQUEST,
                                   message=f"{request.method} refused by the gateway: {why}; "
                                           "it passes requests on only during a call")
        return await self.ask_worker(call.ctx, request, server=server)

    async def answer_rounds(self, ctx: ServerRequestContext[Any], server: str,
                            asked: types.InputRequiredResult) -> dict[str, Any]:
        """Ask the worker each input request of an ``input_required`` round; the responses
        by key. Raises MCPError when the worker refuses one (or cannot be asked)."""
        responses: dict[str, Any] = {}
        for key, request in (asked.input_requests or {}).items():
            answer = await self.ask_worker(ctx, request, server=server)
            if isinstance(answer, types.ErrorData):
                raise MCPError.from_error_data(answer)
            responses[key] = answer
        return responses

    # ------------------------------------------------------------------ logging

    async def _log(self, server: str, params: types.LoggingMessageNotificationParams) -> None:
        call, why = self._target(server)
        if call is None:
            log.info("upstream %s logged (%s; not passed on: %s): %s", server, params.level,
                     why, params.data)
            return
        session = call.ctx.session
        if (session.protocol_version not in MODERN_PROTOCOL_VERSIONS
                and LOG_LEVELS.index(params.level) < LOG_LEVELS.index(self.level_of(call.ctx))):
            return
        # A 2026-07-28 worker's own opt-in (its request's _meta) is applied by the SDK.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await session.send_log_message(params.level, params.data, logger=params.logger,
                                           related_request_id=call.ctx.request_id)

    def handlers(self, server: str) -> UpstreamHandlers:
        """What the connection to ``server`` does with what that server sends."""

        async def sampling(context: ClientRequestContext,
                           params: types.CreateMessageRequestParams) -> Any:
            return await self._relay(server, types.CreateMessageRequest(params=params))

        async def elicitation(context: ClientRequestContext,
                              params: types.ElicitRequestParams) -> Any:
            return await self._relay(server, types.ElicitRequest(params=params))

        async def list_roots(context: ClientRequestContext) -> Any:
            return await self._relay(server, types.ListRootsRequest())

        async def logging_message(params: types.LoggingMessageNotificationParams) -> None:
            await self._log(server, params)

        return UpstreamHandlers(sampling=sampling, elicitation=elicitation,
                                list_roots=list_roots, logging=logging_message)
