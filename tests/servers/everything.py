"""Test fixture: the resources, prompts and completions the MCP conformance suite asks for.

The official suite (``@modelcontextprotocol/conformance``) checks a server by fixed names:
resources ``test://static-text``, ``test://static-binary``, the template
``test://template/{id}/data``; prompts ``test_simple_prompt``,
``test_prompt_with_arguments``, ``test_prompt_with_embedded_resource``,
``test_prompt_with_image``; completion for ``test_prompt_with_arguments``. Its reference
server is not published, so this is ours, written from the suite's scenario descriptions;
the gateway passes these through unchanged (GW-16). Tool scenarios call bare tool names,
which the gateway renames (GW-1), so this fixture offers one tool only
(``test_simple_text``). Serves stdio, either protocol era.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5E"
       "rkJggg==")
"""A 1x1 PNG."""

TEXT = "This is the content of the static text resource."


async def list_tools(ctx: ServerRequestContext[Any],
                     params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool(
        name="test_simple_text", description="Answer with a simple text.",
        input_schema={"type": "object", "properties": {}},
        annotations=types.ToolAnnotations(read_only_hint=True))])


async def call_tool(ctx: ServerRequestContext[Any],
                    params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(
        type="text", text="This is a simple text response for testing.")])


async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[
        types.Resource(uri="test://static-text", name="static-text", mime_type="text/plain"),
        types.Resource(uri="test://static-binary", name="static-binary", mime_type="image/png"),
    ])


async def list_templates(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
        uri_template="test://template/{id}/data", name="template",
        mime_type="application/json")])


async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                        ) -> types.ReadResourceResult:
    uri = str(params.uri)
    contents: list[types.TextResourceContents | types.BlobResourceContents]
    if uri == "test://static-text":
        contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text=TEXT)]
    elif uri == "test://static-binary":
        contents = [types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG)]
    elif uri.startswith("test://template/") and uri.endswith("/data"):
        key = uri[len("test://template/"):-len("/data")]
        data = {"id": key, "templateTest": True, "data": f"Data for ID: {key}"}
        contents = [types.TextResourceContents(uri=uri, mime_type="application/json",
                                               text=json.dumps(data))]
    else:
        raise MCPError(code=types.INVALID_PARAMS, message=f"Resource not found: {uri}",
                       data={"uri": uri})
    return types.ReadResourceResult(contents=contents)


PROMPTS = [
    types.Prompt(name="test_simple_prompt", description="A simple prompt."),
    types.Prompt(name="test_prompt_with_arguments", description="A prompt with arguments.",
                 arguments=[types.PromptArgument(name="arg1", required=True),
                            types.PromptArgument(name="arg2", required=True)]),
    types.Prompt(name="test_prompt_with_embedded_resource", description="Embeds a resource.",
                 arguments=[types.PromptArgument(name="resourceUri", required=True)]),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image."),
]


async def list_prompts(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                       ) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=PROMPTS)


def _user(content: Any) -> types.PromptMessage:
    return types.PromptMessage(role="user", content=content)


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
                     ) -> types.GetPromptResult:
    args = params.arguments or {}
    if params.name == "test_simple_prompt":
        messages = [_user(_text("This is a simple prompt for testing."))]
    elif params.name == "test_prompt_with_arguments":
        messages = [_user(_text(f"Prompt with arguments: arg1='{args.get('arg1')}', "
                                f"arg2='{args.get('arg2')}'"))]
    elif params.name == "test_prompt_with_embedded_resource":
        messages = [
            _user(types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                uri=args.get("resourceUri", "test://embedded"), mime_type="text/plain",
                text="Embedded resource content for testing."))),
            _user(_text("Please process the embedded resource above."))]
    elif params.name == "test_prompt_with_image":
        messages = [_user(types.ImageContent(type="image", data=PNG, mime_type="image/png")),
                    _user(_text("Please analyze the image above."))]
    else:
        raise MCPError(code=types.INVALID_PARAMS, message=f"no prompt {params.name}")
    return types.GetPromptResult(messages=messages)


async def complete(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
                   ) -> types.CompleteResult:
    value = params.argument.value
    words = [w for w in ("paris", "park", "party") if w.startswith(value)]
    return types.CompleteResult(completion=types.Completion(values=words, total=len(words),
                                                            has_more=False))


async def serve() -> None:
    server: Server[Any] = Server(
        "awl-test-everything", on_list_tools=list_tools, on_call_tool=call_tool,
        on_list_resources=list_resources, on_list_resource_templates=list_templates,
        on_read_resource=read_resource, on_list_prompts=list_prompts, on_get_prompt=get_prompt,
        on_completion=complete)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve)
