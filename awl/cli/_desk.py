"""The manager's commands on the desk, and the worker's for scripts.

Manager: ``awl order create|list|show|follow|questions``, ``awl review``, ``awl answer``,
``awl cancel``, ``awl track``, ``awl handoff``. Worker: ``awl work
accept|decline|start|progress|report``.

Every command takes ``--home DIR`` (else ``$AWL_HOME``, else ``./.awl``) and ``--json``;
commands that write take ``--as PRINCIPAL`` (else ``$AWL_ACTOR``) and refuse to run
without one. Output is for people unless ``--json`` is given; errors are one line on
stderr with a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from awl.cli._common import (
    ACTOR_ENV,
    CLIError,
    acting,
    add_json_option,
    add_store_option,
    named_actor,
    naming_the_desk,
    read_document,
)
from awl.desk import Desk, OrderView, Question
from awl.desk.criteria import check_question, latest_checks
from awl.desk.effects import ApprovalScope, list_effects, scope_of
from awl.desk.home import default_store
from awl.desk.track import TrackRecord
from awl.documents.display import scan, shown_value, visible
from awl.documents.errors import ValidationFailed
from awl.documents.lifecycle import ACTIVE, TERMINAL
from awl.documents.limits import MAX_QUESTION_PAGE, QUESTION_PAGE, check_integer
from awl.documents.models import Event, WorkOrder
from awl.store.urls import shown_url

__all__ = ["register"]

FOLLOW_TIMED_OUT = 3
"""Exit code of ``awl order follow`` when ``--timeout`` ran out before the order ended."""

_STATES = sorted(ACTIVE | TERMINAL)
_BREAKS = re.compile("[\t\n\r\x0b\x0c\x85\u2028\u2029]")


# --------------------------------------------------------------------------- plumbing

def _fail(message: str) -> Exception:
    return CLIError(message)


def _percent(text: str | None) -> int | None:
    """``--percent`` as a whole number from 0 to 100 (``40`` or ``40.0``; LC-11)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value.is_integer() or not 0 <= value <= 100:
        raise _fail(f"--percent takes a whole number from 0 to 100, not {text!r}")
    return int(value)


def _clean(text: str) -> str:
    """One line, whatever the text holds (a goal or a note may have line breaks), shown by
    the display rule (SEC-14): what would not show is written ``<U+XXXX>``."""
    return visible(_BREAKS.sub(" ", text))


def _effect_lines(arguments: dict[str, Any], indent: str) -> list[str]:
    """A warning line for each string in an effect's arguments that is not what it looks
    like (SEC-14)."""
    return [f"{indent}warning {_short(flag.line(), 300)}" for flag in scan(arguments)]


