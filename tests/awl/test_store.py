"""The Store contract, run against every implementation."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from awl.documents.effect_states import STATES, TABLE
from awl.documents.errors import BadRequest, Conflict, InvalidTransition, NotFound
from awl.documents.models import Event, Review, WorkOrder, WorkReport
from awl.store.protocol import (
    EffectState,
    LockInfo,
    OverBudget,
    PassRecord,
    Reservation,
    Reserved,
    Revocation,
    Scope,
    Settlement,
    Store,
    Subscriptions,
    TokenRecord,
)
from tests.awl.desk_support import open_backend, reserved

T0 = "2030-01-01T00:00:00Z"




def make_order(order_id: str = "o1", *, to: str = "agent:w", manager: str = "human:m",
               parent_id: str | None = None) -> WorkOrder:
    data: dict[str, Any] = {
        "spec": "awl/work-order@0.3", "id": order_id, "created_at": T0, "from": manager,
        "to": to, "goal": "do it", "criteria": [{"id": "c1", "text": "it is done"}],
        "budget": {"tool_calls": 10}, "deadline": "2030-01-02T00:00:00Z",
        "tools": ["srv/*"], "staged": ["srv/send"],
    }
    if parent_id is not None:
        data["parent_id"] = parent_id
    return WorkOrder.model_validate(data)


def ev(seq: int, action: str, frm: str | None, to: str, at: str = T0) -> Event:
    return Event.model_validate(
        {"seq": seq, "at": at, "actor": "agent:w", "action": action, "from": frm, "to": to}
    )


def create(store: Store, order_id: str = "o1", **kw: Any) -> WorkOrder:
    order = make_order(order_id, **kw)
    store.create_order(order, ev(1, "create", None, "offered"))
    return order


def report(order_id: str = "o1", attempt: int = 1) -> WorkReport:
    return WorkReport.model_validate({
        "spec": "awl/work-report@0.3", "order_id": order_id, "from": "agent:w",
        "status": "done", "result": {"summary": "done"}, "evidence": [],
        "cost": {"tool_calls": 1}, "finished_at": T0, "tools_used": [], "attempt": attempt,
    })


def reserve(store: Store, order_id: str = "o1", *, tool: str = "srv/read",
            jti: str | None = None, usd: float = 0.0, scopes: list[Scope] | None = None,
            at: str = T0, attempt: int = 1) -> Reservation:
    return store.reserve_call(
        order_id, attempt=attempt, tool=tool, arguments={"x": [1, 2]}, pass_jti=jti, usd=usd,
        started_at=at, scopes=scopes or [],
    )


def refusal(order_id: str = "o1", at: str = T0) -> dict[str, Any]:
    return {"order_id": order_id, "attempt": 1, "tool": "srv/write", "arguments": {},
            "outcome": "refused", "error": "AWL_FORBIDDEN: no", "started_at": at,
            "ended_at": at}


# Orders and logs -----------------------------------------------------------------------


def test_create_and_load_round_trip(store: Store) -> None:
    """A created order loads back with its state, seq and document unchanged."""
    order = create(store)
    got = store.load("o1")
    assert got.order.to_json() == order.to_json()
    assert (got.state, got.seq, got.reports, got.reviews) == ("offered", 1, (), ())
    assert got.updated_at == T0
    assert store.events("o1") == [ev(1, "create", None, "offered")]


def test_create_twice_is_a_conflict(store: Store) -> None:
    """Creating an order whose id exists is a Conflict and changes nothing."""
    create(store)
    with pytest.raises(Conflict) as info:
        create(store)
    assert info.value.actual_seq == 1
    assert store.load("o1").seq == 1


@pytest.mark.spec("LC-2")
def test_first_event_must_be_seq_one(store: Store) -> None:
    """A first event with another seq is refused."""
    with pytest.raises(BadRequest):
        store.create_order(make_order(), ev(2, "create", None, "offered"))
    with pytest.raises(NotFound):
        store.load("o1")


def test_absent_order_is_not_found(store: Store) -> None:
    """Every per-order read and write names an absent order as NotFound."""
    with pytest.raises(NotFound):
        store.load("nope")
    with pytest.raises(NotFound):
        store.events("nope")
    with pytest.raises(NotFound):
        store.append("nope", ev(2, "accept", "offered", "accepted"), state="accepted")
    with pytest.raises(NotFound):
        reserve(store, "nope")
    with pytest.raises(NotFound):
        store.record_call(refusal("nope"))
    with pytest.raises(NotFound):
        store.calls("nope")
    with pytest.raises(NotFound):
        store.usage("nope")
    with pytest.raises(NotFound):
        store.effects("nope")


def test_append_stores_event_state_report_and_review(store: Store) -> None:
    """An append stores the event, the new state and the report or review with it."""
    create(store)
    store.append("o1", ev(2, "accept", "offered", "accepted", "2030-01-01T00:01:00Z"),
                 state="accepted")
    store.append("o1", ev(3, "start", "accepted", "working"), state="working")
    store.append("o1", ev(4, "report", "working", "submitted"), state="submitted",
                 report=report())
    review = Review(order_id="o1", attempt=1, actor="human:m", decision="rework",
                    reason="more", at=T0)
    store.append("o1", ev(5, "rework", "submitted", "working"), state="working",
                 review=review)
    store.append("o1", ev(6, "report", "working", "submitted"), state="submitted",
                 report=report(attempt=2))
    got = store.load("o1")
    assert (got.state, got.seq) == ("submitted", 6)
    assert [r.attempt for r in got.reports] == [1, 2]
    assert got.reports[0].to_json() == report().to_json()
    assert got.reviews == (review,)
    assert [e.seq for e in store.events("o1")] == [1, 2, 3, 4, 5, 6]
    assert [e.seq for e in store.events("o1", after=2, limit=2)] == [3, 4]
    assert store.events("o1", after=6) == []
    assert store.events("o1", after=6, limit=1) == store.events("o1", limit=0) == []


@pytest.mark.spec("LC-2")
def test_append_with_a_stale_seq_is_a_conflict(store: Store) -> None:
    """An append whose seq does not follow the stored one writes nothing."""
    create(store)
    store.append("o1", ev(2, "accept", "offered", "accepted"), state="accepted")
    for seq in (2, 4, 1):
        with pytest.raises(Conflict) as info:
            store.append("o1", ev(seq, "decline", "offered", "declined"), state="declined",
                         report=report())
        assert (info.value.expected_seq, info.value.actual_seq) == (seq - 1, 2)
    got = store.load("o1")
    assert (got.state, got.seq, got.reports) == ("accepted", 2, ())


def test_list_orders_filters_newest_first(store: Store) -> None:
    """Listing applies every filter and returns the most recently created first."""
    create(store, "a", to="agent:x")
    create(store, "b", to="agent:y", manager="human:n")
    create(store, "c", to="agent:x", parent_id="a")
    store.append("b", ev(2, "accept", "offered", "accepted"), state="accepted")

    def ids(**kw: Any) -> list[str]:
        return [r.order.id for r in store.list_orders(**kw)]

    assert ids() == ["c", "b", "a"]
    assert ids(worker="agent:x") == ["c", "a"]
    assert ids(manager="human:n") == ["b"]
    assert ids(state="accepted") == ["b"]
    assert ids(state=["offered", "accepted"]) == ["c", "b", "a"]
    assert ids(state=[]) == []
    assert ids(parent_id="a") == ["c"]
    assert ids(worker="agent:x", state="offered", manager="human:m") == ["c", "a"]
    assert ids(limit=1, offset=1) == ["b"]
    assert ids(limit=None, offset=2) == ["a"]
    assert store.list_orders(state="accepted")[0].seq == 2


def test_track_rows_match_the_full_records(store: Store) -> None:
    """track_rows gives, in bulk, exactly the rows built from full records and seq 2."""
    from awl.store.protocol import TrackRow

    for oid in ("a", "b", "c", "d"):
        create(store, oid, to="agent:x" if oid != "d" else "agent:y")
    store.append("a", ev(2, "accept", "offered", "accepted", "2030-01-01T00:00:01Z"),
                 state="accepted")
    store.append("a", ev(3, "start", "accepted", "working"), state="working")
    for seq, attempt in ((4, 1), (6, 2)):
        store.append("a", ev(seq, "report", "working", "submitted"), state="submitted",
                     report=report("a", attempt))
        decision = "rework" if attempt == 1 else "approve"
        store.append("a", ev(seq + 1, decision, "submitted",
                             "working" if attempt == 1 else "approved"),
                     state="working" if attempt == 1 else "approved",
                     review=Review(order_id="a", attempt=attempt, actor="human:m",
                                   decision=decision, reason="r",
                                   at=f"2030-01-01T00:0{attempt}:00Z"))
    store.append("b", ev(2, "decline", "offered", "declined"), state="declined")
    got = store.track_rows("agent:x")
    records = store.list_orders(worker="agent:x", limit=None)
    seconds = {r.order.id: store.events(r.order.id, after=1, limit=1) for r in records}
    assert got == [TrackRow.of(r, next(iter(seconds[r.order.id]), None)) for r in records]
    assert [r.order_id for r in got] == ["c", "b", "a"]
    assert (got[2].reworks, got[2].accepted_at, got[2].approved_at, got[2].cost) == (
        1, "2030-01-01T00:00:01Z", "2030-01-01T00:02:00Z", {"tool_calls": 1})
    assert got[1].accepted_at is None and got[0].status is None
    assert store.track_rows("agent:nobody") == []


# Call records ----------------------------------------------------------------------------


def test_calls_are_numbered_per_order_across_attempts(store: Store) -> None:
    """N runs from 1 per order over reserved and refused calls of every attempt."""
    create(store, "a")
    create(store, "b")
    first = reserved(reserve(store, "a"))
    assert first.ref == "srv/read#1" and first.outcome == "pending"
    assert first.ended_at == first.started_at and first.arguments == {"x": [1, 2]}
    assert store.record_call(refusal("a")).ref == "srv/write#2"
    assert reserved(reserve(store, "b")).ref == "srv/read#1"
    assert reserved(reserve(store, "a", tool="srv/send", attempt=2)).ref == "srv/send#3"
    assert [c.ref for c in store.calls("a")] == ["srv/read#1", "srv/write#2", "srv/send#3"]
    assert [c.ref for c in store.calls("a", attempt=2)] == ["srv/send#3"]


def test_finish_call_sets_the_outcome_once(store: Store) -> None:
    """A reserved call gets one final outcome; a second one is a Conflict."""
    create(store)
    reserve(store)
    store.finish_call("o1", "srv/read#1", outcome="ok", result={"r": 1}, error=None,
                      ended_at="2030-01-01T00:00:01Z")
    [done] = store.calls("o1")
    assert (done.outcome, done.result, done.ended_at) == ("ok", {"r": 1}, "2030-01-01T00:00:01Z")
    with pytest.raises(Conflict):
        store.finish_call("o1", "srv/read#1", outcome="error", result=None, error="x",
                          ended_at=T0)
    with pytest.raises(NotFound):
        store.finish_call("o1", "srv/read#2", outcome="ok", result=None, error=None,
                          ended_at=T0)
    with pytest.raises(NotFound):
        store.finish_call("o1", "srv/other#1", outcome="ok", result=None, error=None,
                          ended_at=T0)
    reserve(store)
    with pytest.raises(BadRequest):
        store.finish_call("o1", "srv/read#2", outcome="pending", result=None, error=None,
                          ended_at=T0)
    store.hold_call("o1", "srv/read#call-2", result=None, ended_at=T0)
    assert [c.outcome for c in store.calls("o1")] == ["ok", "held"]
    with pytest.raises(BadRequest, match="error"):  # checked before anything is looked up
        store.finish_call("o1", "srv/read#9", outcome="error", result=None,
                          error=7, ended_at=T0)  # type: ignore[arg-type]


def test_bad_call_records_are_refused(store: Store) -> None:
    """A call record that would not validate is refused and takes no number."""
    create(store)
    with pytest.raises(BadRequest):
        store.record_call({**refusal(), "ref": "srv/write#9"})
    with pytest.raises(BadRequest):
        store.record_call({**refusal(), "tool": "not a tool"})
    with pytest.raises(BadRequest):
        store.record_call({**refusal(), "started_at": "yesterday"})
    with pytest.raises(BadRequest):
        reserve(store, tool="bad")
    circular: dict[str, Any] = {}
    circular["self"] = circular
    for not_json in ({"x": float("nan")}, {"x": {1, 2}}, {"x": object()}, circular):
        with pytest.raises(BadRequest, match="JSON data"):
            store.record_call({**refusal(), "arguments": not_json})
    assert reserved(reserve(store)).ref == "srv/read#1"
    with pytest.raises(BadRequest, match="JSON data"):
        store.finish_call("o1", "srv/read#1", outcome="ok", result={"r": float("inf")},
                          error=None, ended_at=T0)
    with pytest.raises(BadRequest, match="outcome"):
        store.finish_call("o1", "srv/read#1", outcome="maybe", result=None, error=None,
                          ended_at=T0)
    with pytest.raises(BadRequest, match="ended_at"):
        store.finish_call("o1", "srv/read#1", outcome="ok", result=None, error=None,
                          ended_at="later")
    assert store.calls("o1")[0].outcome == "pending"


def test_usage_counts_reserved_calls_only(store: Store) -> None:
    """Usage counts reserved calls of every outcome and their usd, never refusals."""
    create(store)
    assert store.usage("o1").tool_calls == 0 and store.usage("o1").first_call_at is None
    store.record_call(refusal(at="2029-12-31T23:00:00+00:00"))
    reserve(store, jti="p1", usd=0.5, at="2030-01-01T01:00:00+02:00")
    reserve(store, jti="p2", usd=0.25)
    reserve(store, usd=1.0)
    store.finish_call("o1", "srv/read#2", outcome="error", result=None, error="x",
                      ended_at="2030-01-01T00:00:00Z")
    store.hold_call("o1", "srv/read#3", result=None, ended_at=T0)
    total = store.usage("o1")
    assert (total.tool_calls, total.usd) == (3, 1.75)
    assert total.first_call_at == "2029-12-31T23:00:00+00:00"
    mine = store.usage("o1", frozenset({"p1", "p2"}))
    assert (mine.tool_calls, mine.usd) == (2, 0.75)
    # 01:00+02:00 is 23:00Z the day before: earlier than T0 though it sorts later as text.
    assert mine.first_call_at == "2030-01-01T01:00:00+02:00"
    assert store.usage("o1", frozenset()).tool_calls == 0


def test_charges_say_what_each_call_counts(store: Store) -> None:
    """charges gives each call's usd by N, None for a refusal (which counts nothing)."""
    create(store)
    assert store.charges("o1") == []
    reserve(store, usd=0.5)
    store.record_call(refusal())
    reserve(store, usd=0.0)
    reserve(store, usd=0.25, attempt=2)
    assert store.charges("o1") == [0.5, None, 0.0, 0.25]
    with pytest.raises(NotFound):
        store.charges("nope")


