"""The SQLite store: the embedded default, one file shared safely by several processes.

The file is in WAL mode, so readers never wait for the writer, with ``synchronous=FULL``, so
a committed write (an effect marked ``dispatching`` above all) is on disk before the call
returns: that fsync is what makes committing effects at most once survive a power cut.
Call records are the one exception (see ``_write``): they skip the fsync, survive any process
crash, and reach the disk with the next durable commit.
Every write is one ``BEGIN IMMEDIATE`` transaction: it takes the write lock before reading
what it checks (the seq, an effect's state, a lock's holder, the calls counted so far), so
the check and the write can never be split by another process. Reads that touch several
tables run in one read transaction and so see one snapshot.

A gateway writes two call records per forwarded call, so that path is kept short: a
reservation reads running totals rather than summing every call so far. Each call row
carries its order's counted calls and usd through that call, so the newest row has the
order's totals and a reservation writes one page (its own row); each pass's totals and each
order's first call have small tables of their own (the latter changes only when a call
starts earlier than every call before it).

Connections come from two small pools (durable, and ``synchronous=NORMAL`` for call records
and reads) rather than one per thread: a thread may use any idle connection, and a pool
never grows past the number of calls running at once (worker threads that come and go
leave nothing behind).

Documents are kept as JSON text exactly as their models dump them; the columns beside them
exist only to filter, order and check.

The statements this store shares with PostgreSQL's (orders' logs, effects, passes, tokens,
webhooks and the outbox) live in :class:`awl.store.sql.SQLStore`, spelled for SQLite by
:data:`DIALECT`; this module keeps its connections, migrations, the call path, listings and
the commit lock.

By default SQLite checkpoints the write-ahead log itself, inside whichever commit finds the
log long (copying pages into the desk file and syncing it: tens of milliseconds added to one
unlucky write). With ``checkpoint_every`` (the gateway sets it, STO-14) this store's
connections never do: a background thread of its own runs a passive checkpoint that often,
which waits for no reader or writer and makes none wait, so no call pays for one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import astuple, dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from awl.documents.errors import AWLError, Conflict, StoreUnavailable
from awl.documents.lifecycle import ACTIVE
from awl.documents.models import CallRecord
from awl.store.files import OpenMark, create_private, make_private
from awl.store.protocol import (
    DeskOrder,
    LockInfo,
    OrderRecord,
    OverBudget,
    Reservation,
    Reserved,
    Scope,
    TrackRow,
    Usage,
)
from awl.store.queue import KEY_INDEXES, KEY_SQL, keyed
from awl.store.rules import (
    MAX_CHAIN,
    call_number,
    check_ending,
    check_restored_ref,
    check_takeover,
    dump_json,
    ended_doc,
    exceeded_above,
    exceeded_scope,
    json_text,
    lock_doc,
    may_take,
    new_call,
    order_not_found,
    outcome_conflict,
    read_call,
    read_lock,
    read_track_row,
    record_order_id,
    stale_order,
    state_names,
    stored_call,
    timestamp,
)
from awl.store.sql import QUEUE_COLUMNS, Connection, Dialect, SQLStore
from awl.store.tally import adding_sql, filled, value_sql, write_sql

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

# What the question queue keeps of the blocked orders `o` (`latest`: the JSON array
# [attempt, questions] of the latest report).
_QUEUED = """
    SELECT o.pos, o.id, json_extract(o.doc, '$.goal'), o.worker, o.manager,
        json_extract(o.doc, '$.escalate_to'), json_extract(o.doc, '$.deadline'), o.seq,
        o.updated_at,
        (SELECT json_array(json_extract(r.doc, '$.attempt'), json_extract(r.doc, '$.questions'))
            FROM reports r WHERE r.order_id = o.id ORDER BY r.idx DESC LIMIT 1),
        (SELECT COUNT(*) FROM reviews v WHERE v.order_id = o.id
            AND json_extract(v.doc, '$.decision') = 'rework')
    FROM orders o WHERE o.state = 'blocked'"""

# Each entry moves the schema up one version; entries are never edited once released, a
# change is a new entry. Statements run one by one inside the migrating transaction
# (executescript would commit on its own); a function is a step that needs Python.
MIGRATIONS: tuple[tuple[str | Callable[[sqlite3.Connection], None], ...], ...] = (
    (
        """CREATE TABLE orders (
            pos INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            doc TEXT NOT NULL,
            state TEXT NOT NULL,
            seq INTEGER NOT NULL,
            worker TEXT NOT NULL,
            manager TEXT NOT NULL,
            parent_id TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        # Every listing filter with the newest-first order, so a filtered page on a large
        # desk reads only the rows it returns.
        "CREATE INDEX orders_by_state ON orders (state, pos)",
        "CREATE INDEX orders_by_worker ON orders (worker, pos)",
        "CREATE INDEX orders_by_manager ON orders (manager, pos)",
        "CREATE INDEX orders_by_parent ON orders (parent_id, pos)",
        """CREATE TABLE events (
            order_id TEXT NOT NULL REFERENCES orders (id),
            seq INTEGER NOT NULL,
            doc TEXT NOT NULL,
            PRIMARY KEY (order_id, seq)
        ) WITHOUT ROWID""",
        """CREATE TABLE reports (
            order_id TEXT NOT NULL REFERENCES orders (id),
            idx INTEGER NOT NULL,
            doc TEXT NOT NULL,
            PRIMARY KEY (order_id, idx)
        ) WITHOUT ROWID""",
        """CREATE TABLE reviews (
            order_id TEXT NOT NULL REFERENCES orders (id),
            idx INTEGER NOT NULL,
            doc TEXT NOT NULL,
            PRIMARY KEY (order_id, idx)
        ) WITHOUT ROWID""",
        """CREATE TABLE calls (
            order_id TEXT NOT NULL REFERENCES orders (id),
            n INTEGER NOT NULL,
            pass_jti TEXT,
            attempt INTEGER NOT NULL,
            counted INTEGER NOT NULL,
            usd REAL NOT NULL,
            started REAL NOT NULL,
            doc TEXT NOT NULL,
            PRIMARY KEY (order_id, n)
        ) WITHOUT ROWID""",
        """CREATE TABLE effects (
            order_id TEXT NOT NULL REFERENCES orders (id),
            n INTEGER NOT NULL,
            doc TEXT NOT NULL,
            PRIMARY KEY (order_id, n)
        ) WITHOUT ROWID""",
        """CREATE TABLE locks (
            name TEXT PRIMARY KEY,
            doc TEXT NOT NULL
        )""",
        """CREATE TABLE revocations (
            jti TEXT PRIMARY KEY,
            reason TEXT NOT NULL,
            at TEXT NOT NULL
        )""",
        """CREATE TABLE tokens (
            token_hash TEXT PRIMARY KEY,
            principal TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
    ),
    (
        # Passes issued per order, so an order's end can revoke them all.
        """CREATE TABLE passes (
            pos INTEGER PRIMARY KEY AUTOINCREMENT,
            jti TEXT NOT NULL UNIQUE,
            order_id TEXT NOT NULL,
            doc TEXT NOT NULL
        )""",
        "CREATE INDEX passes_by_order ON passes (order_id, pos)",
    ),
    (
        # Running totals of each order's calls, and of its calls under each pass, updated in
        # the transaction that writes each call record: a reservation reads one row instead
        # of summing every call so far. `first_*` is the earliest call by (started, n),
        # counted or not; `last_n` the highest N (the order's totals only).
        """CREATE TABLE call_totals (
            order_id TEXT PRIMARY KEY REFERENCES orders (id),
            last_n INTEGER NOT NULL,
            calls INTEGER NOT NULL,
            usd REAL NOT NULL,
            first_started REAL NOT NULL,
            first_n INTEGER NOT NULL,
            first_at TEXT NOT NULL
        ) WITHOUT ROWID""",
        """CREATE TABLE pass_call_totals (
            order_id TEXT NOT NULL REFERENCES orders (id),
            jti TEXT NOT NULL,
            calls INTEGER NOT NULL,
            usd REAL NOT NULL,
            first_started REAL NOT NULL,
            first_n INTEGER NOT NULL,
            first_at TEXT NOT NULL,
            PRIMARY KEY (order_id, jti)
        ) WITHOUT ROWID""",
        # The calls already recorded. The usd sums run in N order, as the running totals do.
        """INSERT INTO call_totals
            (order_id, last_n, calls, usd, first_started, first_n, first_at)
        SELECT t.order_id, t.last_n, t.calls, t.usd, f.started, f.n,
            json_extract(f.doc, '$.started_at')
        FROM (SELECT order_id, MAX(n) AS last_n, SUM(counted) AS calls,
                TOTAL(usd * counted) AS usd
            FROM calls GROUP BY order_id) AS t
        JOIN calls AS f ON f.order_id = t.order_id AND f.n = (
            SELECT n FROM calls WHERE order_id = t.order_id ORDER BY started, n LIMIT 1)""",
        """INSERT INTO pass_call_totals
            (order_id, jti, calls, usd, first_started, first_n, first_at)
        SELECT t.order_id, t.jti, t.calls, t.usd, f.started, f.n,
            json_extract(f.doc, '$.started_at')
        FROM (SELECT order_id, pass_jti AS jti, SUM(counted) AS calls,
                TOTAL(usd * counted) AS usd
            FROM calls WHERE pass_jti IS NOT NULL GROUP BY order_id, pass_jti) AS t
        JOIN calls AS f ON f.order_id = t.order_id AND f.n = (
            SELECT n FROM calls WHERE order_id = t.order_id AND pass_jti = t.jti
            ORDER BY started, n LIMIT 1)""",
    ),
    (
        # The order's running totals move onto its call rows: each row carries the order's
        # counted calls and usd through itself (the newest row has the order's totals), so a
        # reservation writes its own row and no totals row beside it. The first call, which
        # rarely changes, keeps a table of its own; pass totals stay as they are.
        "ALTER TABLE calls ADD COLUMN total_calls INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE calls ADD COLUMN total_usd REAL NOT NULL DEFAULT 0",
        # Summed in N order, as reservations add them.
        """UPDATE calls SET total_calls = r.total_calls, total_usd = r.total_usd
        FROM (SELECT order_id, n, SUM(counted) OVER w AS total_calls,
                TOTAL(usd * counted) OVER w AS total_usd
            FROM calls
            WINDOW w AS (PARTITION BY order_id ORDER BY n ROWS UNBOUNDED PRECEDING)) AS r
        WHERE calls.order_id = r.order_id AND calls.n = r.n""",
        """CREATE TABLE first_calls (
            order_id TEXT PRIMARY KEY REFERENCES orders (id),
            started REAL NOT NULL,
            n INTEGER NOT NULL,
            at TEXT NOT NULL
        ) WITHOUT ROWID""",
        """INSERT INTO first_calls (order_id, started, n, at)
        SELECT order_id, first_started, first_n, first_at FROM call_totals""",
        "DROP TABLE call_totals",
    ),
    (
        # What each order's sub-orders, at any depth, have spent: charged to its budget
        # (LC-15). A reservation under a sub-order adds its call to the row of every order
        # above it, in the same transaction; `first_*` is their earliest call, counted or
        # not, which starts the order's seconds. Rows exist only for orders with sub-orders
        # that made calls.
        """CREATE TABLE suborder_totals (
            order_id TEXT PRIMARY KEY REFERENCES orders (id),
            calls INTEGER NOT NULL,
            usd REAL NOT NULL,
            first_started REAL NOT NULL,
            first_at TEXT NOT NULL
        ) WITHOUT ROWID""",
        # The calls sub-orders already made. Each (sub-order, order above it) pair is taken
        # once, whatever path led to it (a damaged store's cycle cannot count twice).
        """INSERT INTO suborder_totals (order_id, calls, usd, first_started, first_at)
        WITH RECURSIVE up (below, above, depth) AS (
            SELECT id, parent_id, 1 FROM orders WHERE parent_id IS NOT NULL
            UNION
            SELECT up.below, o.parent_id, up.depth + 1 FROM up JOIN orders AS o
                ON o.id = up.above WHERE o.parent_id IS NOT NULL AND up.depth < 64
        ), pairs AS (SELECT DISTINCT below, above FROM up WHERE below != above)
        SELECT pairs.above, SUM(c.counted), TOTAL(c.usd * c.counted), MIN(c.started),
            json_extract(c.doc, '$.started_at')
        FROM pairs JOIN calls AS c ON c.order_id = pairs.below
        WHERE pairs.above IN (SELECT id FROM orders)
        GROUP BY pairs.above""",
    ),
    (
        # A hold used to write the call's outcome and its effect in two transactions, and
        # readers took a held call without an effect as held. Now both are written together
        # (hold_call, CM-14): a call left held without one (a crash between the two writes)
        # gets the effect the second write would have made.
        """INSERT INTO effects (order_id, n, doc)
        SELECT c.order_id, c.n, json_object('order_id', c.order_id,
            'ref', json_extract(c.doc, '$.ref'), 'attempt', c.attempt, 'state', 'held',
            'result', NULL, 'error', NULL, 'settlement', NULL, 'dispatches', 0,
            'updated_at', json_extract(c.doc, '$.ended_at'))
        FROM calls AS c
        WHERE json_extract(c.doc, '$.outcome') = 'held' AND NOT EXISTS (
            SELECT 1 FROM effects AS e WHERE e.order_id = c.order_id AND e.n = c.n)""",
    ),
    (
        # Webhook subscriptions, and the outbox: one row per notification, written in the
        # transaction of the event or effect write that causes it (HOOK-3). `next_at` is
        # when a pending one is next due, in seconds since the epoch.
        """CREATE TABLE webhooks (
            pos INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            doc TEXT NOT NULL
        )""",
        """CREATE TABLE outbox (
            pos INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            webhook_id TEXT NOT NULL,
            order_id TEXT NOT NULL,
            state TEXT NOT NULL,
            next_at REAL NOT NULL,
            doc TEXT NOT NULL
        )""",
        "CREATE INDEX outbox_due ON outbox (state, next_at)",
        "CREATE INDEX outbox_by_order ON outbox (order_id, pos)",
    ),
    (
        # Track records as running tallies, per worker (manager '') and per worker and
        # manager, written in the transaction of every write that changes them; the values
        # medians are read from, in value order (see awl.store.tally).
        """CREATE TABLE track_tally (
            worker TEXT NOT NULL,
            manager TEXT NOT NULL,
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            orders INTEGER NOT NULL,
            spent REAL NOT NULL,
            budget REAL NOT NULL,
            PRIMARY KEY (worker, manager, kind, key)
        ) WITHOUT ROWID""",
        """CREATE TABLE track_values (
            order_id TEXT NOT NULL REFERENCES orders (id),
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            worker TEXT NOT NULL,
            manager TEXT NOT NULL,
            value REAL NOT NULL,
            PRIMARY KEY (order_id, kind, key)
        ) WITHOUT ROWID""",
        "CREATE INDEX track_values_by_worker ON track_values (worker, kind, key, value)",
        "CREATE INDEX track_values_by_manager"
        " ON track_values (worker, manager, kind, key, value)",
        # The question queue: what it shows of each blocked order, written in the
        # transaction of each event that blocks or unblocks it.
        """CREATE TABLE question_queue (
            pos INTEGER PRIMARY KEY,
            order_id TEXT NOT NULL UNIQUE REFERENCES orders (id),
            goal TEXT NOT NULL,
            worker TEXT NOT NULL,
            manager TEXT NOT NULL,
            escalate_to TEXT,
            deadline TEXT NOT NULL,
            seq INTEGER NOT NULL,
            asked_at TEXT NOT NULL,
            latest TEXT,
            reworks INTEGER NOT NULL
        )""",
        "CREATE INDEX question_queue_by_manager ON question_queue (manager, pos)",
        "CREATE INDEX question_queue_by_escalation ON question_queue (escalate_to, pos)",
        # Listing by worker, manager or parent and state, and a deep page or one of several
        # states: a page's positions are found in a narrow index before any document is read.
        "CREATE INDEX orders_by_worker_state ON orders (worker, state, pos)",
        "CREATE INDEX orders_by_manager_state ON orders (manager, state, pos)",
        "CREATE INDEX orders_by_parent_state ON orders (parent_id, state, pos)",
        "CREATE INDEX orders_by_pos_state ON orders (pos, state)",
        # The orders already there (the question queue too).
        lambda conn: fill_derived(conn),
    ),
    (
        # The approval page's sessions (BIND-9), by the hash of their id: never the id.
        # `expires_at` is in seconds since the epoch.
        """CREATE TABLE web_sessions (
            id_hash TEXT PRIMARY KEY,
            principal TEXT NOT NULL,
            csrf TEXT NOT NULL,
            expires_at REAL NOT NULL,
            token_hash TEXT
        )""",
        "CREATE INDEX web_sessions_by_expiry ON web_sessions (expires_at)",
    ),
    (
        # The question queue in its order, a page at a time (BIND-20): each question's key
        # (`rank`, minus its weight, then `asked`, then the order id) and its deadline as
        # text that sorts as time (awl.store.queue), kept by every write that changes
        # them; the questions already there keyed here. The indexes by position go: no
        # read orders the queue by creation any more.
        "ALTER TABLE question_queue ADD COLUMN rank INTEGER NOT NULL DEFAULT -1",
        "ALTER TABLE question_queue ADD COLUMN asked TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE question_queue ADD COLUMN due TEXT NOT NULL DEFAULT ''",
        lambda conn: fill_queue(conn),
        *KEY_INDEXES,
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)

IDLE_KEPT = 8
"""Idle connections each pool keeps for the next transaction. A burst of concurrent
requests (a server runs each store call on a thread of its own, up to 40) opens one
connection per thread; past this many, those given back are closed, so a server that
once served a burst does not hold two descriptors and a page cache per thread for good."""
"""The schema version this code writes; a desk file is migrated up to it when opened."""

DIALECT = Dialect(param="?", no_limit=-1, effect_state="json_extract(doc, '$.state')")
"""SQLite's spelling of the shared statements: documents are JSON text, and no row is locked
(every write holds the file's one write lock from ``BEGIN IMMEDIATE``)."""

_where = DIALECT.where


def _jti_filter(jtis: frozenset[str]) -> tuple[str, list[str]]:
    if not jtis:
        return " AND 0", []
    return f" AND jti IN ({','.join('?' * len(jtis))})", sorted(jtis)


def _code(exc: sqlite3.Error) -> int:
    """SQLite's primary result code of ``exc`` (-1 for an error of Python's module)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return -1 if code is None else int(code) & 0xFF


_DAMAGED = ("it is damaged: stop every process using it, keep a copy of the file (with its "
            "-wal file), and restore the desk from a backup (`sqlite3 FILE 'PRAGMA "
            "integrity_check'` shows the damage)")
_READ_ONLY = ("this process may not write it: make the file, its -wal and -shm files and "
              "its folder writable by this user (or open a writable copy)")

# What to do when SQLite fails a read or write of an open desk, by result code (see
# SQLiteStore._failure), each said with "nothing was written" where that is so.
_ADVICE: dict[int, str] = {
    sqlite3.SQLITE_READONLY: f"{_READ_ONLY}; nothing was written",
    sqlite3.SQLITE_PERM: f"{_READ_ONLY}; nothing was written",
    sqlite3.SQLITE_CANTOPEN: ("the file or its folder is gone or out of reach: check that "
                              "both exist and that this user may write them; nothing was "
                              "written"),
    sqlite3.SQLITE_FULL: "the disk holding it is full: free space and retry; nothing was written",
    sqlite3.SQLITE_IOERR: ("the disk refused a read or write (full, over a size limit, or "
                           "failing): fix that and retry; a write that failed as it committed "
                           "may have been written, so read before you retry it"),
    sqlite3.SQLITE_CORRUPT: f"{_DAMAGED}; nothing was written",
    sqlite3.SQLITE_NOTADB: f"{_DAMAGED}; nothing was written",
}

# What to do when a desk cannot be opened, by result code (see SQLiteStore.__init__).
_OPEN_DEFAULT = ("check that its folder exists, that you may write there, and that the file "
                 "is a desk")
_OPEN_ADVICE: dict[int, str] = {
    sqlite3.SQLITE_BUSY: ("another process held it locked for the whole wait (a long "
                          "write, or a tool holding the file): retry when it is done"),
    sqlite3.SQLITE_LOCKED: ("another process held it locked for the whole wait (a long "
                            "write, or a tool holding the file): retry when it is done"),
    sqlite3.SQLITE_READONLY: _READ_ONLY,
    sqlite3.SQLITE_NOTADB: "the file is not a SQLite database, so not a desk: check the path",
    sqlite3.SQLITE_CORRUPT: _DAMAGED,
    sqlite3.SQLITE_FULL: "the disk holding it is full: free space and retry",
}


def _schema_version(conn: sqlite3.Connection) -> int | None:
    """The desk's schema version, read without a write lock; None for a new file."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'"
                    " AND name = 'awl_schema'").fetchone() is None:
        return None
    row = conn.execute("SELECT MAX(version) FROM awl_schema").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _settle_early_layouts(conn: sqlite3.Connection) -> None:
    """Bring a desk from a development build whose numbered migration differed from the
    released one to the layout its number has here, so that the migrations after it apply.
    Run in the migrating transaction, before them; a desk of any other layout is left as
    it is.

    - Schema 6 with the webhook tables: a build numbered them 6 (they are 7 here) and had
      no 6 (held calls given their effect). That 6 runs now, and the desk is 7.
    - Schema 8 (or 9) without the question queue, or without the listing indexes by parent
      and by position: builds whose 8 made the tallies alone, or other indexes. What 8
      makes here and the desk lacks is made now, the tallies and the queue filled again
      (the tallies from the same orders), and those builds' own indexes, which nothing reads
      any more, dropped.
    """
    version = _schema_version(conn)
    if version is None:
        return
    tables = {name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version == 6 and "webhooks" in tables:
        for step in MIGRATIONS[5]:
            conn.execute(cast(str, step))
        conn.execute("INSERT INTO awl_schema (version) VALUES (7)")
    elif version in (8, 9):
        indexes = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index'")}
        if ("question_queue" in tables and "orders_by_parent_state" in indexes
                and "orders_by_pos_state" in indexes):
            return
        conn.execute("DROP INDEX IF EXISTS orders_blocked_by_escalation")
        conn.execute("DROP INDEX IF EXISTS orders_by_pos")
        SQLiteStore._missing_only(conn, MIGRATIONS[7], lambda name: conn.execute(
            "SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None)


# What a track row is made of (read_track_row's fields), picked from the documents of
# the orders `o`.
_TRACK_FIELDS = """o.id, o.state, json_extract(o.doc, '$.budget'),
    (SELECT json_array(json_extract(r.doc, '$.cost'), json_extract(r.doc, '$.status'))
        FROM reports r WHERE r.order_id = o.id ORDER BY r.idx DESC LIMIT 1),
    (SELECT COUNT(*) FROM reviews v WHERE v.order_id = o.id
        AND json_extract(v.doc, '$.decision') = 'rework'),
    (SELECT json_extract(e.doc, '$.at') FROM events e WHERE e.order_id = o.id
        AND e.seq = 2 AND json_extract(e.doc, '$.action') = 'accept'),
    (SELECT json_extract(v.doc, '$.at') FROM reviews v WHERE v.order_id = o.id
        AND json_extract(v.doc, '$.decision') = 'approve' ORDER BY v.idx DESC LIMIT 1)"""

# The active orders below each of the orders in the JSON array ?1, reached through orders
# in the states of the JSON array ?3 only, each counted once (a damaged store's cycle ends
# at depth ?2). Each step looks children up by the parent index, which the planner would
# pass over on a desk where most orders have no parent.
_ACTIVE_BELOW = """
    WITH RECURSIVE below (root, id, depth) AS (
        SELECT j.value, c.id, 1 FROM json_each(?1) AS j
            CROSS JOIN orders AS c INDEXED BY orders_by_parent ON c.parent_id = j.value
            WHERE c.state IN (SELECT value FROM json_each(?3))
        UNION
        SELECT b.root, c.id, b.depth + 1 FROM below AS b
            CROSS JOIN orders AS c INDEXED BY orders_by_parent ON c.parent_id = b.id
            WHERE c.state IN (SELECT value FROM json_each(?3)) AND b.depth < ?2
    )
    SELECT root, COUNT(DISTINCT id) FROM below WHERE id != root GROUP BY root"""


def fill_derived(conn: sqlite3.Connection) -> None:
    """Fill the track tallies and the question queue afresh from the orders stored (the
    tallies oldest first): a migration step, and what a benchmark that bulk-inserts orders
    runs after (:func:`awl.store.tally.filled`
    does the arithmetic, as the memory store's)."""
    rows, values = filled((worker, manager, read_track_row(*fields)) for worker, manager, *fields
                          in conn.execute(f"SELECT o.worker, o.manager, {_TRACK_FIELDS}"
                                          " FROM orders o ORDER BY o.pos"))
    conn.execute("DELETE FROM question_queue")
    conn.execute(f"INSERT INTO question_queue ({QUEUE_COLUMNS}) {_QUEUED}")
    conn.execute("DELETE FROM track_tally")
    conn.execute("DELETE FROM track_values")
    conn.executemany(adding_sql("?"), rows)
    conn.executemany(value_sql("?"), values)


def _active_below(conn: sqlite3.Connection, ids: list[str]) -> dict[str, int]:
    """How many active orders are below each of the orders ``ids`` (absent: none)."""
    if not ids:
        return {}
    return dict(conn.execute(_ACTIVE_BELOW, (json.dumps(ids), MAX_CHAIN,
                                             json.dumps(sorted(ACTIVE)))).fetchall())


def fill_queue(conn: sqlite3.Connection) -> None:
    """Write the key of every question in the queue afresh (:func:`awl.store.queue.keyed`):
    a migration step, and what a restore and a benchmark run after filling the queue."""
    rows = conn.execute("SELECT order_id, asked_at, deadline FROM question_queue").fetchall()
    conn.executemany(KEY_SQL, keyed(rows, _active_below(conn, [row[0] for row in rows])))


def fill_current(conn: sqlite3.Connection) -> None:
    """Fill the track tallies and the question queue with its keys afresh, as this version
    keeps them (:func:`fill_derived`, then :func:`fill_queue`)."""
    fill_derived(conn)
    fill_queue(conn)


# One call added to a pass's running totals (see migration 3). In an upsert's SET every
# column reads the row as it was, so the first_* columns move together.
_ADD_TO_PASS_TOTALS = """
    INSERT INTO pass_call_totals (order_id, jti, calls, usd, first_started, first_n, first_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
    ON CONFLICT (order_id, jti) DO UPDATE SET
        calls = calls + excluded.calls,
        usd = usd + excluded.usd,
        first_started = MIN(first_started, excluded.first_started),
        first_n = CASE WHEN excluded.first_started < first_started
            THEN excluded.first_n ELSE first_n END,
        first_at = CASE WHEN excluded.first_started < first_started
            THEN excluded.first_at ELSE first_at END"""

# An order's totals: its newest call row (if any), its first call (see migration 4), and
# what its sub-orders have spent (migration 5).
_ORDER_TOTALS = """
    SELECT o.seq, c.n, c.total_calls, c.total_usd, f.started, f.at, o.parent_id,
        s.calls, s.usd, s.first_started, s.first_at
    FROM orders AS o
    LEFT JOIN calls AS c ON c.order_id = o.id
        AND c.n = (SELECT MAX(n) FROM calls WHERE order_id = o.id)
    LEFT JOIN first_calls AS f ON f.order_id = o.id
    LEFT JOIN suborder_totals AS s ON s.order_id = o.id
    WHERE o.id = ?"""

# A counted call numbered right after the order's newest call as this store last wrote or read
# it, with the totals through it (see SQLiteStore._reserve_next): inserted only while that is
# still so. Calls are numbered densely, so call ?2 being absent (OR IGNORE: the key is taken)
# means no call came since; the order's log is still at ?9; and what its sub-orders have
# charged to it is still ?10 calls and ?11 usd. One statement, so one write transaction.
_RESERVE_NEXT = """
    INSERT OR IGNORE INTO calls (order_id, n, pass_jti, attempt, counted, usd, started, doc,
        total_calls, total_usd)
    SELECT ?1, ?2, NULL, ?3, 1, ?4, ?5, ?6, ?7, ?8
    WHERE (?9 IS NULL OR (SELECT seq FROM orders WHERE id = ?1) = ?9)
        AND COALESCE((SELECT calls = ?10 AND usd = ?11 FROM suborder_totals
            WHERE order_id = ?1), ?10 = 0 AND ?11 = 0)"""

# The orders above one (its parent first) with their tool_calls and usd budgets and what is
# charged to them: their own counted calls plus their sub-orders'.
_ABOVE = """
    WITH RECURSIVE up (id, depth) AS (
        SELECT parent_id, 1 FROM orders WHERE id = ?1 AND parent_id IS NOT NULL
        UNION
        SELECT o.parent_id, up.depth + 1 FROM up JOIN orders AS o ON o.id = up.id
            WHERE o.parent_id IS NOT NULL AND up.depth < ?2
    )
    SELECT o.id, json_extract(o.doc, '$.budget.tool_calls'),
        json_extract(o.doc, '$.budget.usd'),
        COALESCE((SELECT total_calls FROM calls WHERE order_id = o.id ORDER BY n DESC
            LIMIT 1), 0) + COALESCE(s.calls, 0),
        COALESCE((SELECT total_usd FROM calls WHERE order_id = o.id ORDER BY n DESC
            LIMIT 1), 0) + COALESCE(s.usd, 0)
    FROM up JOIN orders AS o ON o.id = up.id
    LEFT JOIN suborder_totals AS s ON s.order_id = o.id
    WHERE o.id != ?1
    ORDER BY up.depth"""

# One call of a sub-order charged to an order above it.
_CHARGE = """
    INSERT INTO suborder_totals (order_id, calls, usd, first_started, first_at)
    VALUES (?1, ?2, ?3, ?4, ?5)
    ON CONFLICT (order_id) DO UPDATE SET
        calls = calls + excluded.calls,
        usd = usd + excluded.usd,
        first_started = MIN(first_started, excluded.first_started),
        first_at = CASE WHEN excluded.first_started < first_started
            THEN excluded.first_at ELSE first_at END"""


@dataclass(frozen=True, slots=True)
class _Totals:
    """An order's calls so far, as a reservation reads them."""

    last_n: int
    calls: int
    usd: float
    first_started: float | None
    first_at: str | None
    parent_id: str | None = None
    charged_calls: int = 0
    """What its sub-orders have spent (charged to it)."""
    charged_usd: float = 0.0
    charged_first: tuple[float, str] | None = None
    """Their earliest call: its start, as a number and as written."""

    def usage(self) -> Usage:
        """What is charged to the order: its own calls and its sub-orders'."""
        first_at = self.first_at
        if self.charged_first is not None and (self.first_started is None
                                               or self.charged_first[0] < self.first_started):
            first_at = self.charged_first[1]
        return Usage(tool_calls=self.calls + self.charged_calls,
                     usd=self.usd + self.charged_usd, first_call_at=first_at)


def _passive_checkpoint(conn: sqlite3.Connection) -> tuple[int, int]:
    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(row[1]), int(row[2])


class _Checkpointer:
    """A daemon thread running a passive checkpoint every ``every`` seconds on its own
    connection, until :meth:`stop`."""

    def __init__(self, conn: sqlite3.Connection, every: float) -> None:
        self._conn = conn
        self._every = every
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="awl-sqlite-checkpoint",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopping.wait(self._every):
            try:
                _passive_checkpoint(self._conn)
            except sqlite3.Error:  # busy or locked now: the next round tries again
                continue

    def stop(self) -> None:
        """Stop the thread (a checkpoint under way finishes first) and close its connection."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        self._conn.close()




_KEPT_RESERVATIONS = 1024
"""The most reserved calls a store keeps the record text of, to end them (see finish_call),
and the most orders it keeps the newest totals of, to reserve their next call
(see SQLiteStore._reserve_next)."""


def _drop_oldest(kept: dict[Any, Any]) -> None:
    """Drop the oldest entry of one of a store's bounded caches. Threads sharing the store
    change the cache without a lock, so the entry may be gone, or the cache changing, as
    this looks: then another thread has just changed it, and the next addition drops one."""
    with contextlib.suppress(KeyError, RuntimeError, StopIteration):
        del kept[next(iter(kept))]


_Kept = tuple[int, int, float, float, int, float]
"""An order's totals through its newest call, as this store last wrote or read them: that
call's N, the counted calls and their usd, the first call's start (seconds), and what its
sub-orders have charged to it (calls, usd)."""


class SQLiteStore(SQLStore):
    """A :class:`awl.store.protocol.Store` in one SQLite file, safe across threads and processes.

    Args:
        path: The desk file; created (with its schema) if absent.
        timeout: Seconds a write waits for another writer before giving up with Conflict.
        checkpoint_every: Seconds between passive WAL checkpoints run by a background
            thread, none of this store's commits then checkpointing; None (the default)
            leaves checkpoints to SQLite, inside commits. :meth:`close` stops the thread.

    Raises:
        StoreUnavailable: The file cannot be opened as a desk (a missing folder, no
            permission, not a database), or was written by a newer version of this library;
            nothing was written.

    Example:
        >>> import tempfile, pathlib
        >>> with SQLiteStore(pathlib.Path(tempfile.mkdtemp()) / "desk.sqlite3") as store:
        ...     store.list_orders()
        []
    """

    in_process = True
    """Its calls are short local transactions: a gateway runs them on its event loop
    (GW-20)."""

    dialect = DIALECT
    track_fields = _TRACK_FIELDS
    queued_rows = _QUEUED

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0,
                 checkpoint_every: float | None = None) -> None:
        self.path = Path(path)
        self._timeout = timeout
        self._idle: list[sqlite3.Connection] = []
        self._idle_fast: list[sqlite3.Connection] = []
        # The record text of each call this store reserved and has not ended (the newest
        # _KEPT_RESERVATIONS), by (order, ref): its ending is written as a whole new text,
        # in place of the old one only if that is still there, without SQLite's JSON
        # functions parsing the old one.
        self._reserved_docs: dict[tuple[str, str], tuple[int, str, str]] = {}
        # The newest totals of each order without a parent that this store numbered a call
        # of (the newest _KEPT_RESERVATIONS), by order: its next call is reserved in one
        # statement while they are still current.
        self._kept_totals: dict[str, _Kept] = {}
        self._guard = threading.Lock()
        self._closed = False
        self._mark: OpenMark | None = None
        """Held shared while this store is open: the desk is not migrated under it."""
        self._private_files()
        self._checkpointer: _Checkpointer | None = None
        try:
            if checkpoint_every is not None:
                self._checkpointer = _Checkpointer(self._open(durable=True), checkpoint_every)
            conn = self._take(True)  # its errors raw: said below as the open's
            try:
                self._migrate(conn)
            finally:
                self._give_back(conn, True)
        except sqlite3.Error as exc:
            self.close()
            raise StoreUnavailable(f"cannot open the desk {self.path} ({exc}); "
                                   f"{_OPEN_ADVICE.get(_code(exc), _OPEN_DEFAULT)}") from None
        except BaseException:
            self.close()
            raise
        if self._checkpointer is not None:
            self._checkpointer.start()

    def _private_files(self) -> None:
        """Make the desk file, and so its journals, owner-only (SEC-10).

        SQLite gives its ``-wal``, ``-shm`` and ``-journal`` files the desk file's own mode,
        so a desk file created 0600 before SQLite first opens it keeps all of them private,
        whatever the umask. Files an older version left open to others are closed up.
        """
        with contextlib.suppress(OSError):  # a missing folder: SQLite's own error says so
            create_private(self.path)
        for suffix in ("", "-wal", "-shm", "-journal"):
            make_private(self.path.with_name(self.path.name + suffix))
        # A journal left read-only (made when the desk file was, by a process that could
        # only read it) would keep a desk file made writable again from being written.
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(OSError):
                journal = self.path.with_name(self.path.name + suffix)
                st = os.stat(journal)
                if (os.name != "nt" and not st.st_mode & 0o200 and st.st_uid == os.getuid()
                        and os.stat(self.path).st_mode & 0o200):
                    os.chmod(journal, 0o600)

    # Connections and transactions -------------------------------------------------------
    def _open(self, *, durable: bool) -> sqlite3.Connection:
        # isolation_level=None: the module opens no transactions of its own; we say BEGIN.
        conn = sqlite3.connect(
            self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        conn.execute("PRAGMA foreign_keys = ON")
        if self._checkpointer is not None:
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # the checkpointer's job
        return conn

    def _take(self, durable: bool) -> sqlite3.Connection:
        """An idle connection of the pool, or a new one."""
        idle = self._idle if durable else self._idle_fast
        with self._guard:
            if self._closed:
                raise AWLError(f"the desk store {self.path} is closed")
            conn = idle.pop() if idle else None
        return conn if conn is not None else self._open(durable=durable)

    def _give_back(self, conn: sqlite3.Connection, durable: bool) -> None:
        """Put ``conn`` back in its pool; one left in a transaction (a failed COMMIT) is closed,
        and so is one the pool has no room for (:data:`IDLE_KEPT`)."""
        broken = conn.in_transaction
        with self._guard:
            idle = self._idle if durable else self._idle_fast
            keep = not (self._closed or broken) and len(idle) < IDLE_KEPT
            if keep:
                idle.append(conn)
        if not keep:
            conn.close()

    @contextmanager
    def _connection(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A pooled connection; ``durable=False``: one set to ``synchronous=NORMAL``.

        Durable connections are for durable writes only; reads and call records share the
        other pool.
        """
        try:
            conn = self._take(durable)
            try:
                yield conn
            finally:
                self._give_back(conn, durable)
        except sqlite3.Error as exc:
            failure = self._failure(exc)
            if failure is None:
                raise
            raise failure from None

    def _busy(self, exc: sqlite3.Error) -> Conflict:
        """The Conflict for a write that waited its whole timeout for another writer."""
        return Conflict(f"the desk {self.path} stayed busy for {self._timeout:g} s ({exc}); "
                        "nothing was written, retry")

    def _failure(self, exc: sqlite3.Error) -> AWLError | None:
        """What a failure of SQLite under a read or write of this desk means, in one line
        naming the desk and what to do: the desk stayed locked (:class:`Conflict`), or it
        cannot be written, its disk is full or failing, or it is damaged
        (:class:`StoreUnavailable`); None for any other (a bug: raised as it is)."""
        code = _code(exc)
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return self._busy(exc)
        advice = _ADVICE.get(code)
        if advice is None:
            return None
        return StoreUnavailable(f"the desk {self.path} failed ({exc}): {advice}")

    def _write(self, *, durable: bool = True) -> _WriteTransaction:
        """One write transaction (``with store._write() as conn:``); ``durable=False`` skips
        the fsync at commit.

        Call records are written twice per forwarded call, so they commit with
        ``synchronous=NORMAL``: in WAL mode such a commit survives a crash of any process (it
        is in the OS's hands) and only a power cut can lose it. The next durable commit
        (an effect state, a lock, an order event) fsyncs the whole log, earlier records with it.
        The two kinds of write use two pools of connections, each set once when opened, so
        no write switches the setting (and none can leave a durable writer set to NORMAL).
        """
        return _WriteTransaction(self, durable)

    def _statement(self) -> AbstractContextManager[sqlite3.Connection]:
        """A pooled connection (of the call-record pool) for one statement, its own
        transaction: no BEGIN and COMMIT around it."""
        return self._connection(durable=False)

    def _among(self, page: str, params: list[Any], ids: list[str]) -> tuple[str, list[Any]]:
        # The page's query again (in the read's snapshot) rather than its ids: a page
        # without a limit may hold more ids than a statement takes parameters.
        return f"IN ({page})", params

    def _announce(self, conn: Connection, order_id: str, seq: int) -> None:
        """Nothing: no other process can hear it (a waiter on this file polls)."""

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        # Reads share the call-record pool (synchronous only matters to writes): a connection
        # drops its page cache when it finds that another connection wrote since its last
        # transaction, so a gateway reading and writing on one connection keeps it warm.
        with self._connection(durable=False) as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Mark the desk open in this process and bring its schema up to
        :data:`SCHEMA_VERSION` (BIND-22).

        The mark is an ``flock`` on ``<desk>-open``, held shared while the store is open.
        A desk already at :data:`SCHEMA_VERSION` is only read: opening it never waits for
        another process's write (a long one would fail the open). An older one is migrated
        holding the mark alone, under the write lock, so a second process opening it waits,
        then finds it migrated; while another process (of an older awl: a process of this
        one would have migrated it) holds the mark, it is refused with nothing written."""
        desk = f"the desk {self.path}"
        deadline = time.monotonic() + self._timeout
        while True:
            version = _schema_version(conn)
            if version is not None and version > SCHEMA_VERSION:
                raise self._newer(desk, version, SCHEMA_VERSION)
            if self._mark is None:
                self._mark = OpenMark(self.path.with_name(self.path.name + "-open"))
            if version == SCHEMA_VERSION:
                if self._mark.try_shared():
                    if _schema_version(conn) == SCHEMA_VERSION:
                        return
                    self._mark.release()  # migrated between the two reads: look again
            elif self._mark.try_exclusive():
                try:
                    self._migrate_alone(conn, desk)
                finally:
                    self._mark.share_after_migrating()
                return
            elif self._mark.try_shared():
                self._mark.release()
                raise self._open_elsewhere(desk, version or 0, SCHEMA_VERSION)
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"{desk} was being migrated by another process for {self._timeout:g} s; "
                    "nothing was written: open it again when that process has finished")
            time.sleep(0.02)  # another process is migrating it: a few statements

    def _migrate_alone(self, conn: sqlite3.Connection, desk: str) -> None:
        """Run the migrations the desk lacks, in one write transaction."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            _settle_early_layouts(conn)
            self._upgrade(conn, MIGRATIONS, desk)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        """Close every connection; calls after this raise."""
        with self._guard:
            self._closed = True
            idle = [*self._idle, *self._idle_fast]
            self._idle, self._idle_fast = [], []
        if self._checkpointer is not None:
            self._checkpointer.stop()
        for conn in idle:
            conn.close()
        if self._mark is not None:
            self._mark.close()

    def checkpoint(self) -> tuple[int, int]:
        """Run one passive WAL checkpoint now: ``(frames in the log, frames copied)``.

        Passive: it copies what no reader still needs and waits for nobody."""
        with self._connection() as conn:
            return _passive_checkpoint(conn)

    # Orders and their logs (the rest are shared: awl.store.sql) ------------------------
    def _tally(self, conn: Connection, worker: str, manager: str, order_id: str,
               old: TrackRow | None, new: TrackRow) -> None:
        """Apply a write that turned the order's row ``old`` into ``new`` to the tallies."""
        write_sql(cast(sqlite3.Connection, conn).executemany, "?", worker, manager, order_id,
                  old, new)

    def _below(self, conn: Connection, ids: list[str]) -> dict[str, int]:
        return _active_below(cast(sqlite3.Connection, conn), ids)

    def list_orders(
        self,
        *,
        state: str | Sequence[str] | None = None,
        worker: str | None = None,
        manager: str | None = None,
        parent_id: str | None = None,
        limit: int | None = 100,
        offset: int = 0,
        before: str | None = None,
        party: str | None = None,
    ) -> list[OrderRecord]:
        """Orders matching every filter given, most recently created first; a page costs
        what it returns, however deep."""
        clauses: list[str] = []
        params: list[Any] = []
        states = state_names(state)
        if states is not None:
            if not states:
                return []
            clauses.append(f"state IN ({','.join('?' * len(states))})")
            params.extend(states)
        if before is not None:
            clauses.append("pos < ?")
            params.append(self._position(before))
        # The page's positions first, from a narrow index (by state; by worker, manager or
        # parent, with a state or not; or by position, with states or not): a deep offset
        # walks index entries, never documents.
        page, values = DIALECT.page(clauses, params, (("worker", worker), ("manager", manager),
                                                      ("parent_id", parent_id)), party)
        return self._records(f"WHERE pos IN ({page})",
                             [*values, -1 if limit is None else limit, offset], None, 0)

    # Gateway call records --------------------------------------------------------------
    @staticmethod
    def _insert_call(conn: sqlite3.Connection, call: Mapping[str, Any], doc: str,
                     totals: _Totals, *, counted: bool, usd: float,
                     above: Sequence[str] = ()) -> _Kept:
        """Store a new call (its record's JSON data ``call`` and text ``doc``, numbered
        ``totals.last_n + 1``) with the order's totals through it, add it to its pass's
        running totals, and charge it to every order above; the order's totals through
        it."""
        n = totals.last_n + 1
        order_id, pass_jti, at = call["order_id"], call.get("pass_jti"), call["started_at"]
        started = timestamp(at)
        adds, spends = (1, usd) if counted else (0, 0.0)  # what it adds to the totals
        conn.execute(
            "INSERT INTO calls (order_id, n, pass_jti, attempt, counted, usd, started, doc,"
            " total_calls, total_usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (order_id, n, pass_jti, call["attempt"], adds, spends, started, doc,
             totals.calls + adds, totals.usd + spends),
        )
        # The first call by (started, N): a later N takes its place only by starting earlier.
        first = totals.first_started
        if first is None or started < first:
            first = started
            conn.execute(
                "INSERT OR REPLACE INTO first_calls (order_id, started, n, at)"
                " VALUES (?, ?, ?, ?)", (order_id, started, n, at))
        if pass_jti is not None:
            conn.execute(_ADD_TO_PASS_TOTALS, (order_id, pass_jti, adds, spends,
                                               started, n, at))
        for above_id in above:
            conn.execute(_CHARGE, (above_id, adds, spends, started, at))
        return (n, totals.calls + adds, totals.usd + spends, first, totals.charged_calls,
                totals.charged_usd)

    @staticmethod
    def _totals(conn: sqlite3.Connection, order_id: str, seq: int | None = None) -> _Totals:
        """The order's calls so far; NotFound if there is no such order.

        With ``seq``: :func:`stale_order` when the order's log is no longer at ``seq``."""
        row = conn.execute(_ORDER_TOTALS, (order_id,)).fetchone()
        if row is None:
            raise order_not_found(order_id)
        (actual, last_n, calls, usd, first_started, first_at, parent_id, sub_calls, sub_usd,
         sub_started, sub_at) = row
        if seq is not None and actual != seq:
            raise stale_order(order_id, seq, actual)
        charged = {} if sub_calls is None else {
            "charged_calls": sub_calls, "charged_usd": sub_usd,
            "charged_first": (sub_started, sub_at)}
        if last_n is None:  # no call yet
            return _Totals(0, 0, 0.0, None, None, parent_id, **charged)
        return _Totals(last_n, calls, usd, first_started, first_at, parent_id, **charged)

    @staticmethod
    def _above(conn: sqlite3.Connection, order_id: str,
               ) -> list[tuple[str, float | None, float | None, int, float]]:
        """The orders above ``order_id`` with their limits and charges (see ``_ABOVE``),
        each once (a cycle, only possible in a damaged store, ends at the first repeat)."""
        found: dict[str, tuple[str, float | None, float | None, int, float]] = {}
        for i, calls_limit, usd_limit, calls, used in conn.execute(
                _ABOVE, (order_id, MAX_CHAIN)).fetchall():
            if i in found:
                break
            found[i] = (str(i), calls_limit, usd_limit, int(calls), float(used))
        return list(found.values())

    @staticmethod
    def _pass_spent(conn: sqlite3.Connection, order_id: str,
                    jtis: frozenset[str]) -> tuple[int, float]:
        """Counted calls and their usd under ``jtis``."""
        clause, params = _jti_filter(jtis)
        calls, usd = conn.execute(
            "SELECT COALESCE(SUM(calls), 0), TOTAL(usd) FROM pass_call_totals"
            " WHERE order_id = ?" + clause, (order_id, *params),
        ).fetchone()
        return int(calls), float(usd)

    def reserve_call(
        self,
        order_id: str,
        *,
        attempt: int,
        tool: str,
        arguments: dict[str, Any],
        pass_jti: str | None,
        usd: float,
        started_at: str,
        scopes: Sequence[Scope],
        seq: int | None = None,
    ) -> Reservation:
        """Atomically number and record a call that counts, or name the scope it exceeds."""
        kept = self._kept_totals.get(order_id)
        if kept is not None and pass_jti is None:
            fast = self._reserve_next(kept, order_id, attempt=attempt, tool=tool,
                                      arguments=arguments, usd=usd, started_at=started_at,
                                      scopes=scopes, seq=seq)
            if fast is not None:
                return fast
        with self._write(durable=False) as conn:
            totals = self._totals(conn, order_id, seq)

            def spent(jtis: frozenset[str] | None) -> tuple[int, float]:
                if jtis is None:
                    return (totals.calls + totals.charged_calls,
                            totals.usd + totals.charged_usd)
                return self._pass_spent(conn, order_id, jtis)

            over = exceeded_scope(scopes, spent, usd)
            above = [] if totals.parent_id is None else self._above(conn, order_id)
            over = over or exceeded_above(above, usd)
            if over is not None:
                return OverBudget(over)
            data = new_call(order_id, totals.last_n + 1, attempt=attempt, tool=tool,
                            arguments=arguments, pass_jti=pass_jti, started_at=started_at)
            doc = json_text(data, "a call record")
            after = self._insert_call(conn, data, doc, totals, counted=True, usd=usd,
                                      above=[a[0] for a in above])
        self._keep_totals(order_id, totals.parent_id, after)
        return self._kept_reservation(order_id, totals.last_n + 1, data, doc)

    def _reserve_next(
        self, kept: _Kept, order_id: str, *, attempt: int, tool: str,
        arguments: dict[str, Any], usd: float, started_at: str, scopes: Sequence[Scope],
        seq: int | None,
    ) -> Reservation | None:
        """Reserve a call without a pass in one statement (:data:`_RESERVE_NEXT`) from the
        totals this store keeps for the order; None when that cannot be done, or the kept
        totals may be out of date or put the call over a scope (the general way decides)."""
        last_n, calls, spent, first_started, charged_calls, charged_usd = kept
        # The order's totals bound those of every scope, a pass's included: a scope they
        # leave room in has room; one they fill may not be full (the general way counts it).
        if exceeded_scope(scopes, lambda _: (calls + charged_calls, spent + charged_usd), usd):
            return None
        n = last_n + 1
        data = new_call(order_id, n, attempt=attempt, tool=tool, arguments=arguments,
                        pass_jti=None, started_at=started_at)
        started = timestamp(started_at)
        if started < first_started:  # a new first call (another clock): the general way
            return None
        doc = json_text(data, "a call record")
        total_usd = spent + usd  # as _insert_call adds it
        if not self._execute(_RESERVE_NEXT, (order_id, n, data["attempt"], usd, started, doc,
                                             calls + 1, total_usd, seq, charged_calls,
                                             charged_usd)):
            return None
        self._kept_totals[order_id] = (n, calls + 1, total_usd, first_started, charged_calls,
                                       charged_usd)
        return self._kept_reservation(order_id, n, data, doc)

    def _keep_totals(self, order_id: str, parent_id: str | None, after: _Kept) -> None:
        """Keep the order's totals ``after`` the call the general way just numbered, for
        :meth:`_reserve_next`."""
        if parent_id is not None:  # charges the orders above: always the general way
            return
        kept = self._kept_totals
        if order_id not in kept and len(kept) >= _KEPT_RESERVATIONS:
            _drop_oldest(kept)
        kept[order_id] = after

    def _kept_reservation(self, order_id: str, n: int, data: dict[str, Any],
                          doc: str) -> Reserved:
        """The reservation of call ``n`` (record ``data``, stored as ``doc``), its text kept
        for :meth:`finish_call`."""
        kept = self._reserved_docs
        if len(kept) >= _KEPT_RESERVATIONS:  # calls ended elsewhere, or never
            _drop_oldest(kept)
        kept[order_id, data["ref"]] = (n, doc, data["started_at"])
        return Reserved(data["ref"], data["attempt"], partial(read_call, doc))

    def record_call(self, record_fields: dict[str, Any]) -> CallRecord:
        """Number and store a call that does not count (a refusal)."""
        order_id = record_order_id(record_fields)
        with self._write(durable=False) as conn:
            totals = self._totals(conn, order_id)
            record, doc = stored_call(record_fields, totals.last_n + 1)
            above = [] if totals.parent_id is None else self._above(conn, order_id)
            after = self._insert_call(conn, record.to_json(), doc, totals, counted=False,
                                      usd=0.0, above=[a[0] for a in above])
        self._keep_totals(order_id, totals.parent_id, after)
        return record

    def finish_call(
        self, order_id: str, ref: str, *, outcome: str, result: dict[str, Any] | None,
        error: str | None, ended_at: str,
    ) -> None:
        """Set the outcome of a reserved call."""
        check_ending(outcome, result, error, ended_at)
        reserved = self._reserved_docs.pop((order_id, ref), None)
        if reserved is not None:
            kept_n, kept_doc, started_at = reserved
            new_doc = ended_doc(kept_doc, started_at, outcome=outcome, result=result,
                                error=error, ended_at=ended_at)
            if new_doc is not None and self._execute(
                    "UPDATE calls SET doc = ? WHERE order_id = ? AND n = ? AND doc = ?",
                    (new_doc, order_id, kept_n, kept_doc)):
                return
            # Changed since (or not as this store writes it): the general way below.
        n, tool = call_number(order_id, ref)
        # The stored record was valid when written and the new fields are checked above, so
        # SQLite sets them in the record's JSON text (unset ones removed), only while the
        # call is still pending, in one statement: its own write transaction.
        params: dict[str, Any] = {"order_id": order_id, "n": n, "tool": tool,
                                  "outcome": outcome, "ended_at": ended_at}
        sets = "'$.outcome', :outcome, '$.ended_at', :ended_at"
        if result is not None:
            params["result"] = json_text(result, "a call's result")
            sets += ", '$.result', json(:result)"
        if error is not None:
            params["error"] = error
            sets += ", '$.error', :error"
        changed = self._execute(
            f"UPDATE calls SET doc = json_set(json_remove(doc, '$.result', '$.error'), {sets})"
            " WHERE order_id = :order_id AND n = :n"
            " AND json_extract(doc, '$.tool') = :tool"
            " AND json_extract(doc, '$.outcome') = 'pending'", params)
        if changed == 0:
            with self._read() as reader:
                _, old = self._call_data(reader, order_id, ref)  # NotFound if there is none
            raise outcome_conflict(order_id, ref, old["outcome"])

    def _execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> int:
        """Run one writing statement as its own transaction; the rows it changed."""
        # _take/_give_back rather than `with self._connection()`: this runs on every forwarded
        # call, and the generator-based context manager costs ~9k instructions more a call.
        try:
            conn = self._take(False)
        except sqlite3.Error as exc:
            raise _said(self, exc) from None
        try:
            return int(conn.execute(sql, params).rowcount)
        except sqlite3.Error as exc:
            failure = self._failure(exc)
            if failure is None:
                raise
            raise failure from None
        finally:
            self._give_back(conn, False)

    def usage(self, order_id: str, jtis: frozenset[str] | None = None) -> Usage:
        """Counted calls and USD so far (for the calls under ``jtis`` if given)."""
        with self._read() as conn:
            calls, usd, first_at = astuple(self._totals(conn, order_id).usage())
            if jtis is not None:
                calls, usd = self._pass_spent(conn, order_id, jtis)
                clause, params = _jti_filter(jtis)
                first = conn.execute(
                    "SELECT first_at FROM pass_call_totals WHERE order_id = ?" + clause
                    + " ORDER BY first_started, first_n LIMIT 1", (order_id, *params),
                ).fetchone()
                first_at = None if first is None else first[0]
        return Usage(tool_calls=calls, usd=usd, first_call_at=first_at)

    # Locks ----------------------------------------------------------------------------
    def acquire_lock(self, info: LockInfo, *, replace: LockInfo | None = None) -> bool:
        """Take the named lock if free, or if it is still exactly ``replace``."""
        check_takeover(info, replace)
        with self._write() as conn:
            row = conn.execute("SELECT doc FROM locks WHERE name = ?", (info.name,)).fetchone()
            if not may_take(None if row is None else read_lock(row[0]), replace):
                return False
            conn.execute(
                "INSERT OR REPLACE INTO locks (name, doc) VALUES (?, ?)",
                (info.name, lock_doc(info)),
            )
            return True

    def get_lock(self, name: str) -> LockInfo | None:
        """The current holder of the named lock, if any."""
        with self._read() as conn:
            row = conn.execute("SELECT doc FROM locks WHERE name = ?", (name,)).fetchone()
        return None if row is None else read_lock(row[0])

    def release_lock(self, name: str, holder: str) -> None:
        """Release the lock if ``holder`` holds it."""
        with self._write() as conn:
            row = conn.execute("SELECT doc FROM locks WHERE name = ?", (name,)).fetchone()
            if row is not None and read_lock(row[0]).holder == holder:
                conn.execute("DELETE FROM locks WHERE name = ?", (name,))


    # Copying a desk (the rest is shared: awl.store.sql) ---------------------------------
    def usages(self, order_ids: Sequence[str]) -> list[Usage]:
        """Each order's usage, in one snapshot."""
        with self._read() as conn:
            return [self._totals(conn, oid).usage() for oid in order_ids]

    def _among_ids(self, ids: list[str]) -> tuple[str, list[Any]]:
        # One JSON text: a batch may hold more ids than a statement takes parameters.
        return "IN (SELECT value FROM json_each(?))", [json.dumps(ids)]

    def _insert_rows(self, conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        assert isinstance(conn, sqlite3.Connection)
        conn.executemany(sql, rows)

    @contextmanager
    def _restoring(self) -> Iterator[sqlite3.Connection]:
        # The file's one write lock, held from BEGIN IMMEDIATE to the commit. Then the track
        # tallies and the question queue, from the orders just written, and the planner's
        # statistics, for the first reads of a large new desk.
        with self._write() as conn:
            yield conn
            fill_current(conn)
            conn.execute("ANALYZE")

    def _restore_calls(self, conn: Connection, order: DeskOrder) -> None:
        assert isinstance(conn, sqlite3.Connection)
        oid = order.record.order.id
        for record, usd in zip(order.calls, order.charges, strict=True):
            totals = self._totals(conn, oid)
            check_restored_ref(record, totals.last_n + 1)
            above = [] if totals.parent_id is None else self._above(conn, oid)
            data = record.to_json()
            self._insert_call(conn, data, dump_json(data), totals,
                              counted=usd is not None, usd=usd or 0.0,
                              above=[a[0] for a in above])

def _said(store: SQLiteStore, exc: sqlite3.Error) -> BaseException:
    """``exc`` as :meth:`SQLiteStore._failure` says it, else ``exc`` itself."""
    failure = store._failure(exc)
    return exc if failure is None else failure


class _WriteTransaction:
    """``BEGIN IMMEDIATE`` on a pooled connection; COMMIT on success, ROLLBACK on error.

    A class rather than a generator-based context manager: the gateway opens one of these
    per tool call (to reserve it), and this costs about half as much.
    """

    __slots__ = ("_conn", "_durable", "_store")

    def __init__(self, store: SQLiteStore, durable: bool) -> None:
        self._store = store
        self._durable = durable
        self._conn: sqlite3.Connection | None = None

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        try:
            conn = store._take(self._durable)
        except sqlite3.Error as exc:
            raise _said(store, exc) from None
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            store._give_back(conn, self._durable)
            raise _said(store, exc) from None
        except BaseException:
            store._give_back(conn, self._durable)
            raise
        self._conn = conn
        return conn

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        conn = self._conn
        assert conn is not None
        try:
            if exc_type is None:
                conn.execute("COMMIT")
            elif conn.in_transaction:
                # A ROLLBACK that fails (a disk error) leaves the connection in its
                # transaction: _give_back closes it, which rolls back; the error raised is
                # the one that failed the write.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
        except sqlite3.Error as failed:
            raise _said(self._store, failed) from None
        finally:
            self._store._give_back(conn, self._durable)
        if isinstance(exc, sqlite3.Error):
            failure = self._store._failure(exc)
            if failure is not None:
                raise failure from None
