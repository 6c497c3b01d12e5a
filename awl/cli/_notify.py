"""``awl notify``: webhooks for managers (HOOK-1 to HOOK-6).

``add`` subscribes a URL to events and prints its signing secret, once; ``list`` and
``remove`` manage subscriptions; ``log`` shows the outbox with every delivery attempt; ``run``
delivers until interrupted (``awl web`` and ``awl serve`` run the same deliverer while they
run). :func:`deliverer_options`, :func:`check_deliverer_options` and :func:`start_deliverer`
give those commands the options. A webhook URL is shown with its password hidden, as a store
URL is (:func:`awl.store.urls.shown_url`): the receiver has it, and no listing needs it (the
desk's own refusals hide it too, :func:`awl.desk.notify.check_url`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from awl.cli._common import CLIError, add_json_option, add_store_option, check_seconds
from awl.desk.desk import Desk
from awl.desk.home import default_store
from awl.desk.notify import (
    PUBLIC_URL_ENV,
    Deliverer,
    check_public_url,
    describe,
    describe_notification,
    webhook_store,
)
from awl.documents.errors import BadRequest
from awl.documents.limits import check_integer
from awl.store.protocol import WebhookStore
from awl.store.urls import shown_url


def register(subparsers: Any) -> None:
    """Add ``notify`` and its subcommands to the ``awl`` command."""
    group = subparsers.add_parser(
        "notify", help="webhooks: tell a chat or a service when an order needs you",
        description="Webhook subscriptions kept in the desk. Each event is written to the "
                    "desk's outbox with the change that causes it and POSTed, signed per "
                    "Standard Webhooks, by `awl notify run` (or by `awl web` / `awl serve` "
                    "while they run), retried until delivered or given up.")
    sub = group.add_subparsers(dest="notify_command", metavar="COMMAND", required=True)

    add = sub.add_parser("add", help="subscribe a URL to events; prints its secret once",
                         description="Subscribe URL to events. Prints the subscription's "
                                     "signing secret (whsec_...) once: give it to the "
                                     "receiver, which verifies each webhook-signature with it.")
    add.add_argument("url", metavar="URL", help="where to POST (http:// or https://)")
    add.add_argument("--events", required=True, metavar="LIST",
                     help="comma-separated: submitted, blocked, expired, unknown, committed, "
                          "failed")
    add.add_argument("--orders", metavar="IDS",
                     help="comma-separated order ids (default: every order)")
    add.set_defaults(func=_add)

    listing = sub.add_parser("list", help="show the subscriptions (never their secrets)",
        description="List the webhook subscriptions: id, URL, events and orders. Their "
                    "secrets are never shown.")
    listing.set_defaults(func=_list)

    remove = sub.add_parser("remove", help="remove a subscription; its pending notifications "
                                           "are never sent",
        description="Remove a webhook subscription. Its notifications not yet delivered are "
                    "never sent.")
    remove.add_argument("id", metavar="ID")
    remove.set_defaults(func=_remove)

    log = sub.add_parser("log", help="show notifications, newest first, with every attempt",
        description="Show the notifications, newest first, each with every delivery attempt "
                    "and its answer.")
    log.add_argument("--order", metavar="ID", help="only this order's")
    log.add_argument("--webhook", metavar="ID", help="only this subscription's")
    log.add_argument("--state", choices=("pending", "delivered", "dead"),
                     help="only notifications in this state")
    log.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (50)")
    log.set_defaults(func=_log)

    run = sub.add_parser("run", help="deliver the outbox until interrupted",
                         description="Deliver pending notifications until interrupted (Ctrl-C). "
                                     "Several deliverers may run at once: each notification "
                                     "is claimed by one at a time.")
    run.add_argument("--once", action="store_true",
                     help="try each notification due now once, then exit")
    deliverer_options(run, switch=False)
    run.add_argument("--retry-for", type=float, default=86400.0, metavar="SECONDS",
                     help="how long after its event a notification is retried (86400)")
    run.add_argument("--backoff", type=float, default=2.0, metavar="SECONDS",
                     help="the delay after a first failure; it doubles each time (2)")
    run.add_argument("--poll", type=float, default=1.0, metavar="SECONDS",
                     help="how often to look for new notifications (1)")
    run.set_defaults(func=_run)

    for command in (add, listing, remove, log, run):
        command.add_argument("--home", metavar="DIR",
                             help="the desk's home folder (default: $AWL_HOME, else ./.awl)")
        add_store_option(command)
        if command is not run:
            add_json_option(command)


def deliverer_options(parser: argparse.ArgumentParser, *, switch: bool = True) -> None:
    """The deliverer's options, for ``notify run`` and the servers that run one."""
    parser.add_argument("--public-url", metavar="URL",
                        help="the approval page's public address; notifications then link "
                             f"each order's page (default: ${PUBLIC_URL_ENV})")
    parser.add_argument("--notify-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long one webhook POST may take (10)")
    if switch:
        parser.add_argument("--no-notify", action="store_true",
                            help="do not deliver webhooks from this process")


