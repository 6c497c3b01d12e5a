"""Desk throughput and read latency on the SQLite store.

``python -m bench.desk [--quick] [--orders N] [--cycles N]``

1. **Cycles**: full create → accept → start → report → approve cycles through
   :class:`awl.Desk` on a fresh SQLite file (every step one fsynced transaction, the order
   and report checked by the numbered rules), in cycles per second.
2. **A large desk**: ``--orders`` orders (default 100,000) spread over 50 workers and 10
   managers, one worker holding a fifth of them. The file is filled with bulk inserts of
   documents the desk itself wrote for a handful of template orders (same shapes, new ids),
   so building it takes seconds rather than the hours single fsynced writes would. Then the
   median latency of: a track record (typical and busiest worker), listing pages (newest,
   by worker, by state, by manager and state), getting one order, and the question queue.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from awl import Desk, Event, MemoryStore, Review, SQLiteStore, WorkOrder, WorkReport

MANAGER = "human:manager"
WORKER = "agent:worker"
T0 = datetime(2030, 1, 1, tzinfo=UTC)
FAR = "2099-01-01T00:00:00Z"
ORDER: dict[str, Any] = {
    "to": WORKER,
    "goal": "Summarize the quarterly filings and mail the CFO.",
    "criteria": [{"id": "c1", "text": "summary written"}, {"id": "c2", "text": "CFO mailed"}],
    "budget": {"usd": 5, "tool_calls": 40},
    "deadline": FAR,
    "tools": ["filings/*", "mail/send"],
    "staged": ["mail/send"],
}
REPORT: dict[str, Any] = {
    "status": "done",
    "result": {"summary": "Summary written; the mail is held for approval."},
    "evidence": [{"criterion": "c1", "type": "artifact", "ref": "file:summary.md"},
                 {"criterion": "c2", "type": "note", "note": "held as mail/send#1"}],
    "cost": {"usd": 1.25, "tool_calls": 12},
    "tools_used": ["filings/search"],
    "effects": [{"ref": "mail/send#1", "tool": "mail/send",
                 "arguments": {"to": "cfo@example.com", "subject": "Q3"}}],
}
# Outcomes of the bulk orders, with their share (out of 20).
MIX = (("approved", 11), ("reworked", 2), ("working", 2), ("blocked", 1), ("cancelled", 2),
       ("declined", 1), ("expired", 1))


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=7)
        return self.now


# --------------------------------------------------------------------------- cycles

def cycles(folder: Path, count: int) -> tuple[float, dict[str, float]]:
    """Run ``count`` full cycles; return cycles per second and the median ms of each step."""
    steps: dict[str, list[float]] = {s: [] for s in ("create", "accept", "start", "report",
                                                     "approve")}
    with SQLiteStore(folder / "cycles.sqlite3") as store:
        desk = Desk(store)

        def timed(name: str, call: Callable[[], Any]) -> Any:
            began = time.perf_counter()
            out = call()
            steps[name].append(time.perf_counter() - began)
            return out

        began = time.perf_counter()
        for _ in range(count):
            order_id = timed("create", lambda: desk.create(ORDER, MANAGER)).id
            timed("accept", lambda: desk.accept(order_id, WORKER))  # noqa: B023 - called now
            timed("start", lambda: desk.start(order_id, WORKER))  # noqa: B023
            timed("report", lambda: desk.report(order_id, WORKER, REPORT))  # noqa: B023
            timed("approve", lambda: desk.review(order_id, MANAGER, "approve"))  # noqa: B023
        elapsed = time.perf_counter() - began
    return count / elapsed, {k: statistics.median(v) * 1000 for k, v in steps.items()}


# --------------------------------------------------------------------------- the large desk

def _dump(model: WorkOrder | WorkReport | Review | Event) -> str:
    return json.dumps(model.to_json(), separators=(",", ":"))


def _templates() -> dict[str, tuple[Any, list[str], list[str], list[str]]]:
    """For each outcome: (state, events, reports, reviews) as JSON text the desk wrote."""
    store = MemoryStore()
    desk = Desk(store, clock=_Clock())
    out = {}
    for kind, _share in MIX:
        view = desk.create(ORDER, MANAGER)
        oid = view.id
        if kind == "declined":
            desk.decline(oid, WORKER, "busy")
        elif kind == "cancelled":
            desk.cancel(oid, MANAGER, "no longer needed")
        else:
            desk.accept(oid, WORKER)
            desk.start(oid, WORKER)
            if kind == "blocked":
                blocked = {k: v for k, v in REPORT.items() if k != "effects"}
                desk.report(oid, WORKER, {**blocked, "status": "blocked",
                                          "questions": ["Which quarter?"]})
            elif kind == "expired":
                desk.report(oid, WORKER, {**REPORT, "cost": {"usd": 9, "tool_calls": 3}})
            elif kind in ("approved", "reworked"):
                if kind == "reworked":
                    desk.report(oid, WORKER, REPORT)
                    desk.review(oid, MANAGER, "rework", "cite the pages")
                desk.report(oid, WORKER, REPORT)
                desk.review(oid, MANAGER, "approve")
        record = store.load(oid)
        out[kind] = (
            (record.state, oid, _dump(record.order)),
            [_dump(e) for e in store.events(oid)],
            [_dump(r) for r in record.reports],
            [_dump(r) for r in record.reviews],
        )
    return out


def _worker(i: int) -> str:
    # One busy worker takes a fifth of the orders; 49 others share the rest.
    return "agent:busy" if i % 5 == 0 else f"agent:w{i % 49:02d}"


def build(path: Path, orders: int) -> float:
    """Fill a desk file with ``orders`` orders by bulk inserts; return the seconds it took."""
    began = time.perf_counter()
    SQLiteStore(path).close()  # creates the schema
    templates = _templates()
    kinds = [kind for kind, share in MIX for _ in range(share)]
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")  # a benchmark fixture, rebuilt on every run
    conn.execute("BEGIN")
    rows: dict[str, list[tuple[Any, ...]]] = {"orders": [], "events": [], "reports": [],
                                              "reviews": []}
    for i in range(orders):
        (state, tid, order_doc), events, reports, reviews = templates[kinds[i % len(kinds)]]
        oid = f"wo_bench{i:07d}"
        worker, manager = _worker(i), f"human:m{i % 10}"

        def swap(doc: str, tid: str = tid, oid: str = oid, worker: str = worker,
                 manager: str = manager) -> str:
            return (doc.replace(tid, oid).replace(WORKER, worker)
                    .replace(MANAGER, manager))

        created = (T0 + timedelta(seconds=i)).isoformat().replace("+00:00", "Z")
        rows["orders"].append((oid, swap(order_doc), state, len(events), worker, manager,
                               None, created, created))
        rows["events"] += [(oid, n, swap(e)) for n, e in enumerate(events, start=1)]
        rows["reports"] += [(oid, n, swap(r)) for n, r in enumerate(reports)]
        rows["reviews"] += [(oid, n, swap(r)) for n, r in enumerate(reviews)]
        if len(rows["events"]) > 50_000:
            _flush(conn, rows)
    _flush(conn, rows)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return time.perf_counter() - began


def _flush(conn: sqlite3.Connection, rows: dict[str, list[tuple[Any, ...]]]) -> None:
    conn.executemany("INSERT INTO orders (id, doc, state, seq, worker, manager, parent_id,"
                     " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     rows["orders"])
    for table in ("events",):
        conn.executemany(f"INSERT INTO {table} (order_id, seq, doc) VALUES (?, ?, ?)",
                         rows[table])
    for table in ("reports", "reviews"):
        conn.executemany(f"INSERT INTO {table} (order_id, idx, doc) VALUES (?, ?, ?)",
                         rows[table])
    for batch in rows.values():
        batch.clear()


def median_ms(call: Callable[[], Any], rounds: int) -> float:
    """The median wall time of ``call`` over ``rounds`` runs, in milliseconds."""
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


@contextmanager
def _folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="awl-bench-desk-") as name:
        yield Path(name)


def main(argv: list[str] | None = None) -> int:
    """Print the desk benchmark table."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10,000 orders and 50 cycles")
    parser.add_argument("--orders", type=int, help="orders on the large desk (default 100000)")
    parser.add_argument("--cycles", type=int, help="full cycles to time (default 200)")
    args = parser.parse_args(argv)
    orders = args.orders or (10_000 if args.quick else 100_000)
    count = args.cycles or (50 if args.quick else 200)
    rounds = 5 if args.quick else 9

    rows: list[tuple[str, str]] = []
    with _folder() as folder:
        per_second, steps = cycles(folder, count)
        rows.append((f"create→accept→start→report→approve ({count} cycles)",
                     f"{per_second:.1f} cycles/s"))
        rows += [(f"  {name} (median)", f"{ms:.2f} ms") for name, ms in steps.items()]

        path = folder / "large.sqlite3"
        seconds = build(path, orders)
        rows.append((f"build a desk of {orders:,} orders (bulk insert)", f"{seconds:.1f} s"))
        with SQLiteStore(path) as store:
            desk = Desk(store)
            busy = desk.track("agent:busy").orders
            typical = desk.track("agent:w07").orders
            blocked = len(desk.questions())
            reads: list[tuple[str, Callable[[], object], int]] = [
                (f"track record, typical worker ({typical:,} orders)",
                 lambda: desk.track("agent:w07"), rounds),
                (f"track record, busiest worker ({busy:,} orders)",
                 lambda: desk.track("agent:busy"), max(3, rounds // 3)),
                ("list newest 50", lambda: desk.list(limit=50), rounds),
                ("list 50 by worker", lambda: desk.list(worker="agent:w07", limit=50), rounds),
                ("list 50 by state (working)", lambda: desk.list(state="working", limit=50),
                 rounds),
                ("list 50 by manager and state",
                 lambda: desk.list(manager="human:m3", state="approved", limit=50), rounds),
                (f"list 50 at offset {orders // 2:,} (deep page)",
                 lambda: desk.list(limit=50, offset=orders // 2), rounds),
                ("get one order", lambda: desk.get("wo_bench0000123"), rounds),
                (f"question queue of one manager ({blocked:,} blocked in all)",
                 lambda: desk.questions("human:m3"), 3),
            ]
            for name, call, times in reads:
                rows.append((name, f"{median_ms(call, times):.2f} ms"))
    width = max(len(name) for name, _ in rows)
    print(f"{'measure'.ljust(width)}  value")
    print(f"{'-' * width}  {'-' * 16}")
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
