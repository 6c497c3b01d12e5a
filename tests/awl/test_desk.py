"""The desk on every store: roles, states, checks, expiry, waits, questions, conflicts."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from awl import (
    BadRequest,
    Conflict,
    Event,
    Forbidden,
    InvalidTransition,
    MemoryStore,
    NotFound,
    ValidationFailed,
)
from awl.desk import AsyncDesk, Desk
from awl.documents.errors import PassError
from awl.documents.lifecycle import DESK_ACTOR, fold
from awl.documents.models import format_time
from awl.passes import (
    DEFAULT_AUDIENCE,
    KeyStore,
    issue_pass,
    issue_recorded_pass,
    record_pass,
    unverified_claims,
    verify_pass,
)
from awl.store.protocol import Store
from tests.awl.desk_support import (
    DEADLINE,
    HELPER,
    MANAGER,
    T0,
    WORKER,
    Clock,
    effect,
    open_store,
    order_fields,
    report_fields,
    reserved,
    submitted,
    working,
)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened = open_store(request.param, tmp_path)
    yield opened
    opened.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def desk(store: Store, clock: Clock) -> Desk:
    return Desk(store, clock=clock)


def rules(exc: ValidationFailed) -> set[tuple[str, str]]:
    return {(f.rule, f.path) for f in exc.findings}


# ----------------------------------------------------------------------------- the happy path

@pytest.mark.spec("LC-2")
def test_an_order_goes_from_offer_to_approval(desk: Desk) -> None:
    """A full order runs create, accept, start, progress, report and approve, one event each."""
    view = desk.create(order_fields(), MANAGER)
    assert (view.state, view.seq) == ("offered", 1)
    assert view.order.spec == "awl/work-order@0.4"  # it stages a tool (DOC-6)
    assert view.order.manager == MANAGER
    assert view.order.created_at == format_time(T0)
    desk.accept(view.id, WORKER)
    desk.start(view.id, WORKER)
    desk.progress(view.id, WORKER, "read the filings", 40)
    done = desk.report(view.id, WORKER, report_fields())
    assert done.state == "submitted"
    assert done.reports[0].attempt == 1
    approved = desk.review(view.id, MANAGER, "approve", "good")
    assert (approved.state, approved.seq) == ("approved", 6)
    events = desk.events(view.id)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    assert [e.action for e in events] == ["create", "accept", "start", "progress", "report",
                                          "approve"]
    assert events[3].data == {"percent": 40}
    assert fold(events) == desk.get(view.id).state == "approved"
    assert desk.get(view.id).reviews[0].decision == "approve"


@pytest.mark.spec("LC-2")
def test_every_log_starts_with_the_creator_s_create_event(desk: Desk) -> None:
    """The first event is seq 1, create, from no state to offered, by the order's manager."""
    view = desk.create(order_fields(), MANAGER)
    child = desk.create(order_fields(to="agent:helper", parent_id=view.id,
                                     budget={"usd": 1, "tool_calls": 1}, tools=["filings/*"],
                                     staged=None, **{"from": WORKER}), WORKER)
    for order_id, manager in ((view.id, MANAGER), (child.id, WORKER)):
        (first,) = desk.events(order_id)
        assert (first.seq, first.action, first.from_, first.to, first.actor) == (
            1, "create", None, "offered", manager)


def test_create_keeps_a_full_order_as_given(desk: Desk) -> None:
    """A complete order document is stored exactly as written."""
    doc = {"spec": "awl/work-order@0.2", "id": "wo_given", "created_at": "2030-01-01T08:00:00Z",
           "from": MANAGER, **order_fields(staged=None)}
    view = desk.create(doc, MANAGER)
    assert view.id == "wo_given"
    assert desk.get("wo_given").order.to_json() == doc


@pytest.mark.spec("LC-4")
def test_an_order_stays_as_created_through_its_whole_life(desk: Desk) -> None:
    """Every operation leaves the stored order exactly as created; nothing can edit it."""
    view = desk.create(order_fields(escalate_to=HELPER), MANAGER)
    created = view.order.to_json()
    steps: list[Callable[[], object]] = [
        lambda: desk.accept(view.id, WORKER),
        lambda: desk.start(view.id, WORKER),
        lambda: desk.progress(view.id, WORKER, "reading", 10),
        lambda: desk.report(view.id, WORKER, report_fields("blocked")),
        lambda: desk.answer(view.id, HELPER, "Q3"),
        lambda: desk.report(view.id, WORKER, report_fields()),
        lambda: desk.review(view.id, MANAGER, "rework", "cite page numbers"),
        lambda: desk.report(view.id, WORKER, report_fields()),
        lambda: desk.review(view.id, MANAGER, "approve"),
        lambda: desk.record(view.id, MANAGER, "settle", note="checked"),
    ]
    for step in steps:
        step()
        assert desk.get(view.id).order.to_json() == created
    assert desk.get(view.id).seq == 1 + len(steps)
    editing = ("edit", "update", "amend", "modify", "patch", "replace", "change")
    assert [name for name in dir(Desk) + dir(AsyncDesk) + dir(Store)
            if not name.startswith("_") and any(word in name for word in editing)] == []


@pytest.mark.spec("LC-5")
def test_create_refuses_an_invalid_order_with_its_findings(desk: Desk) -> None:
    """An order with invalid findings is refused with them and nothing is stored."""
    with pytest.raises(ValidationFailed) as caught:
        desk.create(order_fields(id="wo_bad", created_at="2030-01-03T00:00:00Z"), MANAGER)
    assert ("O3", "/deadline") in rules(caught.value)
    with pytest.raises(NotFound):
        desk.get("wo_bad")


@pytest.mark.spec("LC-5")
def test_create_refuses_someone_else_s_name(desk: Desk) -> None:
    """Only the manager named in ``from`` may issue an order."""
    with pytest.raises(Forbidden) as caught:
        desk.create(order_fields(**{"from": HELPER}), MANAGER)
    assert (caught.value.actor, caught.value.action) == (MANAGER, "create")


@pytest.mark.spec("LC-5")
def test_create_refuses_a_passed_deadline_and_reserved_principals(desk: Desk,
                                                                  clock: Clock) -> None:
    """A deadline in the past and principals under awl: are refused."""
    clock.advance(days=3)
    with pytest.raises(BadRequest, match="deadline"):
        desk.create(order_fields(created_at="2030-01-01T00:00:00Z"), MANAGER)
    with pytest.raises(BadRequest, match="reserved"):
        desk.create(order_fields(to="awl:desk", deadline="2031-01-01T00:00:00Z"), MANAGER)


