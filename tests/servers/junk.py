"""Test fixture: a stdio MCP server, written without the SDK, that writes lines which are not
JSON-RPC messages to its stdout before every answer: a blank line, ``[1,2]``, a number of
5,000 digits, and plain text. Its one tool, ``echo(text)``, answers with ``text``.

It speaks the handshake era only: ``server/discover`` is answered "method not found".
"""

from __future__ import annotations

import json
import sys
from typing import Any

JUNK = ["", "[1,2]", "1" + "0" * 4999, "this is not a JSON-RPC message"]

TOOLS = [{"name": "echo", "description": "Answer with the text.",
          "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
          "annotations": {"readOnlyHint": True}}]


def answer(request: dict[str, Any]) -> dict[str, Any]:
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {"result": {"protocolVersion": params.get("protocolVersion", "2025-11-25"),
                           "capabilities": {"tools": {}},
                           "serverInfo": {"name": "junk", "version": "0"}}}
    if method == "tools/list":
        return {"result": {"tools": TOOLS}}
    if method == "tools/call":
        text = str((params.get("arguments") or {}).get("text", ""))
        return {"result": {"content": [{"type": "text", "text": text}], "isError": False}}
    if method == "ping":
        return {"result": {}}
    return {"error": {"code": -32601, "message": f"no method {method}"}}


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if "id" not in request or "method" not in request:
            continue  # a notification or a response: nothing to answer
        out = "".join(junk + "\n" for junk in JUNK)
        out += json.dumps({"jsonrpc": "2.0", "id": request["id"], **answer(request)}) + "\n"
        sys.stdout.write(out)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
