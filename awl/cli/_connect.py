"""``awl connect URL --pass-file F``: the stdio bridge a worker's MCP client starts.

It speaks MCP on stdin/stdout to the client that started it and carries every message to
and from the gateway at ``URL`` (``awl gateway --http``), sending the pass as the Bearer
token (:mod:`awl.mcp.bridge`). It needs no desk home, opens no store and reads no keys, so
it runs as the worker's own OS user, who holds nothing but the pass (SPEC BIND-30).
Stdout is the protocol stream: this command prints nothing else there.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any
from urllib.parse import urlsplit

import anyio

from awl.cli._common import CLIError, read_pass_file
from awl.documents.limits import show_value


def register(subparsers: Any) -> None:
    """Add ``connect`` to the ``awl`` command."""
    parser = subparsers.add_parser(
        "connect", help="bridge a stdio MCP client to a gateway served over HTTP, with a pass",
        description="Speak MCP on stdin/stdout to the client that started this command and "
                    "carry every message to and from the gateway at URL (awl gateway "
                    "--http), sending the Delegation Pass as the Bearer token. It holds "
                    "nothing but the pass: no desk home, no store, no keys. It ends when "
                    "stdin closes.")
    parser.add_argument("url", metavar="URL",
                        help="the gateway's MCP endpoint, e.g. http://127.0.0.1:8765/mcp")
    parser.add_argument("--pass-file", required=True, metavar="PATH",
                        help="the worker's Delegation Pass, in a file only its user can read")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    url = _check_url(args.url)
    token = read_pass_file(args.pass_file)
    from awl.mcp.bridge import run_bridge

    # The SDK's own log lines (a failed POST, with its traceback) would be printed by
    # Python's last-resort handler; the bridge says what went wrong in one line instead.
    for name in ("mcp", "httpx2"):
        logging.getLogger(name).addHandler(logging.NullHandler())
        logging.getLogger(name).propagate = False
    anyio.run(run_bridge, url, token)
    return 0


def _check_url(text: str) -> str:
    """``URL`` as given, once it is an http(s) URL with a host; else one line saying so."""
    try:
        parts = urlsplit(text)
        _ = parts.port  # a port that is not a number fails here
        good = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        good = False
    if not good:
        raise CLIError(f"URL {show_value(text)} is not an http:// or https:// address; give "
                       "the gateway's endpoint, e.g. http://127.0.0.1:8765/mcp")
    return text
