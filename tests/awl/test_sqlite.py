"""What the SQLite store adds to the Store contract: a versioned, durable file."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from awl.documents.errors import AWLError
from awl.documents.models import CallRecord, Event, WorkOrder
from awl.store.memory import MemoryStore
from awl.store.protocol import OverBudget, Reserved, Scope, Store
from awl.store.sqlite import IDLE_KEPT, MIGRATIONS, SCHEMA_VERSION, SQLiteStore
from tests.awl.desk_support import newer_desk, reserved

T0 = "2030-01-01T00:00:00Z"


def _create(store: Store, order_id: str) -> None:
    order = WorkOrder.model_validate({
        "spec": "awl/work-order@0.3", "id": order_id, "created_at": T0, "from": "human:m",
        "to": "agent:w", "goal": "g", "criteria": [{"id": "c", "text": "t"}],
        "budget": {"usd": 1}, "deadline": "2030-01-02T00:00:00Z", "tools": ["*"],
    })
    store.create_order(order, Event.model_validate(
        {"seq": 1, "at": T0, "actor": "human:m", "action": "create", "from": None,
         "to": "offered"}))


@pytest.mark.slow
def test_a_reopened_desk_keeps_everything(tmp_path: Path) -> None:
    """Orders written before close are there after reopening, and the schema is not redone."""
    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as store:
        _create(store, "o1")
        assert store.schema_version() == SCHEMA_VERSION
    with SQLiteStore(path) as store:
        assert store.load("o1").order.id == "o1"
        assert store.schema_version() == SCHEMA_VERSION
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM awl_schema").fetchone() == (SCHEMA_VERSION,)
    conn.close()


def test_connections_are_wal_and_fully_synchronous(tmp_path: Path) -> None:
    """Every connection commits durably: WAL journal with synchronous=FULL."""
    with SQLiteStore(tmp_path / "desk.sqlite3") as store, store._connection() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # 2 is FULL


_WEB_SESSIONS = next(n for n, steps in enumerate(MIGRATIONS, 1) if any(
    isinstance(step, str) and "CREATE TABLE web_sessions" in step for step in steps))
"""The migration that makes the table of the approval page's sessions."""


def _back_to(path: Path, version: int, *undo: str) -> None:
    """Make the desk file look as an older version left it: run ``undo`` and forget the
    migrations after ``version``."""
    conn = sqlite3.connect(path, isolation_level=None)
    if version < _WEB_SESSIONS:  # the approval page's sessions, which that migration makes
        undo = (*undo, "DROP TABLE web_sessions")
    if version < 8:  # the track tallies and the indexes migration 8 makes again
        undo = (*undo, "DROP TABLE track_tally", "DROP TABLE track_values",
                "DROP TABLE question_queue", *(f"DROP INDEX {name}" for name in (
                    "orders_by_worker_state", "orders_by_manager_state", "orders_by_parent_state",
                    "orders_by_pos_state")))
    if version < 7:  # the webhook tables, which migration 7 makes again
        undo = (*undo, "DROP TABLE webhooks", "DROP TABLE outbox")
    for statement in undo:
        conn.execute(statement)
    conn.execute("DELETE FROM awl_schema WHERE version > ?", (version,))
    conn.close()


@contextmanager
def _synchronous_of_each_connection(store: SQLiteStore) -> Iterator[list[int]]:
    """The ``synchronous`` setting of every connection the store takes meanwhile."""
    seen: list[int] = []
    real_take = store._take

    def spy(durable: bool) -> sqlite3.Connection:
        conn = real_take(durable)
        seen.append(conn.execute("PRAGMA synchronous").fetchone()[0])
        return conn

    store._take = spy  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        store._take = real_take  # type: ignore[method-assign]


def test_call_records_skip_the_fsync_and_other_writes_stay_durable(
        tmp_path: Path) -> None:
    """A call record commits with synchronous=NORMAL; the durable pool stays FULL."""
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        _create(store, "o1")
        with _synchronous_of_each_connection(store) as seen:
            record = reserved(store.reserve_call("o1", attempt=1, tool="s/t", arguments={},
                                        pass_jti=None, usd=0.0, started_at=T0, scopes=()))
            store.finish_call("o1", record.ref, outcome="ok", result=None, error=None,
                              ended_at=T0)
        assert seen == [1, 1]  # 1 is NORMAL
        with store._connection() as conn:
            assert conn.execute("PRAGMA synchronous").fetchone() == (2,)


