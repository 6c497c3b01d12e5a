"""The PostgreSQL store: one desk shared by gateways, committers and desks on many hosts.

Chosen by a ``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` URL (libpq's own form, so
``?sslmode=require`` and the other libpq parameters work too; ``options=-csearch_path=S``
puts the desk in schema ``S``, so one database can hold several desks). It runs on psycopg 3
with two :mod:`psycopg_pool` pools, one for writes and one for reads, every connection set to
``synchronous_commit=on`` (whatever the server's default): a commit returns once the server
has flushed it to disk.

What holds across hosts, and how:

- Every write is one transaction that first locks the rows it checks: an order's row
  (``FOR NO KEY UPDATE``) before its seq is compared or a call is numbered or counted, so
  two gateways on two hosts can neither number two calls alike, nor leave a gap, nor spend
  past a limit. An order's running totals live on its row; a reservation under a sub-order
  locks the orders above it one by one, parent first (every transaction locks a chain from
  the bottom up, so two of them never wait on each other in a circle), checks and charges
  them in the same transaction.
- Call records (reservations, refusals, outcomes) are durable like every other write, so
  not even a crash of the server loses a count (GW-20). A reservation is usually one
  statement (one round trip, one flush); outcomes that wait while another group of them
  commits are set together in one statement (group commit), each caller returning once
  its own is on disk; and concurrent commits of any process share the server's flushes.
- Effects (``dispatching`` above all), order events, locks, passes, revocations, tokens,
  webhooks and delivery attempts are durable before the call returns.
- Webhooks (HOOK-1 to HOOK-6): the outbox row of a notification is written in the
  transaction of the event or effect write that causes it, so both commit or neither does
  (a writer killed between the two leaves neither). Deliverers on several hosts claim at
  once: a claim locks the due rows it takes with ``FOR UPDATE SKIP LOCKED``, so two never
  take the same one, and makes them due again only when the lease ends. A write that
  notifies holds the webhooks it read (``FOR KEY SHARE``), so a removal running meanwhile
  waits for it and then kills the notifications it wrote.
- The commit lock is a row and a session advisory lock held on a connection of its own:
  when the holder dies its connection closes and the server lets the lock go at once, so
  the next committer takes it without waiting out a lease. A takeover of a live holder
  whose lease ran out ends that holder's lock connection first, so its next renewal
  fails and it sends nothing more.
- The desk's public key set is published in the store (``publish_keys``), so gateways on
  other hosts verify passes without the desk's private keys.
- ``wait_for_events`` is woken by ``LISTEN``/``NOTIFY``: each event written notifies the
  desk's channel when its transaction commits.
- The schema is migrated on open inside one transaction holding an advisory lock, so
  several processes opening a new database at once migrate it once; a database made by a
  newer version is refused before anything is written.

The checks every backend shares live in :mod:`awl.store.rules`; the statements the SQL
backends share (orders' logs, effects, passes, tokens, webhooks and the outbox) live in
:class:`awl.store.sql.SQLStore`, spelled for PostgreSQL by :data:`DIALECT`. This module keeps
what is its own: connections and pools, migrations, the call path, listings, the commit lock,
published keys and ``LISTEN``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout
from psycopg_pool.pool import AddConnection, MaintenanceTask

from awl.documents.errors import BadRequest, Conflict, StoreUnavailable, debugging
from awl.documents.lifecycle import ACTIVE
from awl.documents.models import CallRecord
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
    USD_TOLERANCE,
    call_number,
    check_ending,
    check_restored_ref,
    check_takeover,
    dump_json,
    exceeded_above,
    exceeded_scope,
    json_text,
    lock_doc,
    may_take,
    new_call,
    order_not_found,
    outcome_conflict,
    over_limit,
    read_call,
    read_lock,
    read_track_row,
    record_order_id,
    stale_order,
    state_names,
    stored_call,
    stored_lock,
    timestamp,
)
from awl.store.settings import POOL_SIZE_ENV, TIMEOUT_ENV
from awl.store.sql import QUEUE_COLUMNS, Connection, Dialect, SQLStore
from awl.store.tally import filled, write_sql

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

_A = TypeVar("_A", dict[str, Any] | None, str | None)
"""An upstream's answer as a store keeps it: a result object, or an error's text."""

# What the question queue keeps of the blocked orders `o` (`latest`: the JSON array
# [attempt, questions] of the latest report).
_QUEUED = """
    SELECT o.pos, o.id, o.doc->>'goal', o.worker, o.manager, o.doc->>'escalate_to',
        o.doc->>'deadline', o.seq, o.updated_at,
        (SELECT jsonb_build_array(r.doc->'attempt', r.doc->'questions')::text
            FROM reports r WHERE r.order_id = o.id ORDER BY r.idx DESC LIMIT 1),
        (SELECT COUNT(*) FROM reviews v WHERE v.order_id = o.id
            AND v.doc->>'decision' = 'rework')
    FROM orders o WHERE o.state = 'blocked'"""

# Each entry moves the schema up one version; entries are never edited once released, a
# change is a new entry. They run inside the migrating transaction; a function is a step
# that needs Python.
MIGRATIONS: tuple[tuple[str | Callable[[psycopg.Connection[Any]], None], ...], ...] = (
    (
        # An order, with the running totals of its calls: `last_n` the highest N, `calls`
        # and `usd` its counted calls, `first_*` its earliest call by (started, N), counted
        # or not; `sub_*` what its sub-orders at any depth spent (charged to it, LC-15).
        """CREATE TABLE orders (
            pos BIGSERIAL PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            doc JSONB NOT NULL,
            state TEXT NOT NULL,
            seq INTEGER NOT NULL,
            worker TEXT NOT NULL,
            manager TEXT NOT NULL,
            parent_id TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            last_n INTEGER NOT NULL DEFAULT 0,
            calls INTEGER NOT NULL DEFAULT 0,
            usd DOUBLE PRECISION NOT NULL DEFAULT 0,
            first_started DOUBLE PRECISION,
            first_n INTEGER,
            first_at TEXT,
            sub_calls INTEGER NOT NULL DEFAULT 0,
            sub_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
            sub_started DOUBLE PRECISION,
            sub_at TEXT
        )""",
        "CREATE INDEX orders_by_state ON orders (state, pos)",
        "CREATE INDEX orders_by_worker ON orders (worker, pos)",
        "CREATE INDEX orders_by_manager ON orders (manager, pos)",
        "CREATE INDEX orders_by_parent ON orders (parent_id, pos)",
        """CREATE TABLE events (
            order_id TEXT NOT NULL REFERENCES orders (id),
            seq INTEGER NOT NULL,
            doc JSONB NOT NULL,
            PRIMARY KEY (order_id, seq)
        )""",
        """CREATE TABLE reports (
            order_id TEXT NOT NULL REFERENCES orders (id),
            idx INTEGER NOT NULL,
            doc JSONB NOT NULL,
            PRIMARY KEY (order_id, idx)
        )""",
        """CREATE TABLE reviews (
            order_id TEXT NOT NULL REFERENCES orders (id),
            idx INTEGER NOT NULL,
            doc JSONB NOT NULL,
            PRIMARY KEY (order_id, idx)
        )""",
        """CREATE TABLE calls (
            order_id TEXT NOT NULL REFERENCES orders (id),
            n INTEGER NOT NULL,
            pass_jti TEXT,
            attempt INTEGER NOT NULL,
            counted BOOLEAN NOT NULL,
            usd DOUBLE PRECISION NOT NULL,
            started DOUBLE PRECISION NOT NULL,
            doc JSONB NOT NULL,
            PRIMARY KEY (order_id, n)
        )""",
        # The running totals of an order's calls under each pass.
        """CREATE TABLE pass_totals (
            order_id TEXT NOT NULL REFERENCES orders (id),
            jti TEXT NOT NULL,
            calls INTEGER NOT NULL,
            usd DOUBLE PRECISION NOT NULL,
            first_started DOUBLE PRECISION NOT NULL,
            first_n INTEGER NOT NULL,
            first_at TEXT NOT NULL,
            PRIMARY KEY (order_id, jti)
        )""",
        """CREATE TABLE effects (
            order_id TEXT NOT NULL REFERENCES orders (id),
            n INTEGER NOT NULL,
            doc JSONB NOT NULL,
            PRIMARY KEY (order_id, n)
        )""",
        # A lock's record; `backend` is the server process of the connection holding its
        # advisory lock (the lock is held only while that connection lives).
        """CREATE TABLE locks (
            name TEXT PRIMARY KEY,
            doc JSONB NOT NULL,
            backend INTEGER NOT NULL
        )""",
        """CREATE TABLE revocations (
            pos BIGSERIAL PRIMARY KEY,
            jti TEXT NOT NULL UNIQUE,
            reason TEXT NOT NULL,
            at TEXT NOT NULL
        )""",
        """CREATE TABLE tokens (
            pos BIGSERIAL PRIMARY KEY,
            token_hash TEXT NOT NULL UNIQUE,
            principal TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        """CREATE TABLE passes (
            pos BIGSERIAL PRIMARY KEY,
            jti TEXT NOT NULL UNIQUE,
            order_id TEXT NOT NULL,
            doc JSONB NOT NULL
        )""",
        "CREATE INDEX passes_by_order ON passes (order_id, pos)",
    ),
    (
        # The desk's public key set (JWKS), published for gateways on other hosts.
        """CREATE TABLE public_keys (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            doc JSONB NOT NULL
        )""",
    ),
    (
        # Webhook subscriptions, and the outbox: one row per notification, written in the
        # transaction of the event or effect write that causes it (HOOK-3). `next_at` is
        # when a pending one is next due, in seconds since the epoch.
        """CREATE TABLE webhooks (
            pos BIGSERIAL PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            doc JSONB NOT NULL
        )""",
        """CREATE TABLE outbox (
            pos BIGSERIAL PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            webhook_id TEXT NOT NULL,
            order_id TEXT NOT NULL,
            state TEXT NOT NULL,
            next_at DOUBLE PRECISION NOT NULL,
            doc JSONB NOT NULL
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
            spent DOUBLE PRECISION NOT NULL,
            budget DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (worker, manager, kind, key)
        )""",
        """CREATE TABLE track_values (
            order_id TEXT NOT NULL REFERENCES orders (id),
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            worker TEXT NOT NULL,
            manager TEXT NOT NULL,
            value DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (order_id, kind, key)
        )""",
        "CREATE INDEX track_values_by_worker ON track_values (worker, kind, key, value)",
        "CREATE INDEX track_values_by_manager"
        " ON track_values (worker, manager, kind, key, value)",
        # The question queue: what it shows of each blocked order, written in the
        # transaction of each event that blocks or unblocks it.
        """CREATE TABLE question_queue (
            pos BIGINT PRIMARY KEY,
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
            expires_at DOUBLE PRECISION NOT NULL,
            token_hash TEXT
        )""",
        "CREATE INDEX web_sessions_by_expiry ON web_sessions (expires_at)",
    ),
    (
        # The question queue in its order, a page at a time (BIND-20): each question's key
        # (`rank`, minus its weight, then `asked`, then the order id, both compared by code
        # point as every backend compares them) and its deadline as text that sorts as time
        # (awl.store.queue), kept by every write that changes them; the questions already
        # there keyed here. The indexes by position go: no read orders the queue by
        # creation any more.
        "ALTER TABLE question_queue ADD COLUMN rank INTEGER NOT NULL DEFAULT -1,"
        ' ADD COLUMN asked TEXT COLLATE "C" NOT NULL DEFAULT \'\','
        ' ADD COLUMN due TEXT COLLATE "C" NOT NULL DEFAULT \'\','
        ' ALTER COLUMN order_id TYPE TEXT COLLATE "C"',
        lambda conn: fill_queue(conn),
        *KEY_INDEXES,
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this code writes; a database is migrated up to it when opened."""

DIALECT = Dialect(
    param="%s", no_limit=None, effect_state="doc->>'state'", text="::text", jsonb="::jsonb",
    lock=" FOR UPDATE", lock_order=" FOR NO KEY UPDATE", share=" FOR KEY SHARE",
    skip_locked=" FOR UPDATE SKIP LOCKED", rowid="pos", hold=" FOR SHARE")
"""PostgreSQL's spelling of the shared statements: documents are JSONB, and a write locks
the rows it checks (there is no one write lock)."""

CONNECT_TIMEOUT = 10
"""Seconds to wait for the server when connecting (at most the store's timeout)."""



RETRY_EVERY = 2.0
"""The longest a pool that cannot connect waits before it tries again, in seconds."""

_TAKEOVER_WAIT = 5.0
"""Seconds a takeover waits for the old holder's lock connection to end."""

# An order's row as a reservation reads (and locks) it.
_LOCK_ORDER = """
    SELECT seq, last_n, calls, usd, first_started, parent_id, sub_calls, sub_usd
    FROM orders WHERE id = %s FOR NO KEY UPDATE"""

# The ids above an order, its parent first (parent_id never changes once written, so this
# reads without locking; the rows are locked next, in this order).
_CHAIN = """
    WITH RECURSIVE up (id, depth) AS (
        SELECT parent_id, 1 FROM orders WHERE id = %s AND parent_id IS NOT NULL
        UNION ALL
        SELECT o.parent_id, up.depth + 1 FROM up JOIN orders AS o ON o.id = up.id
            WHERE o.parent_id IS NOT NULL AND up.depth < %s
    )
    SELECT id FROM up ORDER BY depth"""

# What the counted calls under some passes have spent (read with the order's row locked).
_PASS_SPENT = """
    SELECT COALESCE(SUM(calls), 0), COALESCE(SUM(usd), 0) FROM pass_totals
    WHERE order_id = %s AND jti = ANY(%s)"""

# What a track row is made of (read_track_row's fields), picked from the documents of
# the orders `o`.
_TRACK_FIELDS = """o.id, o.state, (o.doc->'budget')::text,
    (SELECT jsonb_build_array(r.doc->'cost', r.doc->'status')::text FROM reports r
        WHERE r.order_id = o.id ORDER BY r.idx DESC LIMIT 1),
    (SELECT COUNT(*) FROM reviews v WHERE v.order_id = o.id
        AND v.doc->>'decision' = 'rework'),
    (SELECT e.doc->>'at' FROM events e WHERE e.order_id = o.id
        AND e.seq = 2 AND e.doc->>'action' = 'accept'),
    (SELECT v.doc->>'at' FROM reviews v WHERE v.order_id = o.id
        AND v.doc->>'decision' = 'approve' ORDER BY v.idx DESC LIMIT 1)"""

# The active orders below each of the orders %(ids)s, reached through active orders only,
# each counted once (a damaged store's cycle ends at depth %(depth)s).
_ACTIVE_BELOW = """
    WITH RECURSIVE below (root, id, depth) AS (
        SELECT c.parent_id, c.id, 1 FROM orders AS c
            WHERE c.parent_id = ANY(%(ids)s) AND c.state = ANY(%(active)s)
        UNION
        SELECT b.root, c.id, b.depth + 1 FROM below AS b JOIN orders AS c
            ON c.parent_id = b.id WHERE c.state = ANY(%(active)s) AND b.depth < %(depth)s
    )
    SELECT root, COUNT(DISTINCT id) FROM below WHERE id != root GROUP BY root"""


def _active_below(conn: psycopg.Connection[Any], ids: list[str]) -> dict[str, int]:
    """How many active orders are below each of the orders ``ids`` (absent: none)."""
    if not ids:
        return {}
    return dict(conn.execute(_ACTIVE_BELOW, {"ids": ids, "active": sorted(ACTIVE),
                                             "depth": MAX_CHAIN}).fetchall())


def fill_queue(conn: psycopg.Connection[Any]) -> None:
    """Write the key of every question in the queue afresh (:func:`awl.store.queue.keyed`):
    a migration step, and what a restore and a benchmark run after filling the queue."""
    rows = conn.execute("SELECT order_id, asked_at, deadline FROM question_queue").fetchall()
    with conn.cursor() as cur:
        cur.executemany(DIALECT.sql(KEY_SQL),
                        keyed(rows, _active_below(conn, [row[0] for row in rows])))


def fill_current(conn: psycopg.Connection[Any]) -> None:
    """Fill the track tallies and the question queue with its keys afresh, as this version
    keeps them (:func:`fill_derived`, then :func:`fill_queue`)."""
    fill_derived(conn)
    fill_queue(conn)


def fill_derived(conn: psycopg.Connection[Any]) -> None:
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
    with conn.cursor() as cur:
        for table, columns, items in (
                ("track_tally", "worker, manager, kind, key, orders, spent, budget", rows),
                ("track_values", "order_id, kind, key, worker, manager, value", values)):
            with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for item in items:
                    copy.write_row(item)


_LOCK_ABOVE = """
    SELECT id, (doc->'budget'->>'tool_calls')::float8, (doc->'budget'->>'usd')::float8,
        calls + sub_calls, usd + sub_usd
    FROM orders WHERE id = %s FOR NO KEY UPDATE"""

# How a call adds to its pass's running totals (after VALUES or a SELECT of those columns).
_PASS_TOTALS_UPSERT = """
    ON CONFLICT (order_id, jti) DO UPDATE SET
        calls = t.calls + excluded.calls,
        usd = t.usd + excluded.usd,
        first_started = LEAST(t.first_started, excluded.first_started),
        first_n = CASE WHEN excluded.first_started < t.first_started
            THEN excluded.first_n ELSE t.first_n END,
        first_at = CASE WHEN excluded.first_started < t.first_started
            THEN excluded.first_at ELSE t.first_at END"""

_ADD_TO_PASS_TOTALS = """
    INSERT INTO pass_totals AS t (order_id, jti, calls, usd, first_started, first_n, first_at)
    VALUES (%s, %s, %s, %s, %s, %s, %s)""" + _PASS_TOTALS_UPSERT

_CHARGE = """
    UPDATE orders SET sub_calls = sub_calls + %(calls)s, sub_usd = sub_usd + %(usd)s,
        sub_at = CASE WHEN sub_started IS NULL OR %(started)s < sub_started
            THEN %(at)s ELSE sub_at END,
        sub_started = LEAST(sub_started, %(started)s)
    WHERE id = ANY(%(ids)s)"""

# How a new call numbered %(n)s moves its order's running totals.
_COUNT_CALL = """
    UPDATE orders SET last_n = %(n)s, calls = calls + %(adds)s, usd = usd + %(usd)s,
        first_n = CASE WHEN first_started IS NULL OR %(started)s < first_started
            THEN %(n)s ELSE first_n END,
        first_at = CASE WHEN first_started IS NULL OR %(started)s < first_started
            THEN %(at)s ELSE first_at END,
        first_started = LEAST(first_started, %(started)s)
    WHERE id = %(order_id)s"""

_INSERT_CALL = """
    WITH added AS (
        INSERT INTO calls (order_id, n, pass_jti, attempt, counted, usd, started, doc)
        VALUES (%(order_id)s, %(n)s, %(jti)s, %(attempt)s, %(counted)s, %(usd)s,
            %(started)s, %(doc)s::jsonb)
    )""" + _COUNT_CALL

# A whole reservation in one statement (its own transaction: one round trip, one flush),
# for the usual case: an order with no order above it, whose own scope is the only one with
# limits, numbered as guessed (%(n)s). It locks the order's row and writes the call only if
# all of that holds and the call fits (the same test as rules.over_limit, whose verdict
# decides when it does not), and returns the row as locked with whether it wrote.
_RESERVE = """
    WITH o AS (
        SELECT seq, last_n, calls + sub_calls AS spent_calls, usd + sub_usd AS spent_usd,
            parent_id
        FROM orders WHERE id = %(order_id)s FOR NO KEY UPDATE
    ), fits AS (
        SELECT 1 FROM o WHERE o.last_n + 1 = %(n)s AND o.parent_id IS NULL
            AND (%(seq)s::bigint IS NULL OR o.seq = %(seq)s::bigint)
            AND (%(max_calls)s::float8 IS NULL OR o.spent_calls + 1 <= %(max_calls)s::float8)
            AND (%(max_usd)s::float8 IS NULL
                OR o.spent_usd + %(usd)s::float8 <= %(max_usd)s::float8 + %(tolerance)s::float8)
    ), added AS (
        INSERT INTO calls (order_id, n, pass_jti, attempt, counted, usd, started, doc)
        SELECT %(order_id)s, %(n)s, %(jti)s, %(attempt)s, true, %(usd)s, %(started)s,
            %(doc)s::jsonb FROM fits
    ), to_pass AS (
        INSERT INTO pass_totals AS t (order_id, jti, calls, usd, first_started, first_n,
            first_at)
        SELECT %(order_id)s, %(jti)s, 1, %(usd)s, %(started)s, %(n)s, %(at)s
        FROM fits WHERE %(jti)s::text IS NOT NULL""" + _PASS_TOTALS_UPSERT + """
    ), counted AS (""" + _COUNT_CALL + """ AND EXISTS (SELECT 1 FROM fits)
    )
    SELECT o.seq, o.last_n, o.spent_calls, o.spent_usd, o.parent_id,
        EXISTS (SELECT 1 FROM fits) FROM o"""

_FAST_TRIES = 3
"""How many one-statement tries a reservation makes, each numbering the call after the last
one the previous try saw, before it takes the general path (other gateways numbering calls
of the same order in between)."""


# An order's usage (its own calls and its sub-orders'), from its row.
_ORDER_USAGE = """
    calls + sub_calls, usd + sub_usd, CASE WHEN sub_started IS NOT NULL
        AND (first_started IS NULL OR sub_started < first_started) THEN sub_at
        ELSE first_at END"""


@dataclass(slots=True, eq=False)
class _Reserving:
    """One reservation waiting for its order's group commit, and what became of it: a
    Reservation, an error, or neither (it takes the general path)."""

    attempt: int
    tool: str
    arguments: dict[str, Any]
    pass_jti: str | None
    usd: float
    started_at: str
    scope: Scope | None
    seq: int | None
    done: bool = False
    result: Reservation | None = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Lane:
    """An order's reservations waiting for their group commit, and the lock held by the
    thread committing a group of them (see :meth:`PostgresStore.reserve_call`)."""

    waiting: list[_Reserving]
    committer: threading.Lock


@dataclass(slots=True, eq=False)
class _Ending:
    """One outcome waiting for its group commit, and what became of it."""

    order_id: str
    n: int
    tool: str
    text: str
    done: bool = False
    changed: bool = False
    error: BaseException | None = None


# Set each ending (a JSON object of outcome, ended_at, result, error) in its call's document,
# unset fields removed, only while the call is still pending; the calls it set.
_SET_ENDINGS = """
    UPDATE calls AS c SET doc = (c.doc - 'result' - 'error') || v.ending::jsonb
    FROM unnest(%s::text[], %s::int[], %s::text[], %s::text[]) AS v(order_id, n, tool, ending)
    WHERE c.order_id = v.order_id AND c.n = v.n AND c.doc->>'tool' = v.tool
        AND c.doc->>'outcome' = 'pending'
    RETURNING c.order_id, c.n"""

# The same for a batch of one ending (the usual case when calls do not overlap): scalar
# parameters, which cost the client about a third of the CPU the four arrays do.
_SET_ENDING = """
    UPDATE calls SET doc = (doc - 'result' - 'error') || %s::jsonb
    WHERE order_id = %s AND n = %s AND doc->>'tool' = %s AND doc->>'outcome' = 'pending'
    RETURNING order_id, n"""


@dataclass(frozen=True, slots=True)
class _Row:
    """An order's row as a reservation locks it."""

    seq: int
    last_n: int
    calls: int
    usd: float
    parent_id: str | None
    sub_calls: int
    sub_usd: float


def _exists(conn: psycopg.Connection[Any], name: str) -> bool:
    """Whether the schema the store uses holds a table or index ``name``."""
    row = conn.execute("SELECT to_regclass(quote_ident(current_schema()) || '.' || %s)",
                       (name,)).fetchone()
    return row is not None and row[0] is not None


def _settle_early_layouts(conn: psycopg.Connection[Any]) -> None:
    """Bring a desk from a development build whose numbered migration differed from the
    released one to the layout its number has here, so that the migrations after it apply.
    Run in the migrating transaction, before them; a desk of any other layout is left as
    it is.

    - Schema 3 with the track tallies: a build numbered them 3 (they are 4 here, with the
      question queue) and had no webhook tables (3 here). Those are made now, then what 4
      makes here and the desk lacks, the tallies and the queue filled again (the tallies
      from the same orders); the desk is 4.
    - Schema 4 (or 5) without the listing indexes by parent and by position: builds whose
      4 made other indexes. They are made now.

    Either way that build's own index, which nothing reads any more, is dropped.
    """
    version = _desk_version(conn)
    if version == 3 and _exists(conn, "track_tally") and not _exists(conn, "webhooks"):
        for step in MIGRATIONS[2]:
            conn.execute(cast(str, step))
        conn.execute("DROP INDEX IF EXISTS orders_blocked_by_escalation")
        PostgresStore._missing_only(conn, MIGRATIONS[3], lambda name: _exists(conn, name))
        conn.execute("INSERT INTO awl_schema (version) VALUES (4)")
    elif version in (4, 5) and not (_exists(conn, "orders_by_parent_state")
                                    and _exists(conn, "orders_by_pos_state")):
        conn.execute("DROP INDEX IF EXISTS orders_blocked_by_escalation")
        indexes = [step for step in MIGRATIONS[3]
                   if isinstance(step, str) and step.startswith("CREATE INDEX orders_")]
        PostgresStore._missing_only(conn, indexes, lambda name: _exists(conn, name))


def _desk_version(conn: psycopg.Connection[Any]) -> int | None:
    """The desk's schema version; None for a new database."""
    if not _exists(conn, "awl_schema"):
        return None
    row = conn.execute("SELECT MAX(version) FROM awl_schema").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _holders(conn: psycopg.Connection[Any], key: int) -> str:
    """Who holds the advisory lock ``(key, 0)``, as the refusal names them: each holder's
    ``application_name`` (an awl names its host and process)."""
    rows = conn.execute(
        "SELECT DISTINCT a.application_name FROM pg_locks AS l"
        " JOIN pg_stat_activity AS a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = 0"
        " AND l.objsubid = 2 AND l.pid <> pg_backend_pid() AND l.granted",
        (key & 0xFFFFFFFF,)).fetchall()
    names = sorted(str(name) or "unnamed" for (name,) in rows)
    return f" ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})" if names else ""


def _key(text: str) -> int:
    """A signed 32-bit advisory lock key for ``text``."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big",
                          signed=True)


def _where(url: str) -> str:
    """The server a URL names, as messages show it (never its password)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "the local socket"
        port = parts.port
        database = parts.path.lstrip("/") or parts.username or "?"
    except ValueError:
        return "the PostgreSQL server"
    return f"PostgreSQL at {host}{'' if port is None else f':{port}'}/{database}"


def _address(url: str) -> str:
    """``HOST:PORT`` of the server a URL names (libpq's defaults filled in)."""
    try:
        parts = urlsplit(url)
        return f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
    except ValueError:
        return "the host and port of the store URL"


# What each refusal of the server means, by SQLSTATE (a refusal while connecting carries
# none in psycopg: then by what libpq and the server said, in English).
_FULL, _AUTH, _UNREACHABLE, _READ_ONLY, _RESTARTING, _NO_DATABASE, _SLOW, _DENIED = (
    "full", "auth", "unreachable", "read-only", "restarting", "no database", "slow",
    "denied")
_BY_STATE = {"53300": _FULL, "28P01": _AUTH, "28000": _AUTH, "25006": _READ_ONLY,
             "42501": _DENIED,
             "57P01": _RESTARTING, "57P02": _RESTARTING, "57P03": _RESTARTING,
             "3D000": _NO_DATABASE, "57014": _SLOW}
_BY_TEXT = (
    (_FULL, ("too many connections", "too many clients", "connection slots are reserved")),
    (_AUTH, ("password authentication failed", "no password supplied", "authentication "
             "failed", "no pg_hba.conf entry", "is not permitted to log in")),
    (_RESTARTING, ("starting up", "shutting down", "in recovery mode", "not yet accepting",
                   "administrator command", "not accepting connections")),
    (_READ_ONLY, ("read-only transaction",)),
    (_UNREACHABLE, ("connection refused", "timeout expired", "could not translate host name",
                    "no route to host", "network is unreachable", "no such file or directory",
                    "server closed the connection", "connection timed out", "connection reset",
                    "could not connect", "ssl negotiation", "consuming input failed",
                    "failed to resolve host",
                    "the connection is lost", "connection is closed")),
)


_REFUSALS = (psycopg.OperationalError, pg_errors.ReadOnlySqlTransaction,
             pg_errors.InsufficientPrivilege)
"""What the server raises when it cannot be used, or not by this user, or not for writing."""


def _cause(exc: BaseException) -> str | None:
    """Why the server refused or could not be used, as one of the kinds above (None: none
    of them, the server's own words say it)."""
    state = getattr(exc, "sqlstate", None)
    if state in _BY_STATE:
        return _BY_STATE[str(state)]
    if isinstance(exc, pg_errors.InvalidPassword):
        return _AUTH
    lowered = str(exc).lower()
    if "does not exist" in lowered:  # a role's (28000) or a database's (3D000)
        if 'database "' in lowered:
            return _NO_DATABASE
        if 'role "' in lowered:
            return _AUTH
    for cause, signs in _BY_TEXT:
        if any(sign in lowered for sign in signs):
            return cause
    return None


def _unavailable(url: str, exc: BaseException, *, refused: BaseException | None = None,
                 pool_size: int | None = None, timeout: float | None = None,
                 ) -> StoreUnavailable:
    """One line for a server that cannot be reached, refuses us, or cannot take a write,
    with the advice that fits its cause (never the URL's password). ``refused``: what the
    last try to connect said, for a wait for a connection that ran out (``exc``, a
    PoolTimeout, says nothing of why)."""
    where = _where(url)
    waited = isinstance(exc, PoolTimeout)
    if waited and refused is not None:
        exc = refused
    said = _said(url, exc)
    cause = _cause(exc)
    after = f" within {timeout:g} s" if waited and timeout is not None else ""
    if cause == _AUTH:
        return StoreUnavailable(f"{where} refused the credentials in the store URL ({said}); "
                                "check its user name and password (or PGPASSWORD, ~/.pgpass)")
    if cause == _FULL:
        each = f" (each awl process opens up to 2 x {pool_size})" if pool_size else ""
        return StoreUnavailable(
            f"{where} is full: it refused a new connection{after} ({said}); nothing was "
            "written: raise the server's max_connections (or the role's CONNECTION LIMIT), "
            f"or lower {POOL_SIZE_ENV}{each} or run fewer awl processes against it")
    if cause == _UNREACHABLE:
        return StoreUnavailable(
            f"cannot reach {where}{after} ({said or 'no answer'}); is the server running at "
            f"{_address(url)}? Start it, or fix the host and port in the store URL")
    if cause == _READ_ONLY:
        return StoreUnavailable(
            f"{where} is read-only ({said}): a hot standby, or a role or database with "
            "default_transaction_read_only on; nothing was written: point the store URL at "
            "the primary server")
    if cause == _RESTARTING:
        return StoreUnavailable(f"{where} is restarting or shutting down ({said}); nothing "
                                "was written: retry once it is up")
    if cause == _DENIED:
        return StoreUnavailable(
            f"{where} refused the store URL's user ({said}); nothing was written: grant it "
            "the rights on the desk's schema and tables, or use the user that owns them")
    if cause == _NO_DATABASE:
        return StoreUnavailable(f"{where}: the database does not exist; create it (createdb) "
                                "or fix the store URL")
    if cause == _SLOW or waited:
        busy = (f"no connection of this process's {pool_size} came free" if waited else said)
        more = f", or raise {TIMEOUT_ENV} (now {timeout:g} s)" if timeout else ""
        return StoreUnavailable(f"{where} did not answer{after or ' in time'} ({busy}); "
                                f"nothing was written: retry{more}")
    if isinstance(exc, (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)):
        return StoreUnavailable(f"{where}: {said} (another session held what this one "
                                "needed); nothing was written, try again")
    return StoreUnavailable(f"{where}: {said}; nothing was written")


def _said(url: str, exc: BaseException) -> str:
    """What the server or libpq said, in one line, the URL's password never in it."""
    # The server's own one-line message, when it sent one (the last line of the text may
    # be a HINT that says nothing by itself).
    primary = getattr(getattr(exc, "diag", None), "message_primary", None)
    said = str(primary or _last_line(str(exc).strip()) or type(exc).__name__)
    with suppress(ValueError):
        password = urlsplit(url).password
        if password:
            said = said.replace(password, "***")
    return said


def _last_line(text: str) -> str:
    """The most telling line of a libpq message (its last non-empty one but a hint),
    shortened, without the address libpq repeats (the message names the server itself)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()
             and not line.strip().startswith(("Is the server running", "HINT:"))]
    line = _TRIED.sub("", lines[-1] if lines else "")
    for prefix in ("FATAL:", "ERROR:"):
        line = line.removeprefix(prefix).strip()
    return line[:200]


_TRIED = re.compile(r"^(connection failed: )?(connection to server (at|on) .*? failed: )?")
"""What libpq puts before the reason a connection failed."""


class _Pool(ConnectionPool[psycopg.Connection[Any]]):
    """A connection pool that keeps what its last failed try to connect said
    (``refused``, None once one succeeds), so a wait for a connection that runs out names
    the cause (the pool's own timeout says only that it waited)."""

    refused: BaseException | None = None
    trying = 0
    """How many tries to connect are under way (one to a server that does not answer at
    all waits for its connect_timeout)."""
    _counting = threading.Lock()  # the pool's workers connect in threads of their own

    def _connect(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        # psycopg_pool's one place that opens a connection (and runs ``configure``).
        with self._counting:
            self.trying += 1
        try:
            conn = super()._connect(timeout)
        except Exception as exc:
            self.refused = exc
            raise
        finally:
            with self._counting:
                self.trying -= 1
        self.refused = None
        return conn

    def schedule_task(self, task: MaintenanceTask, delay: float) -> None:
        # The pool tries again after 1, 2, 4, ... s: after an outage of half a minute, calls
        # would fail that long again once the server is back. Every RETRY_EVERY at most.
        if isinstance(task, AddConnection):
            delay = min(delay, RETRY_EVERY)
        super().schedule_task(task, delay)


def _set_waits(conn: psycopg.Connection[Any], ms: int) -> None:
    """Bound the lock waits and statements of ``conn`` to ``ms`` milliseconds each."""
    conn.execute("SELECT set_config('lock_timeout', %s, false),"
                 " set_config('statement_timeout', %s, false)", (f"{ms}ms", f"{ms}ms"))


class _HeldLock:
    """A lock this store holds: its record and the connection holding its advisory lock."""

    __slots__ = ("conn", "info")

    def __init__(self, conn: psycopg.Connection[Any], info: LockInfo) -> None:
        self.conn = conn
        self.info = info


class PostgresStore(SQLStore):
    """A :class:`awl.store.protocol.Store` in a PostgreSQL database, safe across hosts.

    Args:
        url: ``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` (any libpq connection URL).
        pool_size: The most connections each of the two pools opens.
        timeout: The bound on every wait of one operation on the store (or of the store
            work :meth:`bounded` encloses, a gateway call's admission say), in seconds from
            its start: for a free connection (a server out of reach, full or restarting is
            tried again meanwhile), for a row another writer holds, and for the server's
            answer. Past it the operation fails in one line naming the cause.

    Raises:
        StoreUnavailable: The server cannot be reached, refuses the credentials, or the
            database was made by a newer version of this library (nothing is written then).
    """

    in_process = False
    """Its calls wait for a server: a gateway runs them in worker threads (GW-20)."""

    dialect = DIALECT
    track_fields = _TRACK_FIELDS
    queued_rows = _QUEUED

    def __init__(self, url: str, *, pool_size: int = 8, timeout: float = 30.0) -> None:
        self.url = url
        self._timeout = timeout
        self._pool_size = pool_size
        self._local = threading.local()
        """This thread's deadline (``deadline``), set by :meth:`bounded`."""
        self._where = _where(url)
        # Each connection names its host and process (pg_stat_activity shows which gateway
        # on which host holds what), unless the URL names one itself.
        named = conninfo_to_dict(url).get("application_name")
        self._application = (str(named) if named else
                             f"awl {socket.gethostname()} pid {os.getpid()}"[:63])
        self._guard = threading.Lock()
        self._held: dict[str, _HeldLock] = {}
        self._spare: psycopg.Connection[Any] | None = None
        """A connection that tried for a lock and did not get it, for the next try."""
        self._freed: dict[str, tuple[str, LockInfo]] = {}
        """By lock name: the holder that took it and the dead holder's record it found."""
        self._closed = False
        self._layout = SCHEMA_VERSION
        """The schema this code writes; a desk migrated past it is refused (BIND-22)."""
        self._migrated = False
        """Set when a new connection finds the desk migrated past this code (BIND-22)."""
        self._listener: _Listener | None = None
        self._next_n: dict[str, int] = {}
        """Per order, the N its next call is likely to get (see :meth:`reserve_call`)."""
        self._lanes: dict[str, _Lane] = {}
        """Per order, the reservations waiting for a group commit (see :meth:`reserve_call`)."""
        self._lanes_guard = threading.Lock()
        self.reservation_batches = 0
        """How many group commits of two or more reservations this store has made."""
        self._endings: list[_Ending] = []
        """Outcomes waiting for the next group commit (see :meth:`finish_call`)."""
        self._endings_guard = threading.Lock()
        self._committer = threading.Lock()
        """Held by the thread committing a group of outcomes."""
        self.endings_batches = 0
        """How many group commits of outcomes this store has made."""
        try:
            with self._connect(autocommit=False) as conn:
                schema = conn.execute("SELECT current_schema()").fetchone()
                if schema is None or schema[0] is None:
                    raise StoreUnavailable(f"{self._where}: the schema the store URL's "
                                           "search_path names does not exist; create it first")
                self.schema: str = str(schema[0])
                self._migrate(conn)
        except _REFUSALS as exc:
            raise _unavailable(url, exc) from None
        self._space = _key(f"awl:{self.schema}")
        self.channel = f"awl_events_{self._space & 0xFFFFFFFF:08x}"
        """The ``NOTIFY`` channel events are announced on."""
        # The URL's own options (a search_path, say) come first; ours are added to them.
        given = str(conninfo_to_dict(url).get("options") or "")
        wait = int(timeout * 1000)
        options = f"{given} -c lock_timeout={wait} -c statement_timeout={wait}".strip()
        self._pools = {
            durable: _Pool(
                url, min_size=1, max_size=pool_size, timeout=timeout, open=True,
                name=f"awl-{'write' if durable else 'read'}", configure=self._mark_open,
                kwargs={"options": f"{options} -c synchronous_commit=on",
                        "application_name": self._application,
                        "connect_timeout": self._connect_timeout,
                        # A server that stops answering (its host gone) is given up on
                        # once data sent to it stays unacknowledged this long.
                        "tcp_user_timeout": wait, "autocommit": True})
            for durable in (True, False)
        }

    @property
    def _connect_timeout(self) -> int:
        return max(1, min(CONNECT_TIMEOUT, int(self._timeout)))

    @contextmanager
    def bounded(self) -> Iterator[None]:
        """Every wait on the store in this thread inside this ends within the store's
        timeout of entering it (a nested one: within the outer one's), so work made of
        several operations (a gateway call's admission) is bounded as one is."""
        if getattr(self._local, "deadline", None) is not None:
            yield
            return
        self._local.deadline = time.monotonic() + self._timeout
        try:
            yield
        finally:
            self._local.deadline = None

    def _left(self) -> float:
        """Seconds left of this thread's bound (the whole timeout outside one)."""
        deadline = getattr(self._local, "deadline", None)
        return self._timeout if deadline is None else max(0.0, deadline - time.monotonic())

    def _waited(self) -> StoreUnavailable:
        """The error for a bound that ran out waiting on this process's own other work."""
        return _unavailable(self.url, PoolTimeout(), refused=self._refused(),
                            pool_size=self._pool_size, timeout=self._timeout)

    def _refused(self) -> BaseException | None:
        """What the pools' last try to connect said, if it failed (a try still waiting for
        the server's first answer: that it has none yet)."""
        pools = getattr(self, "_pools", {})
        said = next((pool.refused for pool in pools.values() if pool.refused), None)
        if said is None and any(pool.trying for pool in pools.values()):
            return psycopg.OperationalError("no answer yet: connection timed out")
        return said

    def _hold(self, lock: threading.Lock) -> bool:
        """Take ``lock`` within this thread's bound; False when it ran out."""
        return lock.acquire(timeout=max(self._left(), 0.001))

    # Connections and transactions -------------------------------------------------------
    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        """A connection of its own (outside the pools)."""
        return psycopg.connect(self.url, autocommit=autocommit,
                               connect_timeout=self._connect_timeout,
                               application_name=self._application)

    @contextmanager
    def _tx(self, *, durable: bool = True) -> Iterator[psycopg.Connection[Any]]:
        """One transaction on a pooled connection: COMMIT on success, ROLLBACK on error.

        ``durable=False`` takes a connection of the read pool (its commits are synchronous
        too: nothing the store writes ever commits asynchronously). A lost server, a
        deadlock or a row held past the timeout become one-line errors; nothing of the
        transaction is written then (or, for a connection lost during COMMIT, nothing is
        known to be).
        """
        with self._errors(), self._pooled(durable) as conn, conn.transaction():
            yield conn

    @contextmanager
    def _statement(self, *, durable: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one statement, its own transaction: one round trip, where
        BEGIN and COMMIT would add two (the gateway's per-call reads and outcomes)."""
        with self._errors(), self._pooled(durable) as conn:
            yield conn

    @contextmanager
    def _pooled(self, durable: bool) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the write (``durable``) or read pool, given back after.

        One the server ended while it sat idle (a restart) is closed and another taken, so
        a restart fails no call; a new connection the server ends at once fails the call
        with the server's reason.
        """
        pool = self._pools[durable]
        conn = self._getconn(pool)
        for _ in range(pool.max_size):
            if _still_open(conn):
                break
            conn.close()
            pool.putconn(conn)  # the pool lets it go and opens another
            conn = self._getconn(pool)
        # A connection that came late: its statements wait only what is left of the bound.
        short = int(self._left() * 1000) if self._left() < self._timeout - 1 else None
        try:
            self._refuse_if_migrated()  # what a new connection just found
            if short is not None:
                _set_waits(conn, max(short, 1))
            with conn:
                yield conn
        finally:
            if short is not None:
                with suppress(psycopg.Error):
                    _set_waits(conn, int(self._timeout * 1000))
            pool.putconn(conn)

    def _getconn(self, pool: _Pool) -> psycopg.Connection[Any]:
        """A connection of ``pool`` within this thread's bound; PoolTimeout past it (at
        once when the server refused the credentials: waiting will not change them)."""
        left = self._left()
        if left <= 0 or (pool.refused is not None and _cause(pool.refused) == _AUTH
                         and pool.get_stats().get("pool_size", 0) == 0):
            raise PoolTimeout("no time left")
        return pool.getconn(timeout=left)

    def _write(self, *, durable: bool = True) -> AbstractContextManager[psycopg.Connection[Any]]:
        """One write transaction (see :meth:`_tx`)."""
        return self._tx(durable=durable)

    def _read(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """One read transaction, on the read pool (``READ COMMITTED``: each statement
        sees what was committed when it began)."""
        return self._tx(durable=False)

    @contextmanager
    def _snapshot(self) -> Iterator[psycopg.Connection[Any]]:
        """A read transaction whose statements all see one snapshot."""
        with self._tx(durable=False) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn

    def _among(self, page: str, params: list[Any], ids: list[str]) -> tuple[str, list[Any]]:
        return "= ANY(%s)", [ids]

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """A lost server, a deadlock or a row held past the timeout as one-line errors."""
        if self._closed:
            raise StoreUnavailable(f"the desk store at {self._where} is closed")
        try:
            with self.bounded():
                yield
        except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure,
                pg_errors.LockNotAvailable) as exc:
            raise Conflict(f"{self._where} was busy ({_last_line(str(exc))}); nothing was "
                           "written, retry") from None
        except psycopg.DataError as exc:
            # U+0000 (NUL), which PostgreSQL keeps in no text (in jsonb the server refuses
            # it, in a text parameter psycopg does): the writer's data is at fault, not the
            # server, and nothing was written.
            if not isinstance(exc, pg_errors.UntranslatableCharacter) and "NUL" not in str(exc):
                raise
            raise BadRequest(f"{self._where} cannot keep the character U+0000 (NUL) this "
                             "holds; nothing was written: leave it out") from None
        except (*_REFUSALS, PoolTimeout) as exc:
            raise _unavailable(self.url, exc, refused=self._refused(),
                               pool_size=self._pool_size, timeout=self._timeout) from None

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Bring the schema up to :data:`SCHEMA_VERSION`, once, whoever opens it first, and
        only while no process of an older awl has the desk open (BIND-22): each pooled
        connection holds the open mark (an advisory lock) shared, and migrating takes it
        alone for the migrating transaction."""
        desk = f"the desk at {self._where}"
        with conn.transaction():
            # Held to the end of this transaction: a second process opening a new database
            # waits here, then finds it migrated.
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (_key(f"awl:{self.schema}"),))
            version = _desk_version(conn)
            if version is not None and version < SCHEMA_VERSION:
                got = conn.execute("SELECT pg_try_advisory_xact_lock(%s, 0)",
                                   (self._open_key,)).fetchone()
                if not (got and got[0]):
                    raise self._open_elsewhere(desk, version, SCHEMA_VERSION,
                                               _holders(conn, self._open_key))
            if version != SCHEMA_VERSION:  # a desk as this code writes it needs no DDL (a
                _settle_early_layouts(conn)  # standby, read-only, still opens for reading)
                self._upgrade(conn, MIGRATIONS, desk)
        conn.commit()

    @property
    def _open_key(self) -> int:
        """The advisory lock every pooled connection holds shared: the desk is open here."""
        return _key(f"awl-open:{self.schema}")

    def _mark_open(self, conn: psycopg.Connection[Any]) -> None:
        """A new pooled connection: mark the desk open on it, then check that the desk was
        not migrated past this code meanwhile (BIND-22). Only a new connection can see
        that: while any of this store's connections holds the mark, nobody migrates."""
        conn.execute("SELECT pg_advisory_lock_shared(%s, 0)", (self._open_key,))
        self._check_layout(conn)

    def _check_layout(self, conn: psycopg.Connection[Any]) -> None:
        if _desk_version(conn) != self._layout:
            self._migrated = True

    def _refuse_if_migrated(self) -> None:
        if self._migrated:
            raise StoreUnavailable(
                f"the desk at {self._where} was migrated past schema version {self._layout} "
                "by a newer awl while this process had it open; nothing more is written from "
                "here: restart this process with the newer awl-gateway")

    def close(self) -> None:
        """Close every connection (which lets go of every lock held); calls after this
        raise."""
        with self._guard:
            if self._closed:
                return
            self._closed = True
            held, self._held = list(self._held.values()), {}
            listener, self._listener = self._listener, None
            spare, self._spare = self._spare, None
        for lock in held:
            lock.conn.close()
        if spare is not None:
            spare.close()
        if listener is not None:
            listener.stop()
        for pool in self._pools.values():
            pool.close()

    # Orders and their logs -----------------------------------------------------------
    def _announce(self, conn: Connection, order_id: str, seq: int) -> None:
        """Tell every listener, when this transaction commits, that the order moved."""
        conn.execute("SELECT pg_notify(%s, %s)", (self.channel, f"{seq}:{order_id}"))

    def _tally(self, conn: Connection, worker: str, manager: str, order_id: str,
               old: TrackRow | None, new: TrackRow) -> None:
        """Apply a write that turned the order's row ``old`` into ``new`` to the tallies."""
        with cast(psycopg.Connection[Any], conn).cursor() as cur:
            write_sql(cur.executemany, "%s", worker, manager, order_id, old, new)

    def _below(self, conn: Connection, ids: list[str]) -> dict[str, int]:
        return _active_below(cast(psycopg.Connection[Any], conn), ids)

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
            clauses.append("state = ANY(%s)")
            params.append(states)
        if before is not None:
            clauses.append("pos < %s")
            params.append(self._position(before))
        # The page's positions first, by an index-only scan of a narrow index (by state; by
        # worker, manager or parent, with a state or not; or by position, with states or
        # not): a deep offset walks index entries, never documents.
        page, values = DIALECT.page(clauses, params, (("worker", worker), ("manager", manager),
                                                      ("parent_id", parent_id)), party)
        return self._records(f"WHERE pos IN ({page})", [*values, limit, offset], None, 0)

    # Gateway call records --------------------------------------------------------------
    @staticmethod
    def _lock_order(conn: psycopg.Connection[Any], order_id: str,
                    seq: int | None = None) -> _Row:
        """Lock the order's row and read its totals; NotFound if absent, and
        :func:`stale_order` when its log is no longer at ``seq``."""
        row = conn.execute(_LOCK_ORDER, (order_id,)).fetchone()
        if row is None:
            raise order_not_found(order_id)
        actual, last_n, calls, usd, _first, parent_id, sub_calls, sub_usd = row
        if seq is not None and actual != seq:
            raise stale_order(order_id, seq, actual)
        return _Row(actual, last_n, calls, usd, parent_id, sub_calls, sub_usd)

    @staticmethod
    def _lock_above(conn: psycopg.Connection[Any], order_id: str,
                    ) -> list[tuple[str, float | None, float | None, int, float]]:
        """Lock the orders above ``order_id``, parent first, and read their limits and
        charges; each once (a cycle, only possible in a damaged store, ends at the first
        repeat)."""
        chain = [row[0] for row in conn.execute(_CHAIN, (order_id, MAX_CHAIN)).fetchall()]
        found: dict[str, tuple[str, float | None, float | None, int, float]] = {}
        for above_id in chain:
            if above_id in found or above_id == order_id:
                break
            row = conn.execute(_LOCK_ABOVE, (above_id,)).fetchone()
            if row is None:  # a parent that was never stored ends the chain
                break
            found[above_id] = (str(row[0]), row[1], row[2], int(row[3]), float(row[4]))
        return list(found.values())

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
        """Atomically number and record a call that counts, or name the scope it exceeds.

        Durable (``synchronous_commit=on``): a count is never lost, not even to a crash of
        the server. Usually one statement (see ``_RESERVE``), numbering the call after the
        last one this store numbered for the order; reservations of one order that arrive
        while another is being written are written together, in one transaction and one
        flush (:meth:`_reserve_group`); else (the first call, a sub-order, pass budgets, or
        other gateways numbering calls in between) one transaction that locks and reads,
        then writes."""
        with self.bounded():
            return self._reserve(order_id, attempt=attempt, tool=tool, arguments=arguments,
                                 pass_jti=pass_jti, usd=usd, started_at=started_at,
                                 scopes=scopes, seq=seq)

    def _reserve(self, order_id: str, *, attempt: int, tool: str, arguments: dict[str, Any],
                 pass_jti: str | None, usd: float, started_at: str, scopes: Sequence[Scope],
                 seq: int | None) -> Reservation:
        limited = [sc for sc in scopes if sc.max_calls is not None or sc.max_usd is not None]
        guess = self._next_n.get(order_id)
        if guess is not None and len(limited) <= 1 and all(sc.jtis is None for sc in limited):
            done = self._reserve_grouped(order_id, _Reserving(
                attempt, tool, arguments, pass_jti, usd, started_at,
                limited[0] if limited else None, seq))
            if done is not None:
                return done
        with self._tx() as conn:
            row = self._lock_order(conn, order_id, seq)

            def spent(jtis: frozenset[str] | None) -> tuple[int, float]:
                if jtis is None:
                    return row.calls + row.sub_calls, row.usd + row.sub_usd
                got = conn.execute(_PASS_SPENT, (order_id, sorted(jtis))).fetchone()
                return (0, 0.0) if got is None else (int(got[0]), float(got[1]))

            over = exceeded_scope(scopes, spent, usd)
            above = [] if row.parent_id is None else self._lock_above(conn, order_id)
            over = over or exceeded_above(above, usd)
            if over is not None:
                return OverBudget(over)
            data = new_call(order_id, row.last_n + 1, attempt=attempt, tool=tool,
                            arguments=arguments, pass_jti=pass_jti, started_at=started_at)
            doc = _call_doc(data)
            self._insert_call(conn, data, doc, row.last_n + 1, counted=True, usd=usd,
                              above=[a[0] for a in above])
        self._numbered(order_id, row.last_n + 1, row.parent_id)
        return Reserved(data["ref"], data["attempt"], partial(read_call, doc))

    def _numbered(self, order_id: str, n: int, parent_id: str | None) -> None:
        """Remember that call ``n`` is the order's last, to number the next one at once;
        a sub-order's reservations always take the general path."""
        if parent_id is None:
            self._next_n[order_id] = n + 1
        else:
            self._next_n.pop(order_id, None)

    def _reserve_grouped(self, order_id: str, item: _Reserving) -> Reservation | None:
        """Group commit of an order's reservations: ``item`` waits for the thread writing
        the order's reservations (at most one per order in this store), then is written
        with every other one that waited meanwhile; the answer for ``item``, or None for
        the general path."""
        with self._lanes_guard:
            lane = self._lanes.get(order_id)
            if lane is None:
                lane = self._lanes[order_id] = _Lane([], threading.Lock())
            lane.waiting.append(item)
        if not self._hold(lane.committer):
            with self._lanes_guard:
                if item in lane.waiting:  # nobody took it: nothing of it is written
                    lane.waiting.remove(item)
                    raise self._waited()
            lane.committer.acquire()  # being written: its writer is bounded, wait for it
        try:
            if not item.done:
                with self._lanes_guard:
                    batch, lane.waiting = lane.waiting, []
                self._reserve_batch(order_id, batch)
        finally:
            lane.committer.release()
        if item.error is not None:
            raise item.error
        return item.result

    def _reserve_batch(self, order_id: str, batch: list[_Reserving]) -> None:
        """Write the reservations of ``batch``: one alone in one statement, two or more in
        one transaction; each item done, with its answer or error."""
        try:
            if len(batch) == 1:
                item = batch[0]
                guess = self._next_n.get(order_id)
                if guess is not None:
                    item.result = self._reserve_at_once(
                        order_id, guess, item.scope, attempt=item.attempt, tool=item.tool,
                        arguments=item.arguments, pass_jti=item.pass_jti, usd=item.usd,
                        started_at=item.started_at, seq=item.seq)
            else:
                self._reserve_group(order_id, batch)
        except BaseException as exc:  # nothing of the batch is known to be written
            for item in batch:
                item.result, item.error = None, exc
        finally:
            for item in batch:
                item.done = True

    def _reserve_group(self, order_id: str, batch: list[_Reserving]) -> None:
        """Number and write two or more reservations of one order in one transaction, in
        the order they arrived, each checked against its scope with the calls before it in
        the group counted: exact, as one at a time would be. The order's row is the only
        one locked, as :meth:`_reserve_at_once` locks it; a sub-order's go the general way.

        Two round trips whatever the group's size, in one pipeline: BEGIN with the lock and
        read of the order's row, then every insert with the COMMIT, whose answer (the group
        on disk, or the first error, and nothing written) ends the pipeline.
        """
        with self._statement(durable=True) as conn, conn.pipeline():
            conn.execute("BEGIN")
            row = self._lock_order(conn, order_id)  # raises: rolled back as the with ends
            if row.parent_id is not None:  # charges the orders above: the general way
                conn.execute("ROLLBACK")
                self._numbered(order_id, row.last_n, row.parent_id)
                return
            n, calls, used = row.last_n, row.calls + row.sub_calls, row.usd + row.sub_usd
            for item in batch:
                if item.seq is not None and row.seq != item.seq:
                    item.error = stale_order(order_id, item.seq, row.seq)
                    continue
                scope = item.scope
                if scope is not None and over_limit(
                        calls, used, item.usd, max_calls=scope.max_calls,
                        max_usd=scope.max_usd) is not None:
                    item.result = OverBudget(scope.name)
                    continue
                try:
                    data = new_call(order_id, n + 1, attempt=item.attempt, tool=item.tool,
                                    arguments=item.arguments, pass_jti=item.pass_jti,
                                    started_at=item.started_at)
                    doc = _call_doc(data)
                except BadRequest as exc:
                    item.error = exc
                    continue
                self._insert_call(conn, data, doc, n + 1, counted=True, usd=item.usd,
                                  above=[])
                n, calls, used = n + 1, calls + 1, used + item.usd
                item.result = Reserved(data["ref"], data["attempt"], partial(read_call, doc))
            conn.execute("COMMIT")
        if n > row.last_n:
            self._numbered(order_id, n, None)
        self.reservation_batches += 1

    def _reserve_at_once(self, order_id: str, n: int, scope: Scope | None, *, attempt: int,
                         tool: str, arguments: dict[str, Any], pass_jti: str | None,
                         usd: float, started_at: str, seq: int | None) -> Reservation | None:
        """:meth:`reserve_call` in one statement, numbering the call ``n``; None when it
        takes the general path after all (a sub-order, or the number taken each try)."""
        started = timestamp(started_at)
        for _ in range(_FAST_TRIES):
            data = new_call(order_id, n, attempt=attempt, tool=tool, arguments=arguments,
                            pass_jti=pass_jti, started_at=started_at)
            doc = _call_doc(data)
            with self._statement(durable=True) as conn:
                got = conn.execute(_RESERVE, {
                    "order_id": order_id, "n": n, "seq": seq, "jti": pass_jti,
                    "attempt": attempt, "usd": usd, "adds": 1, "started": started,
                    "at": started_at, "doc": doc, "tolerance": USD_TOLERANCE,
                    "max_calls": None if scope is None else scope.max_calls,
                    "max_usd": None if scope is None else scope.max_usd}).fetchone()
            if got is None:
                raise order_not_found(order_id)
            actual, last_n, calls, used, parent_id, wrote = got
            if wrote:
                self._numbered(order_id, n, None)
                return Reserved(data["ref"], data["attempt"], partial(read_call, doc))
            if seq is not None and actual != seq:
                raise stale_order(order_id, seq, actual)
            if parent_id is not None:
                self._numbered(order_id, n, parent_id)
                return None
            if last_n + 1 == n:  # it did not fit: the shared rule names the scope
                assert scope is not None
                over = over_limit(int(calls), float(used), usd, max_calls=scope.max_calls,
                                  max_usd=scope.max_usd)
                return None if over is None else OverBudget(scope.name)
            n = last_n + 1
        return None

    @staticmethod
    def _insert_call(conn: psycopg.Connection[Any], call: Mapping[str, Any], doc: str, n: int,
                     *, counted: bool, usd: float, above: Sequence[str]) -> None:
        """Store a new call (its record's JSON data ``call`` and text ``doc``) numbered ``n``
        with the order's totals through it, add it to its pass's totals, and charge it to
        every order above."""
        order_id, pass_jti, at = call["order_id"], call.get("pass_jti"), call["started_at"]
        started = timestamp(at)
        spends = usd if counted else 0.0
        conn.execute(_INSERT_CALL, {
            "order_id": order_id, "n": n, "jti": pass_jti,
            "attempt": call["attempt"], "counted": counted, "usd": spends, "started": started,
            "doc": doc, "adds": 1 if counted else 0, "at": at})
        if pass_jti is not None:
            conn.execute(_ADD_TO_PASS_TOTALS, (order_id, pass_jti,
                                               1 if counted else 0, spends, started, n,
                                               at))
        if above:
            conn.execute(_CHARGE, {"calls": 1 if counted else 0, "usd": spends,
                                   "started": started, "at": at,
                                   "ids": list(above)})

    def record_call(self, record_fields: dict[str, Any]) -> CallRecord:
        """Number and store a call that does not count (a refusal). Durable."""
        order_id = record_order_id(record_fields)
        with self._tx() as conn:
            row = self._lock_order(conn, order_id)
            record, doc = stored_call(record_fields, row.last_n + 1)
            doc = _call_doc(record.to_json()) if "\\u0000" in doc else doc
            above = [] if row.parent_id is None else self._lock_above(conn, order_id)
            self._insert_call(conn, record.to_json(), doc, row.last_n + 1, counted=False,
                              usd=0.0,
                              above=[a[0] for a in above])
        self._numbered(order_id, row.last_n + 1, row.parent_id)
        return record

    def _keepable(self, answer: _A) -> _A:
        """An effect's result or error as PostgreSQL can keep it: a U+0000 (NUL) in what the
        upstream answered becomes U+FFFD, so an effect that ran is still recorded as such
        (:func:`_answer_text`)."""
        if answer is None:
            return answer
        text = _answer_text(answer, "an upstream's answer")
        if "\\ufffd" not in text:
            return answer
        kept: _A = json.loads(text)
        return kept

    def finish_call(
        self, order_id: str, ref: str, *, outcome: str, result: dict[str, Any] | None,
        error: str | None, ended_at: str,
    ) -> None:
        """Set the outcome of a reserved call. Durable."""
        check_ending(outcome, result, error, ended_at)
        n, tool = call_number(order_id, ref)
        # The stored record was valid when written and the new fields are checked above, so
        # they are set in its document (unset ones removed), only while the call is still
        # pending, in one statement: its own transaction, one round trip (and one flush).
        ending: dict[str, Any] = {"outcome": outcome, "ended_at": ended_at}
        if result is not None:
            ending["result"] = result
        if error is not None:
            ending["error"] = error
        item = _Ending(order_id, n, tool, _ending_doc(ending))
        # Group commit: the outcomes waiting when the committer's turn comes are set in one
        # statement, one round trip and one flush; each caller returns once its own is on
        # disk (or raises what that statement raised).
        with self._endings_guard:
            self._endings.append(item)
        with self.bounded():
            if not self._hold(self._committer):
                with self._endings_guard:
                    if item in self._endings:  # nobody took it: nothing of it is written
                        self._endings.remove(item)
                        raise self._waited()
                self._committer.acquire()  # being written: its writer is bounded, wait
            try:
                if not item.done:
                    with self._endings_guard:
                        batch, self._endings = self._endings, []
                    self._set_endings(batch)
            finally:
                self._committer.release()
        if item.error is not None:
            raise item.error
        if not item.changed:
            with self._tx(durable=False) as conn:
                _, old = self._call_data(conn, order_id, ref)  # NotFound if there is none
            raise outcome_conflict(order_id, ref, old["outcome"])

    def _set_endings(self, batch: list[_Ending]) -> None:
        """Set every ending of ``batch`` whose call is still pending, in one statement (the
        same call twice in one batch: the first ending only, the other finds it set)."""
        first = list({(e.order_id, e.n): e for e in reversed(batch)}.values())
        try:
            with self._statement(durable=True) as conn:
                if len(first) == 1:
                    e = first[0]
                    rows = conn.execute(_SET_ENDING, (e.text, e.order_id, e.n, e.tool))
                else:
                    rows = conn.execute(_SET_ENDINGS, (
                        [e.order_id for e in first], [e.n for e in first],
                        [e.tool for e in first], [e.text for e in first]))
                set_now = {(str(o), int(n)) for o, n in rows.fetchall()}
        except BaseException as exc:
            for e in batch:
                e.error, e.done = exc, True
            return
        sent = {id(e) for e in first}
        for e in batch:
            e.changed, e.done = id(e) in sent and (e.order_id, e.n) in set_now, True
        self.endings_batches += 1

    def usage(self, order_id: str, jtis: frozenset[str] | None = None) -> Usage:
        """Counted calls and USD so far (for the calls under ``jtis`` if given)."""
        with self._tx(durable=False) as conn:
            row = conn.execute(f"SELECT {_ORDER_USAGE} FROM orders WHERE id = %s",
                               (order_id,)).fetchone()
            if row is None:
                raise order_not_found(order_id)
            if jtis is None:
                return Usage(tool_calls=int(row[0]), usd=float(row[1]), first_call_at=row[2])
            got = conn.execute(
                "SELECT COALESCE(SUM(calls), 0), COALESCE(SUM(usd), 0),"
                " (ARRAY_AGG(first_at ORDER BY first_started, first_n))[1]"
                " FROM pass_totals WHERE order_id = %s AND jti = ANY(%s)",
                (order_id, sorted(jtis)),
            ).fetchone()
        assert got is not None
        return Usage(tool_calls=int(got[0]), usd=float(got[1]), first_call_at=got[2])

    # Locks ----------------------------------------------------------------------------
    def _lock_keys(self, name: str) -> tuple[int, int]:
        return self._space, _key(name)

    def acquire_lock(self, info: LockInfo, *, replace: LockInfo | None = None) -> bool:
        """Take the named lock if free, or if it is still exactly ``replace``.

        The lock is free when no live connection holds its advisory lock, whatever record
        a dead holder left. A takeover of a live holder (its lease ran out) ends the
        holder's lock connection, so the holder can no longer renew.
        """
        check_takeover(info, replace)
        mine = stored_lock(info)
        with self._guard:
            held = self._held.get(info.name)
        if held is not None and replace is not None and held.info == stored_lock(replace):
            return self._renew(held, mine)
        with self._guard:
            conn, self._spare = self._spare, None
        try:
            if conn is None or conn.closed:
                conn = self._connect(autocommit=True)
                self._check_layout(conn)
        except psycopg.OperationalError as exc:
            raise _unavailable(self.url, exc) from None
        try:
            self._refuse_if_migrated()
            taken, freed = self._take(conn, mine, replace)
        except BaseException:
            conn.close()
            raise
        with self._guard:
            self._freed.pop(info.name, None)
            if freed is not None:
                self._freed[info.name] = (mine.holder, freed)
        if not taken:
            # Kept for the next attempt: a committer waiting for a busy lock asks ten
            # times a second, and a new connection costs a login each time.
            with self._guard:
                if self._spare is None and not self._closed:
                    conn, self._spare = None, conn
            if conn is not None:
                conn.close()
            return False
        with self._guard:
            old = self._held.pop(info.name, None)
            self._held[info.name] = _HeldLock(conn, mine)
        if old is not None:
            old.conn.close()
        return True

    def _take(self, conn: psycopg.Connection[Any], mine: LockInfo,
              replace: LockInfo | None) -> tuple[bool, LockInfo | None]:
        """Take the advisory lock on ``conn`` and write the record: whether it was taken,
        and the record of a holder whose lock the server had freed (see :meth:`freed_lock`)."""
        space, key = self._lock_keys(mine.name)
        got = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (space, key)).fetchone()
        freed = None
        if got and got[0]:
            # A record left beside a free advisory lock is a holder that never let go (a
            # release deletes it first): its connection ended with its process.
            row = conn.execute("SELECT doc::text FROM locks WHERE name = %s",
                               (mine.name,)).fetchone()
            left = None if row is None else read_lock(row[0])
            freed = left if left is not None and left.holder != mine.holder else None
        else:
            current = self._live_lock(conn, mine.name)
            if current is None or not may_take(current[0], replace):
                return False, None
            # A takeover: end the holder's lock connection, then wait for its lock.
            self._drop_local(mine.name, current[1])
            conn.execute("SELECT pg_terminate_backend(%s)", (current[1],))
            deadline = time.monotonic() + _TAKEOVER_WAIT
            while True:
                got = conn.execute("SELECT pg_try_advisory_lock(%s, %s)",
                                   (space, key)).fetchone()
                if got and got[0]:
                    break
                if time.monotonic() > deadline:
                    return False, None
                time.sleep(0.01)
            # Between its end and our lock, someone else may have taken it and let go.
            with conn.transaction():
                row = conn.execute("SELECT doc::text FROM locks WHERE name = %s FOR UPDATE",
                                   (mine.name,)).fetchone()
                if row is not None and read_lock(row[0]) != current[0]:
                    conn.execute("SELECT pg_advisory_unlock(%s, %s)", (space, key))
                    return False, None
        conn.execute(
            "INSERT INTO locks (name, doc, backend) VALUES (%s, %s::jsonb, pg_backend_pid())"
            " ON CONFLICT (name) DO UPDATE SET doc = excluded.doc, backend = excluded.backend",
            (mine.name, lock_doc(mine)))
        return True, freed

    def freed_lock(self, name: str, holder: str) -> LockInfo | None:
        """The record of the holder whose lock the server freed (its connection ended
        without releasing it) when ``holder`` took the named lock through this store."""
        with self._guard:
            found = self._freed.get(name)
        return found[1] if found is not None and found[0] == holder else None

    def _drop_local(self, name: str, backend: int) -> None:
        """Forget a lock this store held on ``backend`` (it is being taken over)."""
        with self._guard:
            held = self._held.get(name)
            if held is not None and held.conn.info.backend_pid == backend:
                del self._held[name]
            else:
                held = None
        if held is not None:
            held.conn.close()

    def _renew(self, held: _HeldLock, mine: LockInfo) -> bool:
        """Write a new record of a lock we hold, on its own connection: if that connection
        is gone, so is the lock, and the renewal fails."""
        try:
            with held.conn.transaction():
                row = held.conn.execute(
                    "UPDATE locks SET doc = %s::jsonb WHERE name = %s AND backend ="
                    " pg_backend_pid() RETURNING 1", (lock_doc(mine), mine.name),
                ).fetchone()
        except psycopg.Error:
            row = None
        if row is None:
            self._drop_local(mine.name, held.conn.info.backend_pid)
            return False
        held.info = mine
        return True

    def _live_lock(self, conn: psycopg.Connection[Any], name: str,
                   ) -> tuple[LockInfo, int] | None:
        """The named lock's record and backend, if a live connection holds its advisory
        lock."""
        space, key = self._lock_keys(name)
        row = conn.execute(
            "SELECT l.doc::text, l.backend FROM locks AS l WHERE l.name = %s AND EXISTS ("
            " SELECT 1 FROM pg_locks AS p WHERE p.locktype = 'advisory'"
            " AND p.pid = l.backend AND p.granted AND p.objsubid = 2"
            " AND p.classid::int = %s AND p.objid::int = %s"
            " AND p.database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
            (name, space, key),
        ).fetchone()
        return None if row is None else (read_lock(row[0]), int(row[1]))

    def get_lock(self, name: str) -> LockInfo | None:
        """The current holder of the named lock, if a live connection holds it."""
        with self._tx(durable=False) as conn:
            found = self._live_lock(conn, name)
        return None if found is None else found[0]

    def release_lock(self, name: str, holder: str) -> None:
        """Release the lock if ``holder`` holds it."""
        with self._guard:
            held = self._held.get(name)
            if held is None or held.info.holder != holder:
                return
            del self._held[name]
        try:
            held.conn.execute("DELETE FROM locks WHERE name = %s AND backend = pg_backend_pid()",
                              (name,))
            # Let go of the advisory lock itself before closing: the server frees a closed
            # connection's locks only when its backend has exited, a moment later, and a
            # holder taking the lock meanwhile would find it busy with no record.
            held.conn.execute("SELECT pg_advisory_unlock(%s, %s)", self._lock_keys(name))
        except psycopg.Error:
            pass  # a dead connection held nothing any more
        finally:
            held.conn.close()

    # Public keys ----------------------------------------------------------------------------
    def publish_keys(self, jwks: Mapping[str, Any]) -> None:
        """Replace the desk's published public key set (durable), for verifiers on other
        hosts (see :class:`~awl.store.protocol.KeyDirectory`)."""
        text = json_text(dict(jwks), "a public key set")
        with self._tx() as conn:
            conn.execute("INSERT INTO public_keys (id, doc) VALUES (1, %s::jsonb)"
                         " ON CONFLICT (id) DO UPDATE SET doc = excluded.doc", (text,))

    def published_keys(self) -> dict[str, Any] | None:
        """The published public key set; None if none was ever published."""
        with self._tx(durable=False) as conn:
            row = conn.execute("SELECT doc::text FROM public_keys WHERE id = 1").fetchone()
        if row is None:
            return None
        found: dict[str, Any] = json.loads(row[0])
        return found

    # Subscriptions -----------------------------------------------------------------------
    def wait_for_events(self, order_id: str, after: int, timeout: float) -> bool:
        """Block until the order's log is past seq ``after`` (written by any process on any
        host), at most ``timeout`` seconds; whether it is past ``after`` now.

        A listening connection (one per store, started on first use) hears each event's
        ``NOTIFY`` as its transaction commits. NotFound if the order is absent.
        """
        deadline = time.monotonic() + timeout
        while True:
            listener = self._listening()
            listener.ready()  # listening before we read: no event can slip between
            with self._tx(durable=False) as conn:
                seq = self._seq(conn, order_id)
            if seq > after:
                return True
            if listener.wait(order_id, after, deadline - time.monotonic()):
                return True
            # Its connection ended during the wait (a restart): listen anew for the rest.
            if not listener.ended or time.monotonic() >= deadline:
                return False

    def _listening(self) -> _Listener:
        """The store's listener; a new one on the first wait, or once the server ended the
        last one's connection (a dead listener kept would make every wait return at once:
        its waiters would poll the server in a loop)."""
        with self._guard:
            if self._closed:
                raise StoreUnavailable(f"the desk store at {self._where} is closed")
            if self._listener is None or self._listener.ended:
                self._listener = _Listener(self)
            return self._listener


    # Copying a desk (the rest is shared: awl.store.sql) ---------------------------------
    _DESK_TABLES = (*SQLStore._DESK_TABLES, ("published keys", "public_keys"))

    def usages(self, order_ids: Sequence[str]) -> list[Usage]:
        """Each order's usage, in one statement."""
        ids = list(order_ids)
        with self._statement() as conn:
            rows = {row[0]: row[1:] for row in conn.execute(
                f"SELECT id, {_ORDER_USAGE} FROM orders WHERE id = ANY(%s)", (ids,))}
        for oid in ids:
            if oid not in rows:
                raise order_not_found(oid)
        return [Usage(tool_calls=int(rows[oid][0]), usd=float(rows[oid][1]),
                      first_call_at=rows[oid][2]) for oid in ids]

    def _among_ids(self, ids: list[str]) -> tuple[str, list[Any]]:
        return "= ANY(%s)", [ids]

    def _insert_rows(self, conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        assert isinstance(conn, psycopg.Connection)
        with conn.cursor() as cur:
            cur.executemany(sql, rows)

    @contextmanager
    def _restoring(self) -> Iterator[psycopg.Connection[Any]]:
        # Pipelined: the statements go out without waiting for each answer. The lock keeps
        # every other writer of these tables waiting (up to their lock timeout) till the
        # commit, so two copies into one database cannot both find it empty.
        with self._tx() as conn:
            with conn.pipeline():
                conn.execute("LOCK TABLE " + ", ".join(t for _, t in self._DESK_TABLES)
                             + " IN SHARE ROW EXCLUSIVE MODE")
                yield conn
            # The track tallies and the question queue, from the orders just written (with
            # COPY, which a pipeline cannot carry); then the planner's statistics, so the
            # first reads of a large new desk are planned for its size, not for empty tables.
            fill_current(conn)
            # Only this desk's tables: a bare ANALYZE reads (and locks, briefly) every
            # table of the database, other desks' schemas and other programs' included.
            tables = [name for (name,) in conn.execute(
                "SELECT quote_ident(tablename) FROM pg_tables"
                " WHERE schemaname = current_schema()").fetchall()]
            conn.execute("ANALYZE " + ", ".join(tables))

    def _restore_keys(self, conn: Connection, keys: Mapping[str, Any]) -> None:
        conn.execute("INSERT INTO public_keys (id, doc) VALUES (1, %s::jsonb)",
                     (json_text(dict(keys), "a public key set"),))

    def _restore_calls(self, conn: Connection, order: DeskOrder) -> None:
        assert isinstance(conn, psycopg.Connection)
        oid = order.record.order.id
        above: list[str] = []
        if order.calls and order.record.order.parent_id is not None:
            above = [a[0] for a in self._lock_above(conn, oid)]
        for n, (record, usd) in enumerate(zip(order.calls, order.charges, strict=True), start=1):
            check_restored_ref(record, n)
            data = record.to_json()
            self._insert_call(conn, data, dump_json(data), n,
                              counted=usd is not None, usd=usd or 0.0, above=above)

_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
"""U+0000 as compact JSON text writes it (an escape, not an escaped backslash before one)."""


def _call_doc(data: dict[str, Any]) -> str:
    """A call record's JSON text, as this store can keep it: PostgreSQL keeps no U+0000
    (NUL) in ``jsonb``, so a call whose arguments hold one is refused here, before a
    statement (or a group of other gateways' reservations) could fail on it. Its arguments
    are what the upstream would be sent, so they are never changed."""
    doc = json_text(data, "a call record")
    if "\\u0000" in doc and _NUL_ESCAPE.search(doc):
        raise BadRequest("the call holds the character U+0000 (NUL), which a PostgreSQL desk "
                         "cannot keep; nothing was recorded or sent: leave it out")
    return doc


def _answer_text(answer: Any, what: str) -> str:
    """What an upstream answered, as JSON text this store can keep: a U+0000 (NUL) in it is
    kept as U+FFFD, as ``jsonb`` keeps no NUL: a call or effect that ran must still be
    recorded (GW-7, CM-6)."""
    text = json_text(answer, what)
    if "\\u0000" in text:
        text = _NUL_ESCAPE.sub(lambda m: m.group(1) + "\\ufffd", text)
    return text


def _ending_doc(ending: dict[str, Any]) -> str:
    """A call's ending (what the upstream answered, or the error naming it) as JSON text
    this store can keep (:func:`_answer_text`)."""
    return _answer_text(ending, "a call's ending")


class _ClosedHere(logging.Filter):
    """Drops the pool's warning about a connection :meth:`PostgresStore._pooled` closed
    itself (the server had ended it): that is handled, not news for the operator. So are
    its warnings about each failed try to connect (several lines each, again and again
    while the server is away): the store keeps the last one, and the error of an operation
    that runs out of time names it in one line. ``AWL_DEBUG=1`` lets them through."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith("discarding closed connection"):
            return False
        return debugging() or not message.startswith(_RETRIED)


_RETRIED = ("error connecting in", "reconnection attempt in pool", "discarding broken")


logging.getLogger("psycopg.pool").addFilter(_ClosedHere())


class _LostMidway(logging.Filter):
    """Drops psycopg's warning that the rollback of a transaction whose connection was
    lost failed too (two lines, beside the operation's own one-line error, which says what
    happened); ``AWL_DEBUG=1`` lets it through."""

    def filter(self, record: logging.LogRecord) -> bool:
        return debugging() or not str(record.msg).startswith("error ignored in rollback")


logging.getLogger("psycopg").addFilter(_LostMidway())


def _still_open(conn: psycopg.Connection[Any]) -> bool:
    """Whether a pooled connection, idle until now, was not ended by the server.

    A server that restarts, or ends a backend (``pg_terminate_backend``, an idle timeout),
    says so on the connection and closes it. It sends nothing else to an idle pooled
    connection (they never ``LISTEN``), so only a connection with something to read costs
    a round trip to check; the others cost one ``poll(2)``. (The pool's own ``check`` would
    sleep a second, then two, ... after each connection that fails it.)
    """
    if conn.closed:
        return False
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    if not poller.poll(0):
        return True
    try:
        ConnectionPool.check_connection(conn)
    except psycopg.Error:
        return False
    return True


class _Listener:
    """A thread on a connection of its own that ``LISTEN``s to a store's channel and wakes
    the waiters of each order whose log moved."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self._cond = threading.Condition()
        self._seen: dict[str, int] = {}
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._stop = False
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._run, name="awl-pg-listen", daemon=True)
        self._thread.start()

    @property
    def ended(self) -> bool:
        """Whether it listens no more: it was stopped, its connection ended, or it could
        not connect."""
        return self._stop or self._error is not None

    def ready(self) -> None:
        """Wait until the channel is listened to; the store's error if it cannot be."""
        self._started.wait(CONNECT_TIMEOUT + 1)
        if self._error is not None:
            raise _unavailable(self._store.url, self._error)

    def _run(self) -> None:
        try:
            conn = self._store._connect(autocommit=True)
            self._conn = conn
            conn.execute(f'LISTEN "{self._store.channel}"')
        except psycopg.Error as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        with suppress(psycopg.Error):
            while not self._stop:
                for note in conn.notifies(timeout=0.2):
                    seq_text, _, order_id = note.payload.partition(":")
                    with self._cond:
                        if int(seq_text) > self._seen.get(order_id, 0):
                            self._seen[order_id] = int(seq_text)
                        self._cond.notify_all()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        conn.close()

    def wait(self, order_id: str, after: int, timeout: float) -> bool:
        """Whether an event of the order past ``after`` was heard within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._seen.get(order_id, 0) <= after and not self._stop:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self._seen.get(order_id, 0) > after

    def stop(self) -> None:
        self._stop = True
        self._thread.join(2)
