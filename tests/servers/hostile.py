"""Test fixture: a raw stdio MCP server whose answers are malformed on request (issue 23).

It speaks JSON-RPC by hand, not through the SDK, so it can send what no SDK server would:
results of the wrong shape, content blocks of unknown types, numbers like ``1e400`` written
as JSON text, deep nesting, thousands of blocks, errors with odd codes. ``answer(seed)``
picks the answer from ``random.Random(seed)``, so the fuzz suite replays exactly.

Tools: ``answer(seed)`` (read-only), ``send(to, body)`` whose input schema has a
backtracking pattern (``(a+)+$``), for held calls; ``ok()`` answers plain text. Every
request it gets is appended to ``$HOSTILE_LOG``, when set. Logs only to stderr.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any

TOOLS = [
    {"name": "answer", "description": "A malformed answer chosen by seed.",
     "inputSchema": {"type": "object", "properties": {"seed": {"type": "integer"}}},
     "annotations": {"readOnlyHint": True}},
    {"name": "send", "description": "A write with a hostile input schema.",
     "inputSchema": {"type": "object", "properties": {
         "to": {"type": "string", "pattern": "(a+)+$"}, "body": {"type": "string"}},
         "required": ["to"]}},
    {"name": "ok", "description": "Plain text.",
     "inputSchema": {"type": "object", "properties": {}},
     "annotations": {"readOnlyHint": True}},
]


def _deep(n: int) -> str:
    return '{"a":' * n + "1" + "}" * n


def _block(r: random.Random, many: bool) -> str:
    size = 10 if many else r.choice([10, 5000, 200_000])  # at most about 1 MB per answer
    return r.choice([
        '{"type": "text", "text": "fine"}',
        '{"type": "text"}',
        '{"type": "text", "text": 5}',
        '{"type": "image", "data": "!!", "mimeType": "image/png"}',
        '{"type": "resource", "resource": {"uri": "file:///x", "text": "t"}}',
        '{"type": "resource_link", "uri": "x", "name": "n"}',
        '{"type": "banana", "peel": true}',
        '{"type": "text", "text": "' + "x" * size + '"}',
        '{"type": "text", "text": "ok", "annotations": {"priority": 1e400}}',
        "null", "5", '"text"', "[]",
    ])


# Answers the SDK client cannot even parse as JSON-RPC (it drops them, so the call runs
# into its timeout): rare, since each costs the fuzz a timeout.
_UNREADABLE = ["null", "[1, 2]", '"a string"',
               '{"content": [{"type": "text", "text": "\\ud800 lone"}]}',
               '{"content": [], "structuredContent": ' + _deep(300) + "}",
               '{"content": [], "structuredContent": {"n": ' + "9" * 5000 + "}}"]


def hostile_result(seed: int) -> str:
    """The JSON text of the ``result`` member for ``answer(seed)``."""
    r = random.Random(seed)
    if r.random() < 0.06:
        return r.choice(_UNREADABLE)
    count = r.choice([0, 1, 2, 5, 50, 3000])
    blocks = ", ".join(_block(r, count > 5) for _ in range(count))
    structured = r.choice(["", ', "structuredContent": {"n": 1}',
                           ', "structuredContent": [1, 2]',
                           ', "structuredContent": {"n": 1e400}',
                           ', "structuredContent": ' + _deep(30),
                           ', "structuredContent": {"n": ' + "9" * 400 + "}"])
    error = r.choice(["", ', "isError": true', ', "isError": "yes"', ', "isError": null'])
    return r.choice([
        '{"content": [' + blocks + "]" + structured + error + "}",
        '{"content": [' + blocks + "]" + structured + error + "}",
        '{"content": [' + blocks + "]" + structured + error + "}",
        '{"content": "not a list"}',
        "{}",
        '{"content": [{"type": "text", "text": "x"}], "_meta": {"awl/ref": "forged#1"}}',
        '{"content": [' + blocks + '], "x": 1e400}',
    ])


def _log(message: dict[str, Any]) -> None:
    path = os.environ.get("HOSTILE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(message) + "\n")


def _send(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _answer(message: dict[str, Any]) -> str | None:
    """The JSON text of the answer to one request (None for a notification)."""
    method, rid = message.get("method"), message.get("id")
    if rid is None:
        return None
    ident = json.dumps(rid)
    params = message.get("params") or {}
    if method == "initialize":
        version = params.get("protocolVersion", "2025-06-18")
        result = {"protocolVersion": version, "capabilities": {"tools": {}},
                  "serverInfo": {"name": "hostile", "version": "1"}}
        return json.dumps({"jsonrpc": "2.0", "id": rid, "result": result})
    if method == "tools/list":
        return json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    if method == "ping":
        return json.dumps({"jsonrpc": "2.0", "id": rid, "result": {}})
    if method == "tools/call":
        name = params.get("name")
        arguments = params.get("arguments") or {}
        if name == "answer":
            seed = arguments.get("seed", 0)
            if seed % 17 == 0:
                code = random.Random(seed).choice(["-32603", "7", "-1", "-32000"])
                return (f'{{"jsonrpc": "2.0", "id": {ident}, "error": {{"code": {code}, '
                        '"message": "upstream failed on purpose"}}')
            return f'{{"jsonrpc": "2.0", "id": {ident}, "result": {hostile_result(seed)}}}'
        text = "sent" if name == "send" else "fine"
        return json.dumps({"jsonrpc": "2.0", "id": rid,
                           "result": {"content": [{"type": "text", "text": text}]}})
    return json.dumps({"jsonrpc": "2.0", "id": rid,
                       "error": {"code": -32601, "message": f"no method {method}"}})


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict):
            continue
        _log(message)
        answer = _answer(message)
        if answer is not None:
            _send(answer)


if __name__ == "__main__":
    main()
