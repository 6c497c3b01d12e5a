"""The question queue's order, the one rule every backend keeps (BIND-20, BIND-21).

A blocked order's question weighs as many active orders as wait on its answer: the order
itself plus the active orders below it, reached through active orders only. The queue is
ordered by :data:`QueueKey`, ``(rank, asked, order_id)`` ascending, where ``rank`` is minus
the weight (so the most blocking comes first with every part ascending, as one index reads
it) and ``asked`` the time of the event that blocked it as :func:`queue_time` writes it.

A store keeps each queued order's weight up to date in the transaction of every write that
changes it: an order created under a parent adds one, an order that leaves the active states
takes itself and the active orders below it away, from each blocked order above it that
reached it (:func:`reweighed` says which). A blocked order enters the queue weighing one plus
the active orders below it then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime

from awl.documents.lifecycle import ACTIVE
from awl.documents.models import stored_time
from awl.store.protocol import QueueKey
from awl.store.rules import MAX_CHAIN

__all__ = ["KEY_INDEXES", "KEY_SQL", "QueueKey", "keyed", "queue_instant", "queue_key",
           "queue_time", "reweighed"]


def queue_instant(moment: datetime) -> str:
    """An aware datetime as fixed-width UTC text to the microsecond, so that text order is
    time order (``2027-01-15T08:00:00.000000Z``): the queue's ``asked`` and the deadline it
    finds overdue questions by."""
    utc = moment.astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(sep="T", timespec="microseconds") + "Z"  # the year always 4 digits


def queue_time(text: str) -> str:
    """A stored RFC 3339 time as :func:`queue_instant` writes it."""
    return queue_instant(stored_time(text))


def queue_key(blocking: int, asked_at: str, order_id: str) -> QueueKey:
    """The queue key of a question of weight ``blocking``, asked at ``asked_at``."""
    return -blocking, queue_time(asked_at), order_id


Step = Callable[[str], tuple[str | None, str] | None]
"""How a backend reads one order above: its id → ``(parent_id, state)``, None if absent."""


def reweighed(parent_id: str | None, step: Step) -> Iterator[str]:
    """The blocked orders above an order under ``parent_id`` whose weight an order that
    starts or stops being active changes: walking up from the parent, each blocked order met
    until (and not past) one that is not active. A damaged store's cycle, or a chain deeper
    than :data:`~awl.store.rules.MAX_CHAIN`, stops the walk."""
    seen: set[str] = set()
    node = parent_id
    while node is not None and node not in seen and len(seen) < MAX_CHAIN:
        seen.add(node)
        found = step(node)
        if found is None:
            return
        parent, state = found
        if state == "blocked":
            yield node
        if state not in ACTIVE:
            return
        node = parent


KEY_SQL = "UPDATE question_queue SET rank = ?, asked = ?, due = ? WHERE order_id = ?"
"""The statement that writes a queued order's key and deadline (with ``?`` marks)."""


def keyed(rows: Iterable[tuple[str, str, str]],
          below: Mapping[str, int]) -> list[tuple[int, str, str, str]]:
    """:data:`KEY_SQL`'s parameters ``(rank, asked, due, order_id)`` for each queued order
    ``(order_id, asked_at, deadline)``, where ``below`` counts its active orders below
    (absent: none): what a blocking event writes, and a migration for every question."""
    return [(-1 - below.get(order_id, 0), queue_time(asked_at), queue_time(deadline), order_id)
            for order_id, asked_at, deadline in rows]


KEY_INDEXES = (
    "DROP INDEX question_queue_by_manager",
    "DROP INDEX question_queue_by_escalation",
    "CREATE INDEX question_queue_by_key ON question_queue (rank, asked, order_id)",
    "CREATE INDEX question_queue_by_manager_key"
    " ON question_queue (manager, rank, asked, order_id)",
    "CREATE INDEX question_queue_by_escalation_key"
    " ON question_queue (escalate_to, rank, asked, order_id)",
    "CREATE INDEX question_queue_by_due ON question_queue (due)",
)
"""The queue's indexes by its key (for every question, by manager, by escalate_to) and by
deadline, replacing those by position: statements of a released migration (SQLite's 10,
PostgreSQL's 6), the same on both, never to be changed."""
