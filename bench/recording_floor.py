"""The recording floor, for bench.gateway: the bare proxy plus the least recording there is.

``python -m bench.recording_floor --config FILE --journal FILE``

Per call it does only what any proxy that keeps evidence must: it takes one call from a
budget counter, appends the call (ref, tool, arguments, start time) to a journal file before
forwarding it, and appends the outcome with the result's JSON text before answering, each
line one ``write`` to a file opened for appending, not synced, so a line survives a crash of
the process (the guarantee of the SQLite store's call records, ``synchronous=NORMAL``) and
only a power cut can lose it. It shares the bare proxy's upstream side, MCP server and
stdio transport (:mod:`gateway._bare_proxy`).

It is a floor, not a gateway: no order, no pass, no policy, no staging, no store, one
process only. Measured beside the bare proxy it shows how much of the gateway's overhead
is the price of recording each call before answering, and how much is the rest of its work.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from awl.mcp import coded_error, stdio_frames
from gateway._bare_proxy import exposed_tools
from gateway._config import load_config
from gateway._upstream import UpstreamError, UpstreamPool


class Journal:
    """Numbered call records appended to one file, within a budget of ``calls``."""

    def __init__(self, path: str, calls: int) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        self.left = calls
        self._n = 0

    def reserve(self, tool: str, arguments: dict[str, Any] | None) -> str | None:
        """The new call's ref, its record written; None when the budget is spent."""
        if self.left <= 0:
            return None
        self.left -= 1
        self._n += 1
        ref = f"{tool}#{self._n}"
        self._append(json.dumps({"ref": ref, "tool": tool, "arguments": arguments or {},
                                 "outcome": "pending", "started": time.time()}))
        return ref

    def finish(self, ref: str, outcome: str, result: types.CallToolResult) -> None:
        """Append the call's outcome and its result as the wire carries it."""
        text = result.model_dump_json(by_alias=True, exclude_none=True)
        self._append(f'{{"ref":{json.dumps(ref)},"outcome":"{outcome}","result":{text}}}')

    def _append(self, line: str) -> None:
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


async def serve(config_path: str, journal_path: str, calls: int) -> None:
    """Serve the recording floor over stdio for the upstreams in ``config_path``."""
    config = load_config(config_path)
    journal = Journal(journal_path, calls)
    try:
        async with UpstreamPool(config) as pool:
            table, listed = await exposed_tools(pool)

            async def list_tools(ctx: ServerRequestContext[Any],
                                 params: types.PaginatedRequestParams | None,
                                 ) -> types.ListToolsResult:
                return types.ListToolsResult(tools=listed)

            async def call_tool(ctx: ServerRequestContext[Any],
                                params: types.CallToolRequestParams) -> types.CallToolResult:
                if params.name not in table:
                    return coded_error(f"AWL_FORBIDDEN: no tool {params.name!r}")
                server, tool = table.resolve(params.name)
                ref = journal.reserve(table.canonical(params.name), params.arguments)
                if ref is None:
                    return coded_error("AWL_BUDGET_EXCEEDED: the floor's calls are spent")
                try:
                    answer = await pool.call(server, tool, params.arguments, meta=params.meta)
                except UpstreamError as exc:
                    answer = coded_error(f"{exc.code}: {exc.message}")
                journal.finish(ref, "error" if answer.is_error else "ok", answer)
                answer.meta = {**(answer.meta or {}), "awl/ref": ref}
                return answer

            server = Server("awl-recording-floor", version="0.1.0", on_list_tools=list_tools,
                            on_call_tool=call_tool)
            async with stdio_frames() as (read, write):
                await server.run(read, write, server.create_initialization_options())
    finally:
        journal.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.recording_floor --config FILE --journal FILE [--calls N]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.recording_floor",
                                     description="The bare proxy plus the least recording.")
    parser.add_argument("--config", required=True, help="upstream servers, mcpServers JSON")
    parser.add_argument("--journal", required=True, help="the file calls are appended to")
    parser.add_argument("--calls", type=int, default=1_000_000, help="the budget of calls")
    args = parser.parse_args(argv)
    anyio.run(serve, args.config, args.journal, args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
