"""The OpenAI Agents SDK through the gateway: the order's tools as an ``MCPServerStdio``.

``pip install -e ".[openai-agents]"`` in the checkout, then::

    from agents import Agent, Runner
    from awl.integrations.openai_agents import gateway_server

    async with gateway_server(order_id, "upstream.json", home=home) as server:
        agent = Agent(name="clerk", instructions=..., mcp_servers=[server])
        await Runner.run(agent, "Do the work order.")

The server runs ``awl gateway`` for the order over stdio: the model sees only what the
order allows, reads pass through, staged writes come back ``pending:server/tool#N`` and
wait for the manager. The report, the review and the commit are framework-neutral: see
:mod:`awl.integrations`.
"""

from __future__ import annotations

import os
from typing import Any

from awl.integrations._work import STARTUP_TIMEOUT, gateway_command, missing_extra

try:
    from agents.mcp import MCPServerStdio
except ImportError as _missing:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError(missing_extra(__name__, "openai-agents")) from _missing

__all__ = ["gateway_server"]


def gateway_server(order_id: str, config: str | os.PathLike[str], *,
                   home: str | os.PathLike[str] | None = None,
                   pass_file: str | os.PathLike[str] | None = None, safe: bool = False,
                   name: str | None = None, **options: Any) -> MCPServerStdio:
    """The gateway for ``order_id`` as an Agents SDK MCP server (``Agent(mcp_servers=[...])``).

    Enter it (``async with``) around the runs that use it.

    ``order_id``, ``config``, ``home``, ``pass_file`` and ``safe`` are those of
    :func:`~awl.integrations.gateway_command`; ``name`` names the server in traces (default
    ``awl-gateway:ORDER``); ``options`` are more ``MCPServerStdio`` options
    (``tool_filter``, ``require_approval``, ...). Each request may take
    ``client_session_timeout_seconds`` (default :data:`STARTUP_TIMEOUT`, the handshake's).
    """
    cmd = gateway_command(order_id, config, home=home, pass_file=pass_file, safe=safe)
    options.setdefault("client_session_timeout_seconds", STARTUP_TIMEOUT)
    options.setdefault("cache_tools_list", True)
    return MCPServerStdio({"command": cmd.command, "args": cmd.args, "env": cmd.env},
                          name=name or f"awl-gateway:{order_id}", **options)