@pytest.mark.spec("LC-5")
@pytest.mark.parametrize("field", ["from", "to", "escalate_to"])
def test_create_refuses_a_desk_principal_in_any_role(desk: Desk, field: str) -> None:
    """An order naming an awl: principal as from, to or escalate_to is refused, unstored."""
    actor = "awl:desk" if field == "from" else MANAGER
    with pytest.raises(BadRequest, match="reserved"):
        desk.create(order_fields(id="wo_reserved", **{field: "awl:desk"}), actor)
    with pytest.raises(NotFound):
        desk.get("wo_reserved")


@pytest.mark.spec("LC-5")
def test_create_refuses_a_taken_id(desk: Desk) -> None:
    """Creating an order with an id in use is a conflict."""
    desk.create(order_fields(id="wo_1"), MANAGER)
    with pytest.raises(Conflict):
        desk.create(order_fields(id="wo_1"), MANAGER)


# ----------------------------------------------------------------------------- roles and states

@pytest.mark.spec("LC-3")
@pytest.mark.parametrize(
    ("action", "call"),
    [
        ("accept", lambda d, i, a: d.accept(i, a)),
        ("decline", lambda d, i, a: d.decline(i, a)),
        ("cancel", lambda d, i, a: d.cancel(i, a, "no longer needed")),
    ],
)
def test_a_wrong_actor_is_refused_and_nothing_is_written(
    desk: Desk, action: str, call: Callable[[Desk, str, str], object]
) -> None:
    """Forbidden names the actor and the action, and the log does not grow."""
    view = desk.create(order_fields(), MANAGER)
    outsider = "agent:mallory"
    with pytest.raises(Forbidden) as caught:
        call(desk, view.id, outsider)
    assert (caught.value.actor, caught.value.action) == (outsider, action)
    assert desk.get(view.id).seq == 1


def test_a_refusal_names_who_may_only_to_a_party_of_the_order(desk: Desk) -> None:
    """An outsider refused a write learns no more than from a refused read: not who the
    order's worker and manager are. A party refused is told who may."""
    view = working(desk)
    outsider = "agent:mallory"
    refusals: list[Callable[[str], object]] = [
        lambda actor: desk.accept(view.id, actor),
        lambda actor: desk.cancel(view.id, actor, "mine now"),
        lambda actor: desk.review(view.id, actor, "approve"),
        lambda actor: desk.answer(view.id, actor, "yes"),
        lambda actor: desk.create(order_fields(to="agent:helper", parent_id=view.id,
                                               **{"from": actor}), actor),
    ]
    for refuse in refusals:
        with pytest.raises(Forbidden) as caught:
            refuse(outsider)
        assert MANAGER not in str(caught.value) and WORKER not in str(caught.value)
    with pytest.raises(Forbidden) as told:  # the worker may not cancel: told who may
        desk.cancel(view.id, WORKER, "done with it")
    assert MANAGER in str(told.value)
    assert desk.get(view.id).seq == view.seq


@pytest.mark.spec("LC-3", "LC-7")
def test_the_worker_cannot_review_or_answer_and_the_manager_cannot_report(desk: Desk) -> None:
    """Roles hold in both directions."""
    view = submitted(desk)
    with pytest.raises(Forbidden):
        desk.review(view.id, WORKER, "approve")
    with pytest.raises(Forbidden):
        desk.report(view.id, MANAGER, report_fields())
    assert desk.get(view.id).seq == view.seq


@pytest.mark.spec("LC-3", "LC-11")
def test_a_wrong_state_is_refused_and_nothing_is_written(desk: Desk) -> None:
    """InvalidTransition names the state and the action, and the log does not grow."""
    view = desk.create(order_fields(), MANAGER)
    with pytest.raises(InvalidTransition) as caught:
        desk.start(view.id, WORKER)
    assert (caught.value.state, caught.value.action) == ("offered", "start")
    with pytest.raises(InvalidTransition):
        desk.review(view.id, MANAGER, "approve")
    with pytest.raises(InvalidTransition):
        desk.progress(view.id, WORKER, "not yet")
    assert desk.get(view.id).seq == 1


@pytest.mark.spec("LC-3")
def test_terminal_states_are_final(desk: Desk) -> None:
    """Nothing moves a declined or cancelled order."""
    declined = desk.create(order_fields(), MANAGER)
    desk.decline(declined.id, WORKER, "too busy")
    cancelled = working(desk)
    desk.cancel(cancelled.id, MANAGER, "plans changed")
    for order_id in (declined.id, cancelled.id):
        with pytest.raises(InvalidTransition):
            desk.accept(order_id, WORKER)
        with pytest.raises(InvalidTransition):
            desk.cancel(order_id, MANAGER, "again")
    assert desk.events(declined.id)[-1].note == "too busy"


def test_unknown_orders_are_not_found(desk: Desk) -> None:
    """Every operation on an absent order raises NotFound."""
    with pytest.raises(NotFound):
        desk.get("wo_missing")
    with pytest.raises(NotFound):
        desk.accept("wo_missing", WORKER)
    with pytest.raises(NotFound):
        desk.events("wo_missing")


# ----------------------------------------------------------------------------- reports

@pytest.mark.spec("LC-8")
def test_a_blocked_report_waits_for_an_answer(desk: Desk) -> None:
    """A blocked report blocks the order; the answer moves it back to working, logged."""
    view = working(desk)
    blocked = desk.report(view.id, WORKER, report_fields("blocked"))
    assert blocked.state == "blocked"
    assert blocked.open_questions == ("Which quarter?",)
    with pytest.raises(Forbidden):
        desk.answer(view.id, WORKER, "Q3")
    answered = desk.answer(view.id, MANAGER, "Q3")
    assert answered.state == "working"
    last = desk.events(view.id)[-1]
    assert (last.action, last.note, last.data) == ("answer", "Q3",
                                                  {"attempt": 1, "questions": ["Which quarter?"]})
    again = desk.report(view.id, WORKER, report_fields())
    assert again.reports[-1].attempt == 1
    assert len(again.reports) == 2


@pytest.mark.spec("LC-8")
def test_the_escalation_contact_may_answer(desk: Desk) -> None:
    """``escalate_to`` answers as well as the manager."""
    view = working(desk, escalate_to=HELPER)
    desk.report(view.id, WORKER, report_fields("blocked"))
    assert desk.answer(view.id, HELPER, "Q2").state == "working"


@pytest.mark.spec("LC-7")
def test_an_invalid_report_is_refused_with_findings(desk: Desk) -> None:
    """A report with invalid findings is refused and the order stays working."""
    view = working(desk)
    bad = report_fields(evidence=[{"criterion": "c9", "type": "note"}])
    with pytest.raises(ValidationFailed) as caught:
        desk.report(view.id, WORKER, bad)
    assert ("R3", "/evidence/0/criterion") in rules(caught.value)
    after = desk.get(view.id)
    assert (after.state, after.seq, after.reports) == ("working", view.seq, ())


