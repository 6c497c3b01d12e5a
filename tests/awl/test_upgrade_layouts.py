"""Desks from development builds whose numbered migrations differed from the released ones.

Some builds on the way to this version shipped a migration under a number that means
something else here: SQLite schema 6 was the webhook tables (7 here), SQLite 8 and
PostgreSQL 3 the track tallies without the question queue, other 8s (PostgreSQL 4s) other
listing indexes. Opened by this code, such a desk must come up with this version's layout
and every record it held, not fail on a table it already has or go on without one.

Each test rebuilds the old layout with SQL from a desk of this version (no old code runs).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from awl.desk import Desk
from awl.store.postgres import SCHEMA_VERSION as PG_VERSION
from awl.store.postgres import PostgresStore
from awl.store.protocol import Store
from awl.store.sqlite import SCHEMA_VERSION, SQLiteStore
from tests.awl.desk_support import WORKER, Clock, report_fields, reserved, working

T0 = "2030-01-01T09:00:00Z"

# SQLite: what the build whose 8 made the track tallies alone had as its own indexes.
_OLD_SQLITE_INDEXES = (
    "CREATE INDEX orders_blocked_by_escalation ON orders (json_extract(doc, '$.escalate_to'),"
    " pos) WHERE state = 'blocked'",
    "CREATE INDEX orders_by_pos ON orders (pos)",
)


def _fill(store: Store) -> dict[str, Any]:
    """Two orders: one working with a held call and an ok call; one blocked (in the
    question queue). What a test compares after the upgrade."""
    desk = Desk(store, clock=Clock())
    one = working(desk).id
    held = reserved(store.reserve_call(one, attempt=1, tool="mail/send", arguments={"n": 1},
                                       pass_jti=None, usd=0.25, started_at=T0, scopes=()))
    store.hold_call(one, held.ref, result=None, ended_at=T0)
    ok = reserved(store.reserve_call(one, attempt=1, tool="filings/get", arguments={},
                                     pass_jti=None, usd=0.5, started_at=T0, scopes=()))
    store.finish_call(one, ok.ref, outcome="ok", result={"n": 1}, error=None, ended_at=T0)
    two = working(desk).id
    desk.report(two, WORKER, report_fields("blocked"))
    return _seen(store, one, two)


def _seen(store: Store, *ids: str) -> dict[str, Any]:
    """Every record of the orders ``ids``, and what the desk derives from them."""
    return {
        "ids": ids,
        "calls": [store.calls(order_id) for order_id in ids],
        "usage": [store.usage(order_id) for order_id in ids],
        "effects": [store.effects(order_id) for order_id in ids],
        "events": [store.events(order_id) for order_id in ids],
        "track": store.track_record(WORKER),
        "queue": [q.order_id for q in store.blocked_orders()],
    }



def _sqlite_back(path: Path, version: int, *undo: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in undo:
        conn.execute(statement)
    conn.execute("DELETE FROM awl_schema WHERE version > ?", (version,))
    conn.close()


def _sqlite_objects(path: Path) -> set[tuple[str, str]]:
    conn = sqlite3.connect(path)
    try:
        return set(conn.execute("SELECT type, name FROM sqlite_master"
                                " WHERE name NOT LIKE 'sqlite_%'").fetchall())
    finally:
        conn.close()


def _versions(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [v for (v,) in conn.execute("SELECT version FROM awl_schema ORDER BY version")]
    finally:
        conn.close()


def test_a_sqlite_desk_whose_6_was_the_webhooks_opens_with_its_held_calls_given_effects(
        tmp_path: Path) -> None:
    """A desk at 6 holding the webhook tables (and so without this version's 6, which gives a
    held call left without an effect its effect) opens: the webhook kept, the effect made."""
    path, fresh = tmp_path / "desk.sqlite3", tmp_path / "fresh.sqlite3"
    SQLiteStore(fresh).close()
    with SQLiteStore(path) as store:
        before = _fill(store)
        ids = before["ids"]
    _sqlite_back(path, 6, "DROP TABLE web_sessions", "DROP TABLE question_queue",
                 "DROP TABLE track_tally", "DROP TABLE track_values",
                 "DROP INDEX orders_by_worker_state", "DROP INDEX orders_by_manager_state",
                 "DROP INDEX orders_by_parent_state", "DROP INDEX orders_by_pos_state",
                 "DELETE FROM effects",  # the hold wrote its effect apart, then crashed
                 "INSERT INTO webhooks (id, doc) VALUES ('wh1', '{}')")
    with SQLiteStore(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert _seen(store, *ids) == before
    assert _versions(path) == list(range(1, SCHEMA_VERSION + 1))
    assert _sqlite_objects(path) == _sqlite_objects(fresh)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT id FROM webhooks").fetchall() == [("wh1",)]
    conn.close()


def test_a_sqlite_desk_whose_8_made_the_tallies_alone_opens_with_the_question_queue(
        tmp_path: Path) -> None:
    """A desk at 8 with the track tallies, no question queue and that build's own indexes
    opens with this version's layout: the queue filled, the tallies as they were."""
    path, fresh = tmp_path / "desk.sqlite3", tmp_path / "fresh.sqlite3"
    SQLiteStore(fresh).close()
    with SQLiteStore(path) as store:
        before = _fill(store)
        ids = before["ids"]
    _sqlite_back(path, 8, "DROP TABLE web_sessions", "DROP TABLE question_queue",
                 "DROP INDEX orders_by_parent_state", "DROP INDEX orders_by_pos_state",
                 *_OLD_SQLITE_INDEXES)
    with SQLiteStore(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert _seen(store, *ids) == before
    assert _versions(path) == list(range(1, SCHEMA_VERSION + 1))
    assert _sqlite_objects(path) == _sqlite_objects(fresh)


def test_a_sqlite_desk_whose_8_made_other_indexes_gets_this_versions(tmp_path: Path) -> None:
    """A desk at 8 with the question queue but without the listing indexes by parent and by
    position (a build's 8 made ``orders_by_pos`` instead) gets them, and loses the other."""
    path, fresh = tmp_path / "desk.sqlite3", tmp_path / "fresh.sqlite3"
    SQLiteStore(fresh).close()
    with SQLiteStore(path) as store:
        before = _fill(store)
        ids = before["ids"]
    _sqlite_back(path, 8, "DROP TABLE web_sessions",
                 "DROP INDEX question_queue_by_key", "DROP INDEX question_queue_by_manager_key",
                 "DROP INDEX question_queue_by_escalation_key", "DROP INDEX question_queue_by_due",
                 "ALTER TABLE question_queue DROP COLUMN rank",
                 "ALTER TABLE question_queue DROP COLUMN asked",
                 "ALTER TABLE question_queue DROP COLUMN due",
                 "CREATE INDEX question_queue_by_manager ON question_queue (manager, pos)",
                 "CREATE INDEX question_queue_by_escalation ON question_queue (escalate_to, pos)",
                 "DROP INDEX orders_by_parent_state", "DROP INDEX orders_by_pos_state",
                 _OLD_SQLITE_INDEXES[1])
    with SQLiteStore(path) as store:
        assert _seen(store, *ids) == before
    assert _sqlite_objects(path) == _sqlite_objects(fresh)


# PostgreSQL ------------------------------------------------------------------------------


def _pg(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _pg_objects(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {name for (name,) in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace"
            " AND relkind IN ('r', 'i')").fetchall()}


def _pg_versions(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [v for (v,) in conn.execute("SELECT version FROM awl_schema ORDER BY version")]


@pytest.fixture
def fresh_objects(pg_url: str) -> set[str]:
    """The tables and indexes of a desk this version makes."""
    PostgresStore(pg_url).close()
    return _pg_objects(pg_url)


def test_a_postgres_desk_whose_3_made_the_tallies_opens_with_webhooks_and_the_queue(
        fresh_pg_url: str, fresh_objects: set[str]) -> None:
    """A desk at 3 with the track tallies (a build's 3, where 3 here is the webhook tables)
    opens with this version's layout, every record as it was."""
    with PostgresStore(fresh_pg_url) as store:
        before = _fill(store)
        ids = before["ids"]
    _pg(fresh_pg_url, "DROP TABLE web_sessions", "DROP TABLE question_queue",
        "DROP TABLE webhooks", "DROP TABLE outbox",
        "DROP INDEX orders_by_parent_state", "DROP INDEX orders_by_pos_state",
        "CREATE INDEX orders_blocked_by_escalation ON orders ((doc->>'escalate_to'), pos)"
        " WHERE state = 'blocked'",
        "DELETE FROM awl_schema WHERE version > 3")
    with PostgresStore(fresh_pg_url) as store:
        assert store.schema_version() == PG_VERSION
        assert _seen(store, *ids) == before
    assert _pg_versions(fresh_pg_url) == list(range(1, PG_VERSION + 1))
    assert _pg_objects(fresh_pg_url) == fresh_objects


def test_a_postgres_desk_whose_4_made_other_indexes_gets_this_versions(
        fresh_pg_url: str, fresh_objects: set[str]) -> None:
    """A desk at 4 without the listing indexes by parent and by position gets them."""
    with PostgresStore(fresh_pg_url) as store:
        before = _fill(store)
        ids = before["ids"]
    _pg(fresh_pg_url, "DROP TABLE web_sessions",
        "DROP INDEX question_queue_by_key", "DROP INDEX question_queue_by_manager_key",
        "DROP INDEX question_queue_by_escalation_key", "DROP INDEX question_queue_by_due",
        "ALTER TABLE question_queue DROP COLUMN rank, DROP COLUMN asked, DROP COLUMN due,"
        ' ALTER COLUMN order_id TYPE TEXT COLLATE "default"',
        "CREATE INDEX question_queue_by_manager ON question_queue (manager, pos)",
        "CREATE INDEX question_queue_by_escalation ON question_queue (escalate_to, pos)",
        "DROP INDEX orders_by_parent_state", "DROP INDEX orders_by_pos_state",
        "DELETE FROM awl_schema WHERE version > 4")
    with PostgresStore(fresh_pg_url) as store:
        assert _seen(store, *ids) == before
    assert _pg_objects(fresh_pg_url) == fresh_objects
