"""The desk as an MCP server, each connection bound to one principal.

``awl serve --as PRINCIPAL`` serves it over stdio; ``awl serve --http HOST:PORT`` over
streamable HTTP, where each request acts as the principal whose desk token it sends
(``awl token issue PRINCIPAL``). In code::

    from awl.server import DeskServer
    server = DeskServer(store, principal="human:ana", keys=KeyStore(home))
    async with mcp.Client(server.server) as client: ...

:func:`serve_http` is the transport alone (any low-level MCP server, any Bearer check), for
other servers that need the same.
"""

from awl.desk.tokens import (
    TOKEN_PREFIX,
    issue_token,
    principal_for_token,
    revoke_tokens,
    token_hash,
    token_id,
)
from awl.mcp.errors import tool_error
from awl.mcp.transport import (
    MCP_PATH,
    Authenticate,
    BearerAuth,
    Unauthorized,
    bearer_token,
    identity_of,
    is_loopback,
    parse_address,
    serve_http,
)
from awl.server._server import (
    WAIT_LIMIT,
    DeskServer,
    serve_desk_http,
    serve_stdio,
)
from awl.server._tools import INSTRUCTIONS, TOOL_NAMES, TOOLS, ToolSpec

__all__ = [
    "INSTRUCTIONS",
    "MCP_PATH",
    "TOKEN_PREFIX",
    "TOOLS",
    "TOOL_NAMES",
    "WAIT_LIMIT",
    "Authenticate",
    "BearerAuth",
    "DeskServer",
    "ToolSpec",
    "Unauthorized",
    "bearer_token",
    "identity_of",
    "is_loopback",
    "issue_token",
    "parse_address",
    "principal_for_token",
    "revoke_tokens",
    "serve_desk_http",
    "serve_http",
    "serve_stdio",
    "token_hash",
    "token_id",
    "tool_error",
]
