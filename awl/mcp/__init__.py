"""MCP plumbing shared by the gateway and the servers: frame checks, the HTTP transport, and
refusals as tool errors.

It knows documents (errors and limits) and nothing of stores or desks. The gateway imports
the names re-exported here: the stdio frame guard, the streamable HTTP transport with its
Bearer check and address rules, :func:`tool_error` (so a refusal reads the same from the
gateway's desk tools as from the desk server), :func:`coded_error` (a gateway refusal, its
code under :data:`ERROR_META` too) and :func:`text_result` (every other answer of one text
block), and :func:`bound_meta` / :func:`bound_tracestate` (a client's trace context within
the W3C limits).
"""

from awl.mcp.errors import ERROR_META, coded_error, text_result, tool_error
from awl.mcp.frames import stdio_frames
from awl.mcp.trace_context import bound_meta, bound_tracestate
from awl.mcp.transport import Unauthorized, identity_of, is_loopback, parse_address, serve_http

__all__ = [
    "ERROR_META",
    "Unauthorized",
    "bound_meta",
    "bound_tracestate",
    "coded_error",
    "identity_of",
    "is_loopback",
    "parse_address",
    "serve_http",
    "stdio_frames",
    "text_result",
    "tool_error",
]
