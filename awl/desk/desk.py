"""The desk: where orders are issued, worked, reported, reviewed and followed.

:class:`Desk` is the one place that enforces who may do what (the roles of
:mod:`awl.documents.lifecycle`) and when, validates every document with the numbered checks, and
writes each step as one event appended to the order's log in the store. A refused
operation writes nothing, with one deliberate exception: an order found past its deadline
is expired first (the desk's own event), so nobody ever sees a stale active state.

Conflicts: every operation reads the order, decides, and appends with an optimistic ``seq``
check. When another writer got there first, the desk reads again and decides again
(``conflict_retries`` times, once by default): the retried write happens only if it is
still allowed and valid against the new state, otherwise the caller gets the error the new
state calls for (for example ``InvalidTransition`` when someone else approved first). A
conflict that outlasts the retries is raised as :class:`~awl.Conflict`.

Ends. Right after the event that ends an attempt or an order, the same operation tidies
what the end leaves dangling: a rework drops the held calls of the attempt it ends, an
order reaching a terminal state has its Delegation Passes revoked (DP-8), and one ending
unapproved drops all its held calls (CM-4); each drop is one ``drop`` event by
``awl:desk``.

The class is built in layers, each a module: :mod:`awl.desk.core` (the write path),
:mod:`awl.desk.queries`, :mod:`awl.desk.waiting`, then the commands here;
:mod:`awl.desk.asyncdesk` offers the same operations as coroutines.
"""

from __future__ import annotations

import builtins
import os
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from awl.desk.access import check_action, check_author, check_manager, check_splitter
from awl.desk.core import Write
from awl.desk.criteria import (
    CheckRun,
    checks_refused,
    latest_checks,
    run_checks,
    take_snapshot,
    workspace_root,
)
from awl.desk.lineage import (
    MAX_DEPTH,
    ancestors,
    remaining_of,
    reports_below,
    self_review_problem,
)
from awl.desk.notify import add_webhook as subscribe
from awl.desk.notify import remove_webhook as unsubscribe
from awl.desk.notify import webhook_store
from awl.desk.views import OrderView
from awl.desk.waiting import DeskWaiting
from awl.documents.checks import (
    check_run_findings,
    iter_order_findings,
    iter_report_findings,
    iter_review_findings,
    iter_suborder_findings,
    to_plain,
)
from awl.documents.errors import (
    BadRequest,
    Conflict,
    InvalidTransition,
    NotFound,
    ValidationFailed,
)
from awl.documents.findings import Finding
from awl.documents.lifecycle import ACTIVE, DESK_ACTOR, TERMINAL, is_desk_principal, targets
from awl.documents.limits import check_integer, show_value
from awl.documents.models import (
    Event,
    Handoff,
    Review,
    WorkOrder,
    WorkReport,
    format_time,
    parse_time,
)
from awl.documents.patterns import parse_ref
from awl.documents.versions import from_published, order_spec_for, report_spec_for
from awl.store.protocol import Notification, OrderRecord, Webhook

__all__ = ["Desk"]


Decision = Literal["approve", "rework"]


def new_order_id() -> str:
    """A fresh order id: ``wo_`` + milliseconds since the epoch (hex) + 8 random hex digits.

    The time prefix makes ids sort roughly by creation, which keeps listings readable.
    """
    return f"wo_{int(time.time() * 1000):011x}{secrets.token_hex(4)}"


def _invalid(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.kind == "invalid"]


def _raise_invalid(what: str, findings: Sequence[Finding]) -> None:
    bad = _invalid(findings)
    if bad:
        first = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ValidationFailed(
            f"invalid {what}: {first.rule} {first.path or '/'}: {first.message}{more}",
            findings=findings)


def _whole_percent(value: object) -> int:
    """``value`` as an integer from 0 to 100 (LC-11), or :class:`BadRequest`.

    A float with no fractional part is the same JSON number as the integer (DOC-5), so
    ``40.0`` is accepted and stored as ``40``; a boolean is not a number at all.
    """
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or not 0 <= number <= 100:
        raise BadRequest(f"percent must be a whole number from 0 to 100, not {value!r}")
    return number