def test_reserve_call_refuses_the_first_exceeded_scope(store: Store) -> None:
    """A reservation over any scope's limit names that scope and writes nothing."""
    create(store)
    order = Scope(jtis=None, max_calls=3, max_usd=1.0, name="order")
    child = Scope(jtis=frozenset({"p2"}), max_calls=1, name="pass")
    # The caller passes the scopes the new call falls under: the order's and its pass's.
    assert reserved(reserve(store, jti="p1", usd=0.3, scopes=[order])).ref == "srv/read#1"
    assert reserved(reserve(store, jti="p2", usd=0.3, scopes=[order, child])).ref == "srv/read#2"
    assert reserve(store, jti="p2", usd=0.1, scopes=[order, child]) == OverBudget("pass")
    assert reserve(store, jti="p2", usd=0.5, scopes=[order, child]) == OverBudget("order")
    assert reserved(reserve(store, jti="p1", usd=0.4, scopes=[order])).ref == "srv/read#3"
    assert reserve(store, jti="p1", usd=0.0, scopes=[order]) == OverBudget("order")
    assert store.usage("o1").tool_calls == 3
    assert [c.ref for c in store.calls("o1")] == ["srv/read#1", "srv/read#2", "srv/read#3"]


def test_reserve_call_with_seq_refuses_a_stale_order(store: Store) -> None:
    """With ``seq``, a reservation on an order whose log moved on writes nothing."""
    create(store)
    args: dict[str, Any] = {"attempt": 1, "tool": "srv/read", "arguments": {},
                            "pass_jti": None, "usd": 0.0, "started_at": T0, "scopes": []}
    assert reserved(store.reserve_call("o1", seq=1, **args)).ref == "srv/read#1"
    store.append("o1", ev(2, "accept", "offered", "accepted"), state="accepted")
    with pytest.raises(Conflict) as caught:
        store.reserve_call("o1", seq=1, **args)
    assert (caught.value.expected_seq, caught.value.actual_seq) == (1, 2)
    assert [c.ref for c in store.calls("o1")] == ["srv/read#1"]
    assert reserved(store.reserve_call("o1", seq=2, **args)).ref == "srv/read#2"


