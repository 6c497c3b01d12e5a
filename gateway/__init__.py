"""The AWL MCP gateway: enforces a Work Order on every tool call and holds staged writes.

Run one for an order with ``awl gateway --order ID --config upstream.json`` or, in-process,
``async with open_gateway(order_id, config) as gw`` and connect ``mcp.Client(gw.server)``.

The names below are the gateway's interface, for its users and for the layers above it
(``awl.cli``, ``awl.web``, ``awl.integrations`` import nothing else of it). Each loads with its
module on first use (:func:`awl.documents.lazy_exports`): ``awl gateway`` serving stdio never
loads the commit path, and the commit path never loads the MCP server side.
"""

import typing

from awl.documents import lazy_exports as _lazy_exports

if typing.TYPE_CHECKING:
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
    from gateway._lock import EXIT_LOCKED, LockBusy
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
    from gateway._serve import (
        CHECKPOINT_SECONDS,
        PASS_ENV,
        open_gateway,
        parse_address,
        run_gateway,
        serve_http,
        serve_stdio,
    )
    from gateway._telemetry import enable as enable_telemetry
    from gateway._upstream import (
        UpstreamError,
        UpstreamPool,
        UpstreamRejected,
        UpstreamTimeout,
        UpstreamUnavailable,
    )
    from gateway._worker_tools import WORKER_TOOL_NAMES, listable_effects, tools_used

_HOMES = {name: home for home, names in {
    "gateway._authority": ("Authority",),
    "gateway._commit": ("CommitSummary", "EffectOutcome", "Mismatch", "commit", "commit_sync",
                        "drop_attempt", "retry", "retry_sync"),
    "gateway._config": ("ConfigError", "GatewayConfig", "ServerConfig", "load_config"),
    "gateway._gateway": ("AWL_INVALID_ARGUMENTS", "AWL_UPSTREAM_ERROR", "UNRESOLVED_TOOL",
                         "Gateway"),
    "gateway._lock": ("EXIT_LOCKED", "LockBusy"),
    "gateway._names": ("NameTable", "exposed_name"),
    "gateway._policy": ("AWL_BUDGET_EXHAUSTED", "AWL_EXPIRED", "AWL_FORBIDDEN",
                        "AWL_NOT_ACTIVE", "AWL_PASS_INVALID", "AWL_UPSTREAM_UNAVAILABLE",
                        "REFUSAL_CODES", "Decision", "decide", "is_staged"),
    "gateway._serve": ("CHECKPOINT_SECONDS", "PASS_ENV", "open_gateway", "parse_address",
                       "run_gateway", "serve_http", "serve_stdio"),
    "gateway._upstream": ("UpstreamError", "UpstreamPool", "UpstreamRejected",
                          "UpstreamTimeout", "UpstreamUnavailable"),
    "gateway._worker_tools": ("WORKER_TOOL_NAMES", "listable_effects", "tools_used"),
}.items() for name in names} | {"enable_telemetry": "gateway._telemetry:enable"}
__getattr__, __dir__ = _lazy_exports(__name__, _HOMES)

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
    "CHECKPOINT_SECONDS",
    "CommitSummary",
    "ConfigError",
    "Decision",
    "EXIT_LOCKED",
    "EffectOutcome",
    "Gateway",
    "GatewayConfig",
    "LockBusy",
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
    "listable_effects",
    "load_config",
    "open_gateway",
    "parse_address",
    "retry",
    "retry_sync",
    "run_gateway",
    "serve_http",
    "serve_stdio",
    "tools_used",
]