def _same_ref(a: str, b: str) -> bool:
    pa, pb = parse_ref(a), parse_ref(b)
    return a == b if pa is None or pb is None else pa == pb


class Desk(DeskWaiting):
    """The work-order desk over a :class:`~awl.store.protocol.Store`.

    Every operation takes the acting principal explicitly and enforces its role: only the
    order's worker accepts, declines, starts, posts progress and reports; only its manager
    reviews and cancels; the manager or ``escalate_to`` answers. A wrong actor raises
    :class:`~awl.Forbidden`, a wrong state :class:`~awl.InvalidTransition`, an invalid
    document :class:`~awl.ValidationFailed`; in every case nothing is written.

    Args:
        store: where orders live; default the SQLite store of the home folder.
        clock: returns the current time as an aware datetime (tests pass a fake one).
        conflict_retries: how many times an operation that lost a write race is decided
            again against the new state before :class:`~awl.Conflict` is raised.
        poll_interval: the first pause between store polls in :meth:`wait` (seconds); it
            doubles up to ``max_poll_interval``. Writes through this desk wake waiters at
            once; the polls find writes by other processes.
        max_poll_interval: the longest pause between polls.

    Example:
        >>> from awl import Desk, MemoryStore
        >>> desk = Desk(MemoryStore())
    """

    def create(self, order: WorkOrder | Mapping[str, Any], actor: str, *,
               copy_handoff: bool = False,
               workspace: str | os.PathLike[str] | None = None) -> OrderView:
        """Issue an order; ``actor`` becomes (and must be) its manager.

        Args:
            order: a full Work Order, or its fields: ``spec``, ``id``, ``created_at`` and
                ``from`` are filled in when absent (the lowest version that fits, a fresh id, now,
                ``actor``).
            actor: the manager issuing it.
            copy_handoff: when the order ``continues`` another and has no handoff of its
                own, copy the latest handoff of the continued order (from its latest report
                that has one, else its own).
            workspace: the folder the work happens in: the top of a git work tree, or a
                plain folder in none (its snapshots are kept under the AWL home). The
                desk snapshots it when the order starts and runs the criteria's checks in
                it (LC-17); an order whose criteria carry checks needs one. It is kept in
                the create event, never in the order document, so only the manager's side
                gives it.

        Raises:
            ValidationFailed: the order, or the sub-order against its parent, is invalid.
            Forbidden: ``from`` is not ``actor``, or ``actor`` may not split the parent.
            NotFound: the parent or the continued order does not exist.
            InvalidTransition: the parent is finished, or the continued order is not.
            BadRequest: the deadline has passed, a principal is reserved (``awl:``), or
                the worker is the manager of the order or of an order above it, or the
                escalation contact is its worker or manager (LC-13), or the parent
                already has :data:`~awl.desk.lineage.MAX_DEPTH` orders above it.
            Conflict: the id is taken.
        """

        doc = order.to_json() if isinstance(order, WorkOrder) else to_plain(order)
        if not isinstance(doc, dict):  # an array, a string: judged by the checks (DOC-1)
            _raise_invalid("work order", list(iter_order_findings(doc)))
            raise BadRequest("an order is a JSON object")  # pragma: no cover - O1 said so
        doc = from_published(doc)  # extensions a published writer carried in x-awl
        now = self.now()
        doc.setdefault("id", new_order_id())
        doc.setdefault("created_at", format_time(now))
        doc.setdefault("from", actor)
        check_author(doc["from"], actor)
        for field in ("from", "to", "escalate_to"):
            value = doc.get(field)
            if isinstance(value, str) and is_desk_principal(value):
                raise BadRequest(f"{field} {value!r} is reserved for the desk; name an agent "
                                 "or a human")
        continues = doc.get("continues")
        if isinstance(continues, str) and continues != doc.get("id"):
            previous = self._continued(continues, doc, actor)
            if copy_handoff and "handoff" not in doc:
                handoff = _latest_handoff(previous)
                if handoff is not None:
                    doc["handoff"] = handoff.to_json()
        doc.setdefault("spec", order_spec_for(doc))  # the lowest version that fits (DOC-6)
        parent_id = doc.get("parent_id")
        parent: OrderView | None = None
        above: tuple[WorkOrder, ...] = ()
        if isinstance(parent_id, str) and parent_id != doc.get("id"):
            parent = self._parent(parent_id, actor)
            above = (parent.order, *ancestors(self.store, parent.order))
            if len(above) > MAX_DEPTH:
                # The store charges a call to at most MAX_DEPTH orders above it, and every
                # rule that walks the chain (LC-13, LC-14, LC-16, LC-22, reads) stops there:
                # an order below that would spend, and work on, out of its top order's sight.
                raise BadRequest(
                    f"order {parent_id!r} already has {MAX_DEPTH} orders above it; a "
                    f"sub-order may have at most {MAX_DEPTH}, so the desk can charge its "
                    "calls to, and stop it with, every one of them: split from an order "
                    "nearer the top")
        problem = self_review_problem(doc, above)
        if problem is not None:
            raise BadRequest(problem)
        if parent is not None:
            left = remaining_of(parent.order, self.store.usage(parent.id), now,
                                below=reports_below(self.store, parent.id))
            findings = list(iter_suborder_findings(doc, parent.order, left))
            _raise_invalid("sub-order", findings)
        else:
            findings = list(iter_order_findings(doc))
            _raise_invalid("work order", findings)
        model = WorkOrder.model_validate(doc, by_alias=True, by_name=False)
        if parse_time(model.deadline) <= now:
            raise BadRequest(f"the deadline {model.deadline} has already passed; set a later "
                             "deadline")
        fields: dict[str, Any] = {
            "seq": 1, "at": format_time(now), "actor": actor, "action": "create",
            "from": None, "to": "offered",
        }
        if workspace is not None:
            refused = checks_refused() if _checked(model) else None
            if refused is not None:
                raise BadRequest(refused)
            fields["data"] = {"workspace": str(workspace_root(workspace))}
        elif _checked(model):
            raise BadRequest(f"order {model.id!r} has criteria with checks but no workspace; "
                             "give the folder they run in (awl order create --workspace DIR)")
        event = Event.model_validate(fields)
        self.store.create_order(model, event)
        self._wake()
        return OrderView(order=model, state="offered", seq=1, updated_at=event.at)

    def _continued(self, order_id: str, doc: Mapping[str, Any], actor: str) -> OrderView:
        """The order ``doc`` continues: one ``actor`` may read (its handoff goes into the new
        order, and its state into the refusal), and finished (LC-6)."""
        try:
            previous = self.get(order_id, viewer=actor)
        except NotFound:
            raise NotFound(f"order {doc.get('id')!r} continues {order_id!r}, which does not "
                           "exist") from None
        if previous.state not in TERMINAL:
            raise InvalidTransition(
                f"order {order_id!r} is still {previous.state}; only a finished order can be "
                "continued (cancel it first, or wait for it to end)",
                state=previous.state, action="continue")
        return previous

    def _parent(self, parent_id: str, actor: str) -> OrderView:
        try:
            parent = self.get(parent_id)
        except NotFound:
            raise NotFound(f"parent order {parent_id!r} does not exist") from None
        check_splitter(parent.order, actor)
        if parent.state not in ACTIVE:
            raise InvalidTransition(
                f"parent order {parent_id!r} is {parent.state}; sub-orders are split from "
                "active orders only", state=parent.state, action="create sub-order")
        return parent

    def accept(self, order_id: str, actor: str) -> OrderView:
        """The worker takes the offered order."""
        return self._simple(order_id, "accept", actor)

    def decline(self, order_id: str, actor: str, reason: str | None = None) -> OrderView:
        """The worker turns the offered order down (optionally saying why)."""
        if reason is not None and not isinstance(reason, str):
            raise BadRequest(f"a decline's reason is text, not {show_value(reason)}")
        return self._simple(order_id, "decline", actor, note=reason or None)

    def start(self, order_id: str, actor: str) -> OrderView:
        """The worker starts the accepted order.

        When the order has a workspace the desk records a snapshot of it in the start event
        (LC-17): what the criteria's checks are later compared with.
        """
        workspace = self.workspace(order_id)
        if workspace is None:
            return self._simple(order_id, "start", actor)
        record = self.store.load(order_id)
        check_action(record.order, "start", actor)
        if not targets(record.state, "start"):
            raise self._wrong_state(record.order, record.state, "start")

        return self._simple(order_id, "start", actor,
                            data={"snapshot": take_snapshot(workspace)})

    def _run_criteria_checks(self, order: WorkOrder) -> builtins.list[CheckRun]:

        workspace = self.workspace(order.id)
        if workspace is None:
            raise BadRequest(f"order {order.id!r} has criteria with checks but no workspace "
                             "to run them in")
        refused = checks_refused()
        if refused is not None:
            raise BadRequest(refused)
        checks = [(c.id, c.check) for c in order.criteria if c.check is not None]
        return list(run_checks(workspace, checks, self._snapshot(order.id)))

    def run_checks(self, order_id: str, actor: str) -> builtins.list[dict[str, Any]]:
        """The manager re-runs the order's checks; the runs are recorded (LC-21).

        Raises:
            Forbidden: ``actor`` is not the order's manager.
            BadRequest: the order has no checks or no workspace.
            InvalidTransition: the order has not started, or has ended unapproved.
        """
        record = self.store.load(order_id)
        order = record.order
        check_manager(order, actor, "check", "run the checks")
        if not _checked(order):
            raise BadRequest(f"order {order_id!r} has no criteria with checks")
        state = self._fresh(record).state
        if not targets(state, "check"):
            raise self._wrong_state(order, state, "check")
        runs = self._run_criteria_checks(order)
        items = [run.to_json() for run in runs]
        self._simple(order_id, "check", DESK_ACTOR, note=f"re-run by {actor}",
                     data={"by": actor, "checks": items})
        return items

    def _checks_on_done(self, order_id: str, actor: str,
                        doc: Mapping[str, Any]) -> builtins.list[CheckRun]:
        """Run the checks of a ``done`` report before it is decided (LC-18 to LC-20).

        A failing check refuses the report with an RX5 finding; the run is recorded in a
        ``check`` event, or, when the same check failed the same way on its previous run,
        in a ``block`` event that puts the question to the manager.
        """

        record = self.store.load(order_id)
        late = parse_time(record.order.deadline) < self.now()
        if doc.get("status") != "done" or not _checked(record.order) or late:
            return []  # a late report is kept and the order expired, as without checks
        check_action(record.order, "report", actor)
        if record.state != "working":
            raise self._wrong_state(record.order, record.state, "report")
        runs = self._run_criteria_checks(record.order)
        failed = [run for run in runs if run.outcome in ("failed", "timeout")]
        if not failed:
            return runs

        before = latest_checks(self.store.events(order_id, after=0, limit=None), on_report=True)
        again = [run for run in failed
                 if before.get(run.criterion, {}).get("check", {}).get("signature")
                 == run.signature]
        items = [run.to_json() for run in runs]
        attempt = OrderView.of(record).attempt
        findings = check_run_findings(record.order, items)
        if again:
            questions = [f"the check of criterion {run.criterion} failed the same way twice "
                         f"({run.summary()}); last output: {' | '.join(run.tail[-3:])}"
                         for run in again]
            self._simple(order_id, "block", DESK_ACTOR, note="; ".join(questions),
                         data={"attempt": attempt, "checks": items, "questions": questions})
            raise ValidationFailed(
                f"order {order_id!r} is blocked: {questions[0]}; the manager decides how to "
                "go on", findings=findings)
        self._simple(order_id, "check", DESK_ACTOR, data={"attempt": attempt, "checks": items})
        _raise_invalid("work report", findings)
        return runs  # pragma: no cover - _raise_invalid raised

    def progress(self, order_id: str, actor: str, note: str,
                 percent: int | float | None = None) -> OrderView:
        """The worker posts a progress note (with an optional percentage).

        Args:
            order_id: The order.
            actor: The worker.
            note: What happened; not empty.
            percent: A whole number from 0 to 100 (``40.0`` counts as ``40``; LC-11).

        Raises:
            BadRequest: An empty note, or a percent that is fractional, a boolean, not a
                number or outside 0 to 100.
        """
        if not isinstance(note, str):
            raise BadRequest(f"a progress note is text, not {show_value(note)}")
        if not note.strip():
            raise BadRequest("a progress note says what happened; it cannot be empty")
        data = None if percent is None else {"percent": _whole_percent(percent)}
        return self._simple(order_id, "progress", actor, note=note, data=data)

    def report(self, order_id: str, actor: str,
               report: WorkReport | Mapping[str, Any]) -> OrderView:
        """The worker reports on the working order.

        ``done`` and ``failed`` reports submit the order for review; ``blocked`` blocks it
        until a question is answered. When given as fields, ``spec``, ``order_id``,
        ``from``, ``finished_at`` and ``attempt`` are filled in when absent. The attempt is
        1 + the reworks so far; a report naming another attempt is refused.

        The report is checked against the order (and against its gateway call records when
        there are any: RX2-RX4; against the latest reports of its sub-orders when they have
        reported: RX6). ``limit`` findings (cost over budget, finished after the deadline,
        fewer tokens than the sub-orders reported) are accepted: the report is kept and the
        order expires. A report that arrives after the deadline is kept the same way.

        Raises:
            ValidationFailed: the report has ``invalid`` findings.
            BadRequest: ``from`` or ``attempt`` does not match.
        """

        doc = report.to_json() if isinstance(report, WorkReport) else to_plain(report)
        if not isinstance(doc, dict):  # an array, a string: judged by the checks (DOC-1)
            _raise_invalid("work report", list(iter_report_findings(doc)))
            raise BadRequest("a report is a JSON object")  # pragma: no cover - R1 said so
        runs = self._checks_on_done(order_id, actor, doc)
        # Calls a gateway left pending are read as may-have-run first (GW-7).
        self.calls(order_id)

        def plan(record: OrderRecord, now: datetime) -> Write:
            order = record.order
            view = OrderView.of(record)
            full = from_published(dict(doc))  # extensions a published writer carried
            full.setdefault("spec", report_spec_for(full))  # the lowest that fits (DOC-6)
            full.setdefault("order_id", order.id)
            full.setdefault("from", actor)
            full.setdefault("finished_at", format_time(now))
            if full["from"] != actor:
                raise BadRequest(f"the report says it is from {full['from']!r} but "
                                 f"{actor} is submitting it; they must match")
            attempt = view.attempt
            if "attempt" in full and full["attempt"] != attempt:
                raise BadRequest(f"the report names attempt {full['attempt']!r}, but order "
                                 f"{order.id!r} is on attempt {attempt}")
            full["attempt"] = attempt
            calls = self.store.calls(order.id)
            below = reports_below(self.store, order.id)
            findings = list(iter_report_findings(full, order, calls,
                                                 [run.to_json() for run in runs]
                                                 if runs else None, below or None))
            late = parse_time(order.deadline) < now
            if _invalid(findings):
                if late:  # the order is over either way; expire it, keep nothing invalid
                    return Write(
                        self._event(record, "expire", DESK_ACTOR, "expired", now,
                                    note="the deadline passed"),
                        refusal=InvalidTransition(
                            f"order {order.id!r} expired at its deadline {order.deadline} "
                            "before a valid report came in", state="expired", action="report"))
                _raise_invalid("work report", findings)
            model = WorkReport.model_validate(full, by_alias=True, by_name=False)
            limits = [f for f in findings if f.kind == "limit"]
            if limits or late:
                reasons = [f"{f.rule} {f.path}: {f.message}" for f in limits]
                if late and not any(f.rule == "R8" for f in limits):
                    reasons.append("the deadline passed before the report came in")
                return Write(
                    self._event(record, "expire", DESK_ACTOR, "expired", now,
                                note="; ".join(reasons),
                                data={"attempt": attempt, "status": model.status,
                                      "findings": [f.to_dict() for f in limits]}),
                    report=model)
            to = "blocked" if model.status == "blocked" else "submitted"
            data: dict[str, Any] = {"attempt": attempt, "status": model.status}
            if runs:
                data["checks"] = [run.to_json() for run in runs]
            return Write(
                self._event(record, "report", actor, to, now, note=model.result.summary or None,
                            data=data),
                report=model)

        return self._run(order_id, "report", actor, plan, expire_stale=False)

    def answer(self, order_id: str, actor: str, answer: str) -> OrderView:
        """The manager (or ``escalate_to``) answers the blocked order's questions."""
        if not isinstance(answer, str):
            raise BadRequest(f"an answer is text, not {show_value(answer)}")
        if not answer.strip():
            raise BadRequest("an answer cannot be empty")

        def plan(record: OrderRecord, now: datetime) -> Write:
            view = OrderView.of(record)
            return Write(self._event(record, "answer", actor, "working", now, note=answer,
                                      data={"attempt": view.attempt,
                                            "questions": list(self.open_questions(view))}))

        return self._run(order_id, "answer", actor, plan)

    def review(self, order_id: str, actor: str, decision: Decision, reason: str | None = None,
               *, effects: Sequence[str] | None = None,
               attempt: int | None = None) -> OrderView:
        """The manager approves the submitted report or sends it back for rework.

        Args:
            order_id: the submitted order.
            actor: its manager.
            decision: ``approve`` or ``rework``.
            reason: why; required for a rework.
            effects: for an approval, the refs of the report's effects to run (default all
                of them); every ref must be one of the report's effects.
            attempt: the attempt whose report the manager read. When given, the review is
                decided only on that attempt's report, in the same write: a page or agent
                that read attempt 1 never approves an attempt 2 submitted meanwhile (after
                a rework sent from elsewhere).

        Raises:
            Conflict: ``attempt`` is given and the order's report is another attempt's.
            ValidationFailed: a rework without a reason (W2), effects named on a rework or
                a malformed effect ref (W3).
            BadRequest: an effect ref the report does not list, or an approval of a failed
                report.
        """

        if decision not in ("approve", "rework"):
            raise BadRequest(f"decision must be approve or rework, not {decision!r}")
        if attempt is not None:
            attempt = check_integer(attempt, name="attempt", minimum=1)
        if effects is not None:
            refs = None if isinstance(effects, str | bytes) or not isinstance(
                effects, Iterable) else list(effects)
            if refs is None or not all(isinstance(ref, str) for ref in refs):
                raise BadRequest(f"effects is a list of effect refs (server/tool#N), not "
                                 f"{show_value(effects)}")
            effects = refs

        def plan(record: OrderRecord, now: datetime) -> Write:
            report = record.reports[-1]
            current = report.attempt or OrderView.of(record).attempt
            if attempt is not None and attempt != current:
                raise Conflict(f"you reviewed attempt {attempt} of order {order_id!r}, but its "
                               f"report now is attempt {current}'s; read the order again and "
                               "review what it shows", expected_seq=None,
                               actual_seq=record.seq)
            chosen: builtins.list[str] | None = None
            if decision == "approve":
                if report.status == "failed":
                    raise BadRequest(f"attempt {current} of order {order_id!r} failed; send "
                                     "it back for rework or cancel the order")
                if effects is not None:
                    chosen = self._chosen_effects(order_id, report, effects)
            doc: dict[str, Any] = {"order_id": order_id, "attempt": current, "actor": actor,
                                   "decision": decision, "at": format_time(now)}
            if reason is not None:
                doc["reason"] = reason
            if effects is not None:
                doc["effects"] = chosen if chosen is not None else list(effects)
            _raise_invalid("review", list(iter_review_findings(doc)))
            model = Review.model_validate(doc, by_alias=True, by_name=False)
            data: dict[str, Any] = {"attempt": current}
            if chosen is not None:
                data["effects"] = chosen
            to = "approved" if decision == "approve" else "working"
            return Write(self._event(record, decision, actor, to, now, note=reason or None,
                                      data=data), review=model)

        return self._run(order_id, decision, actor, plan)

    @staticmethod
    def _chosen_effects(order_id: str, report: WorkReport,
                        effects: Sequence[str]) -> builtins.list[str] | None:
        listed = [e.ref for e in report.effects or ()]
        chosen: builtins.list[str] = []
        unknown: builtins.list[str] = []
        for ref in effects:
            match = next((r for r in listed if _same_ref(r, ref)), None)
            if match is None:
                if parse_ref(ref) is not None:
                    unknown.append(ref)
                else:
                    return None  # malformed: the review check names it (W3)
            elif match not in chosen:
                chosen.append(match)
        if unknown:
            raise BadRequest(
                f"the report of order {order_id!r} lists no effect {', '.join(unknown)}; "
                f"approve only effects it lists ({', '.join(listed) or 'none'})")
        return chosen

    def cancel(self, order_id: str, actor: str, reason: str) -> OrderView:
        """The manager cancels the active order, saying why."""
        if not isinstance(reason, str):
            raise BadRequest(f"a cancellation's reason is text, not {show_value(reason)}")
        if not reason.strip():
            raise BadRequest("a cancellation says why; give a reason")
        return self._simple(order_id, "cancel", actor, note=reason)

    # ----------------------------------------------------------------- webhooks

    def add_webhook(self, url: str, events: str | Iterable[str], *,
                    orders: str | Iterable[str] | None = None) -> Webhook:
        """Subscribe ``url`` to ``events`` (some of ``submitted``, ``blocked``, ``expired``,
        ``unknown``, ``committed``, ``failed``), for every order or only ``orders`` (HOOK-1).

        The returned record carries the subscription's signing secret (``whsec_...``), which
        the desk's listings never show. BadRequest for a URL or event name it cannot take,
        NotFound for an order that does not exist."""
        return subscribe(self.store, url, events, orders=orders, now=self.now())

    def webhooks(self) -> builtins.list[Webhook]:
        """Every webhook subscription, oldest first."""
        return webhook_store(self.store).webhooks()

    def remove_webhook(self, webhook_id: str) -> None:
        """Remove a subscription; its pending notifications are never sent (HOOK-6)."""
        unsubscribe(self.store, webhook_id, now=self.now())

    def notifications(self, *, state: str | None = None, webhook_id: str | None = None,
                      order_id: str | None = None,
                      limit: int | None = 100) -> builtins.list[Notification]:
        """The outbox, newest first: each notification with its delivery attempts."""
        return webhook_store(self.store).notifications(state=state, webhook_id=webhook_id,
                                                       order_id=order_id, limit=limit)


def _checked(order: WorkOrder) -> bool:
    """Whether any criterion of ``order`` carries a check."""
    return any(c.check is not None for c in order.criteria)


def _latest_handoff(view: OrderView) -> Handoff | None:
    for report in reversed(view.reports):
        if report.handoff is not None:
            return report.handoff
    return view.order.handoff
