"""The AWL MCP gateway: enforces a Work Order on every tool call and holds staged writes.

Run one for an order with ``awl gateway --order ID --config upstream.json`` or, in-process,
``async with open_gateway(order_id, config) as gw`` and connect ``mcp.Client(gw.server)``.
"""

from gateway._authority import Authority
from gateway._commit import (
    CommitSummary,
    EffectOutcome,
    Mismatch,
    commit,
    commit_sync,
    drop_attempt,
    retry,
    retry_sync,
)
from gateway._config import ConfigError, GatewayConfig, ServerConfig, load_config
from gateway._gateway import (
    AWL_INVALID_ARGUMENTS,
    AWL_UPSTREAM_ERROR,
    UNRESOLVED_TOOL,
    Gateway,
)
from gateway._names import NameTable, exposed_name
from gateway._policy import (
    AWL_BUDGET_EXHAUSTED,
    AWL_EXPIRED,
    AWL_FORBIDDEN,
    AWL_NOT_ACTIVE,
    AWL_PASS_INVALID,
    AWL_UPSTREAM_UNAVAILABLE,
    REFUSAL_CODES,
    Decision,
    decide,
    is_staged,
)
from gateway._serve import PASS_ENV, open_gateway, run_gateway, serve_http, serve_stdio
from gateway._telemetry import enable as enable_telemetry
from gateway._upstream import (
    UpstreamError,
    UpstreamPool,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway._worker_tools import WORKER_TOOL_NAMES

# Plain sorted() order, which the export test pins; ruff would group the constants first.
__all__ = [  # noqa: RUF022
    "AWL_BUDGET_EXHAUSTED",
    "AWL_EXPIRED",
    "AWL_FORBIDDEN",
    "AWL_INVALID_ARGUMENTS",
    "AWL_NOT_ACTIVE",
    "AWL_PASS_INVALID",
    "AWL_UPSTREAM_ERROR",
    "AWL_UPSTREAM_UNAVAILABLE",
    "Authority",
    "CommitSummary",
    "ConfigError",
    "Decision",
    "EffectOutcome",
    "Gateway",
    "GatewayConfig",
    "Mismatch",
    "NameTable",
    "PASS_ENV",
    "REFUSAL_CODES",
    "ServerConfig",
    "UNRESOLVED_TOOL",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamRejected",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "WORKER_TOOL_NAMES",
    "commit",
    "commit_sync",
    "decide",
    "drop_attempt",
    "enable_telemetry",
    "exposed_name",
    "is_staged",
    "load_config",
    "open_gateway",
    "retry",
    "retry_sync",
    "run_gateway",
    "serve_http",
    "serve_stdio",
]