@pytest.mark.spec("LC-7")
def test_a_report_must_come_from_its_submitter(desk: Desk) -> None:
    """A report naming another author is refused."""
    view = working(desk)
    with pytest.raises(BadRequest):
        desk.report(view.id, WORKER, report_fields(**{"from": "agent:other"}))


@pytest.mark.spec("LC-7")
def test_a_report_is_refused_unless_the_order_is_working(desk: Desk) -> None:
    """Reports to an offered, accepted, blocked or submitted order are refused unwritten."""
    offered = desk.create(order_fields(), MANAGER)
    accepted = desk.create(order_fields(), MANAGER)
    desk.accept(accepted.id, WORKER)
    blocked = working(desk)
    desk.report(blocked.id, WORKER, report_fields("blocked"))
    done = submitted(desk)
    for order_id, state in ((offered.id, "offered"), (accepted.id, "accepted"),
                            (blocked.id, "blocked"), (done.id, "submitted")):
        before = desk.get(order_id)
        with pytest.raises(InvalidTransition) as caught:
            desk.report(order_id, WORKER, report_fields())
        assert (caught.value.state, caught.value.action) == (state, "report")
        after = desk.get(order_id)
        assert (after.state, after.seq, after.reports) == (state, before.seq, before.reports)


@pytest.mark.spec("LC-7", "LC-9")
def test_rework_needs_a_reason_and_counts_attempts(desk: Desk) -> None:
    """A rework without a reason is refused; after one, the next report is attempt 2."""
    view = submitted(desk)
    with pytest.raises(ValidationFailed) as caught:
        desk.review(view.id, MANAGER, "rework", "  ")
    assert rules(caught.value) == {("W2", "/reason")}
    desk.review(view.id, MANAGER, "rework", "cite page numbers")
    with pytest.raises(BadRequest, match="attempt"):
        desk.report(view.id, WORKER, report_fields(attempt=1))
    second = desk.report(view.id, WORKER, report_fields(attempt=2))
    assert [r.attempt for r in second.reports] == [1, 2]
    desk.review(view.id, MANAGER, "rework", "still missing page 4")
    third = desk.report(view.id, WORKER, report_fields())
    assert [r.attempt for r in third.reports] == [1, 2, 3]
    assert third.attempt == 3


@pytest.mark.spec("LC-9")
def test_approve_may_name_a_subset_of_the_effects(desk: Desk) -> None:
    """An approval runs only the effects it names, in the report's spelling."""
    view = submitted(desk, effects=[effect(1), effect(2), effect(3)])
    with pytest.raises(BadRequest, match="mail/send#9"):
        desk.review(view.id, MANAGER, "approve", effects=["mail/send#9"])
    with pytest.raises(ValidationFailed) as caught:
        desk.review(view.id, MANAGER, "approve", effects=["not a ref"])
    assert rules(caught.value) == {("W3", "/effects/0")}
    approved = desk.review(view.id, MANAGER, "approve", "only the CFO copy",
                           effects=["mail/send#call-3", "mail/send#1"])
    assert approved.reviews[-1].effects == ("mail/send#3", "mail/send#1")
    assert desk.events(view.id)[-1].data == {"attempt": 1,
                                             "effects": ["mail/send#3", "mail/send#1"]}


def test_a_rework_names_no_effects(desk: Desk) -> None:
    """Effects belong to an approval only."""
    view = submitted(desk, effects=[effect(1)])
    with pytest.raises(ValidationFailed) as caught:
        desk.review(view.id, MANAGER, "rework", "no", effects=["mail/send#1"])
    assert ("W3", "/effects/0") in rules(caught.value)


@pytest.mark.spec("LC-9")
def test_a_failed_report_is_reworked_or_cancelled_not_approved(desk: Desk) -> None:
    """Approving a failed attempt is refused; the manager sends it back or cancels."""
    view = working(desk)
    desk.report(view.id, WORKER, report_fields("failed"))
    with pytest.raises(BadRequest, match="failed"):
        desk.review(view.id, MANAGER, "approve")
    assert desk.cancel(view.id, MANAGER, "not feasible").state == "cancelled"


@pytest.mark.spec("LC-7")
def test_a_report_over_budget_is_kept_and_expires_the_order(desk: Desk) -> None:
    """A limit finding (R7) keeps the report and expires the order, saying why."""
    view = working(desk)
    expired = desk.report(view.id, WORKER, report_fields(cost={"usd": 12, "tool_calls": 3}))
    assert expired.state == "expired"
    assert len(expired.reports) == 1
    last = desk.events(view.id)[-1]
    assert (last.action, last.actor, last.from_) == ("expire", DESK_ACTOR, "working")
    assert last.data is not None
    assert [(f["rule"], f["path"]) for f in last.data["findings"]] == [("R7", "/cost/usd")]


@pytest.mark.spec("LC-7")
def test_the_report_is_checked_against_the_order_s_calls(desk: Desk, store: Store) -> None:
    """With call records, effects must name held calls of this order (RX2, RX3)."""
    view = working(desk)
    call = reserved(store.reserve_call(
        view.id, attempt=1, tool="mail/send", arguments={"to": "cfo"}, pass_jti=None, usd=0.0,
        started_at=DEADLINE.replace("02", "01"), scopes=()))
    store.hold_call(view.id, call.ref, result=None, ended_at=DEADLINE.replace("02", "01"))
    with pytest.raises(ValidationFailed) as caught:
        desk.report(view.id, WORKER, report_fields(
            tools_used=["mail/send"], effects=[effect(2, to="cfo")]))
    assert ("RX2", "/effects/0/ref") in rules(caught.value)
    with pytest.raises(ValidationFailed) as caught:
        desk.report(view.id, WORKER, report_fields(
            tools_used=["mail/send"], effects=[effect(1, to="ceo")]))
    assert ("RX3", "/effects/0") in rules(caught.value)
    ok = desk.report(view.id, WORKER, report_fields(
        tools_used=["mail/send"], effects=[effect(1, to="cfo")]))
    assert ok.state == "submitted"


