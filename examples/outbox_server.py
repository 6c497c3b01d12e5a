"""A small MCP server to put behind the AWL gateway: notes to search, and an outbox.

Run it over stdio (how the gateway normally starts it)::

    OUTBOX_PATH=/tmp/outbox.jsonl python examples/outbox_server.py

or over streamable HTTP on loopback (``--http 0`` picks a free port; the address is
printed on stderr as ``listening on http://127.0.0.1:PORT/mcp``)::

    python examples/outbox_server.py --http 8765

Tools:

- ``search_notes(query)``: notes whose title or text contains ``query`` (read-only);
- ``get_note(id)``: one note (read-only);
- ``send_email(to, subject, body)``: appends the message as one JSON line to the file
  named by ``OUTBOX_PATH`` (with the request's ``awl/ref`` if it carries one), which is
  the write a gateway should hold for approval (one to an address ``@lost.example`` is
  written, then the server exits without answering, so its sender cannot know);
- ``create_issue(title)``: files an issue in memory, answering ``{"number": N}``.

When ``CALL_LOG_PATH`` is set, every ``tools/call`` that reaches the server is appended to
that file first, as one JSON line ``{"tool", "arguments", "awl_ref", "at"}``: the server's own
record of what the gateway let through. Everything else it logs goes to stderr; stdout is
the MCP stream in stdio mode.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from datetime import UTC, datetime
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

NOTES: tuple[dict[str, str], ...] = (
    {"id": "n1", "title": "Q3 invoice reminder",
     "text": "Remind ACME that invoice 1042 is due on the 30th."},
    {"id": "n2", "title": "Team offsite",
     "text": "Offsite moved to the lake house; send the new address to everyone."},
    {"id": "n3", "title": "Refund policy",
     "text": "Refunds over 100 USD need a manager's approval before they are paid."},
)

LOST_DOMAIN = "@lost.example"
"""A message to an address here is written to the outbox, then the server exits before it
answers: a send whose outcome the sender cannot know, for the README's manager walk."""

READ_ONLY = types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
WRITE = types.ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                              open_world_hint=True)


