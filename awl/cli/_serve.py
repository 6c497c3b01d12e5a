"""``awl serve``: the desk as an MCP server; ``awl token issue``: desk tokens for HTTP.

Over stdio (``--as PRINCIPAL``) stdout is the protocol stream, so this command prints
nothing else there; notices go to stderr. Over HTTP (``--http HOST:PORT``) the address is
announced on stderr once requests are accepted, and the server runs until interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

from awl import passes
from awl.cli._common import (
    CLIError,
    add_json_option,
    add_store_option,
    check_address,
    named_actor,
    stdin_text,
)
from awl.cli._notify import check_deliverer_options, deliverer_options, start_deliverer
from awl.desk import AsyncDesk
from awl.desk.home import default_store, home_dir
from awl.desk.tokens import check_principal, issue_token, revoke_tokens, token_hash, token_id
from awl.documents.errors import BadRequest
from awl.documents.limits import show_value
from awl.store.protocol import TokenRecord


def register(subparsers: Any) -> None:
    """Add ``serve`` and ``token`` to the ``awl`` command."""
    serve = subparsers.add_parser(
        "serve", help="serve the desk's tools over MCP (stdio or streamable HTTP)",
        description="Serve the work-order desk over MCP. With --as every call acts as that "
                    "principal (stdio, one agent). With --http each request acts as the "
                    "principal whose desk token it sends as 'Authorization: Bearer <token>' "
                    "(make one with `awl token issue PRINCIPAL`).")
    bind = serve.add_mutually_exclusive_group()
    bind.add_argument("--as", dest="principal", metavar="PRINCIPAL",
                      help="serve over stdio, acting as this principal (e.g. human:ana; "
                           "default: $AWL_ACTOR)")
    bind.add_argument("--http", metavar="HOST:PORT",
                      help="serve streamable HTTP at http://HOST:PORT/mcp (port 0 picks one)")
    serve.add_argument("--allow-remote", action="store_true",
                       help="with --http, allow a non-loopback address")
    serve.add_argument("--home", metavar="DIR",
                       help="the desk's home folder (default: $AWL_HOME, else ./.awl)")
    add_store_option(serve)
    deliverer_options(serve)
    serve.set_defaults(func=_serve)

    token = subparsers.add_parser(
        "token", help="desk access tokens for `awl serve --http`",
        description="Desk access tokens. The desk keeps only a token's hash: the token is "
                    "shown once, when it is issued.")
    sub = token.add_subparsers(dest="token_command", metavar="COMMAND", required=True)
    issue = sub.add_parser("issue", help="issue a new token for a principal and print it once",
        description="Issue a desk token for a principal and print it once; the desk keeps "
                    "only its hash. Send it as a Bearer token to `awl serve --http` or sign "
                    "in to `awl web` with it.")
    issue.add_argument("principal", metavar="PRINCIPAL", help="who the token acts as")
    listing = sub.add_parser("list", help="list the desk's tokens (id, principal, issued; "
                                          "never the tokens)",
        description="List the desk's tokens: id, principal and issue time. The tokens "
                    "themselves are never shown.")
    revoke = sub.add_parser("revoke", help="revoke tokens: by id, by the token itself, or all "
                                           "of a principal's",
        description="Revoke desk tokens, by id, by the token itself, or every token of a "
                    "principal. A revoked token is refused from its next request.")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("id", nargs="?", metavar="ID",
                       help="the token's id from `awl token list` (6 or more of its digits)")
    which.add_argument("--token", metavar="TOKEN",
                       help="the token itself; - reads it from stdin (a command line is "
                            "readable by other users)")
    which.add_argument("--principal", metavar="PRINCIPAL",
                       help="revoke every token of this principal")
    for command, func in ((issue, _issue_token), (listing, _list_tokens),
                          (revoke, _revoke_tokens)):
        command.add_argument("--home", metavar="DIR",
                             help="the desk's home folder (default: $AWL_HOME, else ./.awl)")
        add_store_option(command)
        add_json_option(command)
        command.set_defaults(func=func)


def _serve(args: argparse.Namespace) -> int:
    from awl.server import DeskServer, serve_stdio

    check_deliverer_options(args)
    if args.http is None:
        args.principal = named_actor(args.principal)
        if args.principal is None:
            raise CLIError("serve how? pass --as PRINCIPAL (or set AWL_ACTOR) to serve over "
                           "stdio as that principal, or --http HOST:PORT for token holders")
    if args.principal is not None:
        if args.allow_remote:
            raise CLIError("--allow-remote goes with --http")
        check_principal(args.principal)
        address = None
    else:
        address = check_address(args.http, flag="--http", allow_remote=args.allow_remote)
    home = home_dir(args.home)
    store = default_store(home, url=args.store)
    deliverer = None
    try:
        deliverer = start_deliverer(args, store)
        server = DeskServer(AsyncDesk(store), principal=args.principal, keys=passes.KeyStore(home))
        if address is None:
            anyio.run(serve_stdio, server)
        else:
            from awl.mcp.transport import CannotListen

            try:
                anyio.run(_serve_http, server, address, args.allow_remote)
            except CannotListen as exc:  # a taken port: say which flag
                raise BadRequest(f"--http {show_value(args.http)}: {exc.message}") from None
    finally:
        if deliverer is not None:
            deliverer.stop()
        store.close()
    return 0


async def _serve_http(server: Any, address: tuple[str, int], allow_remote: bool) -> None:
    from awl.server import serve_desk_http

    # No task group here: an error before listening (a taken port) must reach the CLI as
    # itself, one line, not wrapped in an exception group.
    await serve_desk_http(server, address[0], address[1], allow_remote=allow_remote,
                          task_status=_Announce())


class _Announce:
    """Says on stderr where the desk listens, once it does."""

    def started(self, value: str | None = None) -> None:
        print(f"awl serve: serving the desk on {value}; each request sends "
              "'Authorization: Bearer <desk token>'", file=sys.stderr, flush=True)


def _issue_token(args: argparse.Namespace) -> int:
    store = default_store(args.home, url=args.store)
    try:
        token = issue_token(store, args.principal)
    finally:
        store.close()
    if args.json:
        print(json.dumps({"principal": args.principal, "token": token}))
    else:
        print(token)
    print(f"awl token: issued for {args.principal} (id {token_id(token_hash(token))}); the "
          "desk keeps only its hash, so store it now", file=sys.stderr)
    return 0


def _token_rows(records: list[TokenRecord]) -> list[dict[str, str]]:
    return [{"id": token_id(t.token_hash), "principal": t.principal, "issued": t.created_at}
            for t in records]


def _list_tokens(args: argparse.Namespace) -> int:
    store = default_store(args.home, url=args.store, create=False)
    try:
        rows = _token_rows(store.tokens())
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows))
    elif not rows:
        print("no desk tokens (issue one with `awl token issue PRINCIPAL`)")
    else:
        for row in rows:
            print(f"{row['id']}  {row['issued']}  {row['principal']}")
    return 0


def _revoke_tokens(args: argparse.Namespace) -> int:
    store = default_store(args.home, url=args.store, create=False)
    try:
        token = stdin_text("the token").strip() if args.token == "-" else args.token
        rows = _token_rows(revoke_tokens(store, id_prefix=args.id, token=token,
                                         principal=args.principal))
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            print(f"revoked {row['id']}  {row['issued']}  {row['principal']}")
    return 0