@pytest.mark.spec("RX2", "RX4")
def test_an_order_without_calls_proves_no_call(desk: Desk) -> None:
    """No call recorded is no proof: a report citing calls on an order whose worker made
    none (RX2, for evidence and effects alike) is refused, as the approval page would flag
    it; the tools it says it used outside a gateway cannot be checked (no RX4)."""
    view = working(desk)
    with pytest.raises(ValidationFailed) as caught:
        desk.report(view.id, WORKER, report_fields(
            evidence=[{"criterion": "c1", "type": "tool_call", "ref": "filings/search#1"},
                      {"criterion": "c2", "type": "note", "note": "cited"}],
            effects=[effect(2, to="cfo")]))
    assert rules(caught.value) >= {("RX2", "/evidence/0/ref"), ("RX2", "/effects/0/ref")}
    assert not any(rule == "RX4" for rule, _ in rules(caught.value))
    assert desk.report(view.id, WORKER, report_fields()).state == "submitted"


# ----------------------------------------------------------------------------- expiry

@pytest.mark.spec("LC-3", "LC-10")
def test_reading_never_shows_a_stale_active_state(desk: Desk, clock: Clock) -> None:
    """Past the deadline, get and list expire the order and log it as the desk."""
    view = working(desk)
    clock.advance(days=2)
    assert [v.state for v in desk.list(worker=WORKER)] == ["expired"]
    seen = desk.get(view.id)
    assert (seen.state, seen.seq) == ("expired", 4)
    last = desk.events(view.id)[-1]
    assert (last.actor, last.action, last.from_, last.to) == (DESK_ACTOR, "expire", "working",
                                                             "expired")
    with pytest.raises(InvalidTransition) as caught:
        desk.progress(view.id, WORKER, "late")
    assert caught.value.state == "expired"
    assert desk.get(view.id).seq == 4


@pytest.mark.spec("LC-10")
def test_an_action_on_an_overdue_order_expires_it_first(desk: Desk, clock: Clock) -> None:
    """The manager's action on an overdue order finds it expired."""
    view = submitted(desk)
    clock.advance(days=2)
    with pytest.raises(InvalidTransition) as caught:
        desk.review(view.id, MANAGER, "approve")
    assert caught.value.state == "expired"
    assert desk.get(view.id).state == "expired"


@pytest.mark.spec("LC-7", "LC-10")
def test_a_late_report_is_kept_and_the_order_expires(desk: Desk, clock: Clock) -> None:
    """A report arriving after the deadline is recorded with the expiry."""
    view = working(desk)
    clock.advance(days=2)
    late = desk.report(view.id, WORKER, report_fields())
    assert late.state == "expired"
    assert len(late.reports) == 1
    assert ("R8", "/finished_at") in {(f["rule"], f["path"])
                                       for f in (desk.events(view.id)[-1].data or {})["findings"]}


def test_a_forbidden_actor_on_an_overdue_order_writes_nothing(desk: Desk, clock: Clock) -> None:
    """Refusing a wrong actor never writes, not even the expiry."""
    view = working(desk)
    clock.advance(days=2)
    with pytest.raises(Forbidden):
        desk.cancel(view.id, WORKER, "mine now")
    assert desk.store.load(view.id).state == "working"


@pytest.mark.spec("LC-10")
def test_expire_overdue_sweeps_every_active_order(desk: Desk, clock: Clock) -> None:
    """The sweep expires overdue active orders and leaves the rest."""
    early = desk.create(order_fields(deadline="2030-01-01T12:00:00Z"), MANAGER)
    later = desk.create(order_fields(), MANAGER)
    finished = desk.create(order_fields(deadline="2030-01-01T12:00:00Z"), MANAGER)
    desk.decline(finished.id, WORKER)
    clock.advance(hours=4)
    assert desk.expire_overdue() == [early.id]
    assert desk.get(later.id).state == "offered"
    assert desk.get(finished.id).state == "declined"


# ------------------------------------------------------------------- sub-orders, continues

@pytest.mark.spec("LC-12")
def test_a_worker_splits_its_order_within_its_authority(desk: Desk) -> None:
    """A sub-order inside the parent's budget, tools and deadline is accepted."""
    parent = working(desk)
    child = desk.create(order_fields(
        to="agent:helper", parent_id=parent.id, budget={"usd": 3, "tool_calls": 10},
        tools=["filings/search", "filings/read"], staged=["filings/read"],
        **{"from": WORKER}), WORKER)
    assert child.order.parent_id == parent.id
    assert [v.id for v in desk.list(parent_id=parent.id)] == [child.id]


@pytest.mark.spec("LC-12")
def test_a_sub_order_beyond_the_parent_is_refused(desk: Desk) -> None:
    """Sub-order rules refuse more budget or an unstaged staged tool."""
    parent = working(desk)
    with pytest.raises(ValidationFailed) as caught:
        desk.create(order_fields(to="agent:helper", parent_id=parent.id,
                                 budget={"usd": 30, "tool_calls": 10}, staged=[],
                                 **{"from": WORKER}), WORKER)
    assert {("C1", "/budget/usd"), ("C5", "/tools/1")} <= rules(caught.value)


@pytest.mark.spec("LC-12")
def test_sub_orders_need_an_active_parent_and_its_people(desk: Desk) -> None:
    """Only the parent's worker or manager splits it, and only while it is active."""
    parent = working(desk)
    with pytest.raises(Forbidden):
        desk.create(order_fields(parent_id=parent.id, **{"from": "agent:x"}), "agent:x")
    with pytest.raises(NotFound):
        desk.create(order_fields(parent_id="wo_nope"), MANAGER)
    desk.cancel(parent.id, MANAGER, "stop")
    with pytest.raises(InvalidTransition):
        desk.create(order_fields(parent_id=parent.id), MANAGER)


@pytest.mark.spec("LC-6")
def test_continues_names_a_finished_order_and_may_copy_its_handoff(desk: Desk) -> None:
    """A reissued order continues a terminal one and can carry its worker's handoff."""
    with pytest.raises(NotFound):
        desk.create(order_fields(continues="wo_nope"), MANAGER)
    first = working(desk)
    with pytest.raises(InvalidTransition) as caught:
        desk.create(order_fields(continues=first.id), MANAGER)
    assert caught.value.state == "working"
    handoff = {"summary": "half done", "open_questions": ["Which quarter?"]}
    desk.report(first.id, WORKER, report_fields("failed", handoff=handoff))
    with pytest.raises(Forbidden) as refused:  # no party to it: not even its state is told
        desk.create(order_fields(continues=first.id), "human:eve")
    assert "working" not in str(refused.value)
    desk.cancel(first.id, MANAGER, "reassigning")
    count = len(desk.list(limit=None))
    with pytest.raises(Forbidden):  # its handoff is not hers to copy
        desk.create(order_fields(continues=first.id), "human:eve", copy_handoff=True)
    assert len(desk.list(limit=None)) == count
    second = desk.create(order_fields(to="agent:other", continues=first.id), MANAGER,
                         copy_handoff=True)
    assert second.order.continues == first.id
    assert second.order.handoff is not None
    assert second.order.handoff.to_json() == handoff
    plain = desk.create(order_fields(continues=first.id), MANAGER)
    assert plain.order.handoff is None


