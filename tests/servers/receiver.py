"""A loopback MCP server that counts the deliveries it receives, on its own.

Run it as a stdio subprocess (``python -m tests.servers.receiver`` or by path). Every tool
call it gets is appended, before it answers, as one JSON line to the file named by the
``RECEIVER_LOG`` environment variable and fsynced, so the count of deliveries per
``awl/ref`` is independent of anything the gateway records.

Each line is ``{"tool", "arguments", "ref", "order", "attempt", "traceparent", "tracestate",
"pid", "at"}`` where ``ref``, ``order`` and ``attempt`` come from the request's ``_meta``
(``awl/ref``, ``awl/order``, ``awl/attempt``), and so do the W3C trace context keys (None
when absent).

Tools:
    deliver(to, body): a write, answered with ``{"delivered": true, "number": K}`` where K
        counts the lines in the log so far (so a later call can refer to it).
    create_issue(title): the same, answered with ``{"number": K, "title": title}``.
    reject(reason): logged, then answered with ``is_error=True`` (an answered failure).
    echo(text): a read; not logged.

Faults, decided per call after the delivery is logged and before the answer is written:
    ``RECEIVER_CRASH_AFTER`` / ``RECEIVER_HANG_AFTER`` (environment): a comma-separated list
    of refs (or ``*``) for which the server exits at once (``os._exit``) or never answers.
    ``RECEIVER_CONTROL`` (environment): a JSON file read on every call that may set
    ``crash_after``, ``hang_after`` (lists of refs or ``"*"``) and ``delay`` (seconds to wait
    before answering), so a test can change the faults while the server runs.
A hanging server exits on its own once its parent process is gone.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

_OBJECT = {"type": "object"}

TOOLS = [
    types.Tool(
        name="deliver",
        description="Deliver a message (a write the receiver counts).",
        input_schema={
            "type": "object",
            "properties": {"to": {"type": "string", "title": "Recipient",
                                  "description": "Who gets the message."}, "body": {}},
            "required": ["to"],
        },
    ),
    types.Tool(
        name="create_issue",
        description="Open an issue and return its number (a write the receiver counts).",
        input_schema={
            "type": "object",
            "properties": {"title": {"type": "string"}},
            "required": ["title"],
        },
    ),
    types.Tool(
        name="reject",
        description="Receive a write and answer that it failed.",
        input_schema={"type": "object", "properties": {"reason": {"type": "string"}}},
    ),
    types.Tool(
        name="echo",
        description="Return the text (a read; not counted).",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
]


def _refs(value: Any) -> set[str] | str:
    if value == "*" or value == ["*"]:
        return "*"
    if isinstance(value, str):
        return {v.strip() for v in value.split(",") if v.strip()}
    if isinstance(value, list):
        return {str(v) for v in value}
    return set()


def _hit(spec: set[str] | str, ref: str | None) -> bool:
    return spec == "*" or (ref is not None and ref in spec)


def _control() -> dict[str, Any]:
    path = os.environ.get("RECEIVER_CONTROL")
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


_lines: list[int] = []  # lines in the log, counted once at the first delivery


def _append(line: dict[str, Any]) -> int:
    """Append one delivery, fsynced, and return how many lines the log now has."""
    path = os.environ["RECEIVER_LOG"]
    if not _lines:
        _lines.append(len(read_log(path)))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    _lines[0] += 1
    return _lines[0]


async def _hang_until_orphaned() -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        await anyio.sleep(0.05)
    os._exit(3)


async def _list_tools(
    ctx: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = dict(params.arguments or {})
    if params.name == "echo":
        return types.CallToolResult(
            content=[types.TextContent(text=str(args.get("text", "")))],
            structured_content={"text": args.get("text", "")},
        )
    if params.name not in {"deliver", "create_issue", "reject"}:
        return types.CallToolResult(
            content=[types.TextContent(text=f"unknown tool {params.name}")], is_error=True
        )
    meta: dict[str, Any] = dict(params.meta or {})
    ref = meta.get("awl/ref")
    count = _append({
        "tool": params.name,
        "arguments": args,
        "ref": ref,
        "order": meta.get("awl/order"),
        "attempt": meta.get("awl/attempt"),
        "traceparent": meta.get("traceparent"),
        "tracestate": meta.get("tracestate"),
        "pid": os.getpid(),
        "at": time.time(),
    })
    control = _control()
    crash = _refs(control.get("crash_after", os.environ.get("RECEIVER_CRASH_AFTER", "")))
    hang = _refs(control.get("hang_after", os.environ.get("RECEIVER_HANG_AFTER", "")))
    if _hit(crash, ref):
        os._exit(7)  # received and logged, never answered
    if _hit(hang, ref):
        await _hang_until_orphaned()
    delay = control.get("delay")
    if isinstance(delay, int | float) and delay > 0:
        await anyio.sleep(float(delay))
    if params.name == "reject":
        return types.CallToolResult(
            content=[types.TextContent(text=f"rejected: {args.get('reason', 'no reason')}")],
            is_error=True,
        )
    body: dict[str, Any] = {"number": count}
    if params.name == "create_issue":
        body["title"] = args.get("title")
    else:
        body["delivered"] = True
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(body))], structured_content=body
    )


server: Server[Any] = Server(
    "receiver", version="1.0", on_list_tools=_list_tools, on_call_tool=_call_tool
)


async def _main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def read_log(path: str) -> list[dict[str, Any]]:
    """Every line of a JSON-lines log a test server appends to at ``path``, such as this
    receiver's deliveries or the chatty server's requests (empty if there is none yet).

    A reader polling while the server appends can see a line whose write is still under
    way: a last line without its newline is not yet written and is left for the next read.
    """
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.endswith("\n") and line.strip()]
    except FileNotFoundError:
        return []


def counts(path: str) -> dict[str, int]:
    """How many deliveries the receiver logged for each ``awl/ref``."""
    out: dict[str, int] = {}
    for line in read_log(path):
        out[str(line.get("ref"))] = out.get(str(line.get("ref")), 0) + 1
    return out


if __name__ == "__main__":
    if "RECEIVER_LOG" not in os.environ:
        print("receiver: set RECEIVER_LOG to the file deliveries are appended to",
              file=sys.stderr)
        raise SystemExit(2)
    anyio.run(_main)
