"""``awl web``: the manager's approval page over HTTP (BIND-9 to BIND-13).

On start it prints, on stderr, the address and, with ``--as``, a sign-in link carrying a
one-time code for that principal; anyone else signs in with a desk token.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio

from awl.cli._common import add_store_option, check_address, check_seconds, named_actor
from awl.cli._notify import check_deliverer_options, deliverer_options, start_deliverer
from awl.desk.home import default_store, home_dir
from awl.desk.tokens import check_principal
from awl.documents.errors import BadRequest
from awl.documents.limits import show_value
from awl.store.protocol import WebSessions


def register(subparsers: Any) -> None:
    """Add ``web`` to the ``awl`` command."""
    web = subparsers.add_parser(
        "web", help="serve the manager's approval page (inbox, orders, held effects)",
        description="Serve the desk's manager view in a browser: the inbox, each order with "
                    "its evidence, and its held effects to approve, rework, commit or settle. "
                    "Sign in with the one-time link printed for --as, or with a desk token "
                    "(`awl token issue human:ana`).")
    web.add_argument("--listen", default="127.0.0.1:8766", metavar="HOST:PORT",
                     help="where to listen (default 127.0.0.1:8766; port 0 picks one)")
    web.add_argument("--allow-remote", action="store_true",
                     help="allow a non-loopback --listen address")
    web.add_argument("--as", dest="principal", metavar="PRINCIPAL",
                     help="print a one-time sign-in link for this principal (e.g. human:ana; "
                          "default: $AWL_ACTOR)")
    web.add_argument("--config", metavar="FILE",
                     help="upstream servers (mcpServers JSON): lets the page run commits "
                          "and retries; without it the page shows the command to run")
    web.add_argument("--session-hours", type=float, default=8.0, metavar="HOURS",
                     help="how long a sign-in lasts (default 8)")
    web.add_argument("--home", metavar="DIR",
                     help="the desk's home folder (default: $AWL_HOME, else ./.awl)")
    add_store_option(web)
    deliverer_options(web)
    web.set_defaults(func=_web)


def _web(args: argparse.Namespace) -> int:
    from awl.mcp.transport import is_loopback, listen
    from awl.web import Sessions, WebConfig, build_app, loopback_hosts

    host, port = check_address(args.listen, flag="--listen", allow_remote=args.allow_remote,
                               example="127.0.0.1:8766")
    loopback = is_loopback(host)
    # Finite, a year at most: inf would fail only at the first sign-in (the cookie's age).
    check_seconds(args.session_hours, flag="--session-hours", unit=3600)
    check_deliverer_options(args)
    args.principal = named_actor(args.principal)
    if args.principal is not None:
        check_principal(args.principal)
    upstream = None
    if args.config is not None:
        from gateway import load_config
        upstream = load_config(args.config)
    home = home_dir(args.home)
    try:
        sock = listen(host, port)
    except BadRequest as exc:  # a taken port: not a usage error, but say which flag
        raise BadRequest(f"--listen {show_value(args.listen)}: {exc.message}") from None
    port = sock.getsockname()[1]
    store = default_store(home, url=args.store)
    # Sessions live in the store, so they outlast a restart and every `awl web` on the store
    # shares them (BIND-9); a store that keeps none leaves them in this process.
    sessions = Sessions(store if isinstance(store, WebSessions) else None,
                        ttl=args.session_hours * 3600)
    config = WebConfig(upstream=upstream, upstream_path=args.config, home=args.home,
                       store=args.store, hosts=loopback_hosts(host, port) if loopback else None,
                       public_url=args.public_url)
    app = build_app(store, sessions, config)
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    deliverer = None
    try:
        deliverer = start_deliverer(args, store)
        anyio.run(_serve, app, sock, base, sessions, args.principal)
    finally:
        if deliverer is not None:
            deliverer.stop()
        sock.close()
        store.close()
    return 0


async def _serve(app: Any, sock: Any, base: str, sessions: Any, principal: str | None) -> None:
    import uvicorn

    from awl.mcp.transport import HeadDeadline

    # HeadDeadline: a connection that never sends a whole request head is closed (a body
    # that never arrives is refused by the page itself, BIND-12).
    config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=1, http=HeadDeadline)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:
            await anyio.sleep(0.01)
        print(f"awl web: the approval page is at {base}/", file=sys.stderr)
        if principal is not None:
            code = sessions.new_code(principal)
            print(f"awl web: sign in as {principal} (once) at {base}/signin?code={code}",
                  file=sys.stderr, flush=True)
        else:
            print("awl web: sign in with a desk token (`awl token issue human:you`)",
                  file=sys.stderr, flush=True)
