"""The desk's write path: one event appended per operation, decided again after a lost race.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from awl.desk.access import ACTION_ROLE, check_action
from awl.desk.effects import drop_held, held_calls, record_event
from awl.desk.home import default_store
from awl.desk.views import OrderView
from awl.documents.errors import (
    AWLError,
    BadRequest,
    Conflict,
    InvalidTransition,
)
from awl.documents.lifecycle import (
    ACTIVE,
    DESK_ACTOR,
    NOTE_ACTIONS,
    TABLE,
    TERMINAL,
    is_desk_principal,
    targets,
)
from awl.documents.models import (
    Event,
    Review,
    WorkOrder,
    WorkReport,
    format_time,
    parse_time,
    utc_now,
)
from awl.passes import revoke_order_passes
from awl.store.protocol import OrderRecord, Store

__all__ = ["Clock", "DeskCore", "Write"]

log = logging.getLogger("awl.desk")

Clock = Callable[[], datetime]

# The states each action is allowed in, for error messages.
_ALLOWED_IN: dict[str, tuple[str, ...]] = {
    action: tuple(sorted({str(f) for (f, a, _t) in TABLE if a == action and f is not None}))
    for action in ACTION_ROLE
}


@dataclass(frozen=True, slots=True)
class Write:
    """What an operation decided to append."""

    event: Event
    report: WorkReport | None = None
    review: Review | None = None
    # Raised after the write: the desk expired a stale order and now refuses the operation.
    refusal: AWLError | None = None


class DeskCore:
    """The desk's write path, under every operation of :class:`~awl.desk.desk.Desk`.

    Each write reads the order, checks the actor and the state, decides, and appends with an
    optimistic ``seq`` check, deciding again after a lost race; right after an event that
    ends an attempt or an order it tidies what the end leaves dangling. An active order
    found past its deadline is expired first.
    """

    def __init__(self, store: Store | None = None, *, clock: Clock | None = None,
                 conflict_retries: int = 1, poll_interval: float = 0.02,
                 max_poll_interval: float = 0.25) -> None:
        if store is None:
            store = default_store()
        self.store: Store = store
        self._clock: Clock = clock or utc_now
        self._retries = max(0, conflict_retries)
        self._poll = poll_interval
        self._max_poll = max(poll_interval, max_poll_interval)
        self._changed = threading.Condition()
        self._generation = 0

    def now(self) -> datetime:
        """The desk's current time."""
        return self._clock()

    def _wake(self) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def _fresh(self, record: OrderRecord) -> OrderView:
        """The record's view, expiring it first when it is active past its deadline."""
        for _ in range(8):
            now = self.now()
            if record.state not in ACTIVE or parse_time(record.order.deadline) >= now:
                return OrderView.of(record)
            event = self._event(record, "expire", DESK_ACTOR, "expired", now,
                                note="the deadline passed")
            try:
                self.store.append(record.order.id, event, state="expired")
            except Conflict:
                record = self.store.load(record.order.id)
                continue
            self._wake()
            view = self._after(record, Write(event))
            self._tidy(view, event)
            return view
        raise Conflict(f"order {record.order.id!r} keeps changing while being expired; "
                       "read it again")

    def record(self, order_id: str, actor: str, action: str, *, note: str | None = None,
               data: Mapping[str, Any] | None = None) -> OrderView:
        """Log a non-transition event (``settle``, ``retry``, ``drop``) for the effects path.

        The action must be allowed in the order's state and by the actor's role (``settle``
        and ``retry``: the manager, on an approved order; ``drop``: the desk, ``awl:*``).
        """
        if action not in NOTE_ACTIONS:
            raise BadRequest(f"{action!r} is not a note action; use one of "
                             f"{', '.join(sorted(NOTE_ACTIONS))}")
        return self._simple(order_id, action, actor, note=note,
                            data=None if data is None else dict(data))

    def _simple(self, order_id: str, action: str, actor: str, *, note: str | None = None,
                data: dict[str, Any] | None = None) -> OrderView:
        def plan(record: OrderRecord, now: datetime) -> Write:
            to = targets(record.state, action)[0]
            return Write(self._event(record, action, actor, to, now, note=note, data=data))

        return self._run(order_id, action, actor, plan)

    def _event(self, record: OrderRecord, action: str, actor: str, to: str, now: datetime, *,
               note: str | None = None, data: Mapping[str, Any] | None = None) -> Event:
        fields: dict[str, Any] = {
            "seq": record.seq + 1, "at": format_time(now), "actor": actor, "action": action,
            "from": record.state, "to": to,
        }
        if note is not None:
            fields["note"] = note
        if data is not None:
            fields["data"] = dict(data)
        return Event.model_validate(fields, by_alias=True, by_name=False)

    def _run(self, order_id: str, action: str, actor: str,
             plan: Callable[[OrderRecord, datetime], Write], *,
             expire_stale: bool = True) -> OrderView:
        """Read, check actor and state, decide, append; decide again after a lost race."""
        for round_ in range(self._retries + 1):
            record = self.store.load(order_id)
            check_action(record.order, action, actor)
            if round_ == 0 and not is_desk_principal(actor):
                self._mend(record)  # the desk's own writes are the tidying itself
            now = self.now()
            stale = record.state in ACTIVE and parse_time(record.order.deadline) < now
            if stale and (expire_stale or record.state != "working"):
                view = self._fresh(record)
                raise self._wrong_state(view.order, view.state, action)
            if not targets(record.state, action):
                raise self._wrong_state(record.order, record.state, action)
            write = plan(record, now)
            try:
                self.store.append(order_id, write.event, state=write.event.to,
                                  report=write.report, review=write.review)
            except Conflict:
                if round_ == self._retries:
                    raise
                continue
            self._wake()
            view = self._after(record, write)
            self._tidy(view, write.event)
            if write.refusal is not None:
                raise write.refusal
            return view
        raise AssertionError("unreachable")  # pragma: no cover

    def _tidy(self, view: OrderView, event: Event, *, drop_at: str | None = None) -> None:
        """Right after ``event`` is written, undo what it leaves dangling.

        A rework drops the held calls of the attempt it ends (and of any earlier one): they
        can never run. An order that reaches a terminal state has every Delegation Pass
        issued for it revoked (DP-8), as of the event's time, so the effects the manager
        approved still commit (the commit path accepts a pass revoked after the hold); an
        unapproved end also drops every held call (CM-4). An approval drops nothing: the
        commit drops what the approval leaves out.

        The event is written whatever happens here, so a failure is logged, not raised;
        everything here is idempotent and the commit path checks again before running. What
        a failure (or a crash right after the event) leaves undone, :meth:`_mend` does when
        the desk next touches the order; ``drop_at`` is then the time its drops are written.
        """
        ends_attempt = event.action == "rework"
        if event.from_ == event.to or not (ends_attempt or event.to in TERMINAL):
            return
        order_id = view.id
        try:
            if event.to in TERMINAL:

                revoke_order_passes(self.store, order_id, reason=f"order {event.to}",
                                    now=event.at)
            reasons: dict[str, str] = {}
            extra: dict[str, Any] = {}
            note = ""
            if ends_attempt:
                ended = view.attempt - 1
                note = f"attempt {ended} was sent back for rework"
                extra["attempt"] = ended
                for call in held_calls(self.store, order_id, attempts=range(1, view.attempt)):
                    reasons[call.ref] = f"attempt {call.attempt} was sent back for rework"
            elif event.to != "approved":
                note = f"the order was {event.to}"
                reasons = {call.ref: note for call in held_calls(self.store, order_id)}
            if reasons:
                drop_held(self, order_id, reasons, actor=DESK_ACTOR, at=drop_at or event.at,
                          note=note, data=extra)
        except AWLError as exc:
            log.warning("order %s is %s (event %d), but tidying after it failed: %s",
                        order_id, event.to, event.seq, exc)

    def _mend(self, record: OrderRecord) -> None:
        """Finish the tidying an ended order's end left undone (DP-8, CM-4).

        The ending event and its tidying (:meth:`_tidy`) are separate writes: a desk killed
        between them (``kill -9``, a power cut), or a store that failed under the tidying,
        leaves an ended order whose passes still verify and whose held calls still read
        ``held``. So whenever the desk touches an ended order (reads it, or is asked to act on
        it), it looks: a pass of the order not yet expired and not revoked, or (unless it
        was approved) a held call, and then it tidies after the ending event as it would have
        then (revocations as of that event's time; drops now, in one ``drop`` event by
        ``awl:desk``). A call dropped by a tidying killed before its ``drop`` event is
        logged then. A call the gateway held while the order was ending (reserved before
        the end, held after its tidying) is dropped the same way. The look costs a read or
        two; the log is read only when an ended order has a held or dropped call, or a live
        pass not revoked. Failures are logged, as the tidying's are: the caller's answer
        does not depend on them.
        """
        if record.state not in TERMINAL:
            return
        order_id = record.order.id
        try:
            moment = self.now()
            live = [p.jti for p in self.store.passes(order_id) if p.exp > moment.timestamp()]
            unrevoked = bool(live) and not set(live) <= self.store.revoked().keys()
            effects = [] if record.state == "approved" else self.store.effects(order_id)
            held = any(e.state == "held" for e in effects)
            dropped = {e.ref: e.error or "dropped" for e in effects if e.state == "dropped"}
            if not (unrevoked or held or dropped):
                return
            events = self.store.events(order_id)
            logged = {ref for e in events if e.action == "drop" and e.data
                      and isinstance(e.data.get("refs"), list) for ref in e.data["refs"]}
            unlogged = {ref: why for ref, why in dropped.items() if ref not in logged}
            if not (unrevoked or held or unlogged):
                return
            ending = next((e for e in reversed(events)
                           if e.to == record.state and e.from_ != e.to), None)
            if ending is None:  # pragma: no cover - a terminal state is reached by an event
                return
        except AWLError as exc:
            log.warning("order %s is %s, but looking for what its end left undone failed: %s",
                        order_id, record.state, exc)
            return
        log.info("order %s is %s since event %d; finishing what that end left undone",
                 order_id, record.state, ending.seq)
        if unlogged:  # dropped, but killed before the drop event: log it now
            try:
                record_event(self, order_id, DESK_ACTOR, "drop",
                             note=f"the order was {record.state}",
                             data={"refs": list(unlogged), "reasons": unlogged})
            except AWLError as exc:
                log.warning("order %s: logging the drop of %s failed: %s", order_id,
                            ", ".join(unlogged), exc)
        self._tidy(OrderView.of(record), ending, drop_at=format_time(moment))

    @staticmethod
    def _after(record: OrderRecord, write: Write) -> OrderView:
        return OrderView(
            order=record.order, state=write.event.to, seq=write.event.seq,
            reports=record.reports + ((write.report,) if write.report else ()),
            reviews=record.reviews + ((write.review,) if write.review else ()),
            updated_at=write.event.at,
        )

    @staticmethod
    def _wrong_state(order: WorkOrder, state: str, action: str) -> InvalidTransition:
        allowed = _ALLOWED_IN.get(action, ())
        if set(allowed) == ACTIVE:
            needed = "active (not yet approved, declined, expired or cancelled)"
        elif len(allowed) > 1:
            needed = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
        else:
            needed = allowed[0] if allowed else "in another state"
        return InvalidTransition(
            f"cannot {action} order {order.id!r}: it is {state}; {action} needs it {needed}",
            state=state, action=action)
