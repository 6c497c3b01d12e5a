"""Test fixture: an MCP server (stdio) that misbehaves on request.

Tools: ``slow(seconds)`` answers after a delay; ``crash()`` kills its own process with
SIGKILL before answering; ``big(n)`` answers with ``n`` bytes of text; ``echo(...)``
answers with its arguments and the request's ``_meta``; ``pid()`` answers with its
process id, so a test can see a restart. Logs only to stderr.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

READ_ONLY = types.ToolAnnotations(read_only_hint=True)

TOOLS = [
    types.Tool(name="slow", description="Answer after `seconds`.",
               input_schema={"type": "object", "properties": {"seconds": {"type": "number"}},
                             "required": ["seconds"]},
               annotations=READ_ONLY),
    types.Tool(name="crash", description="Kill this server process.",
               input_schema={"type": "object", "properties": {}}),
    types.Tool(name="big", description="Answer with n bytes of text.",
               input_schema={"type": "object", "properties": {"n": {"type": "integer"}},
                             "required": ["n"]},
               annotations=READ_ONLY),
    types.Tool(name="echo", description="Answer with the arguments and _meta received.",
               input_schema={"type": "object"}, annotations=READ_ONLY),
    types.Tool(name="pid", description="Answer with this process id.",
               input_schema={"type": "object", "properties": {}}, annotations=READ_ONLY),
]


def _text(text: str, structured: dict[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured)


async def list_tools(ctx: ServerRequestContext[Any],
                     params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: ServerRequestContext[Any],
                    params: types.CallToolRequestParams) -> types.CallToolResult:
    args = dict(params.arguments or {})
    if params.name == "slow":
        await anyio.sleep(float(args["seconds"]))
        return _text(f"slept {args['seconds']} s")
    if params.name == "crash":
        print("flaky: crashing on request", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if params.name == "big":
        return _text("x" * int(args["n"]))
    if params.name == "echo":
        payload = {"arguments": args, "meta": dict(params.meta or {})}
        return _text(json.dumps(payload), structured=payload)
    if params.name == "pid":
        return _text(str(os.getpid()), structured={"pid": os.getpid()})
    return types.CallToolResult(content=[types.TextContent(type="text", text="unknown tool")],
                                is_error=True)


async def serve() -> None:
    server: Server[Any] = Server("awl-test-flaky", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve)