def _short(text: str, limit: int) -> str:
    line = " ".join(_clean(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _common(parser: argparse.ArgumentParser, *, writes: bool) -> None:
    parser.add_argument("--home", metavar="DIR",
                        help="the desk's home (default: $AWL_HOME, else ./.awl)")
    add_store_option(parser)
    add_json_option(parser)
    what = ("required: who is acting" if writes else
            "whose view: only what that principal may see")
    parser.add_argument("--as", dest="actor", metavar="PRINCIPAL",
                        help=f"{what} (default: ${ACTOR_ENV})")


def _actor(args: argparse.Namespace) -> str:
    return acting(args.actor)


def _viewer(args: argparse.Namespace) -> str | None:
    """Whose view a read shows: ``--as`` (else ``$AWL_ACTOR``), who then sees only what the
    desk shows that principal over MCP (the orders it is part of, or is above); None, the
    desk's operator, sees everything (as ``awl track`` does, SEC-8)."""
    return named_actor(args.actor)


@contextmanager
def _desk(args: argparse.Namespace, *, create: bool = False) -> Iterator[Desk]:
    """The desk the command names. Only a command that starts a desk's history (``order
    create``) makes one; every other command on a desk that is not there fails naming the path
    it read, and leaves nothing behind."""
    store = default_store(args.home, url=args.store, create=create)
    try:
        with naming_the_desk(store):
            yield Desk(store)
    except ValidationFailed as exc:
        if args.json:  # scripts get the findings; the one-line error still goes to stderr
            print(json.dumps({"error": exc.code, "message": exc.message,
                              "findings": [f.to_dict() for f in exc.findings]}, indent=2))
        raise
    finally:
        store.close()


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _object(name: str, what: str) -> dict[str, Any]:
    doc = read_document(name)
    if not isinstance(doc, dict):
        raise _fail(f"{name}: a {what} is a JSON object")
    return doc


# --------------------------------------------------------------------------- registering

def register(subparsers: Any) -> None:
    """Add the desk commands to the ``awl`` command."""
    order = subparsers.add_parser(
        "order", help="create, list, show and follow work orders",
        description="Work orders on the desk.")
    sub = order.add_subparsers(dest="order_command", metavar="COMMAND", required=True)

    create = sub.add_parser(
        "create", help="issue an order from a JSON file",
        description="Issue a work order. The file holds a full order or its fields: spec, "
                    "id, created_at and from are filled in when absent (from is --as).")
    create.add_argument("file", metavar="FILE", help="the order as JSON, or - for stdin")
    create.add_argument("--copy-handoff", action="store_true",
                        help="copy the handoff of the order this one continues")
    create.add_argument("--workspace", metavar="DIR",
                        help="the folder the work happens in (the top of a git work tree, "
                             "or a plain folder); the desk snapshots it "
                             "when the order starts and runs the criteria's checks there")
    _common(create, writes=True)
    create.set_defaults(func=_create)

    listing = sub.add_parser("list", help="list orders, newest first",
        description="Print the desk's orders, newest first, one line each: id, state, worker, "
                    "goal. With --as, only the orders that principal may see.")
    listing.add_argument("--state", action="append", choices=_STATES,
                         help="only this state (repeat for several)")
    listing.add_argument("--worker", metavar="W", help="only orders to this worker")
    listing.add_argument("--manager", metavar="M", help="only orders from this manager")
    listing.add_argument("--parent", metavar="ID", help="only sub-orders of this order")
    listing.add_argument("--limit", type=int, default=50, metavar="N",
                         help="at most N orders (default 50)")
    _common(listing, writes=False)
    listing.set_defaults(func=_list)

    show = sub.add_parser("show", help="show an order with its reports, reviews and events",
        description="Print an order whole: its goal, criteria, budget and spend, every report "
                    "and review, what the latest approval covers, and its event log.")
    show.add_argument("order_id", metavar="ID")
    _common(show, writes=False)
    show.set_defaults(func=_show)

    follow = sub.add_parser(
        "follow", help="print an order's events as they happen until it ends",
        description="Print the order's events live until it reaches a terminal state or "
                    "Ctrl-C. With --json, one JSON event per line. Exit 0 when the order "
                    f"ended, {FOLLOW_TIMED_OUT} when --timeout ran out first.")
    follow.add_argument("order_id", metavar="ID")
    follow.add_argument("--after", type=int, default=0, metavar="SEQ",
                        help="start after this seq (default: the whole log)")
    follow.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="stop after this many seconds")
    _common(follow, writes=False)
    follow.set_defaults(func=_follow)

    questions = sub.add_parser(
        "questions", help="open questions of blocked orders, most blocking first",
        description="The questions waiting for an answer, a page at a time, most blocking "
                    "first (BIND-20). With --as (or $AWL_ACTOR), only those that principal "
                    "may answer; with --all, every one. When more follow, the last line is "
                    "the command that shows the next page (with --json: `next`).")
    questions.add_argument("--all", action="store_true", help="every open question")
    questions.add_argument("--limit", type=int, default=QUESTION_PAGE, metavar="N",
                           help=f"at most N questions, 1 to {MAX_QUESTION_PAGE} "
                                f"(default {QUESTION_PAGE})")
    questions.add_argument("--after", metavar="CURSOR",
                           help="the page after this cursor (the one the page before printed)")
    _common(questions, writes=False)
    questions.set_defaults(func=_questions)

    review = subparsers.add_parser("review", help="approve a submitted report or send it back",
        description="Approve the submitted report of an order (all its effects, or only those "
                    "named with --effects), or send it back with --rework REASON, which drops "
                    "the attempt's held calls. Only the order's manager may.")
    review.add_argument("order_id", metavar="ID")
    decision = review.add_mutually_exclusive_group(required=True)
    decision.add_argument("--approve", action="store_true", help="approve the report")
    decision.add_argument("--rework", metavar="REASON", help="send it back, saying why")
    review.add_argument("--effects", metavar="REF,...",
                        help="with --approve: run only these effects (default: all)")
    review.add_argument("--reason", metavar="TEXT", help="with --approve: a note")
    review.add_argument("--attempt", type=int, metavar="N",
                        help="the attempt you reviewed (`awl order show` names it): refused "
                             "if the order's report is another attempt's by now")
    _common(review, writes=True)
    review.set_defaults(func=_review)

    answer = subparsers.add_parser("answer", help="answer a blocked order's questions",
        description="Answer the questions of a blocked order; the worker goes on from there. "
                    "Only the order's manager (or its escalate_to) may.")
    answer.add_argument("order_id", metavar="ID")
    answer.add_argument("text", metavar="TEXT", help="the answer")
    _common(answer, writes=True)
    answer.set_defaults(func=_write, verb="answered",
                        op=lambda desk, a, actor: desk.answer(a.order_id, actor, a.text))

    cancel = subparsers.add_parser("cancel", help="cancel an active order",
        description="Cancel an order that has not ended, with a reason kept in its log. Its "
                    "held calls are never sent.")
    cancel.add_argument("order_id", metavar="ID")
    cancel.add_argument("reason", metavar="REASON", help="why")
    _common(cancel, writes=True)
    cancel.set_defaults(func=_write, verb="cancelled",
                        op=lambda desk, a, actor: desk.cancel(a.order_id, actor, a.reason))

    track = subparsers.add_parser("track", help="a worker's track record",
        description="Print a worker's track record: orders approved the first time, after "
                    "rework, failed or expired; spend against budget; time to approval.")
    track.add_argument("worker", metavar="WORKER")
    _common(track, writes=False)
    track.set_defaults(func=_track)

    handoff = subparsers.add_parser("handoff", help="a Markdown briefing for whoever continues",
        description="Print a Markdown briefing of an order for whoever continues it: goal, "
                    "what was done, decisions, open questions and next steps.")
    handoff.add_argument("order_id", metavar="ID")
    _common(handoff, writes=False)
    handoff.set_defaults(func=_handoff)

    _register_work(subparsers)
    _register_checks(subparsers)


def _register_checks(subparsers: Any) -> None:
    group = subparsers.add_parser("checks", help="run an order's criteria checks again",
                                  description="The checks a manager wrote into the criteria.")
    run = group.add_subparsers(dest="checks_command", metavar="COMMAND", required=True) \
        .add_parser("run", help="re-run an order's checks in its workspace (manager)",
            description="Run the checks written into an order's criteria again, in its "
                        "workspace and in the sandbox, and print each one's result. Only the "
                        "order's manager may.")
    run.add_argument("order_id", metavar="ID")
    _common(run, writes=True)
    run.set_defaults(func=_checks_run)


def _register_work(subparsers: Any) -> None:
    work = subparsers.add_parser("work",
                                 help="the worker's side: accept, start, decline, progress, report",
                                 description="Worker operations, for scripts and tests.")
    sub = work.add_subparsers(dest="work_command", metavar="COMMAND", required=True)
    accept = sub.add_parser("accept", help="take an offered order",
        description="Accept an order offered to you (its worker).")
    accept.add_argument("order_id", metavar="ID")
    _common(accept, writes=True)
    accept.set_defaults(func=_write, verb="accepted",
                        op=lambda desk, a, actor: desk.accept(a.order_id, actor))
    start = sub.add_parser("start", help="start an accepted order",
        description="Start work on an order you accepted; its tools are usable from then on.")
    start.add_argument("order_id", metavar="ID")
    _common(start, writes=True)
    start.set_defaults(func=_write, verb="started",
                       op=lambda desk, a, actor: desk.start(a.order_id, actor))
    decline = sub.add_parser("decline", help="turn an offered order down",
        description="Turn down an order offered to you, with a reason kept in its log.")
    decline.add_argument("order_id", metavar="ID")
    decline.add_argument("reason", metavar="REASON", nargs="?", help="why (optional)")
    _common(decline, writes=True)
    decline.set_defaults(func=_write, verb="declined",
                         op=lambda desk, a, actor: desk.decline(a.order_id, actor, a.reason))
    progress = sub.add_parser("progress", help="post a progress note",
        description="Post a progress note on an order you are working; it is kept in the "
                    "order's log.")
    progress.add_argument("order_id", metavar="ID")
    progress.add_argument("note", metavar="NOTE")
    # Parsed by _percent, not argparse, so a bad value is one line rather than usage text.
    progress.add_argument("--percent", metavar="P", help="a whole number from 0 to 100")
    _common(progress, writes=True)
    progress.set_defaults(
        func=_write, verb="noted progress on",
        op=lambda desk, a, actor: desk.progress(a.order_id, actor, a.note,
                                                _percent(a.percent)))
    report = sub.add_parser(
        "report", help="submit a work report from a JSON file",
        description="Submit a work report. The file holds a full report or its fields: spec, "
                    "order_id, from, finished_at and attempt are filled in when absent.")
    report.add_argument("order_id", metavar="ID")
    report.add_argument("file", metavar="FILE", help="the report as JSON, or - for stdin")
    _common(report, writes=True)
    report.set_defaults(func=_report)


# --------------------------------------------------------------------------- rendering

def _event_line(e: Event) -> str:
    move = e.to if e.from_ is None or e.from_ == e.to else f"{e.from_} → {e.to}"
    note = f": {_short(e.note, 200)}" if e.note else ""
    pct = (e.data or {}).get("percent")
    share = f" ({pct:g}%)" if isinstance(pct, int | float) else ""
    return f"#{e.seq} {e.at} {_clean(e.actor)} {e.action} ({move}){share}{note}"


def _write_result(args: argparse.Namespace, view: OrderView, verb: str,
                  detail: str = "") -> int:
    if args.json:
        _print_json(view.to_json())
    else:
        print(f"{verb} {view.id}{detail}: now {view.state} (seq {view.seq})")
    return 0


def _amounts(units: dict[str, float]) -> str:
    return ", ".join(f"{unit} {value:g}" for unit, value in units.items())


def _show_text(view: OrderView, events: Sequence[Event],
               scope: ApprovalScope | None = None) -> list[str]:
    o = view.order
    out = [f"{o.id} · {view.state} · attempt {view.attempt}",
           f"goal: {_short(o.goal, 300)}",
           f"manager {o.manager} → worker {o.to}"
           + (f" (escalate to {o.escalate_to})" if o.escalate_to else ""),
           f"deadline {o.deadline} · budget {_amounts(o.budget.units())}",
           f"tools {', '.join(o.tools) or '(none)'}"
           + (f" · staged {', '.join(o.staged)}" if o.staged else "")]
    if o.parent_id:
        out.append(f"sub-order of {o.parent_id}")
    if o.continues:
        out.append(f"continues {o.continues}")
    out += ["", "criteria:", *_criteria_lines(o, latest_checks(events))]
    if view.reports:
        out += ["", "reports:"]
        for i, r in enumerate(view.reports, start=1):
            out.append(f"  attempt {r.attempt or i} · {r.status} · {r.finished_at} · cost "
                       f"{_amounts(r.cost.units()) or '-'}: {_short(r.result.summary, 160)}")
            if r.error:
                out.append(f"    error: {_short(r.error, 200)}")
            for q in r.questions or ():
                out.append(f"    question: {_short(q, 200)}")
            for eff in r.effects or ():
                shown = json.dumps(shown_value(eff.arguments), ensure_ascii=False)
                out.append(f"    effect {eff.ref}: {_short(shown, 300)}")
                out += _effect_lines(eff.arguments, "      ")
    if view.reviews:
        out += ["", "reviews:"]
        for rv in view.reviews:
            chosen = f" effects {', '.join(rv.effects)}" if rv.effects is not None else ""
            why = f": {_short(rv.reason, 200)}" if rv.reason else ""
            out.append(f"  attempt {rv.attempt} · {rv.decision} by {rv.actor} at {rv.at}"
                       f"{chosen}{why}")
    if scope is not None:  # until the commit runs (BIND-25)
        out += ["", "until the commit runs:", *(f"  {line}" for line in scope.lines())]
    out += ["", f"events ({len(events)}):"] + [f"  {_event_line(e)}" for e in events]
    return out


def _criteria_lines(order: WorkOrder, checks: dict[str, dict[str, Any]]) -> list[str]:
    """Each criterion, with its check and the check's latest run beside it (LC-21)."""
    out = []
    for c in order.criteria:
        out.append(f"  {c.id}: {_short(c.text, 200)}")
        if c.check is None:
            continue
        run = checks.get(c.id)
        result = "not run yet" if run is None else (
            f"{run['check']['outcome']} ({_short(str(run['check'].get('summary', '')), 300)})")
        out.append(f"    check {_short(' '.join(c.check.run), 120)}: {result}")
        question = None if run is None else check_question(run)
        if question is not None:
            out.append(f"    question for the manager: {_short(question, 400)}")
        if run is not None and run["check"]["outcome"] in ("failed", "timeout"):
            out += [f"    | {_clean(line)}" for line in run["check"].get("tail", ())[-5:]]
    return out


def _question_lines(q: Question) -> list[str]:
    head = (f"{q.order_id} · blocks {q.blocking} · {q.worker} asked at {q.asked_at} "
            f"(attempt {q.attempt}): {_short(q.goal, 80)}")
    return [head] + [f"  - {_short(text, 300)}" for text in q.questions]


def _track_lines(record: TrackRecord) -> list[str]:
    out = [f"track record of {record.worker}: {record.orders} orders",
           f"  approved first time    {record.approved_first_time}",
           f"  approved after rework  {record.approved_after_rework}"
           + (" (" + ", ".join(f"{v} after {k} round{'s' if k > 1 else ''}"
                               for k, v in record.rework_rounds.items())
              + ")" if record.rework_rounds else ""),
           f"  failed                 {record.failed}",
           f"  expired                {record.expired}",
           f"  cancelled              {record.cancelled}",
           f"  declined               {record.declined}",
           f"  active                 {record.active}"]
    for unit, s in sorted(record.spend.items()):
        ratio = "-" if s.median_ratio is None else f"{s.median_ratio:.0%}"
        out.append(f"  spend {unit}: {s.spent:g} of {s.budget:g} over {s.orders} orders, "
                   f"median {ratio} of budget")
    if record.median_seconds_to_approval is not None:
        out.append(f"  median accept → approval: {_duration(record.median_seconds_to_approval)}")
    return out


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


# --------------------------------------------------------------------------- commands

def _create(args: argparse.Namespace) -> int:
    actor = _actor(args)
    doc = _object(args.file, "work order")
    continues = doc.get("continues")
    # The desk copies nothing, silently, when there is nothing to copy: say so here.
    if args.copy_handoff and not isinstance(continues, str):
        raise _fail(f"--copy-handoff copies the handoff of the order this one continues, but "
                    f"{args.file} names none; add \"continues\": \"ORDER_ID\" or drop the flag")
    with _desk(args, create=True) as desk:
        view = desk.create(doc, actor, copy_handoff=args.copy_handoff,
                           workspace=args.workspace)
    if args.json:
        _print_json(view.to_json())
    else:
        print(f"created {view.id} for {view.order.to}: {_short(view.order.goal, 80)}")
    if args.copy_handoff and view.order.handoff is None:
        print(f"awl: {continues} has no handoff to copy; {view.id} starts without one",
              file=sys.stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    check_integer(args.limit, name="--limit", minimum=1)
    with _desk(args) as desk:
        views = desk.list(state=args.state, worker=args.worker, manager=args.manager,
                          parent_id=args.parent, limit=args.limit, party=_viewer(args))
    if args.json:
        _print_json([v.to_json() for v in views])
        return 0
    if not views:
        print("no orders")
        return 0
    rows = [(v.id, v.state, _clean(v.order.to), _clean(v.order.manager), v.updated_at,
             _short(v.order.goal, 50)) for v in views]
    header = ("ID", "STATE", "WORKER", "MANAGER", "UPDATED", "GOAL")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True))
              + "  " + row[5])
    return 0


