"""The question queue a page at a time, in the order each store keeps (BIND-20, BIND-21)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from awl.desk import Desk, QuestionPage
from awl.desk.queries import read_cursor, write_cursor
from awl.documents.errors import BadRequest
from awl.documents.lifecycle import ACTIVE
from awl.documents.models import format_time, stored_time
from awl.store.protocol import Store
from tests.awl.desk_support import (
    HELPER,
    MANAGER,
    T0,
    WORKER,
    Clock,
    order_fields,
    report_fields,
    working,
)

ESCALATION = "human:esc"


def sub(desk: Desk, parent: str, worker: str, *, start: bool = True) -> str:
    """A sub-order of the working order ``parent``, from its worker to ``worker``."""
    boss = desk.get(parent).order.to
    oid = desk.create(order_fields(to=worker, parent_id=parent, tools=["filings/*"],
                                   staged=None, budget={"usd": 1, "tool_calls": 1},
                                   **{"from": boss}), boss).id
    if start:
        desk.accept(oid, worker)
        desk.start(oid, worker)
    return oid


def blocked_report(**over: Any) -> dict[str, Any]:
    """A blocked report that spends nothing (within a sub-order's budget)."""
    return report_fields("blocked", cost={"usd": 0, "tool_calls": 0}, **over)


def weights(desk: Desk) -> dict[str, int]:
    return {q.order_id: q.blocking for q in desk.questions().questions}


def fresh_queue(desk: Desk, actor: str | None = None) -> list[tuple[str, int]]:
    """The queue computed afresh from every order: ``(order_id, weight)`` in its order."""
    orders = {v.id: v for v in desk.list(limit=None)}
    children: dict[str, list[str]] = {}
    for v in orders.values():
        if v.order.parent_id is not None:
            children.setdefault(v.order.parent_id, []).append(v.id)

    def weight(oid: str) -> int:
        seen, stack = {oid}, [oid]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in seen and orders[child].state in ACTIVE:
                    seen.add(child)
                    stack.append(child)
        return len(seen)

    blocked = [(weight(v.id), v) for v in orders.values() if v.state == "blocked"
               and (actor is None or actor in v.order.answerers)]
    blocked.sort(key=lambda p: (-p[0], stored_time(p[1].updated_at), p[1].id))
    return [(v.id, w) for w, v in blocked]


def paged(desk: Desk, actor: str | None, limit: int) -> list[tuple[str, int]]:
    """Every page of the queue, one after another, each at most ``limit`` long."""
    out: list[tuple[str, int]] = []
    after = None
    while True:
        page = desk.questions(actor, limit=limit, after=after)
        assert len(page.questions) <= limit
        out += [(q.order_id, q.blocking) for q in page.questions]
        if page.next is None:
            return out
        assert len(page.questions) == limit
        after = page.next


def random_write(desk: Desk, rng: random.Random, n: int) -> None:
    """One write of a random desk (the ``n``-th): a new order or sub-order, an order
    blocked, answered or cancelled."""
    orders = desk.list(limit=None)
    by_state: dict[str, list[str]] = {}
    for v in orders:
        by_state.setdefault(v.state, []).append(v.id)
    op = rng.choice(["new", "new", "sub", "sub", "sub", "block", "block", "block",
                     "answer", "cancel"])
    if op == "new" or not orders:
        working(desk, manager=rng.choice([MANAGER, HELPER]),
                escalate_to=rng.choice([None, ESCALATION]))
    elif op == "sub" and by_state.get("working"):
        sub(desk, rng.choice(by_state["working"]), f"agent:s{n}", start=rng.random() < 0.7)
    elif op == "block" and by_state.get("working"):
        oid = rng.choice(by_state["working"])
        desk.report(oid, desk.get(oid).order.to, blocked_report(questions=[f"q{n}?"]))
    elif op == "answer" and by_state.get("blocked"):
        oid = rng.choice(by_state["blocked"])
        desk.answer(oid, desk.get(oid).order.manager, "go on")
    elif op == "cancel":
        active = [v for v in orders if v.state in ACTIVE]
        if active:
            view = rng.choice(active)
            desk.cancel(view.id, view.order.manager, "plans changed")


@pytest.mark.spec("BIND-21", "BIND-20")
def test_a_question_weighs_what_waits_on_it_as_sub_orders_start_and_end(store: Store) -> None:
    """Each order created under it adds one to a blocked order's weight, even while it is
    blocked; an order that ends takes itself and the active orders below it away."""
    desk = Desk(store, clock=Clock())
    top = working(desk).id
    child = sub(desk, top, "agent:a")
    other = sub(desk, top, "agent:b", start=False)
    desk.report(top, WORKER, report_fields("blocked"))
    assert weights(desk) == {top: 3}
    grand = sub(desk, child, "agent:c")  # under a working child of the blocked order
    assert weights(desk) == {top: 4}
    sub(desk, grand, "agent:d")
    assert weights(desk) == {top: 5}
    desk.report(grand, "agent:c", blocked_report())
    assert weights(desk) == {top: 5, grand: 2}
    # Ending the child takes it, grand and grand's sub-order from the top's weight (grand,
    # still blocked, is reached through an ended order now).
    desk.cancel(child, WORKER, "not needed")
    assert weights(desk) == {top: 2, grand: 2}
    desk.decline(other, "agent:b", "busy")
    assert weights(desk) == {top: 1, grand: 2}
    assert [(q.order_id, q.blocking) for q in desk.questions().questions] == fresh_queue(desk)


@pytest.mark.spec("BIND-20", "BIND-21")
@pytest.mark.parametrize("seed", [1, 2])
def test_pages_one_after_another_are_the_whole_queue_in_order(store: Store, seed: int) -> None:
    """A random desk of trees of orders, blocked, answered and ended at random (many asked
    in the same instant): for every answerer and the whole queue, pages of any size, one
    after another, give the queue as computed afresh from the orders, each question once;
    so every backend gives the same queue for the same writes."""
    rng = random.Random(seed)
    clock = Clock()
    desk = Desk(store, clock=clock)
    for n in range(60):
        random_write(desk, rng, n)
        clock.advance(seconds=rng.choice([0, 0, 1, 60]))
    assert len(fresh_queue(desk)) >= 3
    for actor in (None, MANAGER, HELPER, ESCALATION, WORKER, "human:nobody"):
        whole = fresh_queue(desk, actor)
        for limit in (1, 2, 3, 50):
            assert paged(desk, actor, limit) == whole, (actor, limit)
    assert store.blocked_orders() == store.blocked_orders(limit=None)


@pytest.mark.spec("BIND-20", "BIND-21")
def test_the_queue_is_in_order_after_every_write_with_ties_broken_alike(store: Store) -> None:
    """The memory store keeps its queue ordered as writes change it (a page sorts nothing):
    after every write of a random desk where every question is asked in the same instant,
    so weight and time tie and the order id decides, pages of one and two (each starting
    after a cursor that names a tie) and the whole queue, for every answerer, are the queue
    computed afresh, as every backend gives it."""
    rng = random.Random(7)
    desk = Desk(store, clock=Clock())  # a clock that never moves: every question ties
    for n in range(40):
        random_write(desk, rng, n)
        for actor in (None, MANAGER, ESCALATION):
            whole = fresh_queue(desk, actor)
            assert paged(desk, actor, 1) == whole, (n, actor)
            assert paged(desk, actor, 2) == whole, (n, actor)
            assert [(r.order_id, r.blocking) for r in store.blocked_orders(actor)] == whole
    assert len({w for _, w in fresh_queue(desk)}) < len(fresh_queue(desk)), "no weights tie"


@pytest.mark.spec("BIND-20")
def test_a_cursor_names_a_place_so_an_answer_between_pages_skips_nothing(
        store: Store) -> None:
    """The page after a cursor starts after that place even when the question it came from
    was answered meanwhile; a question asked meanwhile at a later time comes later."""
    clock = Clock()
    desk = Desk(store, clock=clock)
    blocked = []
    for _ in range(5):
        oid = working(desk).id
        desk.report(oid, WORKER, report_fields("blocked"))
        blocked.append(oid)
        clock.advance(seconds=1)
    first = desk.questions(MANAGER, limit=2)
    assert [q.order_id for q in first.questions] == blocked[:2]
    desk.answer(blocked[1], MANAGER, "go on")
    late = working(desk).id
    desk.report(late, WORKER, report_fields("blocked"))
    rest = desk.questions(MANAGER, limit=50, after=first.next)
    assert [q.order_id for q in rest.questions] == [*blocked[2:], late]
    assert rest.next is None


@pytest.mark.spec("BIND-20", "BIND-21")
def test_a_page_reads_its_questions_alone_and_leaves_an_overdue_one_out(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page asks the store for one more question than it shows, never the whole queue,
    and loads no order; an order past its deadline is expired first and left out, and the
    page is still full."""
    clock = Clock()
    desk = Desk(store, clock=clock)
    soon = format_time(T0.replace(hour=10))
    late = working(desk, deadline=soon).id
    desk.report(late, WORKER, report_fields("blocked"))
    for _ in range(6):
        desk.report(working(desk).id, WORKER, report_fields("blocked"))
    asked: list[tuple[Any, int]] = []
    real = store.blocked_orders

    def spy(answerer: str | None = None, **kwargs: Any) -> Any:
        rows = real(answerer, **kwargs)
        asked.append((kwargs.get("limit"), len(rows)))
        return rows

    monkeypatch.setattr(store, "blocked_orders", spy)
    loaded: list[str] = []
    real_load = store.load
    def load(oid: str) -> Any:
        loaded.append(oid)
        return real_load(oid)

    monkeypatch.setattr(store, "load", load)
    page = desk.questions(MANAGER, limit=2)
    assert page.next is not None and asked == [(3, 3)] and loaded == []
    deep = desk.questions(MANAGER, limit=2, after=desk.questions(MANAGER, limit=4).next)
    assert len(deep.questions) == 2 and loaded == []
    clock.advance(hours=2)  # past the first order's deadline
    page = desk.questions(MANAGER, limit=6)
    assert loaded == [late]
    assert len(page.questions) == 6 and late not in [q.order_id for q in page.questions]
    assert page.next is None
    assert real_load(late).state == "expired"


@pytest.mark.spec("BIND-20")
@pytest.mark.parametrize("limit", [0, -1, 201, 10**30, 1.5, "5", None, True])
def test_a_limit_out_of_range_is_refused_in_one_line(limit: Any) -> None:
    from awl.store.memory import MemoryStore

    with pytest.raises(BadRequest) as refused:
        Desk(MemoryStore()).questions(limit=limit)
    assert "\n" not in refused.value.message and "limit" in refused.value.message


_GARBLED = ["", "abc", "q1.", "q1.!!!", "q1.W10", "Q1.WzEsIngiLCJ5Il0", "q1." + "A" * 3000,
            write_cursor((-1, "2030-01-01T09:00:00Z", "wo_1")),  # not the queue's time
            write_cursor((0, "2030-01-01T09:00:00.000000Z", "wo_1")),  # weight 0
            "q1.eyJhIjoxfQ"]  # {"a": 1}


@pytest.mark.spec("BIND-20")
@pytest.mark.parametrize("after", _GARBLED)
def test_a_garbled_cursor_is_refused_in_one_line(after: str) -> None:
    from awl.store.memory import MemoryStore

    with pytest.raises(BadRequest) as refused:
        Desk(MemoryStore()).questions(after=after)
    assert "\n" not in refused.value.message
    assert "not a cursor of the question queue" in refused.value.message


def test_a_cursor_reads_back_as_the_key_it_was_written_from() -> None:
    key = (-3, "2030-01-01T09:00:00.123000Z", "wo_ü")
    assert read_cursor(write_cursor(key)) == key
    assert QuestionPage([], None).to_json() == {"questions": [], "next": None}


def _queue_of(store: Store) -> Any:
    clock = Clock()
    desk = Desk(store, clock=clock)
    top = working(desk).id
    sub(desk, top, "agent:a")
    desk.report(top, WORKER, report_fields("blocked"))
    clock.advance(seconds=1)
    desk.report(working(desk, manager=HELPER).id, WORKER, report_fields("blocked"))
    queue = store.blocked_orders()
    assert [row.blocking for row in queue] == [2, 1]
    return queue


@pytest.mark.spec("BIND-21")
def test_a_sqlite_desk_of_version_9_gets_its_queue_keyed(tmp_path: Path) -> None:
    """Migration 10 keys the questions already in the queue."""
    from awl.store.sqlite import SCHEMA_VERSION, SQLiteStore
    from tests.awl.test_sqlite import _back_to

    path = tmp_path / "desk.sqlite3"
    store = SQLiteStore(path)
    queue = _queue_of(store)
    store.close()
    _back_to(path, 9, *(f"DROP INDEX question_queue_by_{name}"
                        for name in ("key", "manager_key", "escalation_key", "due")),
             *(f"ALTER TABLE question_queue DROP COLUMN {name}"
               for name in ("rank", "asked", "due")),
             "CREATE INDEX question_queue_by_manager ON question_queue (manager, pos)",
             "CREATE INDEX question_queue_by_escalation ON question_queue (escalate_to, pos)")
    conn = sqlite3.connect(path)
    assert "rank" not in [row[1] for row in conn.execute("PRAGMA table_info(question_queue)")]
    conn.close()
    with SQLiteStore(path) as again:
        assert again.schema_version() == SCHEMA_VERSION == 10
        assert again.blocked_orders() == queue
        assert again.blocked_orders(HELPER) == queue[1:]


@pytest.mark.spec("BIND-21")
def test_a_postgres_desk_of_version_5_gets_its_queue_keyed(pg_url: str) -> None:
    """Migration 6 keys the questions already in the queue."""
    import psycopg

    from awl.store.postgres import SCHEMA_VERSION, PostgresStore

    store = PostgresStore(pg_url)
    queue = _queue_of(store)
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in (
                *(f"DROP INDEX question_queue_by_{name}"
                  for name in ("key", "manager_key", "escalation_key", "due")),
                "ALTER TABLE question_queue DROP COLUMN rank, DROP COLUMN asked,"
                " DROP COLUMN due, ALTER COLUMN order_id TYPE TEXT COLLATE \"default\"",
                "CREATE INDEX question_queue_by_manager ON question_queue (manager, pos)",
                "CREATE INDEX question_queue_by_escalation ON question_queue (escalate_to, pos)"):
            conn.execute(statement)
        conn.execute("DELETE FROM awl_schema WHERE version > 5")
    with PostgresStore(pg_url) as again:
        assert again.schema_version() == SCHEMA_VERSION == 6
        assert again.blocked_orders() == queue
        assert again.blocked_orders(HELPER) == queue[1:]


@pytest.mark.spec("BIND-21")
def test_a_postgres_write_that_reweighs_waits_for_a_write_to_an_order_above(
        pg_url: str) -> None:
    """An order ending under one another transaction is ending too waits for it, then sees
    it ended and takes nothing from the orders above it (which that ending already took
    from): without the hold it would read the order above as still working, and count the
    change twice."""
    import threading

    import psycopg

    from awl.store.postgres import PostgresStore

    store = PostgresStore(pg_url)
    try:
        desk = Desk(store, clock=Clock())
        top = working(desk).id
        middle = sub(desk, top, "agent:a")
        low = sub(desk, middle, "agent:b")
        desk.report(top, WORKER, report_fields("blocked"))
        assert weights(desk) == {top: 3}
        with psycopg.connect(pg_url) as other:
            other.execute("SELECT 1 FROM orders WHERE id = %s FOR NO KEY UPDATE", (middle,))
            other.execute("UPDATE orders SET state = 'cancelled' WHERE id = %s", (middle,))
            ended = threading.Thread(target=desk.cancel, args=(low, "agent:a", "stop"))
            ended.start()
            ended.join(1.0)
            assert ended.is_alive()  # waiting for the order above
            other.commit()
        ended.join(10)
        assert not ended.is_alive()
        assert store.load(low).state == "cancelled"
        assert weights(desk) == {top: 3}  # the other write's to change, not this one's
    finally:
        store.close()
