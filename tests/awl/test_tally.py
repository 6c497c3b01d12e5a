"""Track records and the question queue kept by the store in the transaction of each write.

After every kind of event (create, accept, decline, start, report, block, answer, rework,
approve, cancel, expire, sub-orders) the tallies a store keeps agree with a track record
computed from scratch over its track rows, for the worker and for each manager (SEC-8), and
the memory, SQLite and PostgreSQL stores give identical records and queues for the same
writes. A desk from before the tallies gets them filled when it is opened.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from awl.desk import Desk
from awl.desk.track import summarize
from awl.store.protocol import Store, TrackRecord
from tests.awl.desk_support import (
    HELPER,
    MANAGER,
    WORKER,
    Clock,
    open_backend,
    order_fields,
    report_fields,
    working,
)

OTHER = "agent:other"


def _flat(record: TrackRecord) -> dict[str, Any]:
    """The record's figures as one flat mapping (nested keys joined by dots)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            out[prefix] = value

    walk("", record.to_json())
    return out


def _same(kept: TrackRecord, fresh: TrackRecord) -> None:
    """The kept record is the fresh one: counts and medians exactly, spend sums (running sums)
    up to float rounding."""
    a, b = _flat(kept), _flat(fresh)
    assert a.keys() == b.keys()
    for key, value in b.items():
        if key.endswith((".spent", ".budget")):
            assert a[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert a[key] == value, key


def _agrees(store: Store) -> None:
    """Every worker's kept record, and each of its managers' share, equals one computed from
    scratch over the store's track rows."""
    workers = {r.order.to for r in store.list_orders(limit=None)} | {"agent:nobody"}
    for worker in workers:
        rows = store.track_rows(worker)
        _same(store.track_record(worker), summarize(worker, rows))
        managers = {r.order.manager for r in store.list_orders(worker=worker, limit=None)}
        for manager in managers | {"human:nobody"}:
            mine = {r.order.id for r in store.list_orders(worker=worker, manager=manager,
                                                          limit=None)}
            _same(store.track_record(worker, manager=manager),
                  summarize(worker, [row for row in rows if row.order_id in mine]))


def _history(desk: Desk, clock: Clock, check: Callable[[], None]) -> None:
    """Every kind of event, on orders from two managers to two workers, ``check`` after each."""
    steps: list[Callable[[], Any]] = []
    ids: dict[str, str] = {}

    def make(name: str, manager: str = MANAGER, **order: Any) -> Callable[[], Any]:
        def run() -> None:
            ids[name] = working(desk, manager=manager, **order).id
        return run

    def act(call: Callable[..., Any], name: str, *args: Any) -> Callable[[], Any]:
        return lambda: call(ids[name], *args)

    def advance(minutes: float) -> Callable[[], Any]:
        return lambda: clock.advance(minutes=minutes)

    steps += [
        make("first"), advance(10),
        act(desk.report, "first", WORKER, report_fields(cost={"usd": 0.1, "tool_calls": 3})),
        act(desk.review, "first", MANAGER, "approve"),
        make("twice", HELPER), advance(3),
        act(desk.report, "twice", WORKER, report_fields(cost={"usd": 0.2, "tool_calls": 5})),
        act(desk.review, "twice", HELPER, "rework", "more"), advance(7),
        act(desk.report, "twice", WORKER, report_fields(cost={"usd": 0.7, "tool_calls": 9})),
        act(desk.review, "twice", HELPER, "rework", "again"),
        act(desk.report, "twice", WORKER, report_fields(cost={"usd": 1.3, "tool_calls": 11})),
        act(desk.review, "twice", HELPER, "approve"),
        make("blocked"),
        act(desk.report, "blocked", WORKER, report_fields("blocked", questions=["which?"])),
        act(desk.answer, "blocked", MANAGER, "this one"),
        act(desk.report, "blocked", WORKER, report_fields("failed")),
        act(desk.cancel, "blocked", MANAGER, "cannot be done"),
        make("cancelled", HELPER), act(desk.cancel, "cancelled", HELPER, "changed my mind"),
        lambda: ids.update(declined=desk.create(order_fields(), MANAGER).id),
        act(desk.decline, "declined", WORKER, "busy"),
        make("parent"),
        lambda: ids.update(child=desk.create(order_fields(
            to=OTHER, parent_id=ids["parent"], tools=["filings/*"], staged=None,
            budget={"usd": 1, "tool_calls": 2}, **{"from": WORKER}), WORKER).id),
        act(desk.accept, "child", OTHER),
        act(desk.report, "parent", WORKER, report_fields("blocked", questions=["go on?"])),
        make("late", deadline="2030-01-01T12:00:00Z"),
        act(desk.report, "late", WORKER, report_fields("blocked", cost={"usd": 4,
                                                                       "tool_calls": 1})),
        advance(60 * 4), desk.expire_overdue,
    ]
    for step in steps:
        step()
        check()


@pytest.mark.spec("BIND-18")
def test_the_kept_record_agrees_with_one_from_scratch_after_every_event(store: Store) -> None:
    """Counts, rework rounds, medians (exactly) and spend sums (up to rounding) agree, for
    the worker and for each manager's share, after every kind of event."""
    clock = Clock()
    desk = Desk(store, clock=clock)
    _history(desk, clock, lambda: _agrees(store))
    record = store.track_record(WORKER)
    assert (record.orders, record.approved_first_time, record.approved_after_rework,
            record.rework_rounds, record.failed, record.cancelled, record.declined,
            record.expired, record.active) == (7, 1, 1, {2: 1}, 1, 1, 1, 1, 1)
    assert record.median_seconds_to_approval == pytest.approx((10 * 60 + 10 * 60) / 2)
    assert store.track_record(WORKER, manager=HELPER).orders == 2
    assert store.track_record(OTHER).active == 1


@pytest.mark.spec("BIND-18")
def test_memory_sqlite_and_postgres_give_identical_records_and_queues(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The same writes give the same records on every backend, to the last bit of each sum,
    and the same question queue (the order ids aside)."""
    seen: list[tuple[Any, ...]] = []
    for kind in ("memory", "sqlite", "postgres"):
        folder = tmp_path / kind
        folder.mkdir()
        store = open_backend(kind, folder, request)
        try:
            clock = Clock()
            desk = Desk(store, clock=clock)
            snapshots: list[Any] = []

            def snap(desk: Desk = desk, out: list[Any] = snapshots) -> None:
                out.append((
                    [desk.track(w).to_json() for w in (WORKER, OTHER)],
                    [desk.track(WORKER, viewer=m).to_json() for m in (MANAGER, HELPER)
                     if desk.store.track_record(WORKER, manager=m).orders],
                    [(q.goal, q.worker, q.answerers, q.attempt, q.questions, q.asked_at,
                      q.blocking) for q in desk.questions().questions],
                ))

            _history(desk, clock, snap)
            seen.append(tuple(snapshots))
        finally:
            store.close()
    assert seen[0] == seen[1] == seen[2]


@pytest.mark.spec("BIND-18", "SEC-8")
def test_a_manager_s_share_reads_no_order(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A manager reading a worker's record (SEC-8) gets its own orders' share from the
    tallies: no order is loaded or listed, and one that issued none is still refused."""
    from awl.documents.errors import Forbidden

    clock = Clock()
    desk = Desk(store, clock=clock)
    mine = working(desk)
    desk.report(mine.id, WORKER, report_fields())
    desk.review(mine.id, MANAGER, "approve")
    working(desk, manager=HELPER)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a track record read an order")

    for name in ("load", "list_orders", "track_rows"):
        monkeypatch.setattr(store, name, refused)
    record = desk.track(WORKER, viewer=MANAGER)
    assert (record.orders, record.approved_first_time, record.active) == (1, 1, 0)
    assert desk.track(WORKER, viewer=HELPER).active == 1
    with pytest.raises(Forbidden):
        desk.track(WORKER, viewer="human:stranger")


def _filled_again(store: Store, reopen: Callable[[], Any], version: int) -> None:
    """A desk with history, taken back to before the tallies and reopened, gets them filled:
    the same records (sums up to rounding) and the same question queue."""
    clock = Clock()
    _history(Desk(store, clock=clock), clock, lambda: None)
    desk = Desk(store, clock=clock)
    desk.report(working(desk).id, WORKER, report_fields("blocked", questions=["still?"]))
    records = {w: store.track_record(w) for w in (WORKER, OTHER)}
    queue = store.blocked_orders()
    assert len(queue) == 2
    store.close()
    with reopen() as again:
        assert again.schema_version() == version
        for worker, record in records.items():
            _same(again.track_record(worker), record)
        _agrees(again)
        assert again.blocked_orders() == queue
        assert again.blocked_orders(MANAGER) == queue


@pytest.mark.spec("BIND-18")
def test_an_older_sqlite_desk_gets_its_tallies_and_queue_filled(tmp_path: Path) -> None:
    """Migration 8 fills the tallies and the question queue from the orders there."""
    from awl.store.sqlite import SCHEMA_VERSION, SQLiteStore
    from tests.awl.test_sqlite import _back_to

    path = tmp_path / "desk.sqlite3"

    def reopen() -> SQLiteStore:
        _back_to(path, 7)  # before migration 8, which makes the tallies and the queue
        return SQLiteStore(path)

    _filled_again(SQLiteStore(path), reopen, SCHEMA_VERSION)


@pytest.mark.spec("BIND-18")
def test_an_older_postgres_desk_gets_its_tallies_and_queue_filled(pg_url: str) -> None:
    """Migration 4 fills the tallies and the question queue from the orders there."""
    import psycopg

    from awl.store.postgres import MIGRATIONS, SCHEMA_VERSION, PostgresStore

    tallies = next(n for n, steps in enumerate(MIGRATIONS, 1) if any(
        isinstance(step, str) and "CREATE TABLE track_tally" in step for step in steps))
    assert tallies == 4

    def reopen() -> PostgresStore:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for statement in (
                    "DROP TABLE web_sessions",  # migration 5's, made again after the tallies
                    "DROP TABLE track_tally", "DROP TABLE track_values",
                    "DROP TABLE question_queue", "DROP INDEX orders_by_worker_state",
                    "DROP INDEX orders_by_manager_state", "DROP INDEX orders_by_parent_state",
                    "DROP INDEX orders_by_pos_state"):
                conn.execute(statement)
            conn.execute("DELETE FROM awl_schema WHERE version >= %s", (tallies,))
        return PostgresStore(pg_url)

    _filled_again(PostgresStore(pg_url), reopen, SCHEMA_VERSION)


@pytest.mark.spec("BIND-18")
@pytest.mark.parametrize("filters", [
    {}, {"state": "working"}, {"state": ["working", "blocked"]}, {"worker": WORKER},
    {"worker": WORKER, "state": "approved"}, {"manager": MANAGER},
    {"manager": MANAGER, "state": "blocked"}, {"parent_id": "wo_x"},
    {"parent_id": "wo_x", "state": "offered"},
])
def test_a_deep_sqlite_page_finds_its_orders_in_an_index(
        filters: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every filter finds a page's positions in a covering index (the plan names no read of
    the orders table itself), and reads documents by position for the page alone."""
    from awl.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "desk.sqlite3")
    try:
        clock = Clock()
        desk = Desk(store, clock=clock)
        for _ in range(3):
            working(desk)
        pages: list[tuple[str, list[Any]]] = []
        real = store._records

        def spy(where: str, params: list[Any], limit: int | None, offset: int) -> Any:
            pages.append((where, params))
            return real(where, params, limit, offset)

        monkeypatch.setattr(store, "_records", spy)
        assert len(store.list_orders(**filters, limit=1, offset=1)) <= 1
        ((where, params),) = pages
        with store._read() as conn:
            plan = [row[-1] for row in conn.execute(
                f"EXPLAIN QUERY PLAN SELECT doc FROM orders {where}", params)]
        reads = [step for step in plan if step.startswith(("SCAN orders", "SEARCH orders"))]
        assert reads[0] == "SEARCH orders USING INTEGER PRIMARY KEY (rowid=?)", plan
        assert reads[1:] and all("COVERING INDEX" in step for step in reads[1:]), plan
    finally:
        store.close()


@pytest.mark.spec("BIND-18")
def test_pages_after_a_cursor_are_the_pages_at_an_offset(store: Store) -> None:
    """Listing ``before`` the last order of a page gives the next page, with any filter, as
    an offset does; a cursor naming no order is NotFound."""
    from awl.documents.errors import NotFound

    desk = Desk(store, clock=Clock())
    for i in range(7):
        view = working(desk, manager=(MANAGER, HELPER)[i % 2])
        if i % 3 == 0:
            desk.cancel(view.id, view.order.manager, "not needed")
    for filters in ({}, {"manager": MANAGER}, {"state": "working"},
                    {"worker": WORKER, "state": ["working", "cancelled"]}):
        by_offset = [[v.id for v in desk.list(**filters, limit=2, offset=n)]
                     for n in range(0, 8, 2)]
        by_cursor: list[list[str]] = []
        page = [v.id for v in desk.list(**filters, limit=2)]
        while page:
            by_cursor.append(page)
            page = [v.id for v in desk.list(**filters, limit=2, before=page[-1])]
        assert by_cursor == [p for p in by_offset if p], filters
    with pytest.raises(NotFound):
        desk.list(before="wo_nosuchorder")


@pytest.mark.spec("BIND-18")
def test_a_party_s_pages_are_its_orders_as_worker_and_as_manager(store: Store) -> None:
    """Listing by ``party`` gives the orders issued by or to that principal, newest first,
    each once, page by page by offset and by cursor, with a state filter or not."""
    desk = Desk(store, clock=Clock())
    for i in range(9):
        fields = [{"to": OTHER}, {}, {"to": WORKER}][i % 3]
        view = desk.create(order_fields(**fields), (MANAGER, HELPER, OTHER)[i % 3])
        if i % 4 == 0:
            desk.cancel(view.id, view.order.manager, "not needed")
    states: tuple[str | None, ...] = (None, "offered")
    for state in states:
        filters = {} if state is None else {"state": state}
        mine = [v.id for v in desk.list(state=state, limit=None)
                if OTHER in (v.order.to, v.order.manager)]
        assert len(mine) == (6 if not filters else 4)
        by_offset = [[v.id for v in desk.list(state=state, party=OTHER, limit=2, offset=n)]
                     for n in range(0, 8, 2)]
        by_cursor: list[list[str]] = []
        page = [v.id for v in desk.list(state=state, party=OTHER, limit=2)]
        while page:
            by_cursor.append(page)
            page = [v.id for v in desk.list(state=state, party=OTHER, limit=2,
                                            before=page[-1])]
        assert [i for p in by_offset for i in p] == mine, filters
        assert by_cursor == [p for p in by_offset if p], filters


@pytest.mark.spec("BIND-18", "BIND-15")
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_copied_desk_keeps_its_tallies_and_queue(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A copy loaded in one transaction (past create_order and append) has its track
    tallies and question queue filled from the orders it holds."""
    from awl.store.copy import copy_store
    from awl.store.memory import MemoryStore

    source = MemoryStore()
    clock = Clock()
    _history(Desk(source, clock=clock), clock, lambda: None)
    target = open_backend(kind, tmp_path, request)
    try:
        copy_store(source, target)
        for worker in (WORKER, OTHER):
            _same(target.track_record(worker), source.track_record(worker))
        _agrees(target)
        assert target.blocked_orders() == source.blocked_orders() != []
    finally:
        target.close()
