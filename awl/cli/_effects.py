"""``awl effects``: list an order's held calls, settle an unknown one, retry a settled one.

The manager's side of committing: ``list`` shows every held call with its state,
arguments and settlement; ``settle`` records whether an ``unknown`` effect happened, with
evidence (both :mod:`awl.desk.effects`, store only); ``retry`` sends an effect settled as
``did_not_happen`` again, with the same ``awl/ref`` (:mod:`gateway._commit`, imported when
used, since it needs the upstream servers).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from typing import Any

from awl.cli._common import acting, add_json_option, add_store_option, naming_the_desk
from awl.cli._gateway import send_once
from awl.desk import Desk
from awl.desk.effects import EffectView, list_effects
from awl.desk.home import default_store
from awl.desk.settlement import settle
from awl.documents.display import scan, shown_value, visible


def register(subparsers: Any) -> None:
    """Add ``effects`` and its subcommands to the ``awl`` command."""
    group = subparsers.add_parser(
        "effects", help="list, settle and retry an order's held calls",
        description="The held calls of an order and what became of them after approval. "
                    "An effect whose outcome is unknown is never sent again until its "
                    "manager settles it.")
    sub = group.add_subparsers(dest="effects_command", metavar="COMMAND", required=True)

    listing = sub.add_parser("list", help="show every held call with its state",
                             description="Show every held call of the order: state, tool, "
                                         "arguments, result or error, and settlement.")
    listing.add_argument("order", metavar="ORDER")
    _common(listing)
    listing.set_defaults(func=_list)

    settle = sub.add_parser(
        "settle", help="record whether an unknown effect happened",
        description="Record, as the order's manager, whether an effect with an unknown "
                    "outcome happened. Settling does not send anything; an effect settled "
                    "as did-not-happen may then be retried.")
    settle.add_argument("order", metavar="ORDER")
    settle.add_argument("ref", metavar="REF", help="the effect, server/tool#N")
    verdict = settle.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--happened", dest="verdict", action="store_const", const="happened",
                         help="it ran (it will never be sent again)")
    verdict.add_argument("--did-not-happen", dest="verdict", action="store_const",
                         const="did_not_happen", help="it did not run (it may be retried)")
    settle.add_argument("--evidence", required=True, metavar="TEXT",
                        help="what the finding rests on (kept in the order's log)")
    settle.add_argument("--as", dest="actor", metavar="MANAGER",
                        help="who settles: the order's manager (default: $AWL_ACTOR)")
    _common(settle)
    settle.set_defaults(func=_settle)

    retry = sub.add_parser(
        "retry", help="send an effect settled as did-not-happen again",
        description="Send an effect settled as did-not-happen again, with the same awl/ref, "
                    "after checking the order still gives the authority (approved, before "
                    "its deadline, tool allowed and staged). Exit 1 unless it commits, 3 "
                    "when a commit of the order holds its lock (nothing was sent).")
    retry.add_argument("order", metavar="ORDER")
    retry.add_argument("ref", metavar="REF", help="the effect, server/tool#N")
    retry.add_argument("--config", required=True, metavar="FILE",
                       help="the upstream config (mcpServers) to send it through")
    retry.add_argument("--as", dest="actor", metavar="MANAGER",
                       help="who retries: the order's manager (default: $AWL_ACTOR)")
    retry.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="how long to wait for the answer (default: the server's timeout)")
    retry.add_argument("--lock-wait", type=float, default=0.0, metavar="SECONDS",
                       help="how long to wait for a commit of the order that is running")
    _common(retry)
    retry.set_defaults(func=_retry)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", metavar="DIR",
                        help="the desk's home (default: $AWL_HOME, else ./.awl)")
    add_store_option(parser)
    add_json_option(parser)


def _sends(dispatches: int) -> str:
    """How often the effect's request went out, in words: a retry follows a settlement that
    the earlier send did not happen, so the receiver is meant to hold one of them."""
    if dispatches == 0:
        return "never sent"
    if dispatches == 1:
        return "sent once"
    earlier = dispatches - 1
    return (f"sent {dispatches} times: retried after {earlier} send{'s' if earlier > 1 else ''} "
            "settled as did-not-happen")


def _view_lines(order_id: str, views: Sequence[EffectView]) -> Iterator[str]:
    if not views:
        yield "no held calls"
        return
    for v in views:
        extra = " (retryable)" if v.retryable else ""
        yield f"{v.ref}  {v.state}{extra}  attempt {v.attempt}  {_sends(v.dispatches)}"
        # As stored (the tool's order, not sorted), through the display rule (SEC-14);
        # --json has the exact JSON.
        yield f"  arguments: {json.dumps(shown_value(v.arguments), ensure_ascii=False)}"
        for flag in scan(v.arguments):
            yield f"  warning {_line(flag.line())}"
        if v.result is not None:
            yield f"  result: {_line(_result_text(v.result))}"
        if v.error:
            yield f"  note: {_line(v.error)}"
        if v.settlement is not None:
            s = v.settlement
            yield (f"  settled {s.verdict.replace('_', ' ')} by {_line(s.by)} at {s.at}: "
                   f"{_line(s.evidence)}")
        elif v.state == "unknown":
            yield (f"  unsettled: find out whether it ran, then `awl effects settle "
                   f"{order_id} {v.ref} --happened|--did-not-happen --evidence ...`")


def _line(text: str) -> str:
    """``text`` on one line, what would not show (line breaks too) written ``<U+XXXX>``
    (SEC-14)."""
    return visible(text)


_RESULT_CHARS = 500
"""The most characters of an effect's result ``awl effects list`` prints (--json has all)."""


