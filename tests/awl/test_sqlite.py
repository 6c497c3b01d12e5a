"""What the SQLite store adds to the Store contract: a versioned, durable file."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from awl._errors import AWLError
from awl._models import Event, WorkOrder
from awl._sqlite import SCHEMA_VERSION, SQLiteStore

T0 = "2030-01-01T00:00:00Z"


def _create(store: SQLiteStore, order_id: str) -> None:
    order = WorkOrder.model_validate({
        "spec": "awl/work-order@0.3", "id": order_id, "created_at": T0, "from": "human:m",
        "to": "agent:w", "goal": "g", "criteria": [{"id": "c", "text": "t"}],
        "budget": {"usd": 1}, "deadline": "2030-01-02T00:00:00Z", "tools": ["*"],
    })
    store.create_order(order, Event.model_validate(
        {"seq": 1, "at": T0, "actor": "human:m", "action": "create", "from": None,
         "to": "offered"}))


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


def test_call_records_skip_the_fsync_and_the_connection_goes_back_durable(
        tmp_path: Path) -> None:
    """A call record commits with synchronous=NORMAL; the pooled connection returns to FULL."""
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        _create(store, "o1")
        seen: list[int] = []
        real_write = store._write

        def spy(*, durable: bool = True):  # type: ignore[no-untyped-def]
            cm = real_write(durable=durable)
            conn = cm.__enter__()
            seen.append(conn.execute("PRAGMA synchronous").fetchone()[0])
            return _Entered(cm, conn)

        store._write = spy  # type: ignore[method-assign]
        record = store.reserve_call("o1", attempt=1, tool="s/t", arguments={}, pass_jti=None,
                                    usd=0.0, started_at=T0, scopes=())
        assert not isinstance(record, str)
        store.finish_call("o1", record.ref, outcome="ok", result=None, error=None, ended_at=T0)
        store._write = real_write  # type: ignore[method-assign]
        assert seen == [1, 1]  # 1 is NORMAL
        with store._connection() as conn:
            assert conn.execute("PRAGMA synchronous").fetchone() == (2,)


class _Entered:
    def __init__(self, cm: object, conn: sqlite3.Connection) -> None:
        self.cm, self.conn = cm, conn

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, *exc: object) -> object:
        return self.cm.__exit__(*exc)  # type: ignore[attr-defined]


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """A desk written by a newer version is refused with a clear error, not changed."""
    path = tmp_path / "desk.sqlite3"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO awl_schema (version) VALUES (?)", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
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
        assert len(store._idle) == 1


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
