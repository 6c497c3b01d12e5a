"""A bare MCP proxy on the MCP SDK alone: the floor of ``bench.startup`` and ``bench.memory``.

``python -m bench.bare_proxy --config upstream.json``

It imports nothing of ``awl`` or ``gateway``: only the MCP SDK (and what the SDK imports), so
its start and its resident memory are what any Python proxy on the same SDK pays, and the
gateway's figures against it show all the gateway adds, imports included. Like the gateway it
answers ``initialize`` at once and starts every upstream in the background, all together;
``tools/list`` waits until each has listed its tools, then lists them as the gateway names
them (``server__tool``). Calls are forwarded unchecked. Not for production: it enforces nothing.

(``gateway._bare_proxy``, the per-call floor of ``bench.gateway``, shares the gateway's
upstream code on purpose, to isolate what the gateway adds to a call.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters, stdio_client
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

SEPARATOR = "__"


class _Upstreams:
    """Every configured stdio server, each connected in a task of its own."""

    def __init__(self, servers: dict[str, dict[str, Any]]) -> None:
        self.servers = servers
        self.clients: dict[str, Client] = {}
        self.tools: list[types.Tool] = []
        self.ready = anyio.Event()
        self.stop = anyio.Event()
        self._left = len(servers)

    async def run(self, name: str) -> None:
        entry = self.servers[name]
        params = StdioServerParameters(command=entry["command"], args=entry.get("args", []),
                                       env=entry.get("env"), cwd=entry.get("cwd"))
        async with Client(stdio_client(params)) as client:
            self.clients[name] = client
            listed = await client.list_tools()
            self.tools += [t.model_copy(update={"name": f"{name}{SEPARATOR}{t.name}"})
                           for t in listed.tools]
            self._left -= 1
            if not self._left:
                self.ready.set()
            await self.stop.wait()


def build(upstreams: _Upstreams) -> Server[Any]:
    """The MCP server listing and forwarding every upstream tool."""

    async def list_tools(ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        await upstreams.ready.wait()
        return types.ListToolsResult(tools=upstreams.tools)

    async def call_tool(ctx: ServerRequestContext[Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        await upstreams.ready.wait()
        server, _, tool = params.name.partition(SEPARATOR)
        return await upstreams.clients[server].call_tool(tool, params.arguments)

    return Server("bench-bare-proxy", version="0.1.0", on_list_tools=list_tools,
                  on_call_tool=call_tool)


async def serve(config_path: str) -> None:
    """Serve the proxy over stdio until stdin closes, then stop the upstreams."""
    upstreams = _Upstreams(json.loads(Path(config_path).read_text())["mcpServers"])
    if not upstreams.servers:
        upstreams.ready.set()
    server = build(upstreams)
    async with anyio.create_task_group() as tg:
        for name in upstreams.servers:
            tg.start_soon(upstreams.run, name)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
        upstreams.stop.set()


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.bare_proxy --config FILE``."""
    parser = argparse.ArgumentParser(prog="python -m bench.bare_proxy", description=__doc__)
    parser.add_argument("--config", required=True, help="upstream servers, mcpServers JSON")
    args = parser.parse_args(argv)
    anyio.run(serve, args.config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
