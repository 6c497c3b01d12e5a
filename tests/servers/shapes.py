"""Test fixture: an MCP server (stdio) whose answers test the gateway's result shaping.

Tools (all read-only):
    ``blocks(count, size)``: ``count`` text blocks of ``size`` characters each.
    ``file(n)``: like a file server's read: ``n`` characters as text and as the structured
        content ``{"content": ...}``, with that output schema.
    ``off_schema()``: advertises ``{"number": integer}`` and answers ``{"number": "seven"}``.
    ``off_schema_error()``: the same schema; a tool error whose structured content is
        ``{"error": "boom"}``.
    ``bare()``: the same schema; a success with text only.
    ``bad_schema()``: advertises an output schema that is not valid JSON Schema.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

READ_ONLY = types.ToolAnnotations(read_only_hint=True)
NUMBER = {"type": "object", "properties": {"number": {"type": "integer"}},
          "required": ["number"]}
_NONE: dict[str, Any] = {"type": "object", "properties": {}}

TOOLS = [
    types.Tool(name="blocks", description="Answer with count text blocks of size characters.",
               input_schema={"type": "object",
                             "properties": {"count": {"type": "integer"},
                                            "size": {"type": "integer"}},
                             "required": ["count", "size"]},
               annotations=READ_ONLY),
    types.Tool(name="file", description="Answer with n characters, as text and structured.",
               input_schema={"type": "object", "properties": {"n": {"type": "integer"}},
                             "required": ["n"]},
               output_schema={"type": "object", "properties": {"content": {"type": "string"}},
                              "required": ["content"]},
               annotations=READ_ONLY),
    types.Tool(name="off_schema", description="Break its own output schema.",
               input_schema=_NONE, output_schema=NUMBER, annotations=READ_ONLY),
    types.Tool(name="off_schema_error", description="An error that breaks the schema.",
               input_schema=_NONE, output_schema=NUMBER, annotations=READ_ONLY),
    types.Tool(name="bare", description="A success without structured content.",
               input_schema=_NONE, output_schema=NUMBER, annotations=READ_ONLY),
    types.Tool(name="bad_schema", description="An output schema that is not JSON Schema.",
               input_schema=_NONE,
               output_schema={"type": "object", "properties": {"x": {"type": "nonsense"}}},
               annotations=READ_ONLY),
]


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _answer(name: str, args: dict[str, Any]) -> types.CallToolResult:
    if name == "blocks":
        block = _text("b" * int(args["size"]))
        return types.CallToolResult(content=[block] * int(args["count"]))
    if name == "file":
        body = "x" * int(args["n"])
        return types.CallToolResult(content=[_text(body)], structured_content={"content": body})
    if name == "off_schema":
        return types.CallToolResult(content=[_text("seven")],
                                    structured_content={"number": "seven"})
    if name == "off_schema_error":
        return types.CallToolResult(content=[_text("boom")],
                                    structured_content={"error": "boom"}, is_error=True)
    if name == "bare":
        return types.CallToolResult(content=[_text("7")])
    if name == "bad_schema":
        return types.CallToolResult(content=[_text("1")], structured_content={"x": 1})
    return types.CallToolResult(content=[_text("unknown tool")], is_error=True)


async def _on_call(ctx: ServerRequestContext[Any],
                   params: types.CallToolRequestParams) -> types.CallToolResult:
    return _answer(params.name, dict(params.arguments or {}))


async def _on_list(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def serve() -> None:
    server: Server[Any] = Server("awl-test-shapes", on_list_tools=_on_list,
                                 on_call_tool=_on_call)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve)