def _show(args: argparse.Namespace) -> int:
    with _desk(args) as desk:
        view = desk.get(args.order_id, viewer=_viewer(args))
        events = desk.events(args.order_id)
        scope = scope_of(view, list_effects(args.order_id, store=desk.store))
    if args.json:
        _print_json({**view.to_json(), "events": [e.to_json() for e in events]})
    else:
        print("\n".join(_show_text(view, events, scope)))
    return 0


def _follow(args: argparse.Namespace) -> int:
    check_integer(args.after, name="--after")
    if args.timeout is not None and not 0 < args.timeout < math.inf:
        raise _fail(f"--timeout takes a number of seconds above 0, not {args.timeout:g}")
    with _desk(args) as desk:
        desk.get(args.order_id, viewer=_viewer(args))
        ended = False
        for event in desk.follow(args.order_id, args.after, timeout=args.timeout):
            if args.json:
                print(json.dumps(event.to_json(), ensure_ascii=False), flush=True)
            else:
                print(_event_line(event), flush=True)
            ended = event.to in TERMINAL and event.from_ != event.to
        if ended or desk.get(args.order_id).state in TERMINAL:
            return 0
    print(f"awl: stopped following {args.order_id} after {args.timeout:g}s; it has not ended",
          file=sys.stderr)
    return FOLLOW_TIMED_OUT


