"""The in-memory store: the reference implementation of :class:`awl.store.protocol.Store`.

Everything lives in dictionaries behind one lock, so every method is atomic against every
other thread. It keeps nothing across processes; use it for tests and short-lived desks.
The checks it shares with the other backends live in :mod:`awl.store.rules`.
"""


from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any

from awl.documents.lifecycle import ACTIVE
from awl.documents.models import (
    CallRecord,
    Event,
    Review,
    WorkOrder,
    WorkReport,
    stored_time,
)
from awl.store.protocol import (
    BlockedRow,
    DeliveryAttempt,
    EffectState,
    LockInfo,
    Notification,
    OrderRecord,
    OverBudget,
    PassRecord,
    QueueKey,
    Reservation,
    Reserved,
    Revocation,
    Scope,
    Settlement,
    TokenRecord,
    TrackRecord,
    TrackRow,
    Usage,
    Webhook,
    WebSession,
)
from awl.store.queue import queue_key, reweighed
from awl.store.rules import (
    MAX_CHAIN,
    after_attempt,
    call_not_found,
    call_number,
    check_ending,
    check_first_event,
    check_hold,
    check_notification_state,
    check_takeover,
    effect_counts,
    effect_event_kind,
    ended_data,
    exceeded_above,
    exceeded_scope,
    held_call,
    make_call,
    may_take,
    new_call,
    new_notifications,
    next_effect,
    notification_conflict,
    notification_not_found,
    notification_payload,
    order_event_kind,
    order_exists_conflict,
    order_not_found,
    orphaned,
    own_json,
    record_from,
    record_order_id,
    restored_effect,
    seq_conflict,
    stale_order,
    state_names,
    stored_lock,
    timestamp,
    web_session_conflict,
    webhook_conflict,
)
from awl.store.tally import Tally, may_change, queued

__all__ = ["MemoryStore"]


class _Call:
    """A call as the store keeps it: its record's JSON data (the store's own, checked when
    stored; replaced, never changed in place), and the CallRecord made from it when first
    read (a gateway writes a call twice and reads it seldom)."""

    __slots__ = ("_record", "counted", "data", "started", "usd")

    def __init__(self, data: dict[str, Any], counted: bool, usd: float, started: float,
                 record: CallRecord | None = None) -> None:
        self.data = data
        self.counted = counted
        self.usd = usd
        self.started = started
        self._record = record

    @property
    def record(self) -> CallRecord:
        if self._record is None:
            self._record = CallRecord.model_validate(self.data)
        return self._record

    @record.setter
    def record(self, record: CallRecord) -> None:
        self.data, self._record = record.to_json(), record

    @property
    def pass_jti(self) -> str | None:
        return self.data.get("pass_jti")


@dataclass
class _Charged:
    """What an order's sub-orders, at any depth, have spent: charged to its budget."""

    calls: int = 0
    usd: float = 0.0
    first: _Call | None = None  # their earliest call, counted or not


@dataclass
class _Order:
    order: WorkOrder
    state: str
    events: list[Event]
    reports: list[WorkReport]
    reviews: list[Review]
    calls: dict[int, _Call]
    effects: dict[int, EffectState]
    charged: _Charged = field(default_factory=_Charged)
    counted_calls: int = 0
    """Its own counted calls, kept as they are reserved so a reservation reads no list."""
    counted_usd: float = 0.0
    """Their usd, summed in N order (as a sum over the calls would be)."""

    def track_row(self) -> TrackRow:
        return TrackRow.of(self.record(), self.events[1] if len(self.events) > 1 else None)

    def blocked_row(self, blocking: int) -> BlockedRow:
        latest = self.reports[-1] if self.reports else None
        return BlockedRow(
            order_id=self.order.id, goal=self.order.goal, worker=self.order.to,
            manager=self.order.manager, escalate_to=self.order.escalate_to,
            deadline=self.order.deadline, seq=self.events[-1].seq,
            updated_at=self.events[-1].at,
            report_attempt=latest.attempt if latest is not None else None,
            reworks=self.record().reworks,
            questions=tuple(latest.questions or ()) if latest is not None else (),
            blocking=blocking)

    def record(self) -> OrderRecord:
        return OrderRecord(
            order=self.order, state=self.state, seq=self.events[-1].seq,
            reports=tuple(self.reports), reviews=tuple(self.reviews),
            updated_at=self.events[-1].at,
        )


