"""Test fixture: an MCP server (stdio) that uses every channel besides a plain tool answer.

Tools:

- ``steps(n)`` sends ``n`` progress notifications (when the caller asked for progress),
  then answers ``done n``.
- ``say(text)`` sends ``text`` as a log message at level ``info``, then answers ``said``.
- ``ask(kind)`` asks its client for input (``kind``: ``sampling``, ``elicitation`` or
  ``roots``) and answers with what came back: as a server-to-client request when the
  connection can carry one (the handshake era), else as a 2026-07-28 ``input_required``
  round (the answer then arrives in the retried call).
- ``sleep(seconds)`` answers after ``seconds``; when the call is cancelled first, it writes
  ``cancelled <awl/ref>`` to the file named by ``CHATTY_LOG``.

Resources: ``chatty://note`` (text) and the template ``chatty://notes/{name}``. Prompts:
``greet(name)``. Every request that reaches it is appended to ``CHATTY_LOG`` as one JSON
line ``{"method": ..., "name": ...}``, so a test sees what the gateway passed on. Logs only to
stderr.

With ``CHATTY_ERA=legacy`` it serves the handshake era only, as servers before 2026-07-28
do: its clients fall back to ``initialize``, and it asks its questions as server-to-client
requests.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata

# The SDK marks logging deprecated in 2026-07-28; this server logs on purpose.
warnings.filterwarnings("ignore", message="The logging capability is deprecated")

READ_ONLY = types.ToolAnnotations(read_only_hint=True)


def _tool(name: str, description: str, **properties: Any) -> types.Tool:
    return types.Tool(name=name, description=description, annotations=READ_ONLY,
                      input_schema={"type": "object", "properties": properties})


TOOLS = [
    _tool("steps", "Send n progress notifications, then answer.", n={"type": "integer"}),
    _tool("say", "Send a log message, then answer.", text={"type": "string"}),
    _tool("ask", "Ask the client for sampling, elicitation or roots.",
          kind={"type": "string", "enum": ["sampling", "elicitation", "roots"]}),
    _tool("sleep", "Answer after `seconds`; note a cancellation.", seconds={"type": "number"}),
]


def note(entry: dict[str, Any]) -> None:
    """Append one line to the log a test reads."""
    path = os.environ.get("CHATTY_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


Question = types.CreateMessageRequest | types.ElicitRequest | types.ListRootsRequest


def _input_request(kind: str) -> Question:
    if kind == "sampling":
        return types.CreateMessageRequest(params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(
                role="user", content=types.TextContent(type="text", text="What is 2+2?"))],
            max_tokens=20))
    if kind == "elicitation":
        return types.ElicitRequest(params=types.ElicitRequestFormParams(
            message="Your name?",
            requested_schema={"type": "object", "properties": {"name": {"type": "string"}}}))
    return types.ListRootsRequest()


def _describe(answer: Any) -> str:
    """What a client's answer to an input request said, in a few words."""
    if isinstance(answer, types.CreateMessageResult):
        content = answer.content
        return f"sampled: {content.text if isinstance(content, types.TextContent) else content}"
    if isinstance(answer, types.ElicitResult):
        return f"elicited: {answer.action} {json.dumps(answer.content, sort_keys=True)}"
    if isinstance(answer, types.ListRootsResult):
        return "roots: " + " ".join(str(root.uri) for root in answer.roots)
    return f"answered: {answer!r}"


async def _ask(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams,
               kind: str) -> types.CallToolResult | types.InputRequiredResult:
    request = _input_request(kind)
    if ctx.session.can_send_request:
        result_type: type[Any] = {
            "sampling": types.CreateMessageResult, "elicitation": types.ElicitResult,
            "roots": types.ListRootsResult}[kind]
        answer = await ctx.session.send_request(
            request, result_type,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
        return _text(_describe(answer))
    responses = params.input_responses or {}
    if params.request_state == f"asked-{kind}" and "answer" in responses:
        return _text(_describe(responses["answer"]))
    return types.InputRequiredResult(input_requests={"answer": request},
                                     request_state=f"asked-{kind}")


async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                    ) -> types.CallToolResult | types.InputRequiredResult:
    args = dict(params.arguments or {})
    meta = dict(params.meta or {})
    note({"method": "tools/call", "name": params.name, "ref": meta.get("awl/ref")})
    if params.name == "steps":
        n = int(args.get("n", 3))
        for i in range(n):
            await ctx.session.report_progress(i + 1, n, f"step {i + 1} of {n}")
            await anyio.sleep(0.01)
        return _text(f"done {n}")
    if params.name == "say":
        await ctx.session.send_log_message("info", str(args.get("text", "")), logger="chatty",
                                           related_request_id=ctx.request_id)
        return _text("said")
    if params.name == "ask":
        return await _ask(ctx, params, str(args.get("kind", "sampling")))
    if params.name == "sleep":
        try:
            await anyio.sleep(float(args.get("seconds", 30)))
        except anyio.get_cancelled_exc_class():
            note({"cancelled": meta.get("awl/ref")})
            raise
        return _text("slept")
    return types.CallToolResult(content=[types.TextContent(type="text", text="unknown tool")],
                                is_error=True)


async def list_tools(ctx: ServerRequestContext[Any],
                     params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListResourcesResult:
    note({"method": "resources/list"})
    return types.ListResourcesResult(resources=[
        types.Resource(uri="chatty://note", name="note", mime_type="text/plain")])


async def list_templates(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[
        types.ResourceTemplate(uri_template="chatty://notes/{name}", name="notes",
                               mime_type="text/plain")])


async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                        ) -> types.ReadResourceResult:
    uri = str(params.uri)
    note({"method": "resources/read", "name": uri})
    if uri == "chatty://note":
        text = "a note"
    elif uri.startswith("chatty://notes/"):
        text = f"the note called {uri.rsplit('/', 1)[1]}"
    else:
        raise MCPError(code=-32602, message=f"no resource {uri}")
    return types.ReadResourceResult(contents=[
        types.TextResourceContents(uri=uri, mime_type="text/plain", text=text)])


async def list_prompts(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                       ) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[types.Prompt(
        name="greet", description="Greet someone.",
        arguments=[types.PromptArgument(name="name", required=True)])])


async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
                     ) -> types.GetPromptResult:
    note({"method": "prompts/get", "name": params.name})
    who = (params.arguments or {}).get("name", "you")
    return types.GetPromptResult(messages=[types.PromptMessage(
        role="user", content=types.TextContent(type="text", text=f"Say hello to {who}."))])


def build() -> Server[Any]:
    server: Server[Any] = Server(
        "awl-test-chatty", on_list_tools=list_tools, on_call_tool=call_tool,
        on_list_resources=list_resources, on_list_resource_templates=list_templates,
        on_read_resource=read_resource, on_list_prompts=list_prompts, on_get_prompt=get_prompt)
    return server


async def serve() -> None:
    server = build()
    async with stdio_server() as (read, write):
        if os.environ.get("CHATTY_ERA") == "legacy":
            async with server.lifespan(server) as state:
                await serve_loop(server, read, write, lifespan_state=state,
                                 init_options=server.create_initialization_options())
        else:
            await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve)