@pytest.mark.spec("CM-14")
def test_a_hold_is_one_durable_write(tmp_path: Path) -> None:
    """hold_call writes the outcome and the effect in one transaction on a FULL connection."""
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        _create(store, "o1")
        record = reserved(store.reserve_call("o1", attempt=1, tool="s/t", arguments={},
                                             pass_jti=None, usd=0.0, started_at=T0, scopes=()))
        with _synchronous_of_each_connection(store) as seen:
            store.hold_call("o1", record.ref, result=None, ended_at=T0)
        assert seen == [2]  # one connection, FULL


@pytest.mark.spec("CM-14")
def test_a_schema_5_desk_gets_an_effect_for_every_held_call(tmp_path: Path) -> None:
    """Opening a desk from before holds were one write gives each held call left without
    an effect (a crash between the two writes) the effect the hold makes now (migration
    6); effects already there, and calls that were not held, are left as they are."""
    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as store:
        _create(store, "o1")
        refs = []
        for n in range(3):
            made = reserved(store.reserve_call("o1", attempt=1 + n % 2, tool="s/t", arguments={},
                                      pass_jti=None, usd=0.0, started_at=T0, scopes=()))
            refs.append(made.ref)
        lost = store.hold_call("o1", refs[0], result={"content": []},
                               ended_at="2030-01-01T00:00:07Z")
        store.hold_call("o1", refs[1], result=None, ended_at=T0)
        going = store.set_effect("o1", refs[1], expect=["held"], state="dispatching",
                                 count_dispatch=True, at=T0)
        store.finish_call("o1", refs[2], outcome="ok", result=None, error=None, ended_at=T0)
    _back_to(path, 5, "DELETE FROM effects WHERE n = 1")
    with SQLiteStore(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert store.effects("o1") == [lost, going]
        assert [c.outcome for c in store.calls("o1")] == ["held", "held", "ok"]


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """A desk written by a newer version is refused with a clear error, not changed."""
    path = tmp_path / "desk.sqlite3"
    newer_desk(path)
    with pytest.raises(AWLError, match="newer"):
        SQLiteStore(path)


def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    """Using a store after close is an error rather than a silent reopen."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    store.close()
    with pytest.raises(AWLError, match="closed"):
        store.list_orders()


def test_threads_share_a_bounded_pool(tmp_path: Path) -> None:
    """Many short-lived threads reuse pooled connections instead of opening one each."""
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        _create(store, "o1")
        for _ in range(20):
            thread = threading.Thread(target=store.load, args=("o1",))
            thread.start()
            thread.join()
        assert len(store._idle_fast) == 1  # reads use the call-record pool


def test_a_burst_of_concurrent_threads_leaves_a_bounded_pool(tmp_path: Path) -> None:
    """40 threads reading at once (a server's whole thread pool) open a connection each;
    once the burst is over the pool keeps IDLE_KEPT of them, the rest closed."""
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        _create(store, "o1")
        inside = threading.Barrier(40)
        real_read = store._read

        @contextmanager
        def together() -> Iterator[sqlite3.Connection]:
            with real_read() as conn:
                inside.wait(timeout=30)  # every thread holds its connection at once
                yield conn

        store._read = together  # type: ignore[method-assign]
        threads = [threading.Thread(target=store.load, args=("o1",)) for _ in range(40)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not inside.broken
        assert len(store._idle_fast) == IDLE_KEPT


def test_listing_uses_an_index_for_every_filter(tmp_path: Path) -> None:
    """Each listing filter is answered from an index, never a full scan of the orders."""
    with SQLiteStore(tmp_path / "desk.sqlite3") as store, store._connection() as conn:
        for column in ("state", "worker", "manager", "parent_id"):
            plan = " ".join(
                str(row[-1]) for row in conn.execute(
                    f"EXPLAIN QUERY PLAN SELECT id FROM orders WHERE {column} = ?"
                    " ORDER BY pos DESC LIMIT 10", ("x",))
            )
            assert f"orders_by_{column.split('_')[0]}" in plan, plan
            assert "TEMP B-TREE" not in plan, plan


def _stored_v2_call(conn: sqlite3.Connection, n: int, *, jti: str | None, counted: bool,
                    usd: float, at: str, epoch: float) -> None:
    doc = CallRecord.model_validate({
        "ref": f"s/t#{n}", "order_id": "o1", "attempt": 1, "tool": "s/t", "arguments": {},
        "outcome": "ok" if counted else "refused", "started_at": at, "ended_at": at,
        **({} if jti is None else {"pass_jti": jti}),
    }).model_dump_json(exclude_unset=True)
    conn.execute(
        "INSERT INTO calls (order_id, n, pass_jti, attempt, counted, usd, started, doc)"
        " VALUES ('o1', ?, ?, 1, ?, ?, ?, ?)", (n, jti, int(counted), usd, epoch, doc))


def test_a_schema_2_desk_gets_its_call_totals_backfilled(tmp_path: Path) -> None:
    """Opening a desk written before the running totals fills them from its call records
    (migration 3), then moves the order's onto its call rows (migration 4)."""
    path = tmp_path / "desk.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE awl_schema (version INTEGER NOT NULL)")
    for number, statements in enumerate(MIGRATIONS[:2], start=1):
        for statement in statements:
            assert isinstance(statement, str)
            conn.execute(statement)
        conn.execute("INSERT INTO awl_schema (version) VALUES (?)", (number,))
    conn.execute(
        "INSERT INTO orders (id, doc, state, seq, worker, manager, created_at, updated_at)"
        " VALUES ('o1', '{}', 'working', 3, 'agent:w', 'human:m', ?, ?)", (T0, T0))
    # 23:30+00:00 (the pass's first call, a refusal) is earlier than T0 though it sorts
    # later as text; p1's 00:00+01:00 ties with T0's moment and loses to the lower N.
    _stored_v2_call(conn, 1, jti=None, counted=True, usd=0.5, at=T0, epoch=1893456000.0)
    _stored_v2_call(conn, 2, jti="p1", counted=True, usd=0.25,
                    at="2030-01-01T01:00:00+01:00", epoch=1893456000.0)
    _stored_v2_call(conn, 3, jti="p2", counted=False, usd=0.0,
                    at="2029-12-31T23:30:00+00:00", epoch=1893454200.0)
    _stored_v2_call(conn, 4, jti="p1", counted=True, usd=0.125, at=T0, epoch=1893456000.0)
    conn.close()
    with SQLiteStore(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        with store._connection() as conn:
            rows = conn.execute(
                "SELECT n, total_calls, total_usd FROM calls ORDER BY n").fetchall()
            assert rows == [(1, 1, 0.5), (2, 2, 0.75), (3, 2, 0.75), (4, 3, 0.875)]
            assert conn.execute("SELECT started, n, at FROM first_calls").fetchall() == [
                (1893454200.0, 3, "2029-12-31T23:30:00+00:00")]
        total = store.usage("o1")
        assert (total.tool_calls, total.usd, total.first_call_at) == (
            3, 0.875, "2029-12-31T23:30:00+00:00")
        p1 = store.usage("o1", frozenset({"p1"}))
        assert (p1.tool_calls, p1.usd, p1.first_call_at) == (
            2, 0.375, "2030-01-01T01:00:00+01:00")
        p2 = store.usage("o1", frozenset({"p2"}))
        assert (p2.tool_calls, p2.usd, p2.first_call_at) == (0, 0.0, "2029-12-31T23:30:00+00:00")
        refused = store.reserve_call("o1", attempt=1, tool="s/t", arguments={}, pass_jti="p1",
                                     usd=0.0, started_at=T0,
                                     scopes=[Scope(jtis=frozenset({"p1"}), max_calls=2)])
        assert refused == OverBudget("order")
        made = store.reserve_call("o1", attempt=1, tool="s/t", arguments={}, pass_jti="p1",
                                  usd=0.0, started_at=T0, scopes=[Scope(None, max_calls=4)])
        assert isinstance(made, Reserved) and made.record.ref == "s/t#5"


def test_running_totals_agree_with_the_memory_store(tmp_path: Path) -> None:
    """After a seeded run of reservations, refusals and outcomes, usage agrees in every scope."""
    rng = random.Random(5)
    pass_jtis = ["p1", "p2", "p3"]
    jtis: list[str | None] = [None, *pass_jtis]
    times = ["2030-01-01T00:00:00Z", "2030-01-01T01:00:00+01:00", "2029-12-31T23:00:00Z",
             "2030-01-01T00:00:00.5Z", "2030-01-01T00:30:00+00:30"]
    with SQLiteStore(tmp_path / "desk.sqlite3") as sqlite_store:
        stores: list[Store] = [MemoryStore(), sqlite_store]
        for store in stores:
            _create(store, "o1")
        pending: list[str] = []
        for _ in range(120):
            jti, at = rng.choice(jtis), rng.choice(times)
            usd = rng.choice([0.0, 0.1, 0.25, 0.3])
            scopes = [Scope(None, max_calls=rng.randrange(30, 90), max_usd=9.0, name="order"),
                      Scope(frozenset(j for j in pass_jtis if rng.random() < 0.5),
                            max_calls=rng.randrange(5, 30), name="pass")]
            step = rng.random()
            got: list[Any] = []
            for store in stores:
                if step < 0.6:
                    made: Any = store.reserve_call(
                        "o1", attempt=1, tool="s/t", arguments={"i": len(pending)},
                        pass_jti=jti, usd=usd, started_at=at, scopes=scopes)
                    got.append(made.scope if isinstance(made, OverBudget) else made.record.ref)
                elif step < 0.8 or not pending:
                    got.append(store.record_call({
                        "order_id": "o1", "attempt": 1, "tool": "s/t", "arguments": {},
                        "pass_jti": jti, "outcome": "refused", "error": "no",
                        "started_at": at, "ended_at": at}).ref)
                else:
                    store.finish_call("o1", pending[-1], outcome="ok", result={"k": [1]},
                                      error=None, ended_at=at)
                    got.append(next(c.to_json() for c in store.calls("o1")
                                    if c.ref == pending[-1]))
            assert got[0] == got[1]
            if step >= 0.8 and pending:
                pending.pop()
            elif step < 0.6 and "#" in got[0]:
                pending.append(got[0])
        assert stores[0].calls("o1") == stores[1].calls("o1")
        for size in range(len(jtis)):
            for subset in {frozenset(rng.sample(pass_jtis, min(size, 3))) for _ in range(4)}:
                memory, sqlite = (s.usage("o1", subset) for s in stores)
                assert memory.tool_calls == sqlite.tool_calls
                assert memory.first_call_at == sqlite.first_call_at
                assert memory.usd == pytest.approx(sqlite.usd, abs=1e-12)
        assert stores[0].usage("o1") == stores[1].usage("o1")


@pytest.mark.spec("LC-15")
def test_a_schema_4_desk_gets_its_sub_orders_charges_backfilled(tmp_path: Path) -> None:
    """Opening a desk written before sub-orders' calls were charged up the chain fills the
    charges from its call records (migration 5): each order's usage, first call included,
    is what live charging gives, and the next reservation is checked against it."""
    from awl.desk import Desk

    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as store:
        desk = Desk(store, clock=lambda: datetime(2029, 12, 31, 9, tzinfo=UTC))
        fields = {"goal": "g", "criteria": [{"id": "c", "text": "t"}], "tools": ["s/*"],
                  "deadline": "2030-06-01T00:00:00Z"}
        root = desk.create({**fields, "to": "agent:a", "budget": {"tool_calls": 5}}, "human:m")
        child = desk.create({**fields, "to": "agent:b", "parent_id": root.id,
                             "budget": {"tool_calls": 5}}, "agent:a")
        deep = desk.create({**fields, "to": "agent:c", "parent_id": child.id,
                            "budget": {"tool_calls": 5}}, "agent:b")
        for order_id, usd, at in ((deep.id, 0.5, T0), (child.id, 0.25, T0),
                                  (deep.id, 0.125, "2029-12-31T23:00:00Z")):
            store.reserve_call(order_id, attempt=1, tool="s/t", arguments={}, pass_jti=None,
                               usd=usd, started_at=at, scopes=[])
        store.record_call({"order_id": deep.id, "attempt": 1, "tool": "s/t", "arguments": {},
                           "outcome": "refused", "error": "x",
                           "started_at": "2029-12-31T22:00:00Z",
                           "ended_at": "2029-12-31T22:00:00Z"})
        live = {o: store.usage(o) for o in (root.id, child.id, deep.id)}
    assert (live[root.id].tool_calls, live[root.id].usd) == (3, 0.875)
    assert live[root.id].first_call_at == "2029-12-31T22:00:00Z"
    _back_to(path, 4, "DROP TABLE suborder_totals")
    with SQLiteStore(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert {o: store.usage(o) for o in live} == live
        # 3 charged so far: the root's and the child's budgets (5 each) take 2 more.
        for expected in ("s/t#4", "s/t#5", f"order {child.id}"):
            made = store.reserve_call(deep.id, attempt=1, tool="s/t", arguments={},
                                      pass_jti=None, usd=0.0, started_at=T0, scopes=[])
            assert (made.scope if isinstance(made, OverBudget) else made.record.ref) == expected
        assert store.usage(root.id).tool_calls == 5



def _wal_frames(path: Path) -> int:
    """How many frames the log file holds, from its size (a 32-byte header, then frames of
    a 24-byte header and a page); reading it checkpoints nothing."""
    wal = path.with_name(path.name + "-wal")
    size = wal.stat().st_size if wal.exists() else 0
    return max(size - 32, 0) // (4096 + 24)


def _unsaved_pages(path: Path) -> int:
    """Pages of the database that are only in the log so far (no checkpoint copied them)."""
    conn = sqlite3.connect(path)
    try:
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        return pages - path.stat().st_size // 4096
    finally:
        conn.close()


@pytest.mark.spec("GW-18")
def test_with_a_background_checkpointer_no_commit_checkpoints(tmp_path: Path) -> None:
    """SQLite checkpoints inside the commit that finds the log past 1000 pages, and the log
    then starts over; a store with ``checkpoint_every`` leaves it growing for its thread."""
    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path, checkpoint_every=3600) as store:
        made = 0
        while _wal_frames(path) <= 1200:
            _create(store, f"o{made}")
            made += 1
        assert _unsaved_pages(path) > 0
        frames, copied = store.checkpoint()
        assert frames == copied > 1200
        assert _unsaved_pages(path) == 0
    other = tmp_path / "auto.sqlite3"
    with SQLiteStore(other) as store:  # the default: commits checkpoint
        for i in range(made):
            _create(store, f"o{i}")
    assert _wal_frames(other) < 1100


@pytest.mark.spec("GW-18")
def test_the_background_checkpointer_runs_and_a_held_reader_delays_no_write(
        tmp_path: Path) -> None:
    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path, checkpoint_every=0.05) as store:
        _create(store, "o0")
        reader = sqlite3.connect(path)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM orders").fetchone()  # holds its snapshot
        try:
            start = time.monotonic()
            for i in range(1, 40):
                _create(store, f"o{i}")
            assert time.monotonic() - start < 20  # no write waited on the held reader
            time.sleep(0.3)  # checkpoints ran meanwhile, and could not copy past the reader
            assert _unsaved_pages(path) > 0
        finally:
            reader.rollback()
            reader.close()
        deadline = time.monotonic() + 10
        while _unsaved_pages(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _unsaved_pages(path) == 0  # the thread copied the log once it could
        assert [t.name for t in threading.enumerate()].count("awl-sqlite-checkpoint") == 1
    assert "awl-sqlite-checkpoint" not in [t.name for t in threading.enumerate()]


def _reserve(store: SQLiteStore, order_id: str, arguments: dict[str, Any],
             jti: str | None = None) -> CallRecord:
    return reserved(store.reserve_call(
        order_id, attempt=1, tool="srv/tool", arguments=arguments, pass_jti=jti, usd=0.0,
        started_at="2030-01-01T00:00:01.000Z",
        scopes=[Scope(None, max_calls=None, max_usd=None, name="order")]))


def test_a_call_ended_by_the_store_that_reserved_it_reads_as_one_ended_by_another(
        tmp_path: Path) -> None:
    """The store that reserved a call writes its ending as a new text; another store (no
    text kept) sets it with SQLite's JSON functions: the records read the same, down to the
    stored JSON. Arguments that spell the record's own keys change nothing."""
    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as mine, SQLiteStore(path) as other:
        _create(mine, "o1")
        tricky = {"a": 1, "outcome": "pending", "s": ',"outcome":"pending"}', "ended_at": "x"}
        endings: list[dict[str, Any]] = [
            {"outcome": "ok", "result": {"content": [], "isError": False}, "error": None},
            {"outcome": "error", "result": None, "error": "AWL_UPSTREAM_ERROR: it broke"},
            {"outcome": "error", "result": {"x": [1, "é"]}, "error": "lost"},
        ]
        for ending in endings:
            for jti in (None, "pass-1"):
                a = _reserve(mine, "o1", tricky, jti)
                b = _reserve(mine, "o1", tricky, jti)
                mine._reserved_docs.pop(("o1", b.ref))  # as if another process reserved it
                mine.finish_call("o1", a.ref, ended_at="2030-01-01T00:00:02.500Z", **ending)
                other.finish_call("o1", b.ref, ended_at="2030-01-01T00:00:02.500Z", **ending)
                by_ref = {c.ref: c for c in mine.calls("o1")}
                ended_a, ended_b = by_ref[a.ref], by_ref[b.ref]
                assert ended_a.outcome == ending["outcome"]
                assert ended_a.model_copy(update={"ref": b.ref}) == ended_b
                docs = dict(sqlite3.connect(path).execute(
                    "SELECT n, doc FROM calls WHERE order_id = 'o1'").fetchall())
                doc_a, doc_b = (json.loads(docs[int(r.ref.rpartition("#")[2])])
                                for r in (a, b))
                assert {**doc_a, "ref": b.ref} == doc_b


def test_a_call_ended_elsewhere_is_not_ended_again_by_the_store_that_reserved_it(
        tmp_path: Path) -> None:
    """The text a store kept of its reservation is written only in place of that same text:
    a call another store ended meanwhile keeps that outcome, and ending it again is refused
    as on any store."""
    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as mine, SQLiteStore(path) as other:
        _create(mine, "o1")
        call = _reserve(mine, "o1", {"q": 1})
        other.finish_call("o1", call.ref, outcome="error", result=None,
                          error="the gateway died", ended_at="2030-01-01T00:00:03.000Z")
        with pytest.raises(AWLError, match="already has outcome 'error'"):
            mine.finish_call("o1", call.ref, outcome="ok", result={"late": True}, error=None,
                             ended_at="2030-01-01T00:00:04.000Z")
        (stored,) = other.calls("o1")
        assert (stored.outcome, stored.result, stored.error) == ("error", None,
                                                                "the gateway died")


def test_a_result_that_is_not_json_leaves_the_call_pending_to_be_ended_again(
        tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        _create(store, "o1")
        call = _reserve(store, "o1", {})
        with pytest.raises(AWLError, match="a call's result must be JSON data"):
            store.finish_call("o1", call.ref, outcome="ok", result={"x": float("nan")},
                              error=None, ended_at="2030-01-01T00:00:02.000Z")
        assert store.calls("o1")[0].outcome == "pending"
        store.finish_call("o1", call.ref, outcome="ok", result={"x": 1}, error=None,
                          ended_at="2030-01-01T00:00:02.000Z")
        assert store.calls("o1")[0].result == {"x": 1}


def test_calls_beyond_the_reservations_a_store_keeps_still_end(tmp_path: Path) -> None:
    """A store keeps the text of its newest reservations only; an older call ends the
    general way, with the same record."""
    from awl.store.sqlite import _KEPT_RESERVATIONS

    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        _create(store, "o1")
        calls = [_reserve(store, "o1", {"i": i}) for i in range(_KEPT_RESERVATIONS + 2)]
        assert len(store._reserved_docs) == _KEPT_RESERVATIONS
        assert ("o1", calls[0].ref) not in store._reserved_docs
        for call in (calls[0], calls[-1]):
            store.finish_call("o1", call.ref, outcome="ok", result={"n": call.ref}, error=None,
                              ended_at="2030-01-01T00:00:02.000Z")
        by_ref = {c.ref: c for c in store.calls("o1")}
        assert by_ref[calls[0].ref].result == {"n": calls[0].ref}
        assert by_ref[calls[-1].ref].result == {"n": calls[-1].ref}


# The next call of an order reserved in one statement (SQLiteStore._reserve_next) --------


def _order_scope(max_calls: int | None = None, max_usd: float | None = None) -> list[Scope]:
    return [Scope(None, max_calls=max_calls, max_usd=max_usd, name="order")]


def _next(store: SQLiteStore, order_id: str, *, usd: float = 0.0, at: str = T0,
          scopes: list[Scope] | None = None, seq: int | None = None) -> str:
    """Reserve a call without a pass: its ref, or the scope it would exceed."""
    made = store.reserve_call(order_id, attempt=1, tool="s/t", arguments={"usd": usd},
                              pass_jti=None, usd=usd, started_at=at,
                              scopes=_order_scope() if scopes is None else scopes, seq=seq)
    return made.scope if isinstance(made, OverBudget) else made.record.ref


def _counting_one_statement(store: SQLiteStore) -> list[int]:
    """A list that grows by one for each call ``store`` reserves in one statement."""
    taken: list[int] = []
    one_statement = store._reserve_next

    def counted(*args: Any, **kwargs: Any) -> Any:
        made = one_statement(*args, **kwargs)
        if made is not None:
            taken.append(1)
        return made

    store._reserve_next = counted  # type: ignore[method-assign]
    return taken


def test_the_next_call_reserved_in_one_statement_is_stored_as_the_general_way_stores_it(
        tmp_path: Path) -> None:
    """A seeded run of calls, refusals and outcomes on one store that reserves a call after
    its own in one statement and on one made to take the general way each time: the same
    rows, down to the running totals, the same records and usage, budgets refused at the
    same call (an earlier first call included)."""
    rng = random.Random(11)
    times = ["2030-01-01T00:00:00Z", "2030-01-01T00:00:01.250Z", "2029-12-31T23:59:00Z",
             "2030-01-01T00:00:00.5Z", "2029-12-31T12:00:00+01:00"]
    fast, general = (SQLiteStore(tmp_path / f"{name}.sqlite3") for name in ("fast", "general"))
    with fast, general:
        for store in (fast, general):
            _create(store, "o1")
        taken = _counting_one_statement(fast)
        scopes = _order_scope(max_calls=60, max_usd=4.0)
        pending: list[str] = []
        for _ in range(150):
            at, usd, step = rng.choice(times), rng.choice([0.0, 0.1, 0.25, 0.3]), rng.random()
            got: list[Any] = []
            for store in (fast, general):
                store._kept_totals.clear() if store is general else None
                if step < 0.7:
                    got.append(_next(store, "o1", usd=usd, at=at, scopes=scopes))
                elif step < 0.85 or not pending:
                    got.append(store.record_call({
                        "order_id": "o1", "attempt": 1, "tool": "s/t", "arguments": {},
                        "outcome": "refused", "error": "no", "started_at": at,
                        "ended_at": at}).ref)
                else:
                    store.finish_call("o1", pending[-1], outcome="ok", result={"k": 1},
                                      error=None, ended_at=at)
                    got.append(pending[-1])
            assert got[0] == got[1]
            if step < 0.7 and "#" in got[0]:
                pending.append(got[0])
            elif step >= 0.85 and pending:
                pending.pop()
        assert len(taken) > 40  # most calls took the one statement
        assert "order" in [_next(fast, "o1", scopes=_order_scope(max_calls=1))]
        assert fast.calls("o1") == general.calls("o1")
        assert fast.usage("o1") == general.usage("o1")
        rows = [sqlite3.connect(store.path).execute(
            "SELECT n, pass_jti, attempt, counted, usd, started, doc, total_calls, total_usd"
            " FROM calls ORDER BY n").fetchall() for store in (fast, general)]
        assert rows[0] == rows[1]
        firsts = [sqlite3.connect(store.path).execute("SELECT * FROM first_calls").fetchall()
                  for store in (fast, general)]
        assert firsts[0] == firsts[1]


def test_a_call_another_store_numbered_meanwhile_is_counted_by_the_next(
        tmp_path: Path) -> None:
    """The store's kept totals are out of date once another store numbered a call of the
    order: its next call takes the next number after that one, and the budget counts both."""
    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as mine, SQLiteStore(path) as other:
        _create(mine, "o1")
        taken = _counting_one_statement(mine)
        scopes = _order_scope(max_calls=4)
        assert [_next(mine, "o1", scopes=scopes), _next(mine, "o1", scopes=scopes)] == [
            "s/t#1", "s/t#2"]
        assert _next(other, "o1", scopes=scopes) == "s/t#3"
        other.record_call({"order_id": "o1", "attempt": 1, "tool": "s/t", "arguments": {},
                           "outcome": "refused", "error": "no", "started_at": T0,
                           "ended_at": T0})
        assert _next(mine, "o1", scopes=scopes) == "s/t#5"
        assert _next(mine, "o1", scopes=scopes) == "order"
        assert mine.usage("o1").tool_calls == 4
        assert len(taken) == 1  # the second call; the fifth found #3 and #4 taken


@pytest.mark.spec("LC-15")
def test_a_sub_orders_charge_meanwhile_counts_against_the_next_call(tmp_path: Path) -> None:
    """What a sub-order spends is charged to its parent without a call of the parent's
    own: the parent's next call, reserved after this store's own, still sees it."""
    from awl.desk import Desk

    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as mine, SQLiteStore(path) as other:
        desk = Desk(mine, clock=lambda: datetime(2029, 12, 31, 9, tzinfo=UTC))
        fields = {"goal": "g", "criteria": [{"id": "c", "text": "t"}], "tools": ["s/*"],
                  "deadline": "2030-06-01T00:00:00Z"}
        root = desk.create({**fields, "to": "agent:a", "budget": {"tool_calls": 3,
                                                                  "usd": 1.0}}, "human:m")
        child = desk.create({**fields, "to": "agent:b", "parent_id": root.id,
                             "budget": {"tool_calls": 3, "usd": 1.0}}, "agent:a")
        scopes = _order_scope(max_calls=3, max_usd=1.0)
        assert _next(mine, root.id, usd=0.25, scopes=scopes) == "s/t#1"
        assert _next(mine, root.id, usd=0.25, scopes=scopes) == "s/t#2"
        assert _next(other, child.id, usd=0.5, scopes=[]) == "s/t#1"  # charged to the root
        assert _next(mine, root.id, usd=0.25, scopes=scopes) == "order"  # 1.25 usd > 1.0
        assert _next(mine, root.id, scopes=scopes) == "order"  # 4 calls > 3
        assert (mine.usage(root.id).tool_calls, mine.usage(root.id).usd) == (3, 1.0)


def test_a_call_on_an_order_changed_meanwhile_is_refused_as_stale(tmp_path: Path) -> None:
    """A reservation made on the order as read at one seq is not written once its log has
    moved on, after this store's own call as after any other."""
    from awl.desk import Desk
    from awl.documents.errors import Conflict

    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as mine, SQLiteStore(path) as other:
        desk = Desk(mine)
        order = desk.create({"to": "agent:w", "goal": "g", "tools": ["s/*"],
                             "criteria": [{"id": "c", "text": "t"}], "budget": {"tool_calls": 9},
                             "deadline": "2099-01-01T00:00:00Z"}, "human:m")
        desk.accept(order.id, "agent:w")
        seq = desk.start(order.id, "agent:w").seq
        assert [_next(mine, order.id, seq=seq), _next(mine, order.id, seq=seq)] == [
            "s/t#1", "s/t#2"]
        Desk(other).cancel(order.id, "human:m", "stop")
        with pytest.raises(Conflict, match=f"is at seq {seq + 1}, not {seq}"):
            _next(mine, order.id, seq=seq)
        assert [c.ref for c in mine.calls(order.id)] == ["s/t#1", "s/t#2"]


def test_orders_beyond_those_a_store_keeps_totals_of_reserve_the_general_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store keeps the totals of the orders it numbered a call of most recently, up to a
    bound: the others' next calls take the general way and are numbered just as well."""
    import awl.store.sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "_KEPT_RESERVATIONS", 3)
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        orders = [f"o{i}" for i in range(5)]
        for order_id in orders:
            _create(store, order_id)
            assert _next(store, order_id) == "s/t#1"
        assert list(store._kept_totals) == orders[2:]
        taken = _counting_one_statement(store)
        newest_first = orders[::-1]  # those kept, then the two others
        assert [_next(store, order_id) for order_id in newest_first] == ["s/t#2"] * 5
        assert len(taken) == 3
        assert all(store.usage(order_id).tool_calls == 2 for order_id in orders)


def test_calls_with_a_pass_or_in_a_pass_scope_are_counted_as_the_general_way_counts_them(
        tmp_path: Path) -> None:
    """The kept totals are the order's, not a pass's: a call made under a pass is stored with
    it, and a scope counting a pass's calls counts only those, after calls reserved in one
    statement as after any."""
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        _create(store, "o1")
        taken = _counting_one_statement(store)
        roomy = Scope(frozenset({"j1"}), max_calls=10, name="pass")
        assert [_next(store, "o1"), _next(store, "o1", scopes=[roomy])] == ["s/t#1", "s/t#2"]
        made = store.reserve_call("o1", attempt=1, tool="s/t", arguments={}, pass_jti="j1",
                                  usd=0.0, started_at=T0, scopes=[roomy])
        assert isinstance(made, Reserved) and made.record.pass_jti == "j1"
        one = Scope(frozenset({"j1"}), max_calls=1, name="pass")
        assert _next(store, "o1", scopes=[one]) == "pass"  # j1's call, and only it
        two = Scope(frozenset({"j1"}), max_calls=2, name="pass")
        assert _next(store, "o1", scopes=[two]) == "s/t#4"  # 3 of the order's, 1 of j1's
        assert [c.pass_jti for c in store.calls("o1")] == [None, None, "j1", None]
        assert len(taken) == 1  # the second call: the roomy scope has room on any count


def test_threads_sharing_a_store_reserve_exactly_past_the_kept_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four threads reserve and refuse calls of twelve orders on one store that keeps the
    totals of four: every order's calls are numbered densely, and its budget admits exactly
    as many calls as it allows."""
    import awl.store.sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "_KEPT_RESERVATIONS", 4)
    orders = [f"o{i}" for i in range(12)]
    limit = 18
    made: list[tuple[str, str]] = []
    failures: list[BaseException] = []
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        for order_id in orders:
            _create(store, order_id)

        def work(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(70):
                    order_id = rng.choice(orders)
                    if rng.random() < 0.2:
                        store.record_call({
                            "order_id": order_id, "attempt": 1, "tool": "s/t",
                            "arguments": {}, "outcome": "refused", "error": "no",
                            "started_at": T0, "ended_at": T0})
                        made.append((order_id, "refused"))
                    else:
                        made.append((order_id, _next(
                            store, order_id, scopes=_order_scope(max_calls=limit))))
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        for order_id in orders:
            mine = [got for o, got in made if o == order_id]
            admitted = [got for got in mine if "#" in got]
            refused = mine.count("order")
            assert refused == 0 or len(admitted) == limit
            assert store.usage(order_id).tool_calls == len(admitted)
            refs = [c.ref for c in store.calls(order_id)]
            assert refs == [f"s/t#{n}" for n in range(1, len(mine) - refused + 1)]
            assert set(admitted) <= set(refs)


def test_dropping_the_oldest_kept_entry_survives_another_thread_changing_the_cache() -> None:
    """The bound of a store's caches is kept without a lock: an entry another thread dropped
    first, or a cache another thread emptied, is no error."""
    from awl.store.sqlite import _drop_oldest

    class Raced(dict[str, int]):
        def __iter__(self) -> Iterator[str]:
            yield "gone"  # what this thread saw as the oldest, dropped meanwhile

    cache = {"a": 1, "b": 2}
    _drop_oldest(cache)
    assert cache == {"b": 2}
    empty: dict[str, int] = {}
    _drop_oldest(empty)
    raced = Raced(b=2)
    _drop_oldest(raced)
    assert dict(raced) == {"b": 2}
