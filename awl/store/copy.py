"""Copying a whole desk from one store to another, and checking that the copy is equal.

The copy goes through the :class:`~awl.store.protocol.Store` operations alone, so it works
between any two backends, a new one included: orders are created oldest first with their
events, reports and reviews; each order's calls are numbered again in N order (a counted
call reserved with the usd it counted, then finished or held; a refusal recorded as it was),
so the target computes the same refs, totals and charges to the orders above; then come the
effects (each restored as it stands: a copy replays no commit), the passes, the revocations,
the tokens, and the desk's published public keys when both stores keep them
(:class:`~awl.store.protocol.KeyDirectory`; a target that keeps none is said to, the keys
staying in the desk's home folder). Locks are not copied: a lock belongs to a committer
running against the source, and leases run out on their own.

:func:`compare_stores` then reads both stores back, everything the protocol can read, and
lists every difference; :func:`copy_store` raises when there is one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from awl.documents.errors import AWLError, BadRequest
from awl.documents.models import Event, Review, WorkReport
from awl.store.protocol import KeyDirectory, OrderRecord, OverBudget, Store
from awl.store.rules import USD_TOLERANCE

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
                f"tokens{keys}")


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
    if held:
        raise BadRequest(f"the target store already holds {', '.join(held)}; copy into an "
                         "empty store (nothing was written)")


def _copy_log(record: OrderRecord, events: list[Event], target: Store) -> None:
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


def _copy_calls(order_id: str, source: Store, target: Store) -> int:
    calls = source.calls(order_id)
    for record, usd in zip(calls, source.charges(order_id), strict=True):
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
    return len(calls)


def _copy_effects(order_id: str, source: Store, target: Store) -> int:
    effects = source.effects(order_id)
    for effect in effects:
        target.restore_effect(effect)
    return len(effects)


def copy_store(source: Store, target: Store) -> CopyCounts:
    """Copy everything ``source`` holds into the empty ``target``, then compare the two.

    Raises:
        BadRequest: ``target`` is not empty (it holds orders, revocations or tokens);
            nothing was written.
        CopyMismatch: the copy does not read back equal to the source.
    """
    _empty_or_refuse(target)
    records = source.list_orders(limit=None)
    records.reverse()  # oldest first, so the target lists them in the same order
    events = calls = effects = passes = 0
    for record in records:
        log = source.events(record.order.id)
        _copy_log(record, log, target)
        events += len(log)
    for record in records:  # every order exists first: calls are charged to those above
        calls += _copy_calls(record.order.id, source, target)
        effects += _copy_effects(record.order.id, source, target)
        for issued in source.passes(record.order.id):
            target.save_pass(issued)
            passes += 1
    revocations = source.revocations()
    for jti, revocation in revocations.items():
        target.revoke(jti, reason=revocation.reason, at=revocation.at)
    tokens = source.tokens()
    for token in tokens:
        target.save_token(token.token_hash, token.principal, created_at=token.created_at)
    keys = source.published_keys() if isinstance(source, KeyDirectory) else None
    public_keys = "none"
    if keys is not None:
        public_keys = "copied" if isinstance(target, KeyDirectory) else "not kept"
        if isinstance(target, KeyDirectory):
            target.publish_keys(keys)
    differences = compare_stores(source, target)
    if differences:
        raise CopyMismatch(differences)
    return CopyCounts(
        orders=len(records), events=events,
        reports=sum(len(r.reports) for r in records),
        reviews=sum(len(r.reviews) for r in records), calls=calls, effects=effects,
        passes=passes, revocations=len(revocations), tokens=len(tokens),
        public_keys=public_keys)


def compare_stores(a: Store, b: Store) -> list[str]:
    """Every difference between what two stores hold, as lines of text (none: equal)."""
    return list(_differences(a, b))


def _differences(a: Store, b: Store) -> Iterator[str]:
    mine, theirs = a.list_orders(limit=None), b.list_orders(limit=None)
    if [r.order.id for r in mine] != [r.order.id for r in theirs]:
        yield (f"the orders differ: {len(mine)} in the source, {len(theirs)} in the copy "
               "(or listed in another order)")
        return
    workers: set[str] = set()
    for record, other in zip(mine, theirs, strict=True):
        oid = record.order.id
        workers.add(record.order.to)
        if record != other:
            yield f"order {oid}: the order, its state, seq, reports or reviews differ"
        for what, left, right in (
            ("events", a.events(oid), b.events(oid)),
            ("calls", a.calls(oid), b.calls(oid)),
            ("charges", a.charges(oid), b.charges(oid)),
            ("effects", a.effects(oid), b.effects(oid)),
            ("passes", a.passes(oid), b.passes(oid)),
        ):
            if left != right:
                yield f"order {oid}: its {what} differ"
        scopes = [None, *(frozenset({p.jti}) for p in a.passes(oid))]
        for jtis in scopes:
            if not _same_usage(a, b, oid, jtis):
                under = "" if jtis is None else f" under pass {next(iter(jtis))}"
                yield f"order {oid}: its usage{under} differs"
    for worker in sorted(workers):
        if a.track_rows(worker) != b.track_rows(worker):
            yield f"the track rows of {worker} differ"
    if list(a.revocations().items()) != list(b.revocations().items()):
        yield "the revocations differ"
    if a.revoked() != b.revoked():
        yield "the revoked passes differ"
    if a.tokens() != b.tokens():
        yield "the desk tokens differ"
    if (isinstance(a, KeyDirectory) and isinstance(b, KeyDirectory)
            and a.published_keys() != b.published_keys()):
        yield "the published public keys differ"


def _same_usage(a: Store, b: Store, order_id: str, jtis: frozenset[str] | None) -> bool:
    """Whether two stores count the same usage (usd sums may differ in the last bit: the
    copy adds a sub-order's calls to the orders above in another order)."""
    left, right = a.usage(order_id, jtis), b.usage(order_id, jtis)
    return ((left.tool_calls, left.first_call_at) == (right.tool_calls, right.first_call_at)
            and math.isclose(left.usd, right.usd, rel_tol=1e-12, abs_tol=USD_TOLERANCE))