def _result_text(result: dict[str, Any]) -> str:
    """An effect's recorded result in one line: its structured content, else its text."""
    if "structuredContent" in result:
        shown = json.dumps(result["structuredContent"], sort_keys=True, ensure_ascii=False)
    else:
        blocks = result.get("content")
        texts = [b.get("text") for b in blocks if isinstance(b, dict)] if isinstance(
            blocks, list) else []
        shown = " ".join(" ".join(t.split()) for t in texts if isinstance(t, str))
        shown = shown or "(no text)"
    return shown if len(shown) <= _RESULT_CHARS else shown[:_RESULT_CHARS - 1] + "…"


def _list(args: argparse.Namespace) -> int:
    store = default_store(args.home, url=args.store, create=False)
    try:
        with naming_the_desk(store):
            Desk(store).get(args.order)  # NotFound; an ended order's undone drops are done
            views = list_effects(args.order, store=store)
    finally:
        store.close()
    if args.json:
        print(json.dumps({"order_id": args.order, "effects": [v.to_json() for v in views]},
                         indent=2, sort_keys=True))
    else:
        for line in _view_lines(args.order, views):
            print(line)
    return 0


def _settle(args: argparse.Namespace) -> int:
    store = default_store(args.home, url=args.store, create=False)
    try:
        with naming_the_desk(store):
            view = settle(args.order, args.ref, args.verdict, args.evidence,
                          acting(args.actor), store=store)
    finally:
        store.close()
    if args.json:
        print(json.dumps(view.to_json(), indent=2, sort_keys=True))
    else:
        verdict = args.verdict.replace("_", " ")
        then = ("it may now be retried with `awl effects retry`" if view.retryable
                else "it will never be sent again")
        print(f"settled {view.ref} of order {args.order} as {verdict}; {then}")
    return 0


def _retry(args: argparse.Namespace) -> int:
    from gateway import EXIT_LOCKED, retry_sync

    actor = acting(args.actor)
    outcome = send_once(args, lambda store, config: retry_sync(
        args.order, args.ref, actor, store=store, pool_or_config=config,
        timeout=args.timeout, lock_wait=args.lock_wait))
    if outcome is None:
        return EXIT_LOCKED
    if args.json:
        print(json.dumps(outcome.to_json(), indent=2, sort_keys=True))
    else:
        print(f"{outcome.ref}  {outcome.tool}  {outcome.state}  {outcome.reason}")
    return 0 if outcome.state == "committed" else 1
