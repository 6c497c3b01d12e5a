"""What the SQL backends share: the reads and writes whose SQL is the same on SQLite and on
PostgreSQL but for its spelling, written once in :class:`SQLStore`.

A backend subclasses :class:`SQLStore` and gives it two things:

- its :class:`Dialect`: the parameter mark, how a JSON document column is read and a JSON
  parameter written, the row locks a write takes, how "no limit" is said;
- its transactions: ``_write(durable=…)`` (one write transaction; ``durable=False`` is the
  crash-safe kind, see :mod:`awl.store.protocol`), ``_read()`` (one read transaction),
  ``_snapshot()`` (a read of several statements that must see one snapshot),
  ``_statement()`` (a connection that runs one statement as its own transaction) and
  ``_among()`` (how a listing names the orders of its page).

How each of those commits, and what it costs, stays the backend's own. SQLite takes its
one write lock at ``BEGIN IMMEDIATE``, so its dialect locks no rows; PostgreSQL has no such
lock, so its dialect locks the rows a write checks before it writes (``FOR UPDATE``, and
``SKIP LOCKED`` where a deliverer claims notifications: two deliverers on two hosts skip
each other's rows rather than take them twice).

A third SQL backend subclasses this too, with a dialect of its own. What differs in more
than spelling stays in each backend: migrations, connections, the gateway's call path
(numbering and counting calls), listings, the commit lock.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any, ClassVar, Protocol, Self, TypeVar

from awl.documents.errors import BadRequest, StoreUnavailable
from awl.documents.lifecycle import ACTIVE
from awl.documents.models import (
    CallRecord,
    Event,
    Review,
    WorkOrder,
    WorkReport,
)
from awl.store.protocol import (
    BlockedRow,
    DeliveryAttempt,
    DeskOrder,
    EffectState,
    Notification,
    OrderRecord,
    PassRecord,
    QueueKey,
    Revocation,
    Settlement,
    TokenRecord,
    TrackRecord,
    TrackRow,
    Webhook,
    WebSession,
)
from awl.store.queue import KEY_SQL, keyed, queue_instant, reweighed
from awl.store.rules import (
    after_attempt,
    call_not_found,
    call_number,
    check_first_event,
    check_hold,
    check_notification_state,
    dump_json,
    effect_counts,
    effect_doc,
    effect_event_kind,
    first_track_row,
    held_call,
    new_notifications,
    next_effect,
    not_empty,
    notification_conflict,
    notification_not_found,
    notification_payload,
    order_event_kind,
    order_exists_conflict,
    order_not_found,
    orphaned,
    pass_doc,
    read_blocked_rows,
    read_effect,
    read_pass,
    read_record,
    read_track_row,
    restored_effect,
    restored_effects,
    restored_orders,
    restored_rows,
    seq_conflict,
    timestamp,
    web_session_conflict,
    webhook_conflict,
)
from awl.store.tally import may_change, queued, read_sql

__all__ = ["Connection", "Cursor", "Dialect", "SQLStore"]

_A = TypeVar("_A", dict[str, Any] | None, str | None)
_T = TypeVar("_T")
"""An upstream's answer as a store keeps it: a result object, or an error's text."""


class Cursor(Protocol):
    """What the shared code reads from a statement it ran (sqlite3's and psycopg's alike)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """A connection as the shared code uses it: statements in the dialect's spelling."""

    def execute(self, sql: str, params: Any = ..., /) -> Cursor: ...


_TOKENS = ("text", "jsonb", "lock", "lock_order", "share", "skip_locked", "rowid",
           "effect_state", "hold")

QUEUE_COLUMNS = ("pos, order_id, goal, worker, manager, escalate_to, deadline, seq, asked_at,"
                 " latest, reworks")
"""The question queue's columns a backend's ``queued_rows`` fills (the rest, its key, are
written next: :mod:`awl.store.queue`)."""

QUEUE_PICKED = ("order_id, goal, worker, manager, escalate_to, deadline, seq, asked_at, latest,"
                " reworks, -rank AS weight, rank, asked")
"""What a page of the queue reads of each row (:func:`~awl.store.rules.read_blocked_rows`'s
fields, then the key it is ordered by)."""


@dataclass(frozen=True, eq=False)
class Dialect:
    """How one SQL backend spells what the shared statements need.

    The statements are written with ``?`` for each parameter and these ``{tokens}``; see
    :meth:`sql`."""

    param: str
    """The parameter mark: ``?`` or ``%s``."""
    no_limit: int | None
    """The ``LIMIT`` that means none."""
    effect_state: str
    """The expression reading an effect document's ``state``."""
    text: str = ""
    """Added to a JSON document column read, to read it as text."""
    jsonb: str = ""
    """Added to a JSON document parameter, to store it as a document."""
    lock: str = ""
    """Ends a read of rows the write then changes: it locks them till the write ends."""
    lock_order: str = ""
    """Ends a read of an order's row before its log grows (a lock that still lets other
    writers add rows that refer to the order)."""
    share: str = ""
    """Ends a read of rows the write depends on but does not change: it keeps them from
    being deleted till the write ends."""
    skip_locked: str = ""
    """Ends a claim: it locks the rows it takes and skips those another claim holds."""
    hold: str = ""
    """Ends a read of an order's state a write depends on: it waits for, and then reads,
    a write that changes the order's row (and keeps any from starting) till the write ends."""
    rowid: str = "rowid"
    """The column that keeps a table's rows in the order they were added."""
    _cache: dict[str, str] = field(default_factory=dict, repr=False)

    def sql(self, template: str) -> str:
        """``template`` in this dialect: each ``{token}`` (a field's name above) replaced
        by its value, each ``?`` by :attr:`param`. Kept, so a statement is spelled once.

        A template holds no other ``?`` (no literal, no PostgreSQL JSON operator)."""
        try:
            return self._cache[template]
        except KeyError:
            spelled = template
            for token in _TOKENS:
                spelled = spelled.replace(f"{{{token}}}", getattr(self, token))
            spelled = spelled.replace("?", self.param)
            self._cache[template] = spelled
            return spelled

    def where(self, clauses: list[str], params: list[Any],
              equal: Sequence[tuple[str, Any]]) -> str:
        """A WHERE clause of ``clauses`` and ``column = value`` for each pair whose value
        is not None; the values are added to ``params``."""
        for column, value in equal:
            if value is not None:
                clauses.append(f"{column} = {self.param}")
                params.append(value)
        return f"WHERE {' AND '.join(clauses)}" if clauses else ""

    def page(self, clauses: Sequence[str], params: Sequence[Any],
             equal: Sequence[tuple[str, Any]], party: str | None) -> tuple[str, list[Any]]:
        """The SELECT of a listing page's order positions, newest first, with its
        parameters (LIMIT and OFFSET are the last two marks, left to the caller): the orders
        matching ``clauses`` and ``equal`` (as :meth:`where`) and, with ``party``, whose
        worker or manager it is, as the union of a scan of the index by worker and one of
        the index by manager (an OR would walk every order for a top page)."""
        tail = f" ORDER BY pos DESC LIMIT {self.param} OFFSET {self.param}"
        sides = [()] if party is None else [(("worker", party),), (("manager", party),)]
        selects, values = [], []
        for side in sides:
            mine = list(params)
            where = self.where(list(clauses), mine, [*equal, *side])
            selects.append(f"SELECT pos FROM orders {where}")
            values.extend(mine)
        return " UNION ".join(selects) + tail, values