# ----------------------------------------------------------------------------- questions

def test_questions_come_most_blocking_first(desk: Desk, clock: Clock) -> None:
    """The queue ranks blocked orders by how many active orders wait on them."""
    lone = working(desk)
    desk.report(lone.id, WORKER, report_fields("blocked", questions=["lone?"]))
    clock.advance(minutes=1)
    big = working(desk)
    for _ in range(2):
        desk.create(order_fields(to="agent:helper", parent_id=big.id, tools=["filings/*"],
                                 staged=None, budget={"usd": 1, "tool_calls": 1},
                                 **{"from": WORKER}), WORKER)
    child = desk.list(parent_id=big.id)[0]
    desk.create(order_fields(to="agent:deep", parent_id=child.id, tools=["filings/*"],
                             staged=None, budget={"usd": 1, "tool_calls": 1},
                             **{"from": "agent:helper"}), "agent:helper")
    desk.report(big.id, WORKER, report_fields("blocked", questions=["big?"]))
    other = working(desk, manager=HELPER)
    desk.report(other.id, WORKER, report_fields("blocked"))
    queue = desk.questions(MANAGER).questions
    assert [(q.order_id, q.blocking, q.questions) for q in queue] == [
        (big.id, 4, ("big?",)), (lone.id, 1, ("lone?",))]
    assert {q.order_id for q in desk.questions().questions} == {big.id, lone.id, other.id}
    desk.answer(big.id, MANAGER, "go")
    assert [q.order_id for q in desk.questions(MANAGER).questions] == [lone.id]


def test_the_escalation_contact_sees_the_question(desk: Desk) -> None:
    """An order escalating to someone puts its question in their queue too."""
    view = working(desk, escalate_to=HELPER)
    desk.report(view.id, WORKER, report_fields("blocked"))
    assert [q.order_id for q in desk.questions(HELPER).questions] == [view.id]
    assert desk.questions("human:nobody").questions == []


# ----------------------------------------------------------------------------- ends

def _jti(token: str) -> str:
    jti = unverified_claims(token)[1]["jti"]
    assert isinstance(jti, str)
    return jti


def _refusal(token: str, keys: KeyStore, store: Store) -> str | None:
    """Why the pass is refused at T0 (while its times are valid), or None when it verifies."""
    try:
        verify_pass(token, jwks=keys.jwks(), revoked=store.revoked(),
                    audience=DEFAULT_AUDIENCE, now=T0)
    except PassError as exc:
        return exc.reason
    return None


@pytest.mark.spec("DP-8")
@pytest.mark.parametrize("end", ["approve", "cancel", "expire", "decline"])
def test_every_end_of_an_order_revokes_its_passes(desk: Desk, store: Store, clock: Clock,
                                                  tmp_path: Path, end: str) -> None:
    """Approval, cancellation, expiry and declining each revoke every pass of the order, as
    of the event that ended it."""
    keys = KeyStore(tmp_path / "home")
    if end == "decline":
        view = desk.create(order_fields(), MANAGER)
        tokens = [issue_pass(view.order, subject=WORKER, keys=keys, now=T0)]
        record_pass(store, tokens[0])
    else:
        view = working(desk)
        root = issue_recorded_pass(store, view.id, keys=keys, subject=WORKER, now=T0)
        tokens = [root, issue_recorded_pass(store, view.id, keys=keys, subject=HELPER,
                                            parent_token=root, tools=["filings/search"],
                                            now=T0)]
    assert [_refusal(t, keys, store) for t in tokens] == [None] * len(tokens)
    clock.advance(minutes=5)
    if end == "approve":
        desk.report(view.id, WORKER, report_fields())
        desk.review(view.id, MANAGER, "approve")
    elif end == "cancel":
        desk.cancel(view.id, MANAGER, "plans changed")
    elif end == "expire":
        clock.advance(days=2)
        assert desk.get(view.id).state == "expired"
    else:
        desk.decline(view.id, WORKER, "too busy")
    ended = desk.events(view.id)[-1]
    revocations = store.revocations()
    assert {j: (r.reason, r.at) for j, r in revocations.items()} == {
        _jti(t): (f"order {ended.to}", ended.at) for t in tokens}
    assert [_refusal(t, keys, store) for t in tokens] == ["revoked"] * len(tokens)


@pytest.mark.spec("DP-8")
def test_a_rework_keeps_the_order_s_passes(desk: Desk, store: Store, tmp_path: Path) -> None:
    """An order that goes on (reworked, blocked, answered) keeps its passes."""
    keys = KeyStore(tmp_path / "home")
    view = working(desk)
    token = issue_recorded_pass(store, view.id, keys=keys, subject=WORKER, now=T0)
    desk.report(view.id, WORKER, report_fields("blocked"))
    desk.answer(view.id, MANAGER, "Q3")
    desk.report(view.id, WORKER, report_fields())
    desk.review(view.id, MANAGER, "rework", "cite the sources")
    assert store.revocations() == {}
    assert _refusal(token, keys, store) is None


def _hold(store: Store, order_id: str, to: str, *, attempt: int = 1) -> str:
    """Record a held mail/send call as the gateway does (call and effect) and return its ref."""
    at = format_time(T0)
    record = reserved(store.reserve_call(order_id, attempt=attempt, tool="mail/send",
                                arguments={"to": to}, pass_jti=None, usd=0.0, started_at=at,
                                scopes=()))
    store.hold_call(order_id, record.ref, result=None, ended_at=at)
    return record.ref


def _report_held(desk: Desk, order_id: str, refs: dict[str, str]) -> None:
    """Report the held calls (ref → recipient) as the attempt's effects."""
    desk.report(order_id, WORKER, report_fields(
        tools_used=["mail/send"],
        effects=[{"ref": ref, "tool": "mail/send", "arguments": {"to": to}}
                 for ref, to in refs.items()]))


def _states(store: Store, order_id: str) -> dict[str, str]:
    return {e.ref: e.state for e in store.effects(order_id)}


def _drops(desk: Desk, order_id: str) -> list[Event]:
    return [e for e in desk.events(order_id) if e.action == "drop"]


