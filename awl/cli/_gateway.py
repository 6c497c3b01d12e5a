"""``awl gateway``: serve one order's tools to its worker, or commit its approved effects.

Without ``--commit`` the gateway speaks MCP over stdin/stdout (or streamable HTTP with
``--http``), so stdout is the protocol stream: this command prints nothing else there.
With ``--commit`` it runs the effects the manager approved (``gateway._commit``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import anyio

from awl.cli import CLIError


def register(subparsers: Any) -> None:
    """Add ``gateway`` to the ``awl`` command."""
    parser = subparsers.add_parser(
        "gateway", help="serve an order's tools to its worker through the MCP gateway",
        description="Serve MCP to a worker: the upstream tools its order (or pass) allows, "
                    "every call checked, counted and recorded, staged calls held for "
                    "approval. With --commit, run the effects the manager approved instead.")
    parser.add_argument("--order", required=True, metavar="ID", help="the work order")
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="upstream servers, in the mcpServers JSON shape")
    parser.add_argument("--home", metavar="DIR",
                        help="the desk's home folder (default: $AWL_HOME, else ./.awl)")
    parser.add_argument("--pass", dest="pass_token", metavar="TOKEN",
                        help="run the worker under this Delegation Pass (default: $AWL_PASS; "
                             "without one, as the order's worker)")
    parser.add_argument("--safe", action="store_true",
                        help="hold every allowed tool its upstream does not mark read-only")
    parser.add_argument("--http", metavar="HOST:PORT",
                        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio "
                             "(port 0 picks one; workers send their pass as a Bearer token)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="with --http, allow a non-loopback address")
    commit = parser.add_argument_group("committing approved effects")
    commit.add_argument("--commit", action="store_true",
                        help="run the approved report's effects once each, then exit: 0 when "
                             "all committed, 1 when one did not, 3 when another live "
                             "committer holds the order's lock (nothing was sent)")
    commit.add_argument("--json", action="store_true", help="with --commit, print JSON")
    commit.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="with --commit, seconds each effect may take")
    commit.add_argument("--lock-wait", type=float, default=0.0, metavar="SECONDS",
                        help="with --commit, how long to wait for another committer")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.commit:
        if args.http or args.pass_token or args.safe or args.allow_remote:
            raise CLIError("--commit runs approved effects and serves nothing; drop --http, "
                           "--pass, --safe and --allow-remote")
        from gateway._commit import run_commit_cli

        return run_commit_cli(args)
    if args.json or args.timeout is not None or args.lock_wait:
        raise CLIError("--json, --timeout and --lock-wait go with --commit")
    from gateway._serve import PASS_ENV, parse_address, run_gateway

    token = args.pass_token or os.environ.get(PASS_ENV) or None
    http = parse_address(args.http) if args.http else None
    if http is None and args.allow_remote:
        raise CLIError("--allow-remote goes with --http")
    if http is not None and args.pass_token:
        raise CLIError("over --http each worker sends its own pass as a Bearer token; "
                       "drop --pass")
    if http is not None:
        token = None
    anyio.run(lambda: run_gateway(
        args.order, args.config, http=http, allow_remote=args.allow_remote, home=args.home,
        pass_token=token, safe=True if args.safe else None, announce=sys.stderr))
    return 0
