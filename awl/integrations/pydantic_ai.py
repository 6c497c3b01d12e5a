"""PydanticAI through the gateway: the order's tools as an ``MCPToolset``.

``pip install -e ".[pydantic-ai]"`` in the checkout, then::

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

from awl.integrations._work import STARTUP_TIMEOUT, gateway_command, missing_extra

try:
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset
except ImportError as _missing:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError(missing_extra(__name__, "pydantic-ai")) from _missing

__all__ = ["gateway_toolset"]


def gateway_toolset(order_id: str, config: str | os.PathLike[str], *,
                    home: str | os.PathLike[str] | None = None,
                    pass_file: str | os.PathLike[str] | None = None, safe: bool = False,
                    log_file: Path | TextIO | None = None,
                    **options: Any) -> MCPToolset[Any]:
    """The gateway for ``order_id`` as a PydanticAI toolset (``Agent(toolsets=[...])``).

    ``order_id``, ``config``, ``home``, ``pass_file`` and ``safe`` are those of
    :func:`~awl.integrations.gateway_command`; ``log_file`` takes the gateway's stderr
    (default this process's); ``options`` are more ``MCPToolset`` options
    (``tool_error_behavior``, ``max_retries``, ...).
    """
    cmd = gateway_command(order_id, config, home=home, pass_file=pass_file, safe=safe)
    transport = StdioTransport(cmd.command, cmd.args, env=cmd.env, cwd=cmd.cwd,
                               keep_alive=False, log_file=log_file)
    options.setdefault("init_timeout", STARTUP_TIMEOUT)
    return MCPToolset(transport, **options)
