"""A stdio-to-streamable-HTTP MCP bridge that holds nothing but a Bearer token.

A stdio-only MCP client (Claude Code and most others) starts ``awl connect URL --pass-file
F``, which runs :func:`run_bridge`: every JSON-RPC message the client writes on stdin is
posted to the gateway at ``URL`` with ``Authorization: Bearer <pass>``, and every message
the gateway sends (answers, notifications, its own requests, on a request's stream or the
session's) is written to stdout, one line each (SPEC BIND-30). The HTTP side is the MCP
SDK's streamable HTTP client transport, which keeps the session id, opens the session's
GET stream and ends the session on the way out; this module only stamps each message with
the headers its era needs (``MCP-Protocol-Version`` after the handshake; a 2026-07-28
request's ``Mcp-Method``, ``Mcp-Name`` and ``Mcp-Param-*`` headers) and watches every HTTP
exchange for the conditions that end a bridge.

It opens no desk, reads no key and knows no principal: what it may do is what the pass
allows, decided by the gateway on every request (BIND-7). It ends when stdin closes, and
with :class:`BridgeFailed` (one line) when the gateway cannot be reached, refuses the pass,
forgets the session or goes away (BIND-31).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import httpx2
import mcp_types as types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.inbound import (
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    NAME_BEARING_METHODS,
    encode_header_value,
    find_invalid_x_mcp_header,
    mcp_param_headers,
    x_mcp_header_map,
)
from mcp.shared.message import ClientMessageMetadata, SessionMessage
from pydantic import ValidationError

from awl.documents.errors import AWLError
from awl.mcp.frames import MAX_FRAME_BYTES

__all__ = ["BridgeFailed", "run_bridge"]

_SESSION_HEADER = "mcp-session-id"
_CONNECT_SECONDS = 10.0
"""How long reaching the gateway may take before the bridge says it cannot."""


class BridgeFailed(AWLError):
    """The bridge cannot go on; the message says why and what to do, in one line."""

    code = "UNAVAILABLE"


class _Watch(httpx2.AsyncBaseTransport):
    """The HTTP transport under the SDK's client, noting what ends a bridge.

    A refused pass (401, 403), a session the gateway no longer has (404 to a request that
    named one) and a gateway that cannot be reached or stopped answering are each turned
    into the line the bridge ends with; everything else passes as it came.
    """

    def __init__(self, url: str, fail: Callable[[str], None]) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._url = url
        self._fail = fail
        self.answered = False
        """Whether the gateway has answered anything yet (so a failure is 'went away')."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.TransportError as exc:
            if request.method != "DELETE":  # ending the session on the way out: no news
                self._fail(self._unreachable(exc))
            raise
        self.answered = True
        status = response.status_code
        if status in (401, 403):
            body = await response.aread()
            self._fail(f"the gateway at {self._url} refused the pass ({status}"
                       f"{_described(body)}); ask the desk's operator for a valid pass "
                       "(`awl pass issue`) and put it in the pass file")
        elif status == 404 and _SESSION_HEADER in request.headers and request.method != "DELETE":
            self._fail(f"the gateway at {self._url} no longer has this session (it was "
                       "restarted, or ended the session); restart the MCP client to connect "
                       "again")
        return response

    def _unreachable(self, exc: httpx2.TransportError) -> str:
        why = " ".join(str(exc).split()) or type(exc).__name__
        if self.answered:
            return (f"the gateway at {self._url} went away ({why}); the session is over: "
                    "restart the MCP client once the gateway is back")
        return (f"cannot reach the gateway at {self._url} ({why}); check the URL and that "
                "`awl gateway --http` is running there")

    async def aclose(self) -> None:
        await self._inner.aclose()


def _described(body: bytes) -> str:
    """': <what the gateway said>' from a 401 body (``error_description``), else ''."""
    try:
        said = httpx2.Response(200, content=body).json().get("error_description")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(said, str) or not said.strip():
        return ""
    said = " ".join(said.split())
    return ": " + (said if len(said) <= 300 else said[:299] + "…")


