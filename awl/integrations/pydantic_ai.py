"""PydanticAI through the gateway: the order's tools as an ``MCPToolset``.

``pip install "agent-work-layer[pydantic-ai]"``, then::

    from pydantic_ai import Agent
    from awl.integrations import draft_report, work_order
    from awl.integrations.pydantic_ai import gateway_toolset

    agent = Agent(model, toolsets=[gateway_toolset(order_id, "upstream.json", home=home)])

Each ``agent.run`` starts ``awl gateway`` for the order over stdio (PydanticAI's MCP client
is FastMCP's): the model sees only what the order allows, reads pass through, staged
writes come back ``pending:server/tool#N`` and wait for the manager. The rest (the report,
the review, the commit) is framework-neutral: see :mod:`awl.integrations`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TextIO

from awl.integrations._work import gateway_command

try:
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset
except ImportError as _missing:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError("awl.integrations.pydantic_ai needs PydanticAI's MCP client: "
                      'pip install "agent-work-layer[pydantic-ai]"') from _missing

__all__ = ["STARTUP_TIMEOUT", "gateway_toolset"]

STARTUP_TIMEOUT = 60.0
"""Seconds the gateway may take to start and answer the handshake (default init_timeout)."""


def gateway_toolset(order_id: str, config: str | os.PathLike[str], *,
                    home: str | os.PathLike[str] | None = None,
                    pass_file: str | os.PathLike[str] | None = None, safe: bool = False,
                    log_file: Path | TextIO | None = None,
                    **options: Any) -> MCPToolset[Any]:
    """The gateway for ``order_id`` as a PydanticAI toolset (``Agent(toolsets=[...])``).

    Args:
        order_id: The order the agent works on.
        config: The gateway's upstream config file.
        home: The desk's folder (default ``AWL_HOME`` or ``./.awl``).
        pass_file: Run the connection under the Delegation Pass in this file.
        safe: Hold every tool its upstream does not mark read-only.
        log_file: Where the gateway's stderr goes (default this process's stderr).
        options: More ``MCPToolset`` options (``tool_error_behavior``, ``max_retries``, ...).
    """
    cmd = gateway_command(order_id, config, home=home, pass_file=pass_file, safe=safe)
    transport = StdioTransport(cmd.command, cmd.args, env=cmd.env, cwd=cmd.cwd,
                               keep_alive=False, log_file=log_file)
    # PydanticAI gives a server 5 s to start; the gateway starts its upstreams first.
    options.setdefault("init_timeout", STARTUP_TIMEOUT)
    return MCPToolset(transport, **options)