def check_deliverer_options(args: argparse.Namespace) -> None:
    """Refuse a deliverer's wait that is no number of seconds, or a public URL that is no
    http(s) address, naming its flag (the deliverer itself names its parameters); a server
    command checks before it opens the desk or listens. ``args.public_url`` is then the
    checked address: ``--public-url``, else ``$AWL_PUBLIC_URL``, else None."""
    for flag in ("--notify-timeout", "--retry-for", "--backoff", "--poll"):
        check_seconds(getattr(args, flag[2:].replace("-", "_"), None), flag=flag)
    args.public_url = public_url(args.public_url)


def public_url(given: str | None) -> str | None:
    """``--public-url`` (``given``), else ``$AWL_PUBLIC_URL`` (empty is none), checked;
    CLIError (exit 2) naming which of them is wrong and what to write."""
    where = "--public-url"
    if given is None:
        given = os.environ.get(PUBLIC_URL_ENV) or None
        where = f"${PUBLIC_URL_ENV} (the default of --public-url)"
        if given is None:
            return None
    try:
        return check_public_url(given, what=where)
    except BadRequest as exc:
        raise CLIError(f"{exc.message}; write the approval page's address as browsers reach "
                       "it, for example https://awl.example.com") from None


def make_deliverer(args: argparse.Namespace, store: Any, **options: Any) -> Any:
    """The deliverer the parsed options ask for (BadRequest for a bad public URL, or a
    store that keeps no webhooks)."""
    return Deliverer(webhook_store(store), public_url=args.public_url,
                     timeout=args.notify_timeout, **options)


def start_deliverer(args: argparse.Namespace, store: Any) -> Any:
    """Start the deliverer for a server command, unless ``--no-notify`` or the store keeps
    no webhooks; None then."""
    if args.no_notify or not isinstance(store, WebhookStore):
        return None
    return make_deliverer(args, store).start()


def _store(args: argparse.Namespace, *, create: bool = False) -> Any:
    """The desk's store; only ``notify add`` makes a desk that is not there yet."""
    return default_store(args.home, url=args.store, create=create)


def _desk(args: argparse.Namespace, *, create: bool = False) -> Any:
    return Desk(_store(args, create=create))


def _add(args: argparse.Namespace) -> int:
    desk = _desk(args, create=True)
    try:
        webhook = desk.add_webhook(args.url, args.events, orders=args.orders)
    finally:
        desk.store.close()
    if args.json:
        print(json.dumps(describe(webhook, secret=True)))
    else:
        print(f"{webhook.id}  {shown_url(webhook.url)}  {','.join(webhook.events)}  "
              f"{_scope(webhook)}")
        print(f"secret: {webhook.secret}")
    print(f"awl notify: subscribed {webhook.id}; its secret is shown only now: give it to the "
          "receiver to verify each webhook-signature", file=sys.stderr)
    return 0


def _scope(webhook: Any) -> str:
    return "every order" if webhook.orders is None else ",".join(webhook.orders)


def _list(args: argparse.Namespace) -> int:
    desk = _desk(args)
    try:
        webhooks = desk.webhooks()
    finally:
        desk.store.close()
    if args.json:
        print(json.dumps([describe(w) for w in webhooks]))
    elif not webhooks:
        print("no webhooks (add one with `awl notify add URL --events ...`)")
    for webhook in [] if args.json else webhooks:
        print(f"{webhook.id}  {webhook.created_at}  {shown_url(webhook.url)}  "
              f"{','.join(webhook.events)}  {_scope(webhook)}")
    return 0


def _remove(args: argparse.Namespace) -> int:
    desk = _desk(args)
    try:
        desk.remove_webhook(args.id)
    finally:
        desk.store.close()
    if args.json:
        print(json.dumps({"id": args.id, "removed": True}))
    else:
        print(f"removed {args.id}; its pending notifications will not be sent")
    return 0


def _log(args: argparse.Namespace) -> int:
    check_integer(args.limit, name="--limit", minimum=1)
    desk = _desk(args)
    try:
        notes = desk.notifications(state=args.state, webhook_id=args.webhook,
                                   order_id=args.order, limit=args.limit)
    finally:
        desk.store.close()
    if args.json:
        print(json.dumps([describe_notification(n) for n in notes]))
        return 0
    if not notes:
        print("no notifications")
    for note in notes:
        when = f"next {note.next_at}" if note.state == "pending" else ""
        print(f"{note.created_at}  {note.id}  {note.event}  {note.order_id}  {note.webhook_id}"
              f"  {note.state}  {len(note.attempts)} attempt(s)  {when}".rstrip())
        for attempt in note.attempts:
            status = "no answer" if attempt.status is None else f"HTTP {attempt.status}"
            said = "delivered" if attempt.error is None else attempt.error
            print(f"    {attempt.at}  {status}  {attempt.ms:g} ms  {said}")
        if note.error is not None:
            print(f"    dead: {note.error}")
    return 0


def _run(args: argparse.Namespace) -> int:
    check_deliverer_options(args)
    store = _store(args)
    try:
        deliverer = make_deliverer(args, store, retry_for=args.retry_for,
                                   backoff=args.backoff, poll=args.poll)
        if args.once:
            tried = deliverer.deliver_due(limit=1000)
            print(f"awl notify: tried {tried} notification(s)", file=sys.stderr)
            return 0
        print("awl notify: delivering the outbox; Ctrl-C stops", file=sys.stderr, flush=True)
        deliverer.start()
        try:
            while deliverer.alive:
                time.sleep(0.2)
        finally:
            deliverer.stop()
    finally:
        store.close()
    return 0