def _questions(args: argparse.Namespace) -> int:
    actor = None if args.all else named_actor(args.actor)
    if actor is None and not args.all:
        raise _fail(f"whose questions? pass --as PRINCIPAL, set {ACTOR_ENV}, or use --all")
    limit = check_integer(args.limit, name="--limit", minimum=1, maximum=MAX_QUESTION_PAGE)
    with _desk(args) as desk:
        page = desk.questions(actor, limit=limit, after=args.after)
    if args.json:
        _print_json(page.to_json())
        return 0
    if not page.questions:
        print("no more open questions" if args.after is not None else "no open questions")
    for q in page.questions:
        print("\n".join(_question_lines(q)))
    if page.next is not None:
        words = ["--all"] if actor is None else ["--as", actor]
        if args.home:
            words += ["--home", args.home]
        if args.store:  # a password stays out of the line, as every message keeps it
            words += ["--store", shown_url(args.store)]
        if limit != QUESTION_PAGE:
            words += ["--limit", str(limit)]
        print(f"next page: awl order questions {shlex.join(words)} --after {page.next}")
    return 0


def _review(args: argparse.Namespace) -> int:
    actor = _actor(args)
    if args.rework is not None and (args.effects is not None or args.reason is not None):
        raise _fail("--effects and --reason go with --approve; a rework's reason is its "
                    "argument")
    effects = None
    if args.effects is not None:
        effects = [ref.strip() for ref in args.effects.split(",") if ref.strip()]
    with _desk(args) as desk:
        if args.approve:
            view = desk.review(args.order_id, actor, "approve", args.reason, effects=effects,
                               attempt=args.attempt)
        else:
            view = desk.review(args.order_id, actor, "rework", args.rework,
                               attempt=args.attempt)
    detail = ""
    if args.approve and effects is not None:
        detail = f" (effects: {', '.join(view.reviews[-1].effects or ()) or 'none'})"
    code = _write_result(args, view, "approved" if args.approve else "sent back", detail)
    report = view.reports[-1] if view.reports and args.approve else None
    approved = view.reviews[-1].effects if view.reviews else None
    for eff in (report.effects or ()) if report is not None and not args.json else ():
        if approved is None or eff.ref in approved:  # what this approval lets run
            for line in _effect_lines(eff.arguments, ""):
                print(f"awl: {eff.ref}: {line}", file=sys.stderr)
    return code