@pytest.mark.spec("CM-4", "LC-3")
def test_a_rework_drops_the_held_calls_of_the_attempt_it_ends(desk: Desk, store: Store) -> None:
    """The reworked attempt's held calls become dropped with one drop event by the desk; an
    approval drops nothing (the commit drops what it leaves out)."""
    view = working(desk)
    first = {_hold(store, view.id, "cfo"): "cfo", _hold(store, view.id, "ceo"): "ceo"}
    _report_held(desk, view.id, first)
    reworked = desk.review(view.id, MANAGER, "rework", "wrong recipients")
    assert reworked.seq == desk.events(view.id)[-1].seq - 1  # the drop follows the rework
    assert _states(store, view.id) == dict.fromkeys(first, "dropped")
    assert {e.error for e in store.effects(view.id)} == {"attempt 1 was sent back for rework"}
    (drop,) = _drops(desk, view.id)
    assert (drop.actor, drop.from_, drop.to) == (DESK_ACTOR, "working", "working")
    assert drop.data is not None
    assert (drop.data["refs"], drop.data["attempt"]) == (list(first), 1)
    second = {_hold(store, view.id, "cfo", attempt=2): "cfo",
              _hold(store, view.id, "board", attempt=2): "board"}
    _report_held(desk, view.id, second)
    desk.review(view.id, MANAGER, "approve", effects=list(second)[:1])
    assert [_states(store, view.id)[r] for r in second] == ["held", "held"]
    assert len(_drops(desk, view.id)) == 1


@pytest.mark.spec("CM-4")
@pytest.mark.parametrize("end", ["cancel", "expire"])
def test_an_order_ending_unapproved_drops_every_held_call(desk: Desk, store: Store,
                                                          clock: Clock, end: str) -> None:
    """Cancelling or expiring an order drops every call still held, with one drop event
    right after the ending one."""
    view = working(desk)
    first = _hold(store, view.id, "cfo")
    _report_held(desk, view.id, {first: "cfo"})
    desk.review(view.id, MANAGER, "rework", "wrong recipient")
    later = [_hold(store, view.id, "ceo", attempt=2), _hold(store, view.id, "board", attempt=2)]
    if end == "cancel":
        desk.cancel(view.id, MANAGER, "plans changed")
    else:
        clock.advance(days=2)
        desk.get(view.id)
    state = "cancelled" if end == "cancel" else "expired"
    events = desk.events(view.id)
    assert [e.action for e in events[-2:]] == [end, "drop"]
    drop = events[-1]
    assert (drop.actor, drop.from_, drop.to) == (DESK_ACTOR, state, state)
    assert drop.data is not None and drop.data["refs"] == later
    assert drop.data["reasons"] == dict.fromkeys(later, f"the order was {state}")
    assert set(_states(store, view.id).values()) == {"dropped"}
    assert fold(events) == state
    desk.get(view.id)
    assert len(_drops(desk, view.id)) == 2  # the rework's and the end's, nothing more


# ----------------------------------------------------------------------------- note events

@pytest.mark.spec("LC-3")
def test_effect_notes_follow_the_table(desk: Desk) -> None:
    """settle and retry are the manager's on approved orders; drop is the desk's."""
    view = submitted(desk, effects=[effect(1)])
    with pytest.raises(InvalidTransition):
        desk.record(view.id, MANAGER, "settle", note="it happened")
    desk.review(view.id, MANAGER, "approve")
    with pytest.raises(Forbidden):
        desk.record(view.id, WORKER, "settle")
    with pytest.raises(Forbidden):
        desk.record(view.id, MANAGER, "drop")
    desk.record(view.id, "awl:gateway", "drop", data={"refs": ["mail/send#1"]})
    settled = desk.record(view.id, MANAGER, "settle", note="seen in the outbox")
    assert settled.state == "approved"
    with pytest.raises(BadRequest):
        desk.record(view.id, MANAGER, "approve")
    assert fold(desk.events(view.id)) == "approved"


@pytest.mark.spec("LC-11")
def test_progress_checks_its_arguments(desk: Desk) -> None:
    """Progress needs a note and a percentage within 0..100."""
    view = working(desk)
    with pytest.raises(BadRequest):
        desk.progress(view.id, WORKER, " ")
    with pytest.raises(BadRequest):
        desk.progress(view.id, WORKER, "over", 120)


@pytest.mark.spec("LC-11")
def test_progress_is_the_worker_s_while_the_order_is_under_way(desk: Desk) -> None:
    """Only the worker posts progress, and only on an accepted, working or blocked order."""
    view = desk.create(order_fields(escalate_to=HELPER), MANAGER)
    with pytest.raises(InvalidTransition):
        desk.progress(view.id, WORKER, "not yet")
    desk.accept(view.id, WORKER)
    desk.progress(view.id, WORKER, "accepted", 0)
    desk.start(view.id, WORKER)
    for outsider in (MANAGER, HELPER, "agent:mallory"):
        with pytest.raises(Forbidden):
            desk.progress(view.id, outsider, "mine now", 50)
    desk.progress(view.id, WORKER, "working", 100)
    desk.report(view.id, WORKER, report_fields("blocked"))
    desk.progress(view.id, WORKER, "waiting for an answer")
    desk.answer(view.id, MANAGER, "Q3")
    desk.report(view.id, WORKER, report_fields())
    with pytest.raises(InvalidTransition) as caught:
        desk.progress(view.id, WORKER, "one more thing")
    assert caught.value.state == "submitted"
    notes = [(e.from_, e.actor, e.data) for e in desk.events(view.id) if e.action == "progress"]
    assert notes == [("accepted", WORKER, {"percent": 0}), ("working", WORKER, {"percent": 100}),
                     ("blocked", WORKER, None)]


@pytest.mark.spec("LC-11")
@pytest.mark.parametrize("percent", [40.5, True, False, -1, 101, 100.5, float("nan"), "40"])
def test_progress_percent_is_an_integer(desk: Desk, percent: Any) -> None:
    """A fractional, boolean, out-of-range or non-number percent is refused and nothing is
    written."""
    view = working(desk)
    with pytest.raises(BadRequest):
        desk.progress(view.id, WORKER, "about halfway", percent)
    assert desk.get(view.id).seq == view.seq


@pytest.mark.spec("LC-11", "DOC-5")
def test_a_whole_float_percent_is_stored_as_the_integer(desk: Desk) -> None:
    """A percent of 40.0 is the integer 40 and is stored as such."""
    view = working(desk)
    desk.progress(view.id, WORKER, "about halfway", 40.0)
    data = desk.events(view.id)[-1].data
    assert data is not None and data == {"percent": 40} and type(data["percent"]) is int


# ----------------------------------------------------------------------------- conflicts