def _schema(**props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


TOOLS = [
    types.Tool(
        name="search_notes",
        description="Find notes whose title or text contains the query (case-insensitive).",
        input_schema=_schema(query={"type": "string", "description": "Text to look for."}),
        annotations=READ_ONLY,
    ),
    types.Tool(
        name="get_note",
        description="Read one note by its id.",
        input_schema=_schema(id={"type": "string", "description": "The note id, e.g. n1."}),
        annotations=READ_ONLY,
    ),
    types.Tool(
        name="send_email",
        description="Send an email. It leaves immediately and cannot be recalled.",
        input_schema=_schema(
            to={"type": "string", "description": "Recipient address."},
            subject={"type": "string"},
            body={"type": "string"},
        ),
        annotations=WRITE,
    ),
    types.Tool(
        name="create_issue",
        description="File an issue in the tracker and return its number.",
        input_schema=_schema(title={"type": "string"}),
        output_schema={"type": "object", "properties": {"number": {"type": "integer"}},
                       "required": ["number"]},
        annotations=WRITE,
    ),
]


def _text(text: str, *, error: bool = False,
          structured: dict[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured, is_error=error)


class Outbox:
    """The server's state: issues filed so far, and where sent mail is written."""

    def __init__(self, outbox_path: str | None) -> None:
        self.outbox_path = outbox_path
        self.issues = 0
        self.sent = 0

    def search(self, query: str) -> types.CallToolResult:
        q = query.casefold()
        found = [n for n in NOTES if q in n["title"].casefold() or q in n["text"].casefold()]
        lines = [f"{n['id']}: {n['title']}" for n in found] or ["no notes match"]
        return _text("\n".join(lines),
                     structured={"notes": [{"id": n["id"], "title": n["title"]} for n in found]})

    def get(self, note_id: str) -> types.CallToolResult:
        for note in NOTES:
            if note["id"] == note_id:
                return _text(f"{note['title']}\n\n{note['text']}", structured=dict(note))
        return _text(f"no note has the id {note_id!r}", error=True)

    def send(self, args: dict[str, Any], meta: dict[str, Any]) -> types.CallToolResult:
        if self.outbox_path is None:
            return _text("this server has no outbox: set OUTBOX_PATH", error=True)
        self.sent += 1
        message = {
            "id": f"msg-{os.getpid()}-{self.sent}",
            "to": args["to"], "subject": args["subject"], "body": args["body"],
            "at": datetime.now(UTC).isoformat(),
            "awl_ref": meta.get("awl/ref"),
        }
        # One line, synced before answering: the outbox is the record of what was sent.
        _append_line(self.outbox_path, message)
        if str(args["to"]).endswith(LOST_DOMAIN):
            # The mail went out, and the server died before it could say so: the sender
            # cannot tell whether it was sent (the commit marks it unknown). The outbox says.
            os._exit(3)
        return _text(f"sent {message['id']} to {args['to']}", structured={"id": message["id"]})

    def create_issue(self, title: str) -> types.CallToolResult:
        self.issues += 1
        return _text(f"issue #{self.issues}: {title}", structured={"number": self.issues})


def _append_line(path: str, record: dict[str, Any]) -> None:
    """One JSON line, flushed and synced before the server goes on."""
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
        out.flush()
        os.fsync(out.fileno())


def build_server(outbox_path: str | None = None) -> Server[Any]:
    """The MCP server; ``outbox_path`` defaults to the ``OUTBOX_PATH`` variable."""
    state = Outbox(outbox_path if outbox_path is not None else os.environ.get("OUTBOX_PATH"))
    call_log = os.environ.get("CALL_LOG_PATH")

    async def list_tools(ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx: ServerRequestContext[Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        args = dict(params.arguments or {})
        meta = dict(params.meta or {})
        if call_log:
            _append_line(call_log, {"tool": params.name, "arguments": args,
                                    "awl_ref": meta.get("awl/ref"),
                                    "at": datetime.now(UTC).isoformat()})
        needed = {t.name: t.input_schema["required"] for t in TOOLS}
        if params.name not in needed:
            return _text(f"unknown tool {params.name!r}", error=True)
        missing = [k for k in needed[params.name] if not isinstance(args.get(k), str)]
        if missing:
            return _text(f"{params.name} needs string arguments: {', '.join(missing)}", error=True)
        if params.name == "search_notes":
            return state.search(args["query"])
        if params.name == "get_note":
            return state.get(args["id"])
        if params.name == "send_email":
            return state.send(args, meta)
        return state.create_issue(args["title"])

    return Server("awl-example-outbox", version="0.1.0", on_list_tools=list_tools,
                  on_call_tool=call_tool)


async def serve_stdio(server: Server[Any]) -> None:
    """Serve one client over stdin/stdout."""
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(server: Server[Any], port: int) -> None:
    """Serve streamable HTTP on 127.0.0.1; port 0 picks a free one. Announces the URL on stderr."""
    import uvicorn

    # IPPROTO_TCP so that asyncio sets TCP_NODELAY on each connection (with the default
    # proto 0 it does not, and every streamed answer waits 40 ms for a delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    # Listen before announcing the URL: a client that connects between bind and uvicorn's own
    # listen would otherwise be refused.
    sock.listen(128)
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    http = uvicorn.Server(config)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp", file=sys.stderr, flush=True)
    await http.serve(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    """Run the server over stdio, or over HTTP with ``--http PORT``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--http", type=int, metavar="PORT",
                        help="serve streamable HTTP on 127.0.0.1:PORT, not stdio (0: any port)")
    args = parser.parse_args(argv)
    server = build_server()
    if args.http is None:
        anyio.run(serve_stdio, server)
    else:
        anyio.run(serve_http, server, args.http)


if __name__ == "__main__":
    main()