def _track(args: argparse.Namespace) -> int:
    with _desk(args) as desk:
        record = desk.track(args.worker, viewer=_viewer(args))
    if args.json:
        _print_json(record.to_json())
    else:
        print("\n".join(_track_lines(record)))
    return 0


def _checks_run(args: argparse.Namespace) -> int:
    actor = _actor(args)
    with _desk(args) as desk:
        items = desk.run_checks(args.order_id, actor)
    if args.json:
        _print_json(items)
        return 0
    failed = 0
    for item in items:
        body = item["check"]
        failed += body["outcome"] in ("failed", "timeout")
        print(f"{_clean(item['criterion'])}: {body['outcome']} ({_short(body['summary'], 300)})")
        if body["outcome"] in ("failed", "timeout"):
            print("\n".join(f"  | {_clean(line)}" for line in body["tail"][-5:]))
        question = check_question(item)
        if question is not None:
            print(f"  question for the manager: {_short(question, 400)}")
    return 1 if failed else 0


def _handoff(args: argparse.Namespace) -> int:
    with _desk(args) as desk:
        desk.get(args.order_id, viewer=_viewer(args))
        text = desk.handoff(args.order_id)
    if args.json:
        _print_json({"order_id": args.order_id, "markdown": text})
    else:
        sys.stdout.write(text)
    return 0


Operation = Callable[[Desk, argparse.Namespace, str], OrderView]


def _write(args: argparse.Namespace) -> int:
    """Run a one-step write (``args.op``) as ``--as`` and say what it did (``args.verb``)."""
    actor = _actor(args)
    op: Operation = args.op
    with _desk(args) as desk:
        view = op(desk, args, actor)
    return _write_result(args, view, args.verb)


def _report(args: argparse.Namespace) -> int:
    actor = _actor(args)
    doc = _object(args.file, "work report")
    with _desk(args) as desk:
        view = desk.report(args.order_id, actor, doc)
    return _write_result(args, view, "reported on")
