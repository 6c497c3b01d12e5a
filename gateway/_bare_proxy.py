"""A bare pass-through MCP proxy, the baseline the gateway's benchmark compares against.

It lists every upstream tool (under the same exposed names as the gateway) and forwards
every call, with no order, no checks and no recording. It shares the gateway's upstream
side (:class:`~gateway._upstream.UpstreamPool`), MCP server code and stdio transport (the
frame check of :mod:`awl.mcp.frames`), so the difference between the two is exactly what
the gateway adds. Not for production: it enforces nothing.

Run it over stdio::

    python -m gateway._bare_proxy --config upstream.json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from awl.documents import AWLError
from awl.mcp import coded_error, stdio_frames
from gateway._config import load_config
from gateway._names import NameTable
from gateway._upstream import UpstreamError, UpstreamPool


async def exposed_tools(pool: UpstreamPool) -> tuple[NameTable, list[types.Tool]]:
    """The name table of every tool of the open ``pool``, and the tools under their exposed
    names (as the gateway lists them)."""
    upstream = await pool.tools()
    table = NameTable(upstream)
    return table, [tool.model_copy(update={"name": table.exposed(canonical)})
                   for canonical, tool in upstream.items()]


async def build_bare_proxy(pool: UpstreamPool) -> Server[Any]:
    """An MCP server forwarding every tool of the open ``pool``, unchecked."""
    table, listed = await exposed_tools(pool)

    async def list_tools(ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: ServerRequestContext[Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            server, tool = table.resolve(params.name)
            return await pool.call(server, tool, params.arguments, meta=params.meta)
        except (UpstreamError, AWLError) as exc:
            return coded_error(f"{exc.code}: {exc.message}")

    return Server("awl-bare-proxy", version="0.1.0", on_list_tools=list_tools,
                  on_call_tool=call_tool)


async def serve_bare_proxy(config_path: str) -> None:
    """Serve the bare proxy over stdio for the upstreams in ``config_path``."""
    config = load_config(config_path)
    async with UpstreamPool(config) as pool:
        server = await build_bare_proxy(pool)
        async with stdio_frames() as (read, write):
            await server.run(read, write, server.create_initialization_options())


def main(argv: list[str] | None = None) -> int:
    """``python -m gateway._bare_proxy --config FILE``."""
    parser = argparse.ArgumentParser(prog="python -m gateway._bare_proxy",
                                     description="Unchecked MCP pass-through (benchmark baseline).")
    parser.add_argument("--config", required=True, help="upstream servers, mcpServers JSON")
    args = parser.parse_args(argv)
    try:
        anyio.run(serve_bare_proxy, args.config)
    except AWLError as exc:
        print(f"bare proxy: {exc.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