class _Stamp:
    """The HTTP headers each client message needs, learned from what passes by."""

    def __init__(self) -> None:
        self.version: str | None = None
        """The handshake era's negotiated version, once the gateway answered initialize."""
        self._initialize: set[types.RequestId] = set()
        self._lists: set[types.RequestId] = set()
        self._params: dict[str, dict[tuple[str, ...], str]] = {}
        """Each tool's ``Mcp-Param-*`` header map, from the 2026-07-28 tool lists seen."""

    def outgoing(self, message: types.JSONRPCMessage) -> ClientMessageMetadata | None:
        """The metadata (headers) to send ``message`` with."""
        if isinstance(message, types.JSONRPCRequest):
            params = message.params or {}
            meta = params.get("_meta")
            envelope = meta.get(types.PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
            if message.method == "initialize":
                self._initialize.add(message.id)
                return None
            if message.method == "tools/list":
                self._lists.add(message.id)
            if isinstance(envelope, str):  # 2026-07-28: every request says its version
                return ClientMessageMetadata(headers=self._modern(message.method, params,
                                                                  envelope))
        if self.version is not None:
            return ClientMessageMetadata(headers={MCP_PROTOCOL_VERSION_HEADER: self.version})
        return None

    def _modern(self, method: str, params: dict[str, Any], version: str) -> dict[str, str]:
        headers = {MCP_PROTOCOL_VERSION_HEADER: version, MCP_METHOD_HEADER: method}
        key = NAME_BEARING_METHODS.get(method)
        name = params.get(key) if key is not None else None
        if isinstance(name, str):
            headers[MCP_NAME_HEADER] = encode_header_value(name)
        arguments = params.get("arguments")
        if method == "tools/call" and isinstance(name, str) and isinstance(arguments, dict):
            headers.update(mcp_param_headers(self._params.get(name, {}), arguments))
        return headers

    def incoming(self, message: types.JSONRPCMessage) -> None:
        """Learn from a message of the gateway's: the version it agreed, its tools' headers."""
        if not isinstance(message, types.JSONRPCResponse):
            if isinstance(message, types.JSONRPCError) and message.id is not None:
                self._initialize.discard(message.id)
                self._lists.discard(message.id)
            return
        result = message.result if isinstance(message.result, dict) else {}
        if message.id in self._initialize:
            self._initialize.discard(message.id)
            version = result.get("protocolVersion")
            if isinstance(version, str):
                self.version = version
        if message.id in self._lists:
            self._lists.discard(message.id)
            for tool in result.get("tools") or ():
                if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                    schema = tool.get("inputSchema")
                    if find_invalid_x_mcp_header(schema) is None:
                        self._params[tool["name"]] = x_mcp_header_map(schema)


class _Lines:
    """The client's stdin, one line at a time, read by a daemon thread from the descriptor.

    A daemon thread, not the event loop's worker threads: a read blocked on a client that
    neither writes nor closes must not keep the process alive once the bridge has ended.
    It reads the descriptor itself (``os.read``), never through a buffered file, whose lock
    a daemon thread would still hold at exit (Python aborts then)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._send, self.receive = anyio.create_memory_object_stream[bytes](1)

    def start(self) -> None:
        token = anyio.lowlevel.current_token()
        threading.Thread(target=self._read, args=(token,), name="awl connect stdin",
                         daemon=True).start()

    def _read(self, token: Any) -> None:
        pending = b""
        skipping = False  # inside a line over the limit, which is answered once and dropped
        try:
            while True:
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    break
                pending += chunk
                while b"\n" in pending:
                    line, _, pending = pending.partition(b"\n")
                    if not skipping:
                        anyio.from_thread.run(self._send.send, line, token=token)
                    skipping = False
                if len(pending) > MAX_FRAME_BYTES and not skipping:
                    anyio.from_thread.run(self._send.send, pending, token=token)
                    pending, skipping = b"", True
                elif skipping:
                    pending = b""
            if pending and not skipping:
                anyio.from_thread.run(self._send.send, pending, token=token)
        except (OSError, RuntimeError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # stdin failed, or the bridge has ended: either way nothing more comes
        with contextlib.suppress(RuntimeError):  # RuntimeError: the event loop is gone
            anyio.from_thread.run_sync(self._send.close, token=token)


def _parse(line: bytes) -> types.JSONRPCMessage | types.JSONRPCError | None:
    """The message on one stdin line; a JSON-RPC error to answer it with when it is none;
    None for a blank line."""
    if not line.strip():
        return None
    if len(line) > MAX_FRAME_BYTES:
        return _error(types.INVALID_REQUEST, f"the message is over {MAX_FRAME_BYTES} bytes")
    try:
        return types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first.get("type") in ("json_invalid", "json_type"):
            return _error(types.PARSE_ERROR, "the line is not a JSON message")
        return _error(types.INVALID_REQUEST, "the line is not a JSON-RPC message")


def _error(code: int, text: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=None,
                              error=types.ErrorData(code=code, message=f"awl connect: {text}"))


async def run_bridge(url: str, token: str, *, stdin: int = 0, stdout: int = 1) -> None:
    """Carry MCP between the client on the descriptors ``stdin`` and ``stdout`` (default:
    the process's) and the streamable HTTP server at ``url``, authenticating every request
    with ``token``.

    Returns when stdin closes (after ending the HTTP session).

    Raises:
        BridgeFailed: the gateway cannot be reached, refused the token, no longer has the
            session, or went away; the message is one line.
    """
    failed: list[str] = []
    stamp = _Stamp()
    lines = _Lines(stdin)
    write_lock = anyio.Lock()
    scope = anyio.CancelScope()

    def fail(why: str) -> None:
        if not failed:
            failed.append(why)
        scope.cancel()

    async def write(message: types.JSONRPCMessage) -> None:
        data = message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"

        def put() -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(stdout, view):]

        async with write_lock:
            try:
                await anyio.to_thread.run_sync(put, abandon_on_cancel=True)
            except OSError:
                scope.cancel()  # the client stopped reading: nobody is left to serve

    async def down(from_gateway: Any) -> None:
        async for item in from_gateway:
            if isinstance(item, SessionMessage):
                stamp.incoming(item.message)
                await write(item.message)

    async def up(to_gateway: Any) -> None:
        async with lines.receive:
            async for line in lines.receive:
                message = _parse(line)
                if isinstance(message, types.JSONRPCError):
                    await write(message)
                elif message is not None:
                    await to_gateway.send(SessionMessage(message,
                                                         metadata=stamp.outgoing(message)))

    ended = (f"the connection to the gateway at {url} ended; restart the MCP client to "
             "connect again")
    watch = _Watch(url, fail)
    http = httpx2.AsyncClient(
        transport=watch, headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(_CONNECT_SECONDS, read=None), follow_redirects=False)
    try:
        with scope:
            lines.start()
            async with (http, streamable_http_client(
                    url, http_client=http, max_sse_event_size=MAX_FRAME_BYTES + 65536)
                    as (from_gateway, to_gateway), anyio.create_task_group() as tg):
                tg.start_soon(_guard, down, from_gateway, fail, ended)
                try:
                    await up(to_gateway)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    fail(ended)
                tg.cancel_scope.cancel()  # stdin closed: the client is done
    except Exception:
        if not failed:  # pragma: no cover - a failure of the SDK's not foreseen here
            raise
    if failed:
        raise BridgeFailed(failed[0])


async def _guard(part: Callable[[Any], Awaitable[None]], stream: Any,
                 fail: Callable[[str], None], ended: str) -> None:
    """Run the gateway-to-client direction; its end, unless cancelled, ends the bridge."""
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await part(stream)
    fail(ended)
