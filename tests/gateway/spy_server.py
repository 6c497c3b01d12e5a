"""Test fixture: a raw stdio MCP server that writes down every message it receives, whole.

It speaks JSON-RPC by hand (handshake era only: ``server/discover`` is "method not found"),
so what a test reads from its log is exactly what the gateway sent it, ``_meta`` included.
Every message is appended, before anything is answered, as one JSON line to the file named
by ``SPY_LOG`` and flushed to the operating system.

Tools: ``read(text)`` (read-only, answers ``text``), ``write(to)`` (a write, answers
``sent``), ``twice()`` (answers twice, the second answer different), ``garbage()``
(answers a line that is not JSON, then nothing), ``hang()`` (never answers), ``die()``
(exits in the middle of the call). Resources: ``spy://doc``; the template
``spy://docs/{name}``. Prompts: ``hello``. Completions for ``hello``'s argument.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

_READ_ONLY = {"readOnlyHint": True}
TOOLS = [
    {"name": "read", "description": "Answer with the text.", "annotations": _READ_ONLY,
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}},
    {"name": "write", "description": "A write.",
     "inputSchema": {"type": "object", "properties": {"to": {"type": "string"}},
                     "required": ["to"]}},
    {"name": "twice", "description": "Answers twice.", "annotations": _READ_ONLY,
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "garbage", "description": "Answers garbage.", "annotations": _READ_ONLY,
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "hang", "description": "Never answers.", "annotations": _READ_ONLY,
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "die", "description": "Exits mid-call.",
     "inputSchema": {"type": "object", "properties": {}}},
]


def _log(message: Any) -> None:
    path = os.environ.get("SPY_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(message) + "\n")
            log.flush()


def _send(message: dict[str, Any] | str) -> None:
    text = message if isinstance(message, str) else json.dumps(message)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _text(rid: Any, text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid,
            "result": {"content": [{"type": "text", "text": text}], "isError": False}}


def _answer(message: dict[str, Any]) -> None:
    method, rid = message.get("method"), message.get("id")
    if rid is None or method is None:
        return
    params = message.get("params") or {}
    result: Any
    if method == "initialize":
        result = {"protocolVersion": params.get("protocolVersion", "2025-11-25"),
                  "capabilities": {"tools": {}, "resources": {}, "prompts": {},
                                   "completions": {}},
                  "serverInfo": {"name": "spy", "version": "0"}}
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "resources/list":
        result = {"resources": [{"uri": "spy://doc", "name": "doc"}]}
    elif method == "resources/templates/list":
        result = {"resourceTemplates": [{"uriTemplate": "spy://docs/{name}", "name": "docs"}]}
    elif method == "resources/read":
        uri = params.get("uri")
        result = {"contents": [{"uri": uri, "text": f"content of {uri}"}]}
    elif method == "prompts/list":
        result = {"prompts": [{"name": "hello", "arguments": [{"name": "who"}]}]}
    elif method == "prompts/get":
        result = {"messages": [{"role": "user",
                                "content": {"type": "text", "text": "hello"}}]}
    elif method == "completion/complete":
        result = {"completion": {"values": ["world"]}}
    elif method == "tools/call":
        name = params.get("name")
        arguments = params.get("arguments") or {}
        if name == "read":
            _send(_text(rid, str(arguments.get("text", ""))))
        elif name == "write":
            _send(_text(rid, "sent"))
        elif name == "twice":
            _send(_text(rid, "first"))
            _send(_text(rid, "second"))
        elif name == "garbage":
            _send("this is not JSON {")
        elif name == "die":
            sys.stdout.flush()
            os._exit(3)
        elif name != "hang":
            _send({"jsonrpc": "2.0", "id": rid,
                   "error": {"code": -32602, "message": f"no tool {name}"}})
        return
    else:
        _send({"jsonrpc": "2.0", "id": rid,
               "error": {"code": -32601, "message": f"no method {method}"}})
        return
    _send({"jsonrpc": "2.0", "id": rid, "result": result})


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            _log({"unreadable": line})
            continue
        _log(message)
        if isinstance(message, dict):
            _answer(message)


if __name__ == "__main__":
    main()