def _active_below(orders: dict[str, _Order], children: dict[str, list[str]],
                  order_id: str) -> int:
    """Active orders below ``order_id`` (``children``: each order's children), reached
    through active orders only, each once (which also guards against a damaged store's
    cycle)."""
    seen = {order_id}
    frontier = [order_id]
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in seen and orders[child].state in ACTIVE:
                seen.add(child)
                frontier.append(child)
    return len(seen) - 1


class MemoryStore:
    """A :class:`awl.store.protocol.Store` in memory, safe to share between threads.

    Example:
        >>> store = MemoryStore()
        >>> store.list_orders()
        []
    """

    in_process = True
    """Its calls are quick and local: a gateway runs them on its event loop (GW-20)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._news = threading.Condition(self._lock)  # an order's log grew
        self._orders: dict[str, _Order] = {}
        self._locks: dict[str, LockInfo] = {}
        self._revoked: dict[str, Revocation] = {}
        self._tokens: dict[str, TokenRecord] = {}
        self._passes: dict[str, PassRecord] = {}
        self._webhooks: dict[str, Webhook] = {}
        self._outbox: dict[str, Notification] = {}
        self._tally = Tally()
        self._children: dict[str, list[str]] = {}
        self._keys: dict[str, QueueKey] = {}  # each blocked order's, as awl.store.queue says
        self._queue: list[QueueKey] = []  # the same keys, kept in the queue's order
        self._web_sessions: dict[str, WebSession] = {}

    def _get(self, order_id: str) -> _Order:
        found = self._orders.get(order_id)
        if found is None:
            raise order_not_found(order_id)
        return found

    # Orders and their logs -----------------------------------------------------------
    def create_order(self, order: WorkOrder, event: Event) -> None:
        """Store a new order with its first event (seq 1); its state is ``event.to``."""
        check_first_event(order, event)
        with self._lock:
            old = self._orders.get(order.id)
            if old is not None:
                raise order_exists_conflict(order.id, old.events[-1].seq)
            self._orders[order.id] = new = _Order(
                order=order, state=event.to, events=[event],
                reports=[], reviews=[], calls={}, effects={},
            )
            self._tally.write(order.to, order.manager, order.id, None, new.track_row())
            if order.parent_id is not None:
                self._children.setdefault(order.parent_id, []).append(order.id)
            if queued(event.to):
                self._enqueue(order.id, 1 + _active_below(self._orders, self._children,
                                                          order.id), event.at)
            if event.to in ACTIVE:
                self._reweigh(order.parent_id, 1)

    def load(self, order_id: str) -> OrderRecord:
        """The order and all it carries. NotFound if absent."""
        with self._lock:
            return self._get(order_id).record()

    def append(
        self,
        order_id: str,
        event: Event,
        *,
        state: str,
        report: WorkReport | None = None,
        review: Review | None = None,
    ) -> None:
        """Append ``event`` if its seq follows the stored one, else Conflict."""
        with self._lock:
            found = self._get(order_id)
            seq = found.events[-1].seq
            if event.seq != seq + 1:
                raise seq_conflict(order_id, event, seq)
            old = found.track_row() if may_change(found.state, state, report, review) else None
            old_state = found.state
            found.events.append(event)
            found.state = state
            if queued(old_state):
                self._dequeue(order_id)
            if queued(state):
                self._enqueue(order_id, 1 + _active_below(self._orders, self._children,
                                                          order_id), event.at)
            if old_state in ACTIVE and state not in ACTIVE:
                self._reweigh(found.order.parent_id,
                              -1 - _active_below(self._orders, self._children, order_id))
            if report is not None:
                found.reports.append(report)
            if review is not None:
                found.reviews.append(review)
            if old is not None:
                self._tally.write(found.order.to, found.order.manager, order_id, old,
                                  found.track_row())
            self._notify(found, order_event_kind(event), event.at, lambda kind: (
                notification_payload(kind, found.order, state, event.at, self._counts(found),
                                     event=event)))
            self._news.notify_all()

    def wait_for_events(self, order_id: str, after: int, timeout: float) -> bool:
        """Block until the order's log is past ``after``, at most ``timeout`` seconds."""
        with self._lock:
            return self._news.wait_for(
                lambda: self._get(order_id).events[-1].seq > after, max(timeout, 0.0))

    def events(self, order_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """Events with seq > ``after``, in order (at most ``limit``)."""
        with self._lock:
            # seq runs 1..n, so seq s sits at index s - 1.
            events = self._get(order_id).events[max(after, 0):]
        return events if limit is None else events[:limit]

    def track_rows(self, worker: str) -> list[TrackRow]:
        """One track row per order addressed to ``worker``, newest first."""
        with self._lock:
            return [o.track_row() for o in reversed(self._orders.values())
                    if o.order.to == worker]

    def track_record(self, worker: str, *, manager: str | None = None) -> TrackRecord:
        """The worker's track record (only ``manager``'s orders, if given), from its tallies."""
        with self._lock:
            return self._tally.record(worker, manager)

    def _reweigh(self, parent_id: str | None, delta: int) -> None:
        """Add ``delta`` to the weight of each blocked order above an order under
        ``parent_id`` that starts (+1) or stops being active (:func:`awl.store.queue.
        reweighed`)."""
        def step(order_id: str) -> tuple[str | None, str] | None:
            found = self._orders.get(order_id)
            return None if found is None else (found.order.parent_id, found.state)

        for above in list(reweighed(parent_id, step)):
            rank, asked, _ = self._dequeue(above)
            self._keys[above] = key = (rank - delta, asked, above)
            insort(self._queue, key)

    def _enqueue(self, order_id: str, weight: int, asked_at: str) -> None:
        """Queue the blocked order ``order_id`` of ``weight``, asked at ``asked_at``."""
        self._keys[order_id] = key = queue_key(weight, asked_at, order_id)
        insort(self._queue, key)

    def _dequeue(self, order_id: str) -> QueueKey:
        """Take the order ``order_id`` out of the queue; its key."""
        key = self._keys.pop(order_id)
        del self._queue[bisect_left(self._queue, key)]
        return key

    def blocked_orders(self, answerer: str | None = None, *, after: QueueKey | None = None,
                       limit: int | None = None) -> list[BlockedRow]:
        """One row per blocked order ``answerer`` may answer, in the queue's order, after
        ``after`` (at most ``limit``): read from the queue kept in order, from ``after``
        on, so a page sorts nothing."""
        rows: list[BlockedRow] = []
        with self._lock:
            start = 0 if after is None else bisect_right(self._queue, after)
            for at in range(start, len(self._queue)):
                if len(rows) == limit:
                    break
                rank, _, order_id = self._queue[at]
                found = self._orders[order_id]
                if answerer is None or answerer in found.order.answerers:
                    rows.append(found.blocked_row(-rank))
        return rows

    def overdue_blocked(self, now: datetime) -> list[str]:
        """The blocked orders past their deadline at ``now``."""
        with self._lock:
            return [order_id for order_id in self._keys
                    if stored_time(self._orders[order_id].order.deadline) < now]

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
        """Orders matching every filter given, most recently created first."""
        states = state_names(state)
        with self._lock:
            newest = list(reversed(self._orders.values()))
            if before is not None:
                self._get(before)
                newest = newest[[o.order.id for o in newest].index(before) + 1:]
            found = [
                o.record() for o in newest
                if (states is None or o.state in states)
                and (worker is None or o.order.to == worker)
                and (manager is None or o.order.manager == manager)
                and (parent_id is None or o.order.parent_id == parent_id)
                and (party is None or party in (o.order.to, o.order.manager))
            ]
        end = None if limit is None else offset + limit
        return found[offset:end]

    # Gateway call records --------------------------------------------------------------
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
        with self._lock:
            found = self._get(order_id)
            if seq is not None and found.events[-1].seq != seq:
                raise stale_order(order_id, seq, found.events[-1].seq)
            def spent(jtis: frozenset[str] | None) -> tuple[int, float]:
                if jtis is None:
                    return (found.counted_calls + found.charged.calls,
                            found.counted_usd + found.charged.usd)
                mine = [c.usd for c in found.calls.values()
                        if c.counted and c.pass_jti in jtis]
                return len(mine), sum(mine)

            over = exceeded_scope(scopes, spent, usd)
            above = self._above(found)
            over = over or exceeded_above([
                (o.order.id, o.order.budget.tool_calls, o.order.budget.usd,
                 o.counted_calls + o.charged.calls, o.counted_usd + o.charged.usd)
                for o in above], usd)
            if over is not None:
                return OverBudget(over)
            n = len(found.calls) + 1
            data = new_call(order_id, n, attempt=attempt, tool=tool, arguments=arguments,
                            pass_jti=pass_jti, started_at=started_at)
            data["arguments"] = own_json(arguments, "a call's arguments")
            call = found.calls[n] = _Call(data, True, usd, timestamp(started_at))
            found.counted_calls += 1
            found.counted_usd += usd
            self._charge(above, call)
            return Reserved(data["ref"], data["attempt"], partial(record_from, data))

    def _above(self, found: _Order) -> list[_Order]:
        """The orders above ``found``, its parent first (see :data:`MAX_CHAIN`)."""
        chain: list[_Order] = []
        seen = {found.order.id}
        parent_id = found.order.parent_id
        while parent_id is not None and parent_id not in seen and len(chain) < MAX_CHAIN:
            parent = self._orders.get(parent_id)
            if parent is None:
                break
            chain.append(parent)
            seen.add(parent_id)
            parent_id = parent.order.parent_id
        return chain

    @staticmethod
    def _charge(above: Sequence[_Order], call: _Call) -> None:
        """Charge a sub-order's call to every order above it."""
        for order in above:
            charged = order.charged
            if call.counted:
                charged.calls += 1
                charged.usd += call.usd
            if charged.first is None or call.started < charged.first.started:
                charged.first = call

    def record_call(self, record_fields: dict[str, Any]) -> CallRecord:
        """Number and store a call that does not count (a refusal)."""
        order_id = record_order_id(record_fields)
        with self._lock:
            found = self._get(order_id)
            n = len(found.calls) + 1
            record = make_call(record_fields, n)
            call = found.calls[n] = _Call(record.to_json(), False, 0.0,
                                          timestamp(record.started_at), record)
            self._charge(self._above(found), call)
            return record

    def finish_call(
        self, order_id: str, ref: str, *, outcome: str, result: dict[str, Any] | None,
        error: str | None, ended_at: str,
    ) -> None:
        """Set the outcome of a reserved call."""
        check_ending(outcome, result, error, ended_at)
        with self._lock:
            _, call = self._call(order_id, ref)
            call.data = ended_data(call.data, ref, outcome=outcome, result=result, error=error,
                                   ended_at=ended_at)
            call._record = None

    def _call(self, order_id: str, ref: str) -> tuple[int, _Call]:
        calls = self._get(order_id).calls
        number = ref.rpartition("#")[2]
        if number.isdigit() and len(number) <= 18:
            # The ref exactly as the store wrote it (a gateway's, every call): no parse.
            found = calls.get(int(number))
            if found is not None and found.data["ref"] == ref:
                return int(number), found
        n, tool = call_number(order_id, ref)
        call = calls.get(n)
        if call is None or call.data["tool"] != tool:
            raise call_not_found(order_id, ref)
        return n, call

    def charges(self, order_id: str) -> list[float | None]:
        """What each call counts against the budget, by N (None: it does not count)."""
        with self._lock:
            return [c.usd if c.counted else None
                    for _, c in sorted(self._get(order_id).calls.items())]

    def calls(self, order_id: str, *, attempt: int | None = None) -> list[CallRecord]:
        """The order's call records by N."""
        with self._lock:
            return [
                c.record for _, c in sorted(self._get(order_id).calls.items())
                if attempt is None or c.data["attempt"] == attempt
            ]

    def usage(self, order_id: str, jtis: frozenset[str] | None = None) -> Usage:
        """Counted calls and USD so far (for the calls under ``jtis`` if given)."""
        with self._lock:
            found = self._get(order_id)
            mine = [c for c in found.calls.values() if jtis is None or c.pass_jti in jtis]
            charged = _Charged() if jtis is not None else replace(found.charged)
        counted = [c for c in mine if c.counted]
        starts = [*mine, *([] if charged.first is None else [charged.first])]
        first = min(starts, key=lambda c: c.started, default=None)
        return Usage(
            tool_calls=len(counted) + charged.calls,
            usd=sum(c.usd for c in counted) + charged.usd,
            first_call_at=None if first is None else first.data["started_at"],
        )

    # Effects ---------------------------------------------------------------------------
    def effects(self, order_id: str) -> list[EffectState]:
        """Every effect state of the order, by N."""
        with self._lock:
            return [e for _, e in sorted(self._get(order_id).effects.items())]

    def hold_call(
        self, order_id: str, ref: str, *, result: dict[str, Any] | None, ended_at: str,
    ) -> EffectState:
        """Set a reserved call's outcome to ``held`` and create its ``held`` effect, at once."""
        check_hold(result, ended_at)
        with self._lock:
            n, call = self._call(order_id, ref)
            effects = self._orders[order_id].effects
            record, _, effect = held_call(call.data, n, ref, effects.get(n),
                                          result=result, ended_at=ended_at)
            call.record = record
            effects[n] = effect
            return effect

    def set_effect(
        self, order_id: str, ref: str, *, expect: Sequence[str] | None, state: str,
        attempt: int | None = None, result: dict[str, Any] | None = None,
        error: str | None = None, settlement: Settlement | None = None,
        count_dispatch: bool = False, at: str,
    ) -> EffectState:
        """Move an effect to ``state`` if it is in one of ``expect``; Conflict otherwise."""
        with self._lock:
            n, call = self._call(order_id, ref)
            effects = self._orders[order_id].effects
            new = next_effect(
                effects.get(n), call.record, expect=expect, state=state, attempt=attempt,
                result=result, error=error, settlement=settlement,
                count_dispatch=count_dispatch, at=at,
            )
            old = effects.get(n)
            effects[n] = new
            found = self._orders[order_id]
            self._notify(found, effect_event_kind(old, new), at, lambda kind: (
                notification_payload(kind, found.order, found.state, at, self._counts(found),
                                     effect=new, tool=call.record.tool)))
            return new

    def _notify(self, found: _Order, kind: str | None, at: str,
                payload: Callable[[str], dict[str, Any]]) -> None:
        """Put the notifications a write calls for in the outbox (under the write's lock)."""
        for note in new_notifications(list(self._webhooks.values()), kind, found.order.id, at,
                                      payload):
            self._outbox[note.id] = note

    @staticmethod
    def _counts(found: _Order) -> dict[str, int]:
        return effect_counts(e.state for e in found.effects.values())

    def restore_effect(self, effect: EffectState) -> None:
        """Store ``effect`` exactly as given (a copy of a desk), replacing any state."""
        with self._lock:
            n, call = self._call(effect.order_id, effect.ref)
            self._orders[effect.order_id].effects[n] = restored_effect(effect, call.record)

    # Locks ----------------------------------------------------------------------------
    def acquire_lock(self, info: LockInfo, *, replace: LockInfo | None = None) -> bool:
        """Take the named lock if free, or if it is still exactly ``replace``."""
        check_takeover(info, replace)
        with self._lock:
            if not may_take(self._locks.get(info.name), replace):
                return False
            self._locks[info.name] = stored_lock(info)
            return True

    def get_lock(self, name: str) -> LockInfo | None:
        """The current holder of the named lock, if any."""
        with self._lock:
            current = self._locks.get(name)
        return None if current is None else stored_lock(current)

    def release_lock(self, name: str, holder: str) -> None:
        """Release the lock if ``holder`` holds it."""
        with self._lock:
            current = self._locks.get(name)
            if current is not None and current.holder == holder:
                del self._locks[name]

    # Passes and tokens -------------------------------------------------------------------
    def revoke(self, jti: str, *, reason: str, at: str) -> None:
        """Record that a pass is revoked (idempotent: the first reason and time are kept)."""
        with self._lock:
            self._revoked.setdefault(jti, Revocation(reason=reason, at=at))

    def revoked(self) -> dict[str, str]:
        """Every revoked jti with its reason."""
        with self._lock:
            return {jti: r.reason for jti, r in self._revoked.items()}

    def revocations(self) -> dict[str, Revocation]:
        """Every revoked jti with its reason and time."""
        with self._lock:
            return dict(self._revoked)

    def save_pass(self, record: PassRecord) -> None:
        """Remember an issued pass (saving a jti again replaces its record)."""
        with self._lock:
            self._passes[record.jti] = record

    def passes(self, order_id: str) -> list[PassRecord]:
        """The passes saved for an order, in the order they were first saved."""
        with self._lock:
            return [p for p in self._passes.values() if p.order_id == order_id]

    def saved_pass(self, jti: str) -> PassRecord | None:
        """The pass saved under ``jti``, or None."""
        with self._lock:
            return self._passes.get(jti)

    def save_token(self, token_hash: str, principal: str, *, created_at: str) -> None:
        """Remember a desk access token by its hash."""
        with self._lock:
            self._tokens[token_hash] = TokenRecord(token_hash, principal, created_at)

    def principal_for(self, token_hash: str) -> str | None:
        """The principal a token hash was issued to."""
        with self._lock:
            found = self._tokens.get(token_hash)
            return None if found is None else found.principal

    def tokens(self) -> list[TokenRecord]:
        """Every desk access token (by hash), oldest first."""
        with self._lock:
            return list(self._tokens.values())

    def drop_token(self, token_hash: str) -> bool:
        """Forget a token; False if there was no such token."""
        with self._lock:
            return self._tokens.pop(token_hash, None) is not None

    # The approval page's sessions ---------------------------------------------------------
    def start_web_session(self, session: WebSession, *, now: float) -> None:
        """Keep a new session, forgetting every one expired by ``now``."""
        with self._lock:
            for id_hash, kept in list(self._web_sessions.items()):
                if kept.expires_at <= now:
                    del self._web_sessions[id_hash]
            if session.id_hash in self._web_sessions:
                raise web_session_conflict()
            self._web_sessions[session.id_hash] = session

    def web_session(self, id_hash: str, *, now: float) -> WebSession | None:
        """The session kept under ``id_hash``, unless absent or expired by ``now``."""
        with self._lock:
            found = self._web_sessions.get(id_hash)
        return found if found is not None and found.expires_at > now else None

    def end_web_session(self, id_hash: str) -> bool:
        """Forget a session; False if there was none."""
        with self._lock:
            return self._web_sessions.pop(id_hash, None) is not None

    # Subscriptions and outbox -----------------------------------------------------------
    def add_webhook(self, webhook: Webhook) -> None:
        """Keep a webhook subscription. Conflict if its id exists."""
        with self._lock:
            if webhook.id in self._webhooks:
                raise webhook_conflict(webhook.id)
            self._webhooks[webhook.id] = webhook

    def webhooks(self) -> list[Webhook]:
        """Every webhook subscription, oldest first."""
        with self._lock:
            return list(self._webhooks.values())

    def remove_webhook(self, webhook_id: str, *, at: str) -> bool:
        """Forget a webhook; its pending notifications become dead."""
        with self._lock:
            if self._webhooks.pop(webhook_id, None) is None:
                return False
            for note in list(self._outbox.values()):
                if note.webhook_id == webhook_id and note.state == "pending":
                    self._outbox[note.id] = orphaned(note, at)
            return True

    def claim_notifications(self, *, now: str, lease_until: str,
                            limit: int) -> list[tuple[Notification, Webhook]]:
        """Take up to ``limit`` due notifications, due again only at ``lease_until``."""
        moment = timestamp(now)
        with self._lock:
            due = sorted((n for n in self._outbox.values()
                          if n.state == "pending" and timestamp(n.next_at) <= moment),
                         key=lambda n: timestamp(n.next_at))[:max(limit, 0)]
            claimed = []
            for note in due:
                self._outbox[note.id] = note = replace(note, next_at=lease_until)
                claimed.append((note, self._webhooks[note.webhook_id]))  # removal kills notes
            return claimed

    def record_attempt(self, notification_id: str, attempt: DeliveryAttempt, *,
                       state: str, next_at: str, error: str | None = None) -> Notification:
        """Add an attempt and move the notification to ``state``."""
        check_notification_state(state)
        with self._lock:
            old = self._outbox.get(notification_id)
            if old is None:
                raise notification_not_found(notification_id)
            new = self._outbox[notification_id] = after_attempt(
                old, attempt, state=state, next_at=next_at, error=error)
            return new

    def notifications(self, *, state: str | None = None, webhook_id: str | None = None,
                      order_id: str | None = None, limit: int | None = 100) -> list[Notification]:
        """Notifications matching every filter given, newest first."""
        with self._lock:
            found = [n for n in reversed(self._outbox.values())
                     if (state is None or n.state == state)
                     and (webhook_id is None or n.webhook_id == webhook_id)
                     and (order_id is None or n.order_id == order_id)]
        return found if limit is None else found[:limit]

    def notifications_after(self, after: str | None = None, *,
                            limit: int = 500) -> list[Notification]:
        """Notifications kept after ``after``, oldest first, at most ``limit``."""
        with self._lock:
            ids = list(self._outbox)
            if after is None:
                start = 0
            elif after in self._outbox:
                start = ids.index(after) + 1
            else:
                return []
            return [self._outbox[i] for i in ids[start:start + limit]]

    def restore_notification(self, note: Notification) -> None:
        """Keep a notification as it stands (a copy of a desk). Conflict if its id is kept."""
        with self._lock:
            if note.id in self._outbox:
                raise notification_conflict(note.id)
            self._outbox[note.id] = note

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release; present for the interface."""