def test_reserve_call_is_exact_under_racing_threads(store: Store) -> None:
    """Fifty threads racing for ten calls reserve exactly ten, numbered 1 to 10."""
    create(store)
    scope = [Scope(jtis=None, max_calls=10)]
    barrier = threading.Barrier(50)
    results: list[Any] = []
    guard = threading.Lock()

    def run() -> None:
        barrier.wait()
        got = reserve(store, scopes=scope)
        with guard:
            results.append(got)

    threads = [threading.Thread(target=run) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = sorted(r.record.ref for r in results if isinstance(r, Reserved))
    assert len(won) == 10 and results.count(OverBudget("order")) == 40
    assert [c.ref for c in store.calls("o1")] == [f"srv/read#{n}" for n in range(1, 11)]
    assert store.usage("o1").tool_calls == 10


def test_stores_hand_back_json_never_the_callers_objects(store: Store) -> None:
    """Arguments, results and lock data come back as JSON reads them, never aliased."""
    create(store)
    arguments: dict[str, Any] = {"t": (1, 2), "d": {"k": [1]}}
    record = reserved(store.reserve_call(
        "o1", attempt=1, tool="srv/send", arguments=arguments, pass_jti=None, usd=0.0,
        started_at=T0, scopes=[]))
    arguments["d"]["k"].append(2)
    assert record.arguments == {"t": [1, 2], "d": {"k": [1]}}
    assert store.calls("o1")[0].arguments == {"t": [1, 2], "d": {"k": [1]}}
    second = reserved(store.reserve_call(
        "o1", attempt=1, tool="srv/read", arguments={}, pass_jti=None, usd=0.0,
        started_at=T0, scopes=[]))
    result: dict[str, Any] = {"t": (4,), "d": {"k": [1]}}
    store.finish_call("o1", second.ref, outcome="ok", result=result, error=None, ended_at=T0)
    result["d"]["k"].append(2)
    assert store.calls("o1")[1].result == {"t": [4], "d": {"k": [1]}}
    made = store.set_effect("o1", record.ref, expect=None, state="held",
                            result={"t": (3,)}, at=T0)
    assert made.result == {"t": [3]} and store.effects("o1") == [made]
    with pytest.raises(BadRequest):
        store.set_effect("o1", record.ref, expect=["held"], state="held",
                         result={"x": {1, 2}}, at=T0)
    mine = LockInfo(name="n", holder="a", pid=1, host="h", lease_until=1.0,
                    data={"t": (1,)})
    assert store.acquire_lock(mine)
    # Renewing with the very object that took the lock works whatever the store keeps.
    assert store.acquire_lock(mine, replace=mine)
    assert store.get_lock("n") == LockInfo(name="n", holder="a", pid=1, host="h",
                                           lease_until=1.0, data={"t": [1]})
    with pytest.raises(BadRequest):
        store.acquire_lock(LockInfo(name="m", holder="a", pid=1, host="h", lease_until=1.0,
                                    data={"x": object()}))


# Effects ----------------------------------------------------------------------------------


def _held(store: Store) -> str:
    create(store)
    reserve(store, tool="srv/send", attempt=2)
    return "srv/send#1"


@pytest.mark.spec("CM-6")
def test_effect_moves_only_from_the_expected_state(store: Store) -> None:
    """set_effect is a compare-and-set on the effect's state."""
    ref = _held(store)
    made = store.set_effect("o1", ref, expect=None, state="held", at=T0)
    assert (made.ref, made.attempt, made.state, made.dispatches) == (ref, 2, "held", 0)
    with pytest.raises(Conflict):
        store.set_effect("o1", ref, expect=None, state="held", at=T0)
    going = store.set_effect("o1", ref, expect=["held"], state="dispatching",
                             count_dispatch=True, at="2030-01-01T00:00:05Z")
    assert (going.state, going.dispatches, going.updated_at) == (
        "dispatching", 1, "2030-01-01T00:00:05Z")
    with pytest.raises(Conflict):
        store.set_effect("o1", ref, expect=["held"], state="dispatching", at=T0)
    done = store.set_effect("o1", ref, expect=["dispatching", "unknown"], state="committed",
                            result={"id": 7}, at=T0)
    assert (done.state, done.result, done.dispatches) == ("committed", {"id": 7}, 1)
    assert store.effects("o1") == [done]


def test_effect_settlement_and_retry_keep_history(store: Store) -> None:
    """A settlement stays through a retry, and each dispatch is counted."""
    ref = _held(store)
    store.set_effect("o1", ref, expect=None, state="held", at=T0)
    store.set_effect("o1", ref, expect=["held"], state="dispatching", count_dispatch=True,
                     at=T0)
    store.set_effect("o1", ref, expect=["dispatching"], state="unknown", error="lost", at=T0)
    settled = Settlement(verdict="did_not_happen", evidence="no mail", by="human:m", at=T0)
    got = store.set_effect("o1", ref, expect=["unknown"], state="unknown", error="lost",
                           settlement=settled, at=T0)
    assert got.settlement == settled and got.error == "lost"
    again = store.set_effect("o1", ref, expect=["unknown"], state="dispatching",
                             count_dispatch=True, at=T0)
    assert (again.dispatches, again.settlement, again.error) == (2, settled, None)
    assert store.effects("o1") == [again]


def test_restore_effect_stores_a_state_as_given(store: Store) -> None:
    """restore_effect writes an effect exactly as another store held it, checking no move;
    it needs the call, a known state and a JSON result."""
    ref = _held(store)
    settled = Settlement(verdict="did_not_happen", evidence="no mail", by="human:m", at=T0)
    wanted = EffectState(order_id="o1", ref=ref, attempt=2, state="committed",
                         result={"t": (1, 2)}, error=None, settlement=settled, dispatches=3,
                         updated_at="2030-01-02T00:00:00Z")
    store.restore_effect(wanted)
    assert store.effects("o1") == [replace(wanted, result={"t": [1, 2]})]
    store.restore_effect(replace(wanted, state="unknown", dispatches=1, result=None))
    assert [(e.state, e.dispatches) for e in store.effects("o1")] == [("unknown", 1)]
    with pytest.raises(NotFound):
        store.restore_effect(replace(wanted, ref="srv/send#9"))
    with pytest.raises(BadRequest):
        store.restore_effect(replace(wanted, state="sent"))  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        store.restore_effect(replace(wanted, result={"x": {1, 2}}))
    assert [(e.state, e.dispatches) for e in store.effects("o1")] == [("unknown", 1)]


def test_effect_errors(store: Store) -> None:
    """Effects need a recorded call, an existing state to move, and a known state name."""
    ref = _held(store)
    with pytest.raises(NotFound):
        store.set_effect("o1", "srv/send#9", expect=None, state="held", at=T0)
    with pytest.raises(NotFound):
        store.set_effect("o1", "srv/read#1", expect=None, state="held", at=T0)
    with pytest.raises(NotFound):
        store.set_effect("o1", ref, expect=["held"], state="dropped", at=T0)
    with pytest.raises(BadRequest):
        store.set_effect("o1", ref, expect=None, state="sent", at=T0)
    assert store.effects("o1") == []


def _routes() -> dict[str, list[str]]:
    """For each effect state, the legal moves that lead to it from ``held`` (shortest)."""
    routes: dict[str, list[str]] = {"held": []}
    frontier = ["held"]
    while frontier:
        here = frontier.pop(0)
        for (frm, to) in TABLE:
            if frm == here and to not in routes:
                routes[to] = [*routes[here], to]
                frontier.append(to)
    return routes


@pytest.mark.spec("CM-13")
def test_every_effect_move_off_the_table_is_refused(store: Store) -> None:
    """Every pair of states is tried: a move is made exactly when it is a row of the table;
    any other (held → committed, anything out of committed, creating one past held) is
    refused with a line naming the move, and the effect is left as it was."""
    create(store)
    routes = _routes()
    assert set(routes) == set(STATES)  # every state can be reached
    tried = 0
    for frm in STATES:
        for to in STATES:
            ref = reserved(reserve(store, tool="srv/send")).ref
            current = store.set_effect("o1", ref, expect=None, state="held", at=T0)
            for step in routes[frm]:
                current = store.set_effect("o1", ref, expect=[current.state], state=step,
                                           count_dispatch=step == "dispatching", at=T0)
            assert current.state == frm
            tried += 1
            if (frm, to) in TABLE:
                moved = store.set_effect("o1", ref, expect=[frm], state=to,
                                         at="2030-01-01T00:00:09Z")
                assert (moved.state, moved.updated_at) == (to, "2030-01-01T00:00:09Z")
                continue
            with pytest.raises(InvalidTransition, match=f"cannot move from {frm} to {to}"):
                store.set_effect("o1", ref, expect=[frm], state=to, result={"r": 1},
                                 at="2030-01-01T00:00:09Z")
            assert next(e for e in store.effects("o1") if e.ref == ref) == current
    assert tried == len(STATES) ** 2
    for to in STATES:  # an effect is created only as held
        ref = reserved(reserve(store, tool="srv/send")).ref
        if to == "held":
            assert store.set_effect("o1", ref, expect=None, state=to, at=T0).state == "held"
            continue
        with pytest.raises(InvalidTransition, match=f"cannot move from absent to {to}"):
            store.set_effect("o1", ref, expect=None, state=to, at=T0)
        assert all(e.ref != ref for e in store.effects("o1"))


@pytest.mark.spec("CM-13")
def test_a_refused_move_says_what_the_state_allows(store: Store) -> None:
    """The refusal names the moves the state allows, or that the state is final."""
    ref = _held(store)
    store.set_effect("o1", ref, expect=None, state="held", at=T0)
    with pytest.raises(InvalidTransition) as caught:
        store.set_effect("o1", ref, expect=["held"], state="committed", at=T0)
    assert caught.value.message == (
        "effect 'srv/send#1' of order 'o1' cannot move from held to committed; from held it "
        "may move only to dropped, dispatching, skipped (SPEC §15)")
    store.set_effect("o1", ref, expect=["held"], state="dispatching", at=T0)
    store.set_effect("o1", ref, expect=["dispatching"], state="committed", at=T0)
    with pytest.raises(InvalidTransition, match="committed is final: no move leaves it"):
        store.set_effect("o1", ref, expect=["committed"], state="dispatching", at=T0)


@pytest.mark.spec("CM-14", "GW-9")
def test_hold_call_writes_the_outcome_and_the_effect_together(store: Store) -> None:
    """hold_call sets the call's outcome to held and creates its held effect at once;
    finish_call cannot hold a call; a call that cannot be held gets neither write."""
    ref = _held(store)
    answer = {"content": [{"type": "text", "text": f"pending:{ref}"}]}
    made = store.hold_call("o1", ref, result=answer, ended_at="2030-01-01T00:00:03Z")
    assert made == EffectState(order_id="o1", ref=ref, attempt=2, state="held",
                               updated_at="2030-01-01T00:00:03Z")
    assert store.effects("o1") == [made]
    (call,) = store.calls("o1")
    assert (call.outcome, call.result, call.ended_at) == (
        "held", answer, "2030-01-01T00:00:03Z")
    with pytest.raises(Conflict):  # its outcome is set
        store.hold_call("o1", ref, result=None, ended_at=T0)
    with pytest.raises(Conflict):
        store.finish_call("o1", ref, outcome="ok", result=None, error=None, ended_at=T0)
    second = reserved(reserve(store, tool="srv/send")).ref
    with pytest.raises(BadRequest, match="use hold_call"):
        store.finish_call("o1", second, outcome="held", result=None, error=None, ended_at=T0)
    with pytest.raises(BadRequest, match="ended_at"):
        store.hold_call("o1", second, result=None, ended_at="later")
    with pytest.raises(NotFound):
        store.hold_call("o1", "srv/send#9", result=None, ended_at=T0)
    # An effect made beforehand: the hold is refused whole, the call stays pending.
    store.set_effect("o1", second, expect=None, state="held", at=T0)
    with pytest.raises(Conflict):
        store.hold_call("o1", second, result=None, ended_at=T0)
    assert [c.outcome for c in store.calls("o1")] == ["held", "pending"]


def test_effects_are_listed_by_n(store: Store) -> None:
    """Effects come back by call number whatever order they were made in."""
    create(store)
    for _ in range(11):
        reserve(store, tool="srv/send")
    for n in (11, 2, 10, 1):
        store.set_effect("o1", f"srv/send#{n}", expect=None, state="held", at=T0)
    assert [e.ref for e in store.effects("o1")] == [
        "srv/send#1", "srv/send#2", "srv/send#10", "srv/send#11"]


# Locks, revocations, tokens ------------------------------------------------------------


@pytest.mark.spec("CM-10")
def test_lock_is_exclusive_and_taken_over_only_exactly(store: Store) -> None:
    """A held lock is taken only by a takeover naming the holder exactly."""
    first = LockInfo(name="commit:o1", holder="a", pid=1, host="h", lease_until=100.5,
                     data={"k": [1]})
    second = LockInfo(name="commit:o1", holder="b", pid=2, host="h", lease_until=200.0)
    third = LockInfo(name="commit:o1", holder="c", pid=3, host="h", lease_until=300.0)
    assert store.get_lock("commit:o1") is None
    assert store.acquire_lock(first)
    assert store.get_lock("commit:o1") == first
    assert not store.acquire_lock(second)
    import dataclasses

    stale = dataclasses.replace(first, lease_until=100.25)
    assert not store.acquire_lock(second, replace=stale)
    assert not store.acquire_lock(second, replace=dataclasses.replace(first, data={}))
    assert store.acquire_lock(second, replace=first)
    # The loser of a takeover race holds an outdated view and fails.
    assert not store.acquire_lock(third, replace=first)
    assert store.get_lock("commit:o1") == second
    store.release_lock("commit:o1", "a")
    assert store.get_lock("commit:o1") == second
    store.release_lock("commit:o1", "b")
    assert store.get_lock("commit:o1") is None
    assert store.acquire_lock(third, replace=second)
    with pytest.raises(BadRequest):
        store.acquire_lock(first, replace=dataclasses.replace(third, name="other"))


@pytest.mark.spec("DP-8")
def test_revocations_and_tokens(store: Store) -> None:
    """Revocations keep their first reason and time, and tokens map back to their principal."""
    assert store.revoked() == {}
    assert store.revocations() == {}
    store.revoke("j1", reason="lost", at=T0)
    store.revoke("j1", reason="again", at="2030-01-05T00:00:00Z")
    store.revoke("j2", reason="done", at="2030-01-02T10:30:00.125Z")
    assert store.revoked() == {"j1": "lost", "j2": "done"}
    assert store.revocations() == {
        "j1": Revocation(reason="lost", at=T0),
        "j2": Revocation(reason="done", at="2030-01-02T10:30:00.125Z"),
    }
    assert store.principal_for("h") is None
    store.save_token("h", "human:m", created_at=T0)
    assert store.principal_for("h") == "human:m"


@pytest.mark.spec("SEC-6")
def test_tokens_are_listed_oldest_first_and_dropped(store: Store) -> None:
    """Tokens list by hash in the order first saved (a re-save updates in place); a dropped
    token no longer names anyone, and dropping it again says there was none."""
    assert store.tokens() == []
    store.save_token("h1", "human:m", created_at=T0)
    store.save_token("h2", "agent:w", created_at="2030-01-01T00:00:01Z")
    store.save_token("h1", "human:n", created_at="2030-01-01T00:00:02Z")
    assert store.tokens() == [TokenRecord("h1", "human:n", "2030-01-01T00:00:02Z"),
                              TokenRecord("h2", "agent:w", "2030-01-01T00:00:01Z")]
    assert store.drop_token("h1") is True
    assert store.drop_token("h1") is False
    assert store.principal_for("h1") is None and store.principal_for("h2") == "agent:w"
    assert [t.token_hash for t in store.tokens()] == ["h2"]


def test_passes_are_kept_per_order(store: Store) -> None:
    """Saved passes list per order in first-saved order; saving a jti again replaces it."""
    first = PassRecord(jti="j1", order_id="o1", parent_jti=None, subject="agent:w", exp=10,
                       issued_at=T0)
    store.save_pass(first)
    store.save_pass(PassRecord(jti="j2", order_id="o2", parent_jti=None, subject="agent:w",
                               exp=10, issued_at=T0))
    child = PassRecord(jti="j3", order_id="o1", parent_jti="j1", subject="agent:v", exp=5,
                       issued_at=T0)
    store.save_pass(child)
    again = PassRecord(jti="j1", order_id="o1", parent_jti=None, subject="agent:w", exp=20,
                       issued_at=T0)
    store.save_pass(again)
    assert store.passes("o1") == [again, child]
    assert store.passes("none") == []
    assert store.saved_pass("j1") == again and store.saved_pass("j3") == child
    assert store.saved_pass("j9") is None


# Subscriptions ----------------------------------------------------------------------------

SUBSCRIBING = ["memory", "postgres"]
"""The stores that push news of an order (:class:`Subscriptions`); SQLite is polled."""


@pytest.mark.parametrize("kind", SUBSCRIBING)
def test_wait_for_events_wakes_at_an_append_and_times_out(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A waiter wakes when another thread appends; without news it returns False in time."""
    store = open_backend(kind, tmp_path, request)
    assert isinstance(store, Subscriptions)
    create(store)
    assert store.wait_for_events("o1", 0, 5) is True  # already past seq 0
    began = time.monotonic()
    assert store.wait_for_events("o1", 1, 0.2) is False
    assert 0.15 < time.monotonic() - began < 5
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(store.wait_for_events("o1", 1, 60)))
    waiter.start()
    time.sleep(0.1)
    began = time.monotonic()
    store.append("o1", ev(2, "accept", "offered", "accepted"), state="accepted")
    waiter.join(60)
    assert woke == [True] and time.monotonic() - began < 5
    with pytest.raises(NotFound):
        store.wait_for_events("nope", 0, 0.1)
    (tmp_path / "other").mkdir()
    polled = open_backend("sqlite", tmp_path / "other", request)
    assert not isinstance(polled, Subscriptions)
    polled.close()
    store.close()


@pytest.mark.spec("BIND-19")
def test_web_sessions_are_kept_by_hash_expire_and_end(store: Store) -> None:
    from awl.store.protocol import WebSession, WebSessions

    assert isinstance(store, WebSessions)
    old = WebSession("sha256:old", "human:m", "csrf-old", 100.0)
    store.start_web_session(old, now=50.0)
    assert store.web_session("sha256:old", now=99.0) == old
    assert store.web_session("sha256:old", now=100.0) is None  # expired
    new = WebSession("sha256:new", "human:m", "csrf-new", 500.0, token_hash="sha256:tok")
    store.start_web_session(new, now=200.0)  # forgets the expired one
    assert store.web_session("sha256:old", now=0.0) is None
    assert store.web_session("sha256:new", now=200.0) == new
    with pytest.raises(Conflict):
        store.start_web_session(new, now=200.0)
    assert store.end_web_session("sha256:new")
    assert not store.end_web_session("sha256:new")
    assert store.web_session("sha256:new", now=200.0) is None


def test_the_outbox_reads_in_pages_oldest_first(store: Store) -> None:
    """notifications_after: the outbox as written, a page at a time, whatever its states;
    nothing after an id it does not keep."""
    from awl.store.protocol import Notification, WebhookStore

    assert isinstance(store, WebhookStore)
    written = [Notification(id=f"msg_{i}", webhook_id="wh_1", event="submitted",
                            order_id="o1", payload={"n": i}, created_at=T0, next_at=T0,
                            state="dead" if i % 2 else "pending") for i in range(5)]
    for note in written:
        store.restore_notification(note)
    assert store.notifications_after(limit=2) == written[:2]
    assert store.notifications_after("msg_1", limit=2) == written[2:4]
    assert store.notifications_after("msg_3", limit=2) == written[4:]
    assert store.notifications_after("msg_4") == []
    assert store.notifications_after("msg_9") == []