class RacingStore:
    """A store whose next append is preceded by someone else's write."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.before_append: Callable[[], object] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def append(self, order_id: str, event: Event, **kwargs: Any) -> None:
        hook, self.before_append = self.before_append, None
        if hook is not None:
            hook()
        self.inner.append(order_id, event, **kwargs)


def test_a_lost_race_is_decided_again_when_still_valid(store: Store, clock: Clock) -> None:
    """A progress note that lost the race to another note is written after it."""
    racing = RacingStore(store)
    desk = Desk(racing, clock=clock)
    other = Desk(store, clock=clock)
    view = working(desk)
    racing.before_append = lambda: other.progress(view.id, WORKER, "first")
    desk.progress(view.id, WORKER, "second")
    assert [e.note for e in desk.events(view.id, after=3)] == ["first", "second"]


def test_a_lost_race_that_is_no_longer_valid_gets_the_new_state_s_error(
    store: Store, clock: Clock
) -> None:
    """Two reviews race; the loser sees the order already approved."""
    racing = RacingStore(store)
    desk = Desk(racing, clock=clock)
    other = Desk(store, clock=clock)
    view = submitted(desk)
    racing.before_append = lambda: other.review(view.id, MANAGER, "approve")
    with pytest.raises(InvalidTransition) as caught:
        desk.review(view.id, MANAGER, "rework", "redo")
    assert caught.value.state == "approved"
    assert [e.action for e in desk.events(view.id)][-1] == "approve"


@pytest.mark.spec("LC-2")
def test_without_retries_a_lost_race_is_a_conflict(store: Store, clock: Clock) -> None:
    """With conflict_retries=0 the caller gets the Conflict and nothing of theirs is written."""
    racing = RacingStore(store)
    desk = Desk(racing, clock=clock, conflict_retries=0)
    other = Desk(store, clock=clock)
    view = working(desk)
    racing.before_append = lambda: other.progress(view.id, WORKER, "first")
    with pytest.raises(Conflict):
        desk.progress(view.id, WORKER, "second")
    assert [e.note for e in desk.events(view.id, after=3)] == ["first"]


# ----------------------------------------------------------------------------- waiting

def test_wait_returns_at_once_when_events_exist(desk: Desk) -> None:
    """Events after the given seq come back without waiting."""
    view = working(desk)
    assert [e.seq for e in desk.wait(view.id, after=1, timeout=5)] == [2, 3]


def test_wait_times_out_empty(desk: Desk) -> None:
    """With nothing new, wait returns an empty list after the timeout."""
    view = working(desk)
    assert desk.wait(view.id, after=view.seq, timeout=0.05) == []


def test_wait_wakes_on_a_write_from_another_thread(desk: Desk) -> None:
    """A waiter in one thread wakes when another thread writes through the desk."""
    view = working(desk)
    got: list[list[Event]] = []
    waiter = threading.Thread(target=lambda: got.append(desk.wait(view.id, view.seq, 30)))
    waiter.start()
    desk.progress(view.id, WORKER, "news")
    waiter.join(timeout=30)
    assert [e.note for e in got[0]] == ["news"]


def test_wait_sees_writes_by_another_desk_on_the_same_file(tmp_path: Path) -> None:
    """Two desks on one SQLite file (as two processes would) see each other's writes."""
    from awl.store.sqlite import SQLiteStore

    with SQLiteStore(tmp_path / "d.sqlite3") as one, SQLiteStore(tmp_path / "d.sqlite3") as two:
        reader, writer = Desk(one), Desk(two)
        view = writer.create(order_fields(deadline="2099-01-01T00:00:00Z"), MANAGER)
        got: list[list[Event]] = []
        waiter = threading.Thread(target=lambda: got.append(reader.wait(view.id, 1, 30)))
        waiter.start()
        writer.accept(view.id, WORKER)
        waiter.join(timeout=30)
        assert [e.action for e in got[0]] == ["accept"]


def test_wait_on_a_store_with_subscriptions_is_woken_not_polled() -> None:
    """A desk waiting on a store that pushes news (the memory store) wakes at a write made
    through another desk on that store at once, though it would poll only every 30 s."""
    from awl.store.memory import MemoryStore

    store = MemoryStore()
    reader, writer = Desk(store, poll_interval=30), Desk(store)
    view = writer.create(order_fields(deadline="2099-01-01T00:00:00Z"), MANAGER)
    got: list[list[Event]] = []
    waiter = threading.Thread(target=lambda: got.append(reader.wait(view.id, 1, 60)))
    waiter.start()
    time.sleep(0.2)  # the waiter is asleep in its first wait
    began = time.monotonic()
    writer.accept(view.id, WORKER)
    waiter.join(timeout=60)
    assert [e.action for e in got[0]] == ["accept"]
    assert time.monotonic() - began < 5


@pytest.mark.spec("LC-10")
def test_wait_returns_the_expiry_when_the_deadline_passes(store: Store) -> None:
    """A wait across the deadline returns the expire event."""
    desk = Desk(store)
    soon = format_time(datetime.now(UTC) + timedelta(milliseconds=200))
    view = desk.create(order_fields(deadline=soon), MANAGER)
    events = desk.wait(view.id, 1, timeout=30)
    assert [(e.action, e.to) for e in events] == [("expire", "expired")]


def test_subscribers_get_every_new_event_in_order(desk: Desk) -> None:
    """A subscription delivers each new event once, in seq order, until closed."""
    view = desk.create(order_fields(), MANAGER)
    seen: list[int] = []
    done = threading.Event()

    def on_event(event: Event) -> None:
        seen.append(event.seq)
        if event.seq == 3:
            done.set()

    with desk.subscribe(view.id, on_event) as subscription:
        desk.accept(view.id, WORKER)
        desk.start(view.id, WORKER)
        assert done.wait(30)
    assert subscription.closed
    desk.progress(view.id, WORKER, "after close")
    assert seen == [2, 3]


def test_follow_stops_at_a_terminal_state(desk: Desk) -> None:
    """Following an order yields its events until it ends."""
    view = working(desk)
    desk.cancel(view.id, MANAGER, "done with it")
    assert [e.action for e in desk.follow(view.id, timeout=30)] == [
        "create", "accept", "start", "cancel"]


# ----------------------------------------------------------------------------- async

@pytest.mark.anyio
async def test_the_async_desk_runs_a_whole_order(store: Store, clock: Clock) -> None:
    """Every operation works from async code, and an async wait wakes on a write."""
    adesk = AsyncDesk(store, clock=clock)
    view = await adesk.create(order_fields(), MANAGER)
    await adesk.accept(view.id, WORKER)
    await adesk.start(view.id, WORKER)
    got: list[Event] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            async def waiter() -> None:
                got.extend(await adesk.wait(view.id, 3, timeout=30))

            tg.start_soon(waiter)
            await anyio.sleep(0)  # let the waiter reach its wait before the write
            await adesk.progress(view.id, WORKER, "halfway", 50)
    assert [e.note for e in got] == ["halfway"]
    await adesk.report(view.id, WORKER, report_fields())
    done = await adesk.review(view.id, MANAGER, "approve")
    assert done.state == "approved"
    assert [q.order_id for q in (await adesk.questions(MANAGER)).questions] == []
    assert (await adesk.track(WORKER)).approved_first_time == 1
    assert "# Handoff" in await adesk.handoff(view.id)
    with anyio.fail_after(30):
        actions = [e.action async for e in adesk.follow(view.id)]
    assert actions[-1] == "approve"
    assert await adesk.wait(view.id, done.seq, timeout=0.05) == []