def _webhook_from(doc: str) -> Webhook:
    """A webhook from its stored JSON text."""
    data = json.loads(doc)
    orders = data.pop("orders")
    return Webhook(**data | {"events": tuple(data["events"])},
                   orders=None if orders is None else tuple(orders))


_OUTBOX_INSERT = ("INSERT INTO outbox (id, webhook_id, order_id, state, next_at, doc)"
                  " VALUES (?, ?, ?, ?, ?, ?{jsonb})")


def _outbox_row(note: Notification) -> tuple[Any, ...]:
    """The outbox row of ``note``, in :data:`_OUTBOX_INSERT`'s order."""
    return (note.id, note.webhook_id, note.order_id, note.state, timestamp(note.next_at),
            dump_json(asdict(note)))


_OUTBOX_ROWS = 500
"""Notifications a restore writes at a time."""


def _chunks(items: Iterable[_T], size: int) -> Iterator[list[_T]]:
    """``items`` in lists of at most ``size``."""
    chunk: list[_T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _notification_from(doc: str) -> Notification:
    """A notification from its stored JSON text."""
    data = json.loads(doc)
    attempts = tuple(DeliveryAttempt(**a) for a in data.pop("attempts"))
    return Notification(**data, attempts=attempts)


_PUT_EFFECT = ("INSERT INTO effects (order_id, n, doc) VALUES (?, ?, ?{jsonb})"
               " ON CONFLICT (order_id, n) DO UPDATE SET doc = excluded.doc")


_CREATES = re.compile(r"\s*CREATE (?:TABLE|INDEX) (\w+)")
"""A migration step that makes a table or an index, and its name."""


class SQLStore(ABC):
    """The part of a SQL store every SQL backend shares (see the module's description)."""

    dialect: ClassVar[Dialect]

    # What a backend provides ---------------------------------------------------------------
    @abstractmethod
    def _write(self, *, durable: bool = True) -> AbstractContextManager[Connection]:
        """One write transaction: committed when the block ends, rolled back on an error."""

    @abstractmethod
    def _read(self) -> AbstractContextManager[Connection]:
        """One read transaction."""

    @abstractmethod
    def _statement(self) -> AbstractContextManager[Connection]:
        """A connection for one statement, its own transaction."""

    def _snapshot(self) -> AbstractContextManager[Connection]:
        """A read transaction whose statements all see one snapshot."""
        return self._read()

    @abstractmethod
    def _among(self, page: str, params: list[Any], ids: list[str]) -> tuple[str, list[Any]]:
        """The condition (after ``order_id``) and parameters naming the orders a listing
        page returned: ``page`` is its query of their ids, ``ids`` the ids it found."""

    track_fields: ClassVar[str]
    """The backend's SELECT list of a track row of the orders ``o`` (``read_track_row``'s
    fields, picked from their documents)."""
    queued_rows: ClassVar[str]
    """The backend's SELECT of the question queue's rows of the blocked orders ``o``."""

    @abstractmethod
    def _below(self, conn: Connection, ids: list[str]) -> dict[str, int]:
        """How many active orders are below each of the orders ``ids``, reached through
        active orders only (absent: none), as the write ``conn`` is in sees them."""

    @abstractmethod
    def _tally(self, conn: Connection, worker: str, manager: str, order_id: str,
               old: TrackRow | None, new: TrackRow) -> None:
        """Apply, in the write ``conn`` is in, a write that turned the order's track row
        ``old`` into ``new`` (None: a new order) to the tallies
        (:func:`awl.store.tally.write_sql`)."""

    @abstractmethod
    def _announce(self, conn: Connection, order_id: str, seq: int) -> None:
        """Tell whoever listens, when this transaction commits, that the order's log is at
        ``seq`` (a backend that cannot push news does nothing: its waiters poll)."""

    @abstractmethod
    def close(self) -> None:
        """Close every connection; calls after this raise."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The schema -----------------------------------------------------------------------------
    @classmethod
    def _upgrade(cls, conn: Connection, migrations: Sequence[Sequence[str | Callable[[Any], None]]],
                 desk: str) -> None:
        """Run the ``migrations`` the schema has not had yet, in the caller's transaction
        (which the backend makes exclusive: one process migrates a new desk, the others
        wait and find it done); ``desk`` names the desk in the refusal of one whose schema
        is newer than this code (nothing is written then)."""
        conn.execute("CREATE TABLE IF NOT EXISTS awl_schema (version INTEGER NOT NULL)")
        row = conn.execute("SELECT MAX(version) FROM awl_schema").fetchone()
        version = int(row[0] or 0) if row is not None else 0
        if version > len(migrations):
            raise cls._newer(desk, version, len(migrations))
        for number in range(version, len(migrations)):
            for statement in migrations[number]:
                # A step may be a function of the connection (a backfill computed in Python).
                if callable(statement):
                    statement(conn)
                else:
                    conn.execute(statement)
            conn.execute(cls.dialect.sql("INSERT INTO awl_schema (version) VALUES (?)"),
                         (number + 1,))

    @staticmethod
    def _newer(desk: str, version: int, known: int) -> StoreUnavailable:
        """The refusal of a desk whose schema is newer than this code's (BIND-16)."""
        return StoreUnavailable(f"{desk} has schema version {version}, newer than this awl "
                                f"({known}); upgrade awl-gateway to open it")

    @staticmethod
    def _open_elsewhere(desk: str, version: int, known: int, holders: str = "") -> StoreUnavailable:
        """The refusal to migrate a desk another process of an older awl has open (BIND-22)."""
        return StoreUnavailable(
            f"{desk} is at schema version {version} and open in another process of an older "
            f"awl{holders}; this awl migrates it to {known} only when no older process has it "
            "open: stop every process using it, then open it again")

    @staticmethod
    def _missing_only(conn: Connection, steps: Sequence[str | Callable[[Any], None]],
                      exists: Callable[[str], bool]) -> None:
        """Run the CREATE statements of ``steps`` whose table or index the desk lacks
        (``exists`` says, by name), and their functions (backfills, which refill what they
        fill from scratch): a desk a development build left part-way to a migration's
        layout gets the rest of it."""
        for step in steps:
            if callable(step):
                step(conn)
                continue
            made = _CREATES.match(step)
            if made is None:
                raise AssertionError(f"not a CREATE: {step[:40]}")
            if not exists(made.group(1)):
                conn.execute(step)

    def schema_version(self) -> int:
        """The schema version of the open desk."""
        with self._read() as conn:
            row = conn.execute("SELECT MAX(version) FROM awl_schema").fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    # Reads shared by the writes -------------------------------------------------------------
    @classmethod
    def _seq(cls, conn: Connection, order_id: str, *, lock: bool = False) -> int:
        """The order's seq; NotFound if absent. ``lock``: its row is locked (see
        :attr:`Dialect.lock_order`) until the write ends."""
        row = conn.execute(cls.dialect.sql(
            "SELECT seq FROM orders WHERE id = ?{lock_order}" if lock
            else "SELECT seq FROM orders WHERE id = ?"), (order_id,)).fetchone()
        if row is None:
            raise order_not_found(order_id)
        return int(row[0])

    @classmethod
    def _call_data(cls, conn: Connection, order_id: str, ref: str, *,
                   lock: bool = False) -> tuple[int, dict[str, Any]]:
        """The N and stored JSON data of the call ``ref`` names; NotFound if there is none.
        ``lock``: the call's row is locked until the write ends, so two writers of one
        call's effect (even one that creates it) queue rather than both read it absent."""
        n, tool = call_number(order_id, ref)
        row = conn.execute(cls.dialect.sql(
            "SELECT doc{text} FROM calls WHERE order_id = ? AND n = ?{lock}" if lock
            else "SELECT doc{text} FROM calls WHERE order_id = ? AND n = ?"),
            (order_id, n)).fetchone()
        data = None if row is None else json.loads(row[0])
        if data is None or data["tool"] != tool:
            cls._seq(conn, order_id)
            raise call_not_found(order_id, ref)
        return n, data

    @classmethod
    def _effect(cls, conn: Connection, order_id: str, n: int) -> EffectState | None:
        row = conn.execute(cls.dialect.sql(
            "SELECT doc{text} FROM effects WHERE order_id = ? AND n = ?"), (order_id, n)
        ).fetchone()
        return None if row is None else read_effect(row[0])

    # Orders and their logs ------------------------------------------------------------------
    def create_order(self, order: WorkOrder, event: Event) -> None:
        """Store a new order with its first event (seq 1); its state is ``event.to``.
        Durable."""
        check_first_event(order, event)
        q = self.dialect.sql
        with self._write() as conn:
            added = conn.execute(q(
                "INSERT INTO orders (id, doc, state, seq, worker, manager, parent_id,"
                " created_at, updated_at) VALUES (?, ?{jsonb}, ?, 1, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO NOTHING"),
                (order.id, dump_json(order.to_json()), event.to, order.to, order.manager,
                 order.parent_id, order.created_at, event.at),
            ).rowcount
            if not added:
                raise order_exists_conflict(order.id, self._seq(conn, order.id))
            conn.execute(q("INSERT INTO events (order_id, seq, doc) VALUES (?, 1, ?{jsonb})"),
                         (order.id, dump_json(event.to_json())))
            self._tally(conn, order.to, order.manager, order.id, None,
                        first_track_row(order, event))
            self._queue(conn, order.id, None, event.to)
            if event.to in ACTIVE:
                self._reweigh(conn, order.parent_id, 1)
            self._announce(conn, order.id, 1)

    def _position(self, order_id: str) -> int:
        """The order's position (the newest has the highest); NotFound if absent: where a
        listing page ``before`` it starts."""
        with self._read() as conn:
            row = conn.execute(self.dialect.sql("SELECT pos FROM orders WHERE id = ?"),
                               (order_id,)).fetchone()
        if row is None:
            raise order_not_found(order_id)
        return int(row[0])

    # Track records and the question queue, kept in the writes above (awl.store.tally) ------
    def _track_row(self, conn: Connection, order_id: str) -> tuple[str, str, TrackRow]:
        """The order's worker, manager and track row, as they stand in this write."""
        worker, manager, *fields = conn.execute(self.dialect.sql(
            f"SELECT o.worker, o.manager, {self.track_fields} FROM orders o WHERE o.id = ?"),
            (order_id,)).fetchone()
        return worker, manager, read_track_row(*fields)

    def _queue(self, conn: Connection, order_id: str, old_state: str | None,
               state: str) -> None:
        """Keep the order's row of the question queue as the write leaves it: a blocked
        order's row weighs one plus the active orders below it (:mod:`awl.store.queue`)."""
        q = self.dialect.sql
        if queued(old_state):
            conn.execute(q("DELETE FROM question_queue WHERE order_id = ?"), (order_id,))
        if queued(state):
            conn.execute(q(f"INSERT INTO question_queue ({QUEUE_COLUMNS}) {self.queued_rows}"
                           " AND o.id = ?"), (order_id,))
            asked_at, deadline = conn.execute(q(
                "SELECT asked_at, deadline FROM question_queue WHERE order_id = ?"),
                (order_id,)).fetchone()
            conn.execute(q(KEY_SQL), keyed([(order_id, asked_at, deadline)],
                                           self._below(conn, [order_id]))[0])

    def _reweigh(self, conn: Connection, parent_id: str | None, delta: int) -> None:
        """Add ``delta`` to the weight of each blocked order above an order under
        ``parent_id`` that starts (+1) or stops being active (:func:`~awl.store.queue.
        reweighed`); each order above is read with its row held, so a write that changes
        one waits, or is waited for, and no change is counted twice or missed."""
        if parent_id is None:
            return
        q = self.dialect.sql

        def step(order_id: str) -> tuple[str | None, str] | None:
            row = conn.execute(q("SELECT parent_id, state FROM orders WHERE id = ?{hold}"),
                               (order_id,)).fetchone()
            return None if row is None else (row[0], str(row[1]))

        for above in list(reweighed(parent_id, step)):
            conn.execute(q("UPDATE question_queue SET rank = rank - ? WHERE order_id = ?"),
                         (delta, above))

    def blocked_orders(self, answerer: str | None = None, *, after: QueueKey | None = None,
                       limit: int | None = None) -> list[BlockedRow]:
        """One row per blocked order ``answerer`` may answer, in the queue's order, after
        ``after``: read by the index of the queue's key (for an answerer, the first
        ``limit`` of its index by manager and of its index by escalate_to, merged)."""
        q = self.dialect.sql
        key = "rank, asked, order_id"
        later = "" if after is None else f" AND ({key}) > (?, ?, ?)"
        cut = "" if limit is None else " LIMIT ?"
        params: list[Any] = [*(after or ()), *(() if limit is None else (limit,))]
        one = (f"SELECT {QUEUE_PICKED} FROM question_queue WHERE {{who}}{later}"
               f" ORDER BY {key}{cut}")
        if answerer is None:
            sql, values = one.format(who="TRUE"), params
        else:
            sql = (f"SELECT * FROM ({one.format(who='manager = ?')}) AS m UNION"
                   f" SELECT * FROM ({one.format(who='escalate_to = ?')}) AS e"
                   f" ORDER BY {key}{cut}")
            values = [answerer, *params, answerer, *params,
                      *(() if limit is None else (limit,))]
        with self._read() as conn:
            rows = conn.execute(q(sql), values).fetchall()
        return read_blocked_rows(rows)

    def overdue_blocked(self, now: datetime) -> list[str]:
        """The blocked orders past their deadline at ``now``, by the queue's deadline index."""
        with self._read() as conn:
            rows = conn.execute(self.dialect.sql(
                "SELECT order_id FROM question_queue WHERE due < ?"),
                (queue_instant(now),)).fetchall()
        return [str(row[0]) for row in rows]

    def track_rows(self, worker: str) -> list[TrackRow]:
        """One track row per order addressed to ``worker``, newest first, in one query: the
        few fields a track record needs picked from the documents, none parsed as a model;
        the worker index finds the orders and each subquery reads by primary key."""
        with self._snapshot() as conn:
            rows = conn.execute(self.dialect.sql(
                f"SELECT {self.track_fields} FROM orders o WHERE o.worker = ?"
                " ORDER BY o.pos DESC"), (worker,)).fetchall()
        return [read_track_row(*row) for row in rows]

    def track_record(self, worker: str, *, manager: str | None = None) -> TrackRecord:
        """The worker's track record (only ``manager``'s orders, if given), from its tallies
        (:func:`awl.store.tally.read_sql`), in one snapshot."""
        with self._snapshot() as conn:
            return read_sql(worker, manager, lambda sql, params: conn.execute(sql, params),
                            self.dialect.param)

    def load(self, order_id: str) -> OrderRecord:
        """The order and all it carries. NotFound if absent."""
        found = self._records(self.dialect.sql("WHERE id = ?"), [order_id], None, 0)
        if not found:
            raise order_not_found(order_id)
        return found[0]

    def _records(self, where: str, params: list[Any], limit: int | None,
                 offset: int) -> list[OrderRecord]:
        """The orders ``where`` (in the dialect's spelling, with ``params``) picks, newest
        first, with their reports and reviews, all read in one snapshot."""
        q = self.dialect.sql
        page = f"{where} {q('ORDER BY pos DESC LIMIT ? OFFSET ?')}"
        page_params = [*params, self.dialect.no_limit if limit is None else limit, offset]
        with self._snapshot() as conn:
            rows = conn.execute(
                f"{q('SELECT id, doc{text}, state, seq, updated_at FROM orders')} {page}",
                page_params).fetchall()
            extra: dict[str, dict[str, list[str]]] = {}
            if rows:
                among, among_params = self._among(f"SELECT id FROM orders {page}",
                                                  page_params, [row[0] for row in rows])
                for table in ("reports", "reviews"):
                    for oid, doc in conn.execute(
                        q("SELECT order_id, doc{text} FROM ") + table
                        + f" WHERE order_id {among} ORDER BY order_id, idx", among_params,
                    ):
                        extra.setdefault(oid, {}).setdefault(table, []).append(doc)
        return [read_record(doc, state, seq, updated_at,
                            reports=extra.get(oid, {}).get("reports", ()),
                            reviews=extra.get(oid, {}).get("reviews", ()))
                for oid, doc, state, seq, updated_at in rows]

    def append(
        self,
        order_id: str,
        event: Event,
        *,
        state: str,
        report: WorkReport | None = None,
        review: Review | None = None,
    ) -> None:
        """Append ``event`` if its seq follows the stored one, else Conflict; with the
        notifications it calls for, in the same durable transaction (HOOK-3)."""
        q = self.dialect.sql
        with self._write() as conn:
            found = conn.execute(q(
                "SELECT seq, state, parent_id FROM orders WHERE id = ?{lock_order}"),
                (order_id,)).fetchone()
            if found is None:
                raise order_not_found(order_id)
            seq, old_state, parent_id = int(found[0]), str(found[1]), found[2]
            if event.seq != seq + 1:
                raise seq_conflict(order_id, event, seq)
            # The tallies change only with a report, a review or an order leaving the
            # active states: only then is its track row read before and after.
            old = (self._track_row(conn, order_id)
                   if may_change(old_state, state, report, review) else None)
            conn.execute(q("INSERT INTO events (order_id, seq, doc) VALUES (?, ?, ?{jsonb})"),
                         (order_id, event.seq, dump_json(event.to_json())))
            conn.execute(q("UPDATE orders SET seq = ?, state = ?, updated_at = ? WHERE id = ?"),
                         (event.seq, state, event.at, order_id))
            for table, doc in (("reports", report), ("reviews", review)):
                if doc is not None:
                    conn.execute(q(
                        "INSERT INTO {table} (order_id, idx, doc) VALUES (?, (SELECT"
                        " COUNT(*) FROM {table} WHERE order_id = ?), ?{jsonb})"
                    ).format(table=table), (order_id, order_id, dump_json(doc.to_json())))
            if old is not None:
                worker, manager, before = old
                self._tally(conn, worker, manager, order_id, before,
                            self._track_row(conn, order_id)[2])
            self._queue(conn, order_id, old_state, state)
            if parent_id is not None and old_state in ACTIVE and state not in ACTIVE:
                # It and the active orders below it no longer wait on the orders above.
                self._reweigh(conn, parent_id,
                              -1 - self._below(conn, [order_id]).get(order_id, 0))
            self._notify(conn, order_event_kind(event), order_id, event.at,
                         lambda kind, order, counts: notification_payload(
                             kind, order, state, event.at, counts, event=event))
            self._announce(conn, order_id, event.seq)

    def events(self, order_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """Events with seq > ``after``, in order (at most ``limit``)."""
        # One statement, so one snapshot without a transaction of our own (a gateway asks
        # before every call whether the log grew): the order's row joined to the events asked
        # for, which still gives one row, with no event, for an order with none of them.
        with self._statement() as conn:
            rows = conn.execute(self.dialect.sql(
                "SELECT e.doc{text} FROM orders AS o LEFT JOIN events AS e"
                " ON e.order_id = o.id AND e.seq > ? WHERE o.id = ? ORDER BY e.seq LIMIT ?"),
                (after, order_id, self.dialect.no_limit if limit is None else max(limit, 1)),
            ).fetchall()
        if not rows:
            raise order_not_found(order_id)
        if limit == 0:
            return []
        return [Event.model_validate_json(doc) for (doc,) in rows if doc is not None]

    # Call records (reads) --------------------------------------------------------------------
    def calls(self, order_id: str, *, attempt: int | None = None) -> list[CallRecord]:
        """The order's call records by N."""
        q = self.dialect.sql
        with self._read() as conn:
            self._seq(conn, order_id)
            rows = conn.execute(
                q("SELECT doc{text} FROM calls WHERE order_id = ? ORDER BY n")
                if attempt is None else
                q("SELECT doc{text} FROM calls WHERE order_id = ? AND attempt = ? ORDER BY n"),
                (order_id,) if attempt is None else (order_id, attempt),
            ).fetchall()
        return [CallRecord.model_validate_json(doc) for (doc,) in rows]

    def charges(self, order_id: str) -> list[float | None]:
        """What each call counts against the budget, by N (None: it does not count)."""
        with self._read() as conn:
            self._seq(conn, order_id)
            rows = conn.execute(self.dialect.sql(
                "SELECT counted, usd FROM calls WHERE order_id = ? ORDER BY n"), (order_id,)
            ).fetchall()
        return [float(usd) if counted else None for counted, usd in rows]

    # Effects --------------------------------------------------------------------------------
    def effects(self, order_id: str) -> list[EffectState]:
        """Every effect state of the order, by N."""
        with self._read() as conn:
            self._seq(conn, order_id)
            rows = conn.execute(self.dialect.sql(
                "SELECT doc{text} FROM effects WHERE order_id = ? ORDER BY n"), (order_id,)
            ).fetchall()
        return [read_effect(doc) for (doc,) in rows]

    def hold_call(
        self, order_id: str, ref: str, *, result: dict[str, Any] | None, ended_at: str,
    ) -> EffectState:
        """Set a reserved call's outcome to ``held`` and create its ``held`` effect, in one
        durable transaction (CM-14)."""
        check_hold(result, ended_at)
        q = self.dialect.sql
        with self._write() as conn:
            n, data = self._call_data(conn, order_id, ref, lock=True)
            _, doc, effect = held_call(data, n, ref, self._effect(conn, order_id, n),
                                       result=result, ended_at=ended_at)
            conn.execute(q("UPDATE calls SET doc = ?{jsonb} WHERE order_id = ? AND n = ?"),
                         (doc, order_id, n))
            conn.execute(q("INSERT INTO effects (order_id, n, doc) VALUES (?, ?, ?{jsonb})"),
                         (order_id, n, effect_doc(effect)))
            return effect

    def set_effect(
        self, order_id: str, ref: str, *, expect: Sequence[str] | None, state: str,
        attempt: int | None = None, result: dict[str, Any] | None = None,
        error: str | None = None, settlement: Settlement | None = None,
        count_dispatch: bool = False, at: str,
    ) -> EffectState:
        """Move an effect to ``state`` if it is in one of ``expect``; Conflict otherwise.

        Durable: the new state is on disk when this returns (a ``dispatching`` mark before
        its call is sent), with the notifications it calls for (HOOK-3).
        """
        result, error = self._keepable(result), self._keepable(error)
        with self._write() as conn:
            n, data = self._call_data(conn, order_id, ref, lock=True)
            record = CallRecord.model_validate(data)
            old = self._effect(conn, order_id, n)
            new = next_effect(
                old, record, expect=expect, state=state,
                attempt=attempt, result=result, error=error, settlement=settlement,
                count_dispatch=count_dispatch, at=at,
            )
            conn.execute(self.dialect.sql(_PUT_EFFECT), (order_id, n, effect_doc(new)))
            self._notify(conn, effect_event_kind(old, new), order_id, at,
                         lambda kind, order, counts: notification_payload(
                             kind, order, self._state(conn, order_id), at, counts,
                             effect=new, tool=record.tool))
            return new

    def _keepable(self, answer: _A) -> _A:
        """What an upstream answered (an effect's result or error), as this store can keep
        it: unchanged here (see :meth:`PostgresStore._keepable`)."""
        return answer

    def restore_effect(self, effect: EffectState) -> None:
        """Store ``effect`` exactly as given (a copy of a desk), replacing any state."""
        with self._write() as conn:
            n, data = self._call_data(conn, effect.order_id, effect.ref, lock=True)
            new = restored_effect(effect, CallRecord.model_validate(data))
            conn.execute(self.dialect.sql(_PUT_EFFECT), (effect.order_id, n, effect_doc(new)))

    # Passes and tokens ----------------------------------------------------------------------
    def revoke(self, jti: str, *, reason: str, at: str) -> None:
        """Record that a pass is revoked (idempotent: the first reason and time are kept).
        Durable."""
        with self._write() as conn:
            conn.execute(self.dialect.sql(
                "INSERT INTO revocations (jti, reason, at) VALUES (?, ?, ?)"
                " ON CONFLICT (jti) DO NOTHING"), (jti, reason, at))

    def revoked(self) -> dict[str, str]:
        """Every revoked jti with its reason."""
        with self._read() as conn:
            rows = conn.execute(self.dialect.sql(
                "SELECT jti, reason FROM revocations ORDER BY {rowid}")).fetchall()
        return {str(jti): str(reason) for jti, reason in rows}

    def revocations(self) -> dict[str, Revocation]:
        """Every revoked jti with its reason and time."""
        with self._read() as conn:
            rows = conn.execute(self.dialect.sql(
                "SELECT jti, reason, at FROM revocations ORDER BY {rowid}")).fetchall()
        return {jti: Revocation(reason=reason, at=at) for jti, reason, at in rows}

    def save_pass(self, record: PassRecord) -> None:
        """Remember an issued pass (saving a jti again replaces its record). Durable."""
        with self._write() as conn:
            conn.execute(self.dialect.sql(
                "INSERT INTO passes (jti, order_id, doc) VALUES (?, ?, ?{jsonb})"
                " ON CONFLICT (jti) DO UPDATE SET order_id = excluded.order_id,"
                " doc = excluded.doc"), (record.jti, record.order_id, pass_doc(record)))

    def passes(self, order_id: str) -> list[PassRecord]:
        """The passes saved for an order, in the order they were first saved."""
        with self._read() as conn:
            rows = conn.execute(self.dialect.sql(
                "SELECT doc{text} FROM passes WHERE order_id = ? ORDER BY pos"), (order_id,)
            ).fetchall()
        return [read_pass(row[0]) for row in rows]

    def saved_pass(self, jti: str) -> PassRecord | None:
        """The pass saved under ``jti``, or None."""
        with self._read() as conn:
            row = conn.execute(self.dialect.sql(
                "SELECT doc{text} FROM passes WHERE jti = ?"), (jti,)).fetchone()
        return None if row is None else read_pass(row[0])

    def save_token(self, token_hash: str, principal: str, *, created_at: str) -> None:
        """Remember a desk access token by its hash. Durable."""
        with self._write() as conn:
            conn.execute(self.dialect.sql(
                "INSERT INTO tokens (token_hash, principal, created_at) VALUES (?, ?, ?)"
                " ON CONFLICT (token_hash) DO UPDATE SET principal = excluded.principal,"
                " created_at = excluded.created_at"), (token_hash, principal, created_at))

    def principal_for(self, token_hash: str) -> str | None:
        """The principal a token hash was issued to."""
        with self._read() as conn:
            row = conn.execute(self.dialect.sql(
                "SELECT principal FROM tokens WHERE token_hash = ?"), (token_hash,)).fetchone()
        return None if row is None else str(row[0])

    def tokens(self) -> list[TokenRecord]:
        """Every desk access token (by hash), oldest first."""
        with self._read() as conn:
            rows = conn.execute(self.dialect.sql(
                "SELECT token_hash, principal, created_at FROM tokens ORDER BY {rowid}")
            ).fetchall()
        return [TokenRecord(str(h), str(p), str(at)) for h, p, at in rows]

    def drop_token(self, token_hash: str) -> bool:
        """Forget a token; False if there was no such token. Durable."""
        with self._write() as conn:
            return conn.execute(self.dialect.sql("DELETE FROM tokens WHERE token_hash = ?"),
                                (token_hash,)).rowcount > 0

    # The approval page's sessions (BIND-9) ------------------------------------------------
    def start_web_session(self, session: WebSession, *, now: float) -> None:
        """Keep a new session, forgetting every one expired by ``now``. Durable."""
        with self._write() as conn:
            conn.execute(self.dialect.sql("DELETE FROM web_sessions WHERE expires_at <= ?"),
                         (now,))
            added = conn.execute(self.dialect.sql(
                "INSERT INTO web_sessions (id_hash, principal, csrf, expires_at, token_hash)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (id_hash) DO NOTHING"),
                (session.id_hash, session.principal, session.csrf, session.expires_at,
                 session.token_hash)).rowcount
            if added != 1:
                raise web_session_conflict()

    def web_session(self, id_hash: str, *, now: float) -> WebSession | None:
        """The session kept under ``id_hash``, unless absent or expired by ``now``."""
        with self._read() as conn:
            row = conn.execute(self.dialect.sql(
                "SELECT principal, csrf, expires_at, token_hash FROM web_sessions"
                " WHERE id_hash = ? AND expires_at > ?"), (id_hash, now)).fetchone()
        if row is None:
            return None
        principal, csrf, expires_at, token = row
        return WebSession(id_hash, str(principal), str(csrf), float(expires_at),
                          None if token is None else str(token))

    def end_web_session(self, id_hash: str) -> bool:
        """Forget a session; False if there was none. Durable."""
        with self._write() as conn:
            return conn.execute(self.dialect.sql("DELETE FROM web_sessions WHERE id_hash = ?"),
                                (id_hash,)).rowcount > 0

    # Subscriptions and outbox (HOOK-1 to HOOK-6) ----------------------------------------
    @classmethod
    def _state(cls, conn: Connection, order_id: str) -> str:
        return str(conn.execute(cls.dialect.sql("SELECT state FROM orders WHERE id = ?"),
                                (order_id,)).fetchone()[0])

    @classmethod
    def _notify(cls, conn: Connection, kind: str | None, order_id: str, at: str,
                payload: Callable[[str, WorkOrder, dict[str, int]], dict[str, Any]]) -> None:
        """Write the notifications a write calls for, in its transaction (HOOK-3).

        Only a write that calls for one reads the webhooks; only a webhook that wants it
        makes the payload read the order and count its held calls."""
        if kind is None:
            return
        q = cls.dialect.sql
        # The webhooks stay until this write ends: a removal waits for it, and then finds
        # the notifications it wrote (and kills them with the webhook).
        hooks = [_webhook_from(doc) for (doc,) in conn.execute(
            q("SELECT doc{text} FROM webhooks ORDER BY pos{share}")).fetchall()]

        def body(kind: str) -> dict[str, Any]:
            doc = conn.execute(q("SELECT doc{text} FROM orders WHERE id = ?"),
                               (order_id,)).fetchone()
            counts = effect_counts(s for (s,) in conn.execute(
                q("SELECT {effect_state} FROM effects WHERE order_id = ?"), (order_id,)))
            return payload(kind, WorkOrder.model_validate_json(doc[0]), counts)

        for note in new_notifications(hooks, kind, order_id, at, body):
            cls._add_notification(conn, note)

    @classmethod
    def _add_notification(cls, conn: Connection, note: Notification) -> bool:
        """Put ``note`` in the outbox as it stands; False if its id is there already."""
        return bool(conn.execute(cls.dialect.sql(_OUTBOX_INSERT + " ON CONFLICT (id) DO NOTHING"),
                                 _outbox_row(note)).rowcount)

    def add_webhook(self, webhook: Webhook) -> None:
        """Keep a webhook subscription (durable). Conflict if its id exists."""
        with self._write() as conn:
            added = conn.execute(self.dialect.sql(
                "INSERT INTO webhooks (id, doc) VALUES (?, ?{jsonb}) ON CONFLICT (id) DO NOTHING"),
                (webhook.id, dump_json(asdict(webhook)))).rowcount
            if not added:
                raise webhook_conflict(webhook.id)

    def webhooks(self) -> list[Webhook]:
        """Every webhook subscription, oldest first."""
        with self._read() as conn:
            rows = conn.execute(self.dialect.sql(
                "SELECT doc{text} FROM webhooks ORDER BY pos")).fetchall()
        return [_webhook_from(doc) for (doc,) in rows]

    def remove_webhook(self, webhook_id: str, *, at: str) -> bool:
        """Forget a webhook; its pending notifications become dead, in one durable
        transaction."""
        q = self.dialect.sql
        with self._write() as conn:
            if conn.execute(q("DELETE FROM webhooks WHERE id = ?"),
                            (webhook_id,)).rowcount == 0:
                return False
            for (doc,) in conn.execute(q(
                    "SELECT doc{text} FROM outbox WHERE webhook_id = ? AND state = 'pending'"
                    " ORDER BY pos{lock}"), (webhook_id,)).fetchall():
                self._put_notification(conn, orphaned(_notification_from(doc), at))
            return True

    @classmethod
    def _put_notification(cls, conn: Connection, note: Notification) -> None:
        conn.execute(cls.dialect.sql(
            "UPDATE outbox SET state = ?, next_at = ?, doc = ?{jsonb} WHERE id = ?"),
            (note.state, timestamp(note.next_at), dump_json(asdict(note)), note.id))

    def claim_notifications(self, *, now: str, lease_until: str,
                            limit: int) -> list[tuple[Notification, Webhook]]:
        """Take up to ``limit`` due notifications, due again only at ``lease_until``.

        A read looks first, so a deliverer polling an idle outbox takes no write lock (which
        every gateway's call records need). The claim itself is a crash-safe write: one
        lost with a power cut is a lease that never was, and the notification is claimed
        again. Claims running at once take distinct notifications: SQLite's writes run one
        at a time, and PostgreSQL's claim locks the rows it takes and skips those locked."""
        q = self.dialect.sql
        moment = timestamp(now)
        with self._read() as conn:
            if conn.execute(q("SELECT 1 FROM outbox WHERE state = 'pending' AND next_at <= ?"
                              " LIMIT 1"), (moment,)).fetchone() is None:
                return []
        with self._write(durable=False) as conn:
            rows = conn.execute(q(
                "SELECT doc{text} FROM outbox WHERE state = 'pending' AND next_at <= ?"
                " ORDER BY next_at, pos LIMIT ?{skip_locked}"),
                (moment, max(limit, 0))).fetchall()
            if not rows:
                return []
            hooks = {w.id: w for w in (_webhook_from(d) for (d,) in conn.execute(
                q("SELECT doc{text} FROM webhooks")).fetchall())}
            claimed = []
            for (doc,) in rows:
                note = replace(_notification_from(doc), next_at=lease_until)
                self._put_notification(conn, note)
                claimed.append((note, hooks[note.webhook_id]))  # removal kills its notes
            return claimed

    def record_attempt(self, notification_id: str, attempt: DeliveryAttempt, *,
                       state: str, next_at: str, error: str | None = None) -> Notification:
        """Add an attempt and move the notification to ``state`` (durable)."""
        check_notification_state(state)
        with self._write() as conn:
            row = conn.execute(self.dialect.sql("SELECT doc{text} FROM outbox WHERE id = ?{lock}"),
                               (notification_id,)).fetchone()
            if row is None:
                raise notification_not_found(notification_id)
            new = after_attempt(_notification_from(row[0]), attempt, state=state,
                                next_at=next_at, error=error)
            self._put_notification(conn, new)
            return new

    def notifications(self, *, state: str | None = None, webhook_id: str | None = None,
                      order_id: str | None = None, limit: int | None = 100) -> list[Notification]:
        """Notifications matching every filter given, newest first."""
        q = self.dialect.sql
        params: list[Any] = []
        where = self.dialect.where([], params, (("state", state), ("webhook_id", webhook_id),
                                                ("order_id", order_id)))
        with self._read() as conn:
            rows = conn.execute(
                f"{q('SELECT doc{text} FROM outbox')} {where} {q('ORDER BY pos DESC LIMIT ?')}",
                (*params, self.dialect.no_limit if limit is None else limit)).fetchall()
        return [_notification_from(doc) for (doc,) in rows]

    def notifications_after(self, after: str | None = None, *,
                            limit: int = 500) -> list[Notification]:
        """Notifications kept after ``after``, oldest first, at most ``limit``."""
        q = self.dialect.sql
        with self._read() as conn:
            if after is None:
                rows = conn.execute(q("SELECT doc{text} FROM outbox ORDER BY pos LIMIT ?"),
                                    (limit,)).fetchall()
            else:
                rows = conn.execute(q(
                    "SELECT doc{text} FROM outbox WHERE pos > (SELECT pos FROM outbox"
                    " WHERE id = ?) ORDER BY pos LIMIT ?"), (after, limit)).fetchall()
        return [_notification_from(doc) for (doc,) in rows]

    def restore_notification(self, note: Notification) -> None:
        """Keep a notification as it stands (durable). Conflict if its id is kept."""
        with self._write() as conn:
            if not self._add_notification(conn, note):
                raise notification_conflict(note.id)

    # Copying a desk (BulkRead, Restore) ---------------------------------------------------
    _DESK_TABLES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("orders", "orders"), ("revocations", "revocations"), ("tokens", "tokens"),
        ("webhooks", "webhooks"), ("notifications", "outbox"))
    """What an empty store holds none of, and the table that holds it (see :meth:`restore`)."""

    @abstractmethod
    def _among_ids(self, ids: list[str]) -> tuple[str, list[Any]]:
        """The condition (after ``order_id``) and parameters naming the orders ``ids``."""

    @abstractmethod
    def _insert_rows(self, conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run the insert ``sql`` once for each of ``rows``, in as few round trips as may be."""

    @abstractmethod
    def _restoring(self) -> AbstractContextManager[Connection]:
        """The one durable write transaction of :meth:`restore`, holding off every other
        writer of the tables it checks until it ends."""

    @abstractmethod
    def _restore_calls(self, conn: Connection, order: DeskOrder) -> None:
        """Write the order's calls as the store's own call writes would, with every total
        and charge they keep (:func:`~awl.store.rules.check_restored_ref` each first)."""

    def _restore_keys(self, conn: Connection, keys: Mapping[str, Any]) -> None:
        """Write the published key set (a store that keeps none refuses it)."""
        raise BadRequest(f"{type(self).__name__} keeps no published public keys (they stay in "
                         "the desk's home folder)")

    def desk_orders(self, records: Sequence[OrderRecord]) -> list[DeskOrder]:
        """Each record with everything its order carries, read in one snapshot."""
        q = self.dialect.sql
        ids = [record.order.id for record in records]
        among, params = self._among_ids(ids)
        parts: dict[str, dict[str, list[Any]]] = {
            oid: {"events": [], "calls": [], "charges": [], "effects": [], "passes": []}
            for oid in ids}
        with self._snapshot() as conn:
            found = {oid for (oid,) in conn.execute(f"SELECT id FROM orders WHERE id {among}",
                                                    params)}
            for oid in ids:
                if oid not in found:
                    raise order_not_found(oid)
            for oid, doc in conn.execute(q("SELECT order_id, doc{text} FROM events WHERE")
                                         + f" order_id {among} ORDER BY order_id, seq", params):
                parts[oid]["events"].append(Event.model_validate_json(doc))
            for oid, counted, usd, doc in conn.execute(
                    q("SELECT order_id, counted, usd, doc{text} FROM calls WHERE")
                    + f" order_id {among} ORDER BY order_id, n", params):
                parts[oid]["calls"].append(CallRecord.model_validate_json(doc))
                parts[oid]["charges"].append(float(usd) if counted else None)
            for oid, doc in conn.execute(q("SELECT order_id, doc{text} FROM effects WHERE")
                                         + f" order_id {among} ORDER BY order_id, n", params):
                parts[oid]["effects"].append(read_effect(doc))
            for oid, doc in conn.execute(q("SELECT order_id, doc{text} FROM passes WHERE")
                                         + f" order_id {among} ORDER BY pos", params):
                parts[oid]["passes"].append(read_pass(doc))
        return [DeskOrder(record, **{k: tuple(v) for k, v in parts[record.order.id].items()})
                for record in records]

    def restore(self, orders: Iterable[Sequence[DeskOrder]], *,
                revocations: Mapping[str, Revocation], tokens: Sequence[TokenRecord],
                keys: Mapping[str, Any] | None = None, webhooks: Sequence[Webhook] = (),
                notifications: Iterable[Notification] = ()) -> None:
        """Load a whole desk into this empty store in one transaction (see
        :class:`~awl.store.protocol.Restore`): a restore that stops half way (an error, a
        ``kill -9``) writes nothing."""
        q = self.dialect.sql
        with self._restoring() as conn:
            refusal = not_empty([what for what, table in self._DESK_TABLES if conn.execute(
                f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()[0]])
            if refusal is not None:
                raise refusal
            if keys is not None:
                self._restore_keys(conn, keys)
            for batch in orders:
                self._insert_rows(conn, q(
                    "INSERT INTO orders (id, doc, state, seq, worker, manager, parent_id,"
                    " created_at, updated_at) VALUES (?, ?{jsonb}, ?, ?, ?, ?, ?, ?, ?)"),
                    restored_orders(batch))
                for table, rows in restored_rows(batch).items():
                    key = "seq" if table == "events" else "idx"
                    self._insert_rows(conn, q(f"INSERT INTO {table} (order_id, {key}, doc)"
                                              " VALUES (?, ?, ?{jsonb})"), rows)
                for order in batch:
                    self._restore_calls(conn, order)
                self._insert_rows(conn, q("INSERT INTO effects (order_id, n, doc)"
                                          " VALUES (?, ?, ?{jsonb})"),
                                  [row for order in batch for row in restored_effects(order)])
                self._insert_rows(conn, q("INSERT INTO passes (jti, order_id, doc)"
                                          " VALUES (?, ?, ?{jsonb})"),
                                  [(p.jti, p.order_id, pass_doc(p))
                                   for order in batch for p in order.passes])
            self._insert_rows(conn, q("INSERT INTO revocations (jti, reason, at) VALUES (?, ?, ?)"),
                              [(jti, r.reason, r.at) for jti, r in revocations.items()])
            self._insert_rows(conn, q("INSERT INTO tokens (token_hash, principal, created_at)"
                                      " VALUES (?, ?, ?)"),
                              [(t.token_hash, t.principal, t.created_at) for t in tokens])
            self._insert_rows(conn, q("INSERT INTO webhooks (id, doc) VALUES (?, ?{jsonb})"),
                              [(w.id, dump_json(asdict(w))) for w in webhooks])
            # Oldest first, so the outbox lists them as it did; a page at a time (an outbox
            # may hold far more than a desk's memory should).
            for page in _chunks(notifications, _OUTBOX_ROWS):
                self._insert_rows(conn, q(_OUTBOX_INSERT), [_outbox_row(n) for n in page])
