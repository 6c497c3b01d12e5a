"""Shared helpers for the desk tests: a settable clock, order and report fields, stores."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from awl.desk import Desk, OrderView
from awl.documents.models import CallRecord
from awl.store.memory import MemoryStore
from awl.store.protocol import Reservation, Reserved, Store

MANAGER = "human:ana"
WORKER = "agent:writer"
HELPER = "human:bo"
T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
DEADLINE = "2030-01-02T09:00:00Z"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def open_store(kind: str, folder: Path) -> Store:
    """A fresh store of the given kind (``memory`` or ``sqlite``)."""
    if kind == "memory":
        return MemoryStore()
    from awl.store.sqlite import SQLiteStore

    return SQLiteStore(folder / "desk.sqlite3")


def reserved(result: Reservation) -> CallRecord:
    """The record of a reservation that was made (fails the test on OverBudget)."""
    assert isinstance(result, Reserved), result
    return result.record


def newer_desk(path: Path) -> None:
    """Make ``path`` a SQLite desk whose schema is one version newer than this code's."""
    import sqlite3

    from awl.store.sqlite import SCHEMA_VERSION, SQLiteStore

    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO awl_schema (version) VALUES (?)", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()


def order_fields(**over: Any) -> dict[str, Any]:
    """The fields of a small valid order (the desk fills spec, id, created_at, from)."""
    fields: dict[str, Any] = {
        "to": WORKER,
        "goal": "Summarize the quarterly filings",
        "criteria": [{"id": "c1", "text": "a one-page summary"},
                     {"id": "c2", "text": "every figure cited"}],
        "budget": {"usd": 10, "tool_calls": 40},
        "deadline": DEADLINE,
        "tools": ["filings/*", "mail/send"],
        "staged": ["mail/send"],
    }
    fields.update(over)
    return {k: v for k, v in fields.items() if v is not None}


def report_fields(status: str = "done", **over: Any) -> dict[str, Any]:
    """The fields of a valid report of the given status (the desk fills the rest)."""
    fields: dict[str, Any] = {
        "status": status,
        "result": {"summary": f"report ({status})"},
        "evidence": [{"criterion": "c1", "type": "note", "note": "written"},
                     {"criterion": "c2", "type": "note", "note": "cited"}]
        if status == "done" else [],
        "cost": {"usd": 2.5, "tool_calls": 7},
        "tools_used": ["filings/search"],
    }
    if status == "blocked":
        fields["questions"] = ["Which quarter?"]
    if status == "failed":
        fields["error"] = "the filings site is down"
    fields.update(over)
    return {k: v for k, v in fields.items() if v is not None}


def effect(n: int, **arguments: Any) -> dict[str, Any]:
    """A held mail/send effect with ref number ``n``."""
    return {"ref": f"mail/send#{n}", "tool": "mail/send", "arguments": arguments or {"n": n}}


def working(desk: Desk, manager: str = MANAGER, **order: Any) -> OrderView:
    """A new order from ``manager``, accepted and started."""
    view = desk.create(order_fields(**order), manager)
    desk.accept(view.id, WORKER)
    return desk.start(view.id, WORKER)


def submitted(desk: Desk, **report: Any) -> OrderView:
    """A new order with a submitted done report; the effects it lists (:func:`effect`) are
    held calls the worker made first, numbered as their refs say (RX2, RX3)."""
    view = working(desk)
    effects = report.get("effects") or []
    if effects:
        hold_effects(desk.store, view.id, effects)
        report.setdefault("tools_used", sorted({e["tool"] for e in effects}))
    return desk.report(view.id, WORKER, report_fields(**report))


def hold_effects(store: Store, order_id: str, effects: list[dict[str, Any]]) -> None:
    """Record a held call for each effect, numbered as its ref says (refs 1 to the highest,
    in order: a number no effect names is an ``ok`` call of the same tool)."""
    wanted = {int(e["ref"].rsplit("#", 1)[1]): e for e in effects}
    at = "2026-10-09T09:30:00Z"
    for n in range(1, max(wanted) + 1):
        e = wanted.get(n, effects[0])
        call = reserved(store.reserve_call(
            order_id, attempt=1, tool=e["tool"], arguments=e["arguments"], pass_jti=None,
            usd=0.0, started_at=at, scopes=()))
        assert call.ref == f"{e['tool']}#{n}", call.ref
        if n in wanted:
            store.hold_call(order_id, call.ref, result=None, ended_at=at)
        else:
            store.finish_call(order_id, call.ref, outcome="ok", result=None, error=None,
                              ended_at=at)


STORES = ["memory", "sqlite", "postgres"]
"""The backends a test of every store runs on (the ``store`` fixture in conftest.py)."""


def open_backend(kind: str, path: Path, request: pytest.FixtureRequest) -> Store:
    """A new, empty store of ``kind`` (one of :data:`STORES`): SQLite in ``path``,
    PostgreSQL in the test's own schema."""
    if kind == "memory":
        return MemoryStore()
    if kind == "postgres":
        from awl.store.postgres import PostgresStore

        return PostgresStore(request.getfixturevalue("pg_url"))
    from awl.store.sqlite import SQLiteStore

    return SQLiteStore(path / "desk.sqlite3")


def open_at_once(open_and_close: Callable[[], None]) -> list[BaseException]:
    """Four threads (each a store of its own, as a process would have) open a desk at
    once; what they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_one() -> None:
        barrier.wait()
        try:
            open_and_close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors
