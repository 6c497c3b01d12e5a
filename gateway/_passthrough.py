"""Resources, prompts and completions through the gateway (GW-16).

They are reads: nothing runs that the order's budget or staging would govern, so they are
neither counted nor recorded as calls. They are governed by servers instead: the
resources, prompts and completions of an upstream server are offered only when the order's
``tools`` (and the pass's, under a pass) cover every tool of that server (``server/*`` or
``*``), the caller's pass verifies, and the order is accepted or working before its deadline.
Any other request for them is answered with a JSON-RPC error naming the reason.

URIs and prompt names are passed through unchanged, and so is an upstream's JSON-RPC error
(a resource it does not have, say). The request's ``_meta`` goes on without the keys that
describe the worker's own connection (protocol-reserved keys, its progress token) and
without ``awl/*`` keys, which only the gateway sets: a worker cannot make a read look like
a recorded call (``awl/ref``) or another order's to an upstream. Which server a URI belongs to is
learned from what the servers list: an exact resource URI first, then a matching resource
template, then the only open server that offers resources. A prompt name two open servers
both use goes to the first in the configuration (the other is logged and not listed).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

from awl.documents import WorkOrder, covered_by_any
from gateway._authority import Authority
from gateway._config import GatewayConfig
from gateway._upstream import UpstreamError, UpstreamPool, UpstreamRejected, clean_meta

__all__ = ["Passthrough"]

log = logging.getLogger("awl.gateway.passthrough")

_PAGES = 100
_ItemT = TypeVar("_ItemT")
_ParamsT = TypeVar("_ParamsT", bound=types.RequestParams)


def _forwarded(params: _ParamsT) -> _ParamsT:
    """``params`` as sent upstream: its ``_meta`` without the worker connection's own keys
    (:func:`~gateway._upstream.clean_meta`) and without ``awl/*`` keys (GW-16)."""
    meta = clean_meta(params.meta)
    if meta is not None:
        meta = {k: v for k, v in meta.items() if not k.startswith("awl/")} or None
    if meta == params.meta:
        return params
    return params.model_copy(update={"meta": meta})


def _refuse(message: str, code: int = types.INVALID_PARAMS) -> MCPError:
    return MCPError(code=code, message=message)


class Governor(Protocol):
    """What the pass-through handlers need of their gateway (a :class:`~gateway.Gateway`
    is one): who a request runs as, whether the order is active, and the upstreams."""

    pool: UpstreamPool
    config: GatewayConfig

    @property
    def order(self) -> WorkOrder:
        """The order."""
        ...

    async def authority(self, ctx: ServerRequestContext[Any] | None) -> Authority:
        """Who the request in ``ctx`` runs as, checked now."""
        ...

    async def inactive_reason(self) -> str | None:
        """``CODE: why`` when calls may not run now; None while they may."""
        ...


class Passthrough:
    """The gateway's handlers for ``resources/*``, ``prompts/*`` and ``completion/complete``."""

    def __init__(self, gateway: Governor) -> None:
        self._gw = gateway
        self._resource_server: dict[str, str] = {}
        self._templates: dict[str, list[UriTemplate]] = {}
        self._prompt_server: dict[str, str] = {}

    def handlers(self) -> dict[str, Any]:
        """The ``on_*`` arguments of the gateway's :class:`~mcp.server.Server`."""
        return {
            "on_list_resources": self.list_resources,
            "on_list_resource_templates": self.list_templates,
            "on_read_resource": self.read_resource,
            "on_list_prompts": self.list_prompts,
            "on_get_prompt": self.get_prompt,
            "on_completion": self.complete,
        }

    # ------------------------------------------------------------------ governance

    async def open_servers(self, ctx: ServerRequestContext[Any], capability: str) -> list[str]:
        """The servers whose ``capability`` (``resources``, ``prompts``, ``completions``) this
        caller may use, in config order; MCPError when the caller may use none at all."""
        gw = self._gw
        authority = await gw.authority(ctx)
        if authority.problem is not None:
            raise _refuse(f"AWL_PASS_INVALID: {authority.problem}", types.INVALID_REQUEST)
        problem = await gw.inactive_reason()
        if problem is not None:
            raise _refuse(problem, types.INVALID_REQUEST)
        grant = authority.verified.claims.grant if authority.verified else None
        # Upstreams start in the background: wait for them as tools/list does (GW-17).
        await gw.pool.wait_started(gw.config.gateway.startup_wait)
        open_: list[str] = []
        for server in gw.pool.servers:
            whole = f"{server}/*"
            if not covered_by_any(gw.order.tools, whole):
                continue
            if grant is not None and not covered_by_any(grant.tools, whole):
                continue
            caps = gw.pool.capabilities(server)
            if caps is not None and getattr(caps, capability) is not None:
                open_.append(server)
        return open_

    async def _one(self, ctx: ServerRequestContext[Any], capability: str, server: str | None,
                   what: str) -> str:
        """``server`` if this caller may use its ``capability``, else MCPError."""
        open_ = await self.open_servers(ctx, capability)
        if server is None:
            if len(open_) == 1:
                return open_[0]
            raise _refuse(f"{what}: no server this order covers whole (server/*) offers it; "
                          "list first, or ask the manager for an order that covers the server")
        if server not in open_:
            raise _refuse(f"{what}: it belongs to upstream {server!r}, and this order does not "
                          f"cover every tool of it ({server}/*), so the gateway does not pass "
                          f"its {capability} on")
        return server

    async def _ask(self, server: str, request: Any, result_type: Any, what: str) -> Any:
        try:
            return await self._gw.pool.request(server, request, result_type, what=what)
        except UpstreamRejected as exc:
            if exc.rpc_code is None or exc.rpc_message is None:
                raise _refuse(exc.refusal, types.INTERNAL_ERROR) from None
            # The upstream's own error (resource not found, bad arguments) is its answer.
            raise MCPError(code=exc.rpc_code, message=exc.rpc_message,
                           data=exc.rpc_data) from None
        except UpstreamError as exc:
            raise _refuse(exc.refusal, types.INTERNAL_ERROR) from None

    async def _collect(
        self, servers: list[str],
        list_once: Callable[[str, str | None], Awaitable[tuple[list[_ItemT], str | None]]],
    ) -> list[tuple[str, _ItemT]]:
        items: list[tuple[str, _ItemT]] = []
        for server in servers:
            cursor: str | None = None
            try:
                for _ in range(_PAGES):
                    page, cursor = await list_once(server, cursor)
                    items.extend((server, item) for item in page)
                    if not cursor:
                        break
            except MCPError as exc:
                log.warning("upstream %s: cannot list: %s", server, exc.error.message)
        return items

    @staticmethod
    def _page(cursor: str | None) -> types.PaginatedRequestParams | None:
        return types.PaginatedRequestParams(cursor=cursor) if cursor else None

    # ------------------------------------------------------------------ resources

    async def list_resources(self, ctx: ServerRequestContext[Any],
                             params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        async def once(server: str, cursor: str | None) -> tuple[list[types.Resource], str | None]:
            page = await self._ask(server, types.ListResourcesRequest(params=self._page(cursor)),
                                   types.ListResourcesResult, "resources/list")
            return page.resources, page.next_cursor

        found = await self._collect(await self.open_servers(ctx, "resources"), once)
        for server, resource in found:
            self._resource_server.setdefault(str(resource.uri), server)
        return types.ListResourcesResult(resources=[r for _s, r in found])

    async def list_templates(self, ctx: ServerRequestContext[Any],
                             params: types.PaginatedRequestParams | None
                             ) -> types.ListResourceTemplatesResult:
        async def once(server: str, cursor: str | None
                       ) -> tuple[list[types.ResourceTemplate], str | None]:
            page = await self._ask(
                server, types.ListResourceTemplatesRequest(params=self._page(cursor)),
                types.ListResourceTemplatesResult, "resources/templates/list")
            return page.resource_templates, page.next_cursor

        found = await self._collect(await self.open_servers(ctx, "resources"), once)
        self._remember_templates(found)
        return types.ListResourceTemplatesResult(resource_templates=[t for _s, t in found])

    def _remember_templates(self, found: list[tuple[str, types.ResourceTemplate]]) -> None:
        templates: dict[str, list[UriTemplate]] = {}
        for server, template in found:
            try:
                templates.setdefault(server, []).append(UriTemplate.parse(template.uri_template))
            except InvalidUriTemplate:
                log.warning("upstream %s: resource template %r cannot be parsed", server,
                            template.uri_template)
        self._templates = templates

    def _owner(self, uri: str) -> str | None:
        server = self._resource_server.get(uri)
        if server is not None:
            return server
        for name, templates in self._templates.items():
            if any(t.match(uri) is not None for t in templates):
                return name
        return None

    async def read_resource(self, ctx: ServerRequestContext[Any],
                            params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        what = f"resources/read of {uri}"
        server = await self._one(ctx, "resources", self._owner(uri), what)
        result: types.ReadResourceResult = await self._ask(
            server, types.ReadResourceRequest(params=_forwarded(params)),
            types.ReadResourceResult, what)
        return result

    # ------------------------------------------------------------------ prompts

    async def list_prompts(self, ctx: ServerRequestContext[Any],
                           params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        async def once(server: str, cursor: str | None) -> tuple[list[types.Prompt], str | None]:
            page = await self._ask(server, types.ListPromptsRequest(params=self._page(cursor)),
                                   types.ListPromptsResult, "prompts/list")
            return page.prompts, page.next_cursor

        shown: list[types.Prompt] = []
        for server, prompt in await self._collect(await self.open_servers(ctx, "prompts"), once):
            owner = self._prompt_server.setdefault(prompt.name, server)
            if owner == server:
                shown.append(prompt)
            else:
                log.warning("prompt %r of upstream %s is not listed: upstream %s has one of "
                            "that name", prompt.name, server, owner)
        return types.ListPromptsResult(prompts=shown)

    async def get_prompt(self, ctx: ServerRequestContext[Any],
                         params: types.GetPromptRequestParams) -> types.GetPromptResult:
        what = f"prompts/get of {params.name!r}"
        server = await self._one(ctx, "prompts", self._prompt_server.get(params.name), what)
        result: types.GetPromptResult = await self._ask(
            server, types.GetPromptRequest(params=_forwarded(params)), types.GetPromptResult,
            what)
        return result

    # ------------------------------------------------------------------ completion

    async def complete(self, ctx: ServerRequestContext[Any],
                       params: types.CompleteRequestParams) -> types.CompleteResult:
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            owner = self._prompt_server.get(ref.name)
            what = f"completion/complete for prompt {ref.name!r}"
        else:
            owner = self._owner(ref.uri) or next(
                (s for s, ts in self._templates.items()
                 if any(t.template == ref.uri for t in ts)), None)
            what = f"completion/complete for {ref.uri}"
        server = await self._one(ctx, "completions", owner, what)
        result: types.CompleteResult = await self._ask(
            server, types.CompleteRequest(params=_forwarded(params)), types.CompleteResult, what)
        return result
