"""``awl gateway``: serve one order's tools to its worker, or commit its approved effects.

Without ``--commit`` the gateway speaks MCP over stdin/stdout (or streamable HTTP with
``--http``), so stdout is the protocol stream: this command prints nothing else there.
With ``--commit`` it runs the effects the manager approved (``gateway._commit``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

from awl.cli._common import (
    CLIError,
    add_json_option,
    add_store_option,
    check_address,
    check_seconds,
    read_pass_file,
)
from awl.desk.home import default_store
from awl.documents.errors import BadRequest
from awl.documents.limits import show_value
from awl.store.protocol import Store

_T = TypeVar("_T")

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
    add_store_option(parser)
    given = parser.add_mutually_exclusive_group()
    given.add_argument("--pass-file", metavar="PATH",
                       help="run the worker under the Delegation Pass in this file (or set "
                            "$AWL_PASS); without one, as the order's worker")
    given.add_argument("--pass", dest="pass_token", metavar="TOKEN",
                       help="the pass itself: other users of the machine can read it in the "
                            "process list, so prefer --pass-file or $AWL_PASS")
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
    add_json_option(commit, "with --commit, print the commit's outcome")
    commit.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="with --commit, seconds each effect may take")
    commit.add_argument("--lock-wait", type=float, default=0.0, metavar="SECONDS",
                        help="with --commit, how long to wait for another committer")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.commit:
        given = args.pass_token is not None or args.pass_file is not None  # even if empty
        if args.http is not None or given or args.safe or args.allow_remote:
            raise CLIError("--commit runs approved effects and serves nothing; drop --http, "
                           "--pass, --pass-file, --safe and --allow-remote")
        return _commit(args)
    if args.json or args.timeout is not None or args.lock_wait:
        raise CLIError("--json, --timeout and --lock-wait go with --commit")
    from gateway import CHECKPOINT_SECONDS, PASS_ENV, run_gateway

    if args.http is None and args.allow_remote:
        raise CLIError("--allow-remote goes with --http")
    # '' is refused; a remote address without --allow-remote too, before the desk is opened.
    http = None if args.http is None else check_address(args.http, flag="--http",
                                                        allow_remote=args.allow_remote)
    if http is not None and (args.pass_token is not None or args.pass_file is not None):
        raise CLIError("over --http each worker sends its own pass as a Bearer token; "
                       "drop --pass and --pass-file")
    token = None if http is not None else _pass_token(args) or _env_pass(PASS_ENV)
    # No call pays for a WAL checkpoint: a thread of the store runs them (GW-18).
    store = default_store(args.home, url=args.store, checkpoint_every=CHECKPOINT_SECONDS,
                          create=False)
    try:
        anyio.run(lambda: run_gateway(
            args.order, args.config, http=http, allow_remote=args.allow_remote, store=store,
            home=args.home, pass_token=token, safe=True if args.safe else None,
            announce=sys.stderr))
    except BadRequest as exc:
        if http is None:
            raise
        from awl.mcp.transport import CannotListen  # loaded already: it serves the HTTP

        if not isinstance(exc, CannotListen):
            raise
        raise BadRequest(f"--http {show_value(args.http)}: {exc.message}") from None
    finally:
        store.close()
    return 0


def _commit(args: argparse.Namespace) -> int:
    """``awl gateway --order ID --config FILE --commit``: commit and print the summary.

    Exit code 0 when every approved effect is committed, :data:`~gateway._lock.EXIT_LOCKED`
    when another live committer holds the order's lock (nothing was sent), 1 otherwise.
    """
    from gateway import EXIT_LOCKED, commit_sync

    if not args.order:
        raise BadRequest("--commit needs --order ORDER_ID")
    if not args.config:
        raise BadRequest("--commit needs --config FILE (the upstream servers to send to)")
    try:
        summary = send_once(args, lambda store, config: commit_sync(
            args.order, store=store, pool_or_config=config, timeout=args.timeout,
            lock_wait=float(args.lock_wait or 0.0)))
    except KeyboardInterrupt:
        # Exit 130 as any Ctrl-C does, but say where the effects stand: one being sent may
        # have run, and is never sent again on its own.
        print(f"awl: interrupted: the commit of order {args.order} stopped; an effect it "
              "was sending stays unknown until you settle it (`awl effects list "
              f"{args.order}`), and the rest were not sent", file=sys.stderr, flush=True)
        raise
    if summary is None:
        return EXIT_LOCKED
    if args.json:
        print(json.dumps(summary.to_json(), indent=2, sort_keys=True))
    else:
        for line in summary.lines():
            print(line)
    sys.stdout.flush()
    return 0 if summary.ok else 1


def send_once(args: argparse.Namespace, send: Callable[[Store, Any], _T]) -> _T | None:
    """Run a commit or a retry (``send``) with the desk's store (``args.store``, else
    ``AWL_STORE``, else the one in ``args.home``) and the
    upstream config (``args.config``: loaded first, so a bad one fails before the store is
    opened; typed Any so the gateway is imported only when used).

    None when another live committer holds the order's lock (nothing was sent); that is
    said on the way out, as JSON with ``args.json``.
    """
    from gateway import LockBusy, load_config

    # Checked before anything is marked `dispatching`: a timeout of 0 or less would turn
    # every approved effect `unknown` unsent, and nan fails after the first mark.
    check_seconds(args.timeout, flag="--timeout")
    check_seconds(args.lock_wait, flag="--lock-wait", zero=True)
    config = load_config(args.config)
    store = default_store(args.home, url=args.store, create=False)
    try:
        return send(store, config)
    except LockBusy as exc:
        if args.json:
            print(json.dumps({"order_id": args.order, "ok": False, "error": "LOCKED",
                              "message": exc.message}, indent=2, sort_keys=True))
        else:
            print(f"awl: LOCKED: {exc.message}", file=sys.stderr)
        sys.stdout.flush()
        return None
    finally:
        store.close()


def _env_pass(name: str) -> str | None:
    """The pass in the environment variable ``name`` (stripped), or None when it is unset.

    Set but blank is refused, as an empty ``--pass`` is: ``AWL_PASS="$(cat missing.pass)"``
    would otherwise give the connection the whole order instead of the pass."""
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.strip():
        raise CLIError(f"{name} is set but empty; put the token `awl pass issue` printed in "
                       f"it, or unset {name} to run as the order's worker")
    return value.strip()


def _pass_token(args: argparse.Namespace) -> str | None:
    """The pass given by ``--pass-file`` (its text, stripped) or ``--pass``."""
    if args.pass_file is None:
        token: str | None = args.pass_token
        if token is not None and not token.strip():
            # Say so rather than run as the order's worker: `--pass "$T"` with T unset
            # would otherwise give the connection the whole order instead of the pass.
            raise CLIError("--pass is empty; give the token `awl pass issue` printed, or "
                           "leave --pass out to run as the order's worker")
        return token
    return read_pass_file(args.pass_file)
