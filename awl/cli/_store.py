"""``awl store``: work on a desk's store as a whole.

``copy`` moves a desk between backends (SQLite to PostgreSQL, say): everything the source
store holds goes into an empty target through the store operations, and the two are then read
back and compared (:mod:`awl.store.copy`).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from awl.cli._common import add_json_option
from awl.store.copy import copy_store
from awl.store.urls import USAGE, open_store, shown_url


def register(subparsers: Any) -> None:
    """Add ``store`` and its subcommands to the ``awl`` command."""
    group = subparsers.add_parser(
        "store", help="copy a whole desk from one store to another",
        description="Work on a desk's store as a whole. A store is named by a URL: "
                    f"{USAGE}.")
    sub = group.add_subparsers(dest="store_command", metavar="COMMAND", required=True)
    copy = sub.add_parser(
        "copy", help="copy every order, log, call, effect, pass, revocation, token and webhook",
        description="Copy a whole desk into an empty store, then read both back and compare "
                    "them; exits 0 only when the copy is equal. A target that holds anything "
                    "is refused, and nothing is written to it. A SQLite or PostgreSQL "
                    "target is written in one transaction: a copy that is stopped half way "
                    "leaves it empty. Stop the desk's gateways, servers and committers "
                    "first: locks are not copied.")
    copy.add_argument("--from", dest="source", required=True, metavar="URL",
                      help="the store to copy (it must exist)")
    copy.add_argument("--to", dest="target", required=True, metavar="URL",
                      help="the empty store to copy into (a new SQLite file is created)")
    add_json_option(copy)
    copy.set_defaults(func=_copy)


def _copy(args: argparse.Namespace) -> int:
    source = open_store(args.source, create=False)
    try:
        target = open_store(args.target)
        try:
            counts = copy_store(source, target)
        finally:
            target.close()
    finally:
        source.close()
    src, dst = shown_url(args.source), shown_url(args.target)
    if args.json:
        print(json.dumps({"from": src, "to": dst, "verified": True,
                          "copied": asdict(counts)}))
    else:
        print(f"copied {counts.line()} from {src} to {dst}; verified: the copy reads back "
              "equal to the source")
    return 0
