"""Copying a whole desk from one store to another, and checking that the copy is equal.

The copy goes through the :class:`~awl.store.protocol.Store` operations alone, so it works
between any two backends, a new one included: orders are created oldest first with their
events, reports and reviews; each order's calls are numbered again in N order (a counted
call reserved with the usd it counted, then finished or held; a refusal recorded as it was),
so the target computes the same refs, totals and charges to the orders above; then come the
effects (each restored as it stands: a copy replays no commit), the passes, the revocations,
the tokens, the desk's published public keys when both stores keep them
(:class:`~awl.store.protocol.KeyDirectory`; a target that keeps none is said to, the keys
staying in the desk's home folder), and the webhooks with every notification as it stands
(:class:`~awl.store.protocol.WebhookStore`: ids, states and attempts kept, so a pending one
is delivered once, from the target, under the ``webhook-id`` it had; they come after the
orders, so restoring the orders notifies no one). Locks are not copied: a lock belongs to
a committer running against the source, and leases run out on their own. Nor are the
approval page's sessions: whoever was signed in signs in again.

A target that implements :class:`~awl.store.protocol.Restore` (SQLite, PostgreSQL) takes
the same content in one transaction instead, in batches of :data:`BATCH` orders read from
the source (in bulk from a :class:`~awl.store.protocol.BulkRead` source), its calls written
through the store's own call writes so every total comes out as above: a copy that fails or
is killed half way leaves such a target empty, and a second copy into it simply runs
(BIND-17). Any other target is written one durable operation at a time; stopped half way,
it holds part of the desk, which a second copy refuses as not empty.

:func:`compare_stores` then reads both stores back, everything the protocol can read, and
lists every difference; :func:`copy_store` raises when there is one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import zip_longest

from awl.documents.errors import AWLError, BadRequest
from awl.documents.models import Event, Review, WorkReport
from awl.store.protocol import (
    BulkRead,
    DeskOrder,
    KeyDirectory,
    Notification,
    OrderRecord,
    OverBudget,
    Restore,
    Store,
    Usage,
    Webhook,
    WebhookStore,
)
from awl.store.rules import USD_TOLERANCE, not_empty

__all__ = ["CopyCounts", "CopyMismatch", "compare_stores", "copy_store"]


@dataclass(frozen=True, slots=True)
class CopyCounts:
    """How much a copy carried over."""

    orders: int = 0
    events: int = 0
    reports: int = 0
    reviews: int = 0
    calls: int = 0
    effects: int = 0
    passes: int = 0
    revocations: int = 0
    tokens: int = 0
    webhooks: int = 0
    notifications: int = 0
    public_keys: str = "none"
    """The source's published public key set: ``none``, ``copied``, or ``not kept`` (the
    target keeps no key set)."""

    def line(self) -> str:
        """The counts as one line of text."""
        keys = {"copied": ", the published public keys",
                "not kept": " (not the published public keys: the target keeps none; they "
                            "stay in the desk's home folder)"}.get(self.public_keys, "")
        return (f"{self.orders} orders ({self.events} events, {self.reports} reports, "
                f"{self.reviews} reviews, {self.calls} calls, {self.effects} effects, "
                f"{self.passes} passes), {self.revocations} revocations, {self.tokens} "
                f"tokens, {self.webhooks} webhooks ({self.notifications} notifications)"
                f"{keys}; the approval page's sessions are not copied (sign in again)")


class CopyMismatch(AWLError):
    """The copy does not read back equal to its source (``.differences`` says where)."""

    code = "COPY_MISMATCH"

    def __init__(self, differences: list[str]) -> None:
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        super().__init__(f"the copy differs from its source: {differences[0]}{more}; "
                         "was the source in use? Empty the target and copy again")
        self.differences = differences


def _carries_report(event: Event) -> bool:
    """Whether the desk stored a report with this event: a report, or a late one that
    expired the order (its data then names the report's status)."""
    return event.action == "report" or (
        event.action == "expire" and event.data is not None and "status" in event.data)


def _carries_review(event: Event) -> bool:
    return event.action in ("approve", "rework")


BATCH = 500
"""Orders read (and, by a :class:`~awl.store.protocol.Restore` target, written) at a time."""
OUTBOX_PAGE = 500
"""Notifications read, and compared, at a time."""


def _empty_or_refuse(target: Store) -> None:
    held = []
    if target.list_orders(limit=1):
        held.append("orders")
    if target.revocations():
        held.append("revocations")
    if target.tokens():
        held.append("tokens")
    if isinstance(target, KeyDirectory) and target.published_keys() is not None:
        held.append("published keys")
    if isinstance(target, WebhookStore):
        if target.webhooks():
            held.append("webhooks")
        if target.notifications(limit=1):
            held.append("notifications")
    refusal = not_empty(held)
    if refusal is not None:
        raise refusal


def _desk_orders(store: Store, records: Sequence[OrderRecord]) -> list[DeskOrder]:
    """The records with everything their orders carry: in bulk from a
    :class:`~awl.store.protocol.BulkRead` store, else one read at a time."""
    if isinstance(store, BulkRead):
        return store.desk_orders(records)
    return [DeskOrder(record, events=tuple(store.events(oid)), calls=tuple(store.calls(oid)),
                      charges=tuple(store.charges(oid)), effects=tuple(store.effects(oid)),
                      passes=tuple(store.passes(oid)))
            for record in records for oid in (record.order.id,)]


def _ids(store: Store) -> list[str]:
    """Every order's id, newest first: read a page at a time, only the ids kept (a copy of
    a large desk never holds its documents whole)."""
    return [record.order.id for page in _pages(store) for record in page]


def _batches(store: Store, ids: Sequence[str]) -> Iterator[list[DeskOrder]]:
    """The orders ``ids`` names (newest first), oldest first, :data:`BATCH` at a time, each
    batch one page read by cursor with everything its orders carry.

    Raises:
        CopyMismatch: the source's orders changed while it was being copied.
    """
    end = len(ids)
    while end > 0:
        start = max(0, end - BATCH)
        page = store.list_orders(limit=end - start, before=ids[start - 1] if start else None)
        if [record.order.id for record in page] != list(ids[start:end]):
            raise CopyMismatch(["the source's orders changed while it was being copied"])
        page.reverse()
        yield _desk_orders(store, page)
        end = start


def _copy_log(record: OrderRecord, events: Sequence[Event], target: Store) -> None:
    """Create the order in ``target`` with its events, reports and reviews, in order."""
    reports: list[WorkReport] = list(record.reports)
    reviews: list[Review] = list(record.reviews)
    target.create_order(record.order, events[0])
    rest = events[1:]
    for i, event in enumerate(rest):
        left = len(rest) - i  # events still to append, this one included
        # Each report and review goes with the event the desk wrote it with; should a store
        # hold more than those events explain, the last events take the rest, so both lists
        # arrive whole and in order (the comparison then shows any difference).
        report = reports.pop(0) if reports and (_carries_report(event)
                                                or len(reports) >= left) else None
        review = reviews.pop(0) if reviews and (_carries_review(event)
                                                or len(reviews) >= left) else None
        target.append(record.order.id, event, state=event.to, report=report, review=review)


def _copy_calls(order: DeskOrder, target: Store) -> None:
    order_id = order.record.order.id
    for record, usd in zip(order.calls, order.charges, strict=True):
        if usd is None:
            fields = record.to_json()
            del fields["ref"]
            target.record_call(fields)
            continue
        made = target.reserve_call(
            order_id, attempt=record.attempt, tool=record.tool, arguments=record.arguments,
            pass_jti=record.pass_jti, usd=usd, started_at=record.started_at, scopes=())
        if isinstance(made, OverBudget):  # the source kept within these budgets; cannot be
            raise CopyMismatch([f"call {record.ref} of order {order_id} was refused by the "
                                f"target ({made.scope}); the source is damaged"])
        if made.record.ref != record.ref:
            raise CopyMismatch([f"call {record.ref} of order {order_id} was numbered "
                                f"{made.record.ref} by the target"])
        if record.outcome == "held":  # the effect it makes is then restored as it stands
            target.hold_call(order_id, record.ref, result=record.result,
                             ended_at=record.ended_at)
        elif record.outcome != "pending":
            target.finish_call(order_id, record.ref, outcome=record.outcome,
                               result=record.result, error=record.error,
                               ended_at=record.ended_at)


def _write_one_by_one(batches: Iterable[Sequence[DeskOrder]], target: Store) -> None:
    """Fill a target without :class:`~awl.store.protocol.Restore` through its other
    operations: every order first (calls are charged to the orders above), then each
    order's calls, effects and passes."""
    orders = [order for batch in batches for order in batch]
    for order in orders:
        _copy_log(order.record, order.events, target)
    for order in orders:
        _copy_calls(order, target)
        for effect in order.effects:
            target.restore_effect(effect)
        for issued in order.passes:
            target.save_pass(issued)


def _outbox(source: Store, target: Store) -> list[Webhook]:
    """The source's webhooks (oldest first); its notifications are read a page at a time
    (:func:`_notes`).

    Raises:
        BadRequest: the source has some and the target keeps none (nothing was written).
    """
    if not isinstance(source, WebhookStore):
        return []
    hooks = source.webhooks()
    if (hooks or source.notifications(limit=1)) and not isinstance(target, WebhookStore):
        raise BadRequest(f"the source has {len(hooks)} webhooks and notifications, which the "
                         "target store cannot keep; copy into a store that keeps webhooks "
                         "(SQLite, PostgreSQL); nothing was written")
    return hooks


def _notes(store: Store) -> Iterator[list[Notification]]:
    """The store's notifications, oldest first, :data:`OUTBOX_PAGE` at a time (an outbox
    may hold far more than should be in memory at once)."""
    if not isinstance(store, WebhookStore):
        return
    page = store.notifications_after(limit=OUTBOX_PAGE)
    while page:
        yield page
        page = store.notifications_after(page[-1].id, limit=OUTBOX_PAGE)


def copy_store(source: Store, target: Store) -> CopyCounts:
    """Copy everything ``source`` holds into the empty ``target``, then compare the two.

    A :class:`~awl.store.protocol.Restore` target is written in one transaction, so a copy
    that fails or is killed half way leaves it empty; any other target is written record by
    record, and a copy stopped half way leaves it holding part of the desk (which a second
    copy into it refuses).

    Raises:
        BadRequest: ``target`` is not empty (it holds orders, revocations or tokens);
            nothing was written.
        CopyMismatch: the copy does not read back equal to the source.
    """
    _empty_or_refuse(target)
    ids = _ids(source)  # written oldest first, so the target lists them in the same order
    counts = Counter[str]()

    def counted() -> Iterator[list[DeskOrder]]:
        for batch in _batches(source, ids):
            for order in batch:
                counts.update(events=len(order.events), calls=len(order.calls),
                              effects=len(order.effects), passes=len(order.passes),
                              reports=len(order.record.reports),
                              reviews=len(order.record.reviews))
            yield batch

    revocations = source.revocations()
    tokens = source.tokens()
    hooks = _outbox(source, target)
    noted = [0]

    def notes() -> Iterator[Notification]:
        for page in _notes(source):
            noted[0] += len(page)
            yield from page

    keys = source.published_keys() if isinstance(source, KeyDirectory) else None
    public_keys = "none"
    if keys is not None:
        public_keys = "copied" if isinstance(target, KeyDirectory) else "not kept"
    if isinstance(target, Restore):
        target.restore(counted(), revocations=revocations, tokens=tokens,
                       keys=keys if isinstance(target, KeyDirectory) else None,
                       webhooks=hooks, notifications=notes())
    else:
        _write_one_by_one(counted(), target)
        for jti, revocation in revocations.items():
            target.revoke(jti, reason=revocation.reason, at=revocation.at)
        for token in tokens:
            target.save_token(token.token_hash, token.principal, created_at=token.created_at)
        if keys is not None and isinstance(target, KeyDirectory):
            target.publish_keys(keys)
        if isinstance(target, WebhookStore):  # after the orders: their writes notify no one
            for hook in hooks:
                target.add_webhook(hook)
            for note in notes():
                target.restore_notification(note)
    differences = compare_stores(source, target)
    if differences:
        raise CopyMismatch(differences)
    return CopyCounts(
        orders=len(ids), events=counts["events"], reports=counts["reports"],
        reviews=counts["reviews"], calls=counts["calls"], effects=counts["effects"],
        passes=counts["passes"], revocations=len(revocations), tokens=len(tokens),
        webhooks=len(hooks), notifications=noted[0], public_keys=public_keys)


def compare_stores(a: Store, b: Store) -> list[str]:
    """Every difference between what two stores hold, as lines of text (none: equal)."""
    return list(_differences(a, b))


def _pages(store: Store) -> Iterator[list[OrderRecord]]:
    """The store's orders, newest first, :data:`BATCH` at a time (so a large desk is never
    held whole)."""
    page = store.list_orders(limit=BATCH)
    while page:
        yield page
        page = store.list_orders(limit=BATCH, before=page[-1].order.id)


def _differences(a: Store, b: Store) -> Iterator[str]:
    workers: set[str] = set()
    counted = [0, 0]
    pages: Iterator[tuple[list[OrderRecord], list[OrderRecord]]] = zip_longest(
        _pages(a), _pages(b), fillvalue=[])
    for mine, theirs in pages:
        counted[0] += len(mine)
        counted[1] += len(theirs)
        if [r.order.id for r in mine] != [r.order.id for r in theirs]:
            for rest_a, rest_b in pages:
                counted[0] += len(rest_a)
                counted[1] += len(rest_b)
            yield (f"the orders differ: {counted[0]} in the source, {counted[1]} in the copy "
                   "(or listed in another order)")
            return
        left, right = _desk_orders(a, mine), _desk_orders(b, theirs)
        for order, other in zip(left, right, strict=True):
            oid = order.record.order.id
            workers.add(order.record.order.to)
            if order.record != other.record:
                yield f"order {oid}: the order, its state, seq, reports or reviews differ"
            for what in ("events", "calls", "charges", "effects", "passes"):
                if getattr(order, what) != getattr(other, what):
                    yield f"order {oid}: its {what} differ"
        for order, mine_used, theirs_used in zip(left, _usages(a, left), _usages(b, right),
                                                 strict=True):
            if not _same(mine_used, theirs_used):
                yield f"order {order.record.order.id}: its usage differs"
            for issued in order.passes:
                oid, jtis = order.record.order.id, frozenset({issued.jti})
                if not _same(a.usage(oid, jtis), b.usage(oid, jtis)):
                    yield f"order {oid}: its usage under pass {issued.jti} differs"
    for worker in sorted(workers):  # from the tallies each store keeps (not the documents)
        if a.track_record(worker) != b.track_record(worker):
            yield f"the track record of {worker} differs"
    if a.blocked_orders() != b.blocked_orders():
        yield "the question queue differs"
    if list(a.revocations().items()) != list(b.revocations().items()):
        yield "the revocations differ"
    if a.revoked() != b.revoked():
        yield "the revoked passes differ"
    if a.tokens() != b.tokens():
        yield "the desk tokens differ"
    if (isinstance(a, KeyDirectory) and isinstance(b, KeyDirectory)
            and a.published_keys() != b.published_keys()):
        yield "the published public keys differ"
    if isinstance(a, WebhookStore) and isinstance(b, WebhookStore):
        if a.webhooks() != b.webhooks():
            yield "the webhooks differ"
        if any(mine != theirs for mine, theirs in zip_longest(_notes(a), _notes(b))):
            yield "the notifications differ"


def _usages(store: Store, orders: Sequence[DeskOrder]) -> list[Usage]:
    ids = [order.record.order.id for order in orders]
    if isinstance(store, BulkRead):
        return store.usages(ids)
    return [store.usage(oid) for oid in ids]


def _same(left: Usage, right: Usage) -> bool:
    """Whether two stores count the same usage (usd sums may differ in the last bit: the
    copy adds a sub-order's calls to the orders above in another order)."""
    return ((left.tool_calls, left.first_call_at) == (right.tool_calls, right.first_call_at)
            and math.isclose(left.usd, right.usd, rel_tol=1e-12, abs_tol=USD_TOLERANCE))