@pytest.mark.anyio
async def test_an_async_wait_polls_gently_instead_of_spinning(store: Store,
                                                              clock: Clock) -> None:
    """An async wait with nothing to wake it reads the store a few times, not thousands."""
    adesk = AsyncDesk(store, clock=clock)
    view = await adesk.create(order_fields(), MANAGER)
    reads = 0
    real_load = store.load

    def counting_load(order_id: str) -> Any:
        nonlocal reads
        reads += 1
        return real_load(order_id)

    store.load = counting_load  # type: ignore[method-assign]
    try:
        with anyio.fail_after(30):
            assert await adesk.wait(view.id, view.seq, timeout=0.5) == []
    finally:
        store.load = real_load  # type: ignore[method-assign]
    assert reads < 25  # polls back off from 20 ms to 250 ms: about 6 reads in 0.5 s


@pytest.mark.anyio
async def test_both_desks_follow_with_the_same_timeout_rule(store: Store, clock: Clock) -> None:
    """Desk.follow and AsyncDesk.follow refuse a timeout that is not a number of seconds and
    stop when a short timeout runs out on an order that goes on."""
    desk = Desk(store, clock=clock)
    adesk = AsyncDesk.of(desk)
    view = working(desk)
    for bad in (float("nan"), True):
        with pytest.raises(BadRequest, match="timeout must be a number of seconds"):
            list(desk.follow(view.id, timeout=bad))
        with pytest.raises(BadRequest, match="timeout must be a number of seconds"):
            [e async for e in adesk.follow(view.id, timeout=bad)]
    assert [e.seq for e in desk.follow(view.id, 1, timeout=0.05)] == [2, 3]
    assert [e.seq async for e in adesk.follow(view.id, 2, timeout=0.05)] == [3]


@pytest.mark.anyio
async def test_async_errors_are_the_desk_s_errors(store: Store, clock: Clock) -> None:
    """Refusals cross the thread boundary unchanged."""
    adesk = AsyncDesk(store, clock=clock)
    view = await adesk.create(order_fields(), MANAGER)
    with pytest.raises(Forbidden):
        await adesk.accept(view.id, MANAGER)
    with pytest.raises(NotFound):
        await adesk.get("wo_missing")


def test_every_desk_operation_has_an_async_twin_with_the_same_parameters() -> None:
    """Each public method of Desk is on AsyncDesk, as a coroutine taking the same parameters;
    only ``now`` and ``subscribe``, which never wait, stay plain methods."""
    adesk = AsyncDesk(MemoryStore())
    public = sorted(name for name, _ in inspect.getmembers(Desk, inspect.isfunction)
                    if not name.startswith("_"))
    assert {"create", "get", "review", "wait", "follow", "workspace"} <= set(public)
    plain = {"now", "subscribe"}
    for name in public:
        twin = getattr(adesk, name, None)
        assert twin is not None, f"AsyncDesk has no {name}"
        waits = inspect.iscoroutinefunction(twin) or inspect.isasyncgenfunction(twin)
        assert waits == (name not in plain), name

        def shown(func: Callable[..., Any]) -> list[inspect.Parameter]:
            return [p for p in inspect.signature(func).parameters.values()
                    if not p.name.startswith("_")]

        assert shown(twin) == shown(getattr(Desk(MemoryStore()), name)), name


def test_an_async_twin_must_run_the_desk_method_of_its_name() -> None:
    """A twin named after one method but running another is refused when the class is made."""
    from awl.desk.asyncdesk import _InThread

    with pytest.raises(Exception) as raised:
        type("Wrong", (), {"accept": _InThread(Desk.decline)})
    error = raised.value if isinstance(raised.value, TypeError) else raised.value.__cause__
    assert isinstance(error, TypeError)
    assert str(error) == "Wrong.accept would run Desk.decline"


# ----------------------------------------------------------------------------- processes

_HAMMER = """
import json, sys
from awl import Conflict, Desk, InvalidTransition, SQLiteStore
path, who, order_ids = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
out = {"notes": [], "conflicts": 0, "accepted": [], "refused": 0}
with SQLiteStore(path, timeout=60) as store:
    desk = Desk(store, conflict_retries=0)
    print("ready", flush=True)
    sys.stdin.readline()  # start together, so the writes really race
    for oid in order_ids:
        try:
            desk.accept(oid, "agent:writer")
            out["accepted"].append(oid)
        except (Conflict, InvalidTransition):
            out["refused"] += 1
    for i in range(40):
        oid = order_ids[i % len(order_ids)]
        note = f"{who}-{i}"
        try:
            desk.progress(oid, "agent:writer", note)
            out["notes"].append(note)
        except Conflict:
            out["conflicts"] += 1
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.spec("LC-2")
def test_processes_racing_on_one_desk_lose_nothing(tmp_path: Path) -> None:
    """Three processes racing on the same orders: every write lands or is a Conflict."""
    import json
    import subprocess
    import sys

    from awl.store.sqlite import SQLiteStore

    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as store:
        desk = Desk(store)
        ids = [desk.create(order_fields(deadline="2099-01-01T00:00:00Z"), MANAGER).id
               for _ in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", _HAMMER, str(path), f"p{n}", ",".join(ids)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for n in range(3)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=100)
        assert proc.returncode == 0
        results.append(json.loads(out))
    with SQLiteStore(path) as store:
        logs = {oid: store.events(oid) for oid in ids}
        for oid, events in logs.items():
            assert fold(events) == store.load(oid).state == "accepted"
    # Each order was accepted exactly once; the other attempts were refused.
    assert sorted(oid for r in results for oid in r["accepted"]) == sorted(ids)
    assert sum(r["refused"] for r in results) == 2 * len(ids)
    # Every note that was reported written is in a log exactly once, and nothing else is.
    written = sorted(n for r in results for n in r["notes"])
    logged = sorted(e.note or "" for events in logs.values() for e in events
                    if e.action == "progress")
    assert written == logged
    assert len(written) + sum(r["conflicts"] for r in results) == 3 * 40
