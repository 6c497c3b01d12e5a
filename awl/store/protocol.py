"""The store seam: what a backend keeps for a desk, grouped by concern.

:class:`Store` is the union of small protocols, one per concern: :class:`OrderStore`
(orders and their event logs), :class:`ReviewStore` (what reports and reviews add up to per
worker), :class:`CallStore` (gateway call records and budgets), :class:`EffectStore` (held
calls on their way to running at most once), :class:`PassStore` (issued passes and their
revocations), :class:`TokenStore` (desk access tokens), :class:`LockStore` (the commit
lock). :class:`Subscriptions` is optional: a backend that can push news of an order (the
memory store, a PostgreSQL ``LISTEN``) implements it, and a desk polls any other; so is
:class:`KeyDirectory`, a store that keeps the desk's public keys for other hosts, and so are
:class:`WebhookStore` (subscriptions and outbox) and :class:`WebSessions` (who is signed in
to the approval page), which every backend here implements.

Implementations: :class:`awl.MemoryStore` (tests), :class:`awl.SQLiteStore` (the embedded
default) and any other backend :func:`awl.open_store` finds by URL. The checks, refusals and
document encodings every backend shares live in :mod:`awl.store.rules`; a new backend calls
them rather than writing its own. Nothing here relies on SQLite-only behaviour: every write
is one transaction guarded by an optimistic check (``seq`` for an order's log, an expected
state for an effect, the exact holder for a lock).

Every method is synchronous and short; :class:`awl.Desk` runs them in a worker thread for
async callers.

Durability. Each write says what it promises once it returns:

- *atomic*: every write is; its checks and its changes are one transaction, seen by every
  process at once or not at all, and a write that raises has changed nothing.
- *durable*: on stable storage (SQLite ``synchronous=FULL``, PostgreSQL
  ``synchronous_commit=on``); it survives a power cut.
- *crash-safe*: survives the crash of any process, but a power cut may lose it until the next
  durable write of the same store, which makes it durable too. A store may write call
  records this way (a gateway writes two per forwarded call): the SQLite store does; the
  PostgreSQL store makes them durable (GW-20).

A store whose call methods are short local work (memory, SQLite) says so with the class
attribute ``in_process = True``; a gateway runs those on its event loop, and the call work of
any other store (one that waits for a server) in worker threads (GW-20).

The memory store keeps nothing past its process; it promises atomicity only.

Subscriptions and outbox (HOOK-3): a store keeps the desk's webhooks and, in the very
transaction of the write that causes it, one :class:`Notification` per webhook that wants the
event: :meth:`OrderStore.append` for an event reaching ``submitted``, ``blocked`` or
``expired``, :meth:`EffectStore.set_effect` for an effect reaching ``unknown``,
``committed`` or ``failed``. The rules of which writes notify whom, and what a notification
carries, live in :mod:`awl.store.rules` (``order_event_kind``, ``effect_event_kind``,
``wanted_by``, ``notification_payload``), so every backend writes the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from awl.documents.effect_states import EffectStateName
from awl.documents.models import (
    CallRecord,
    Event,
    Review,
    WorkOrder,
    WorkReport,
    answerers_of,
)

NotifyEventName = Literal["submitted", "blocked", "unknown", "committed", "failed", "expired"]
"""What a webhook may subscribe to: an order reaching ``submitted``, ``blocked`` or
``expired``, an effect reaching ``unknown``, ``committed`` or ``failed``."""

NotificationStateName = Literal["pending", "delivered", "dead"]


@dataclass(frozen=True, slots=True)
class OrderRecord:
    """An order with everything the desk knows of it, as of ``seq``."""

    order: WorkOrder
    state: str
    seq: int
    reports: tuple[WorkReport, ...] = ()
    reviews: tuple[Review, ...] = ()
    updated_at: str = ""

    @property
    def reworks(self) -> int:
        """How many reviews sent the work back."""
        return sum(1 for r in self.reviews if r.decision == "rework")

    @property
    def attempt(self) -> int:
        """The attempt the next (or current) report belongs to (:func:`attempt_after`)."""
        return attempt_after(self.reworks)


def attempt_after(reworks: int) -> int:
    """The attempt the next (or current) report of an order belongs to: 1 + its reworks."""
    return 1 + reworks


@dataclass(frozen=True, slots=True)
class Scope:
    """A budget scope for :meth:`Store.reserve_call`.

    Counts the order's counted calls whose ``pass_jti`` is in ``jtis`` (all calls when
    ``jtis`` is None); the reservation fails when the new call would exceed a limit.
    """

    jtis: frozenset[str] | None
    max_calls: int | None = None
    max_usd: float | None = None
    name: str = "order"


@dataclass(frozen=True, slots=True)
class Usage:
    """What an order (or a scope) has spent so far."""

    tool_calls: int = 0
    usd: float = 0.0
    first_call_at: str | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    """A manager's finding about an ``unknown`` effect."""

    verdict: Literal["happened", "did_not_happen"]
    evidence: str
    by: str
    at: str


@dataclass(frozen=True, slots=True)
class EffectState:
    """Where one held call stands on its way to running at most once."""

    order_id: str
    ref: str
    attempt: int
    state: EffectStateName
    result: dict[str, Any] | None = None
    error: str | None = None
    settlement: Settlement | None = None
    dispatches: int = 0
    updated_at: str = ""


@dataclass(frozen=True, slots=True)
class PassRecord:
    """A Delegation Pass the desk issued, remembered so the order's end can revoke it."""

    jti: str
    order_id: str
    parent_jti: str | None
    subject: str
    exp: int
    issued_at: str


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A desk access token as the desk keeps it: its hash, never the token."""

    token_hash: str
    principal: str
    created_at: str


@dataclass(frozen=True, slots=True)
class Revocation:
    """Why and when a pass was revoked (the first revocation of its jti)."""

    reason: str
    at: str
    """RFC 3339 time of the revocation: calls made under the pass before it stay valid."""


@dataclass(frozen=True, slots=True)
class LockInfo:
    """Who holds a named lock, and until when."""

    name: str
    holder: str
    pid: int
    host: str
    lease_until: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TrackRow:
    """What a track record needs of one order."""

    order_id: str
    state: str
    budget: dict[str, float]
    """The order's budget units."""
    cost: dict[str, float] | None = None
    """The latest report's cost (None without a report)."""
    status: str | None = None
    """The latest report's status."""
    reworks: int = 0
    """How many reviews sent the work back."""
    accepted_at: str | None = None
    """When the worker accepted (the seq 2 event, when it is an accept)."""
    approved_at: str | None = None
    """When the manager approved (the latest approving review)."""

    @classmethod
    def of(cls, record: OrderRecord, accept: Event | None = None) -> TrackRow:
        """The row of a full record, given its seq 2 event (if any)."""
        latest = record.reports[-1] if record.reports else None
        approvals = [r.at for r in record.reviews if r.decision == "approve"]
        return cls(
            order_id=record.order.id, state=record.state, budget=record.order.budget.units(),
            cost=latest.cost.units() if latest is not None else None,
            status=latest.status if latest is not None else None,
            reworks=record.reworks,
            accepted_at=accept.at if accept is not None and accept.action == "accept" else None,
            approved_at=approvals[-1] if approvals else None,
        )


@dataclass(frozen=True, slots=True)
class UnitSpend:
    """Spend against budget in one unit (``usd``, ``tokens``, ``tool_calls``, ``seconds``)."""

    orders: int
    """Orders that reported this unit and budgeted it."""
    spent: float
    """Total reported spend."""
    budget: float
    """Total budget of those orders."""
    median_ratio: float | None
    """Median of spend / budget per order (None when no budget was above zero)."""

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON-ready data."""
        return {"orders": self.orders, "spent": self.spent, "budget": self.budget,
                "median_ratio": self.median_ratio}


@dataclass(frozen=True, slots=True)
class TrackRecord:
    """How one worker's orders turned out (see :mod:`awl.desk.track`)."""

    worker: str
    """The worker."""
    orders: int = 0
    """Every order addressed to the worker."""
    approved_first_time: int = 0
    approved_after_rework: int = 0
    rework_rounds: dict[int, int] = field(default_factory=dict)
    """For orders approved after rework: number of rework rounds → how many orders."""
    failed: int = 0
    expired: int = 0
    cancelled: int = 0
    declined: int = 0
    active: int = 0
    spend: dict[str, UnitSpend] = field(default_factory=dict)
    """Per budget unit."""
    median_seconds_to_approval: float | None = None
    """Median time from accept to approval, over approved orders."""

    @property
    def approved(self) -> int:
        """Approved orders, first time or not."""
        return self.approved_first_time + self.approved_after_rework

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready data."""
        return {
            "worker": self.worker, "orders": self.orders,
            "approved_first_time": self.approved_first_time,
            "approved_after_rework": self.approved_after_rework,
            "rework_rounds": {str(k): v for k, v in sorted(self.rework_rounds.items())},
            "failed": self.failed, "expired": self.expired, "cancelled": self.cancelled,
            "declined": self.declined, "active": self.active,
            "spend": {unit: s.to_json() for unit, s in sorted(self.spend.items())},
            "median_seconds_to_approval": self.median_seconds_to_approval,
        }


QueueKey = tuple[int, str, str]
"""Where a question stands in the queue: ``(rank, asked, order_id)``, compared ascending
(:mod:`awl.store.queue`)."""


class BlockedRow(NamedTuple):
    """What the question queue needs of one blocked order, read without its documents (a
    named tuple: a whole queue is thousands of them, built as cheaply as a row)."""

    order_id: str
    goal: str
    worker: str
    manager: str
    escalate_to: str | None
    deadline: str
    seq: int
    updated_at: str
    report_attempt: int | None
    """The attempt its latest report names (None without a report)."""
    reworks: int
    questions: tuple[str, ...]
    """Its latest report's questions."""
    blocking: int
    """Its question's weight: itself plus its active sub-orders, transitively (through
    active orders only), as the store keeps it (:mod:`awl.store.queue`)."""

    @property
    def attempt(self) -> int:
        """The attempt the questions came from: the latest report's, else the current."""
        return self.report_attempt or attempt_after(self.reworks)

    @property
    def answerers(self) -> tuple[str, ...]:
        """Who may answer (:func:`awl.documents.models.answerers_of`)."""
        return answerers_of(self.manager, self.escalate_to)


@dataclass(frozen=True, slots=True)
class WebSession:
    """A browser signed in to the approval page (BIND-9), as a store keeps it: by the hash
    of its session id, never the id itself (the cookie's value)."""

    id_hash: str
    """``sha256:`` and the hex digest of the session id."""
    principal: str
    csrf: str
    """The CSRF token its forms carry (BIND-10)."""
    expires_at: float
    """When it ends, in seconds since the epoch."""
    token_hash: str | None = None
    """The hash of the desk token it signed in with; None for a one-time code."""


class Reserved:
    """A reservation that was made: the call's ref and attempt, and its record (outcome
    ``pending``), made when first asked for: a gateway needs only the ref, on every call."""

    __slots__ = ("_make", "_record", "attempt", "ref")

    def __init__(self, ref: str, attempt: int, make: Callable[[], CallRecord]) -> None:
        self.ref = ref
        self.attempt = attempt
        self._make: Callable[[], CallRecord] | None = make
        self._record: CallRecord | None = None

    @property
    def record(self) -> CallRecord:
        """The call's record as reserved (a copy of its own)."""
        if self._record is None:
            assert self._make is not None
            self._record, self._make = self._make(), None
        return self._record

    def __repr__(self) -> str:
        return f"Reserved(ref={self.ref!r}, attempt={self.attempt})"


@dataclass(frozen=True, slots=True)
class OverBudget:
    """A reservation refused because the call would exceed a limit; nothing was written."""

    scope: str
    """The ``name`` of the first scope exceeded, or ``order <id>`` for an order above."""


Reservation = Reserved | OverBudget
"""What :meth:`CallStore.reserve_call` returns."""


@dataclass(frozen=True, slots=True)
class Webhook:
    """A webhook subscription: where to POST which events, and the key that signs them."""

    id: str
    url: str
    events: tuple[str, ...]
    """Event names (:data:`NotifyEventName`) it wants."""
    secret: str
    """The signing secret in Standard Webhooks form (``whsec_`` + base64)."""
    orders: tuple[str, ...] | None = None
    """Only these orders' events (None: every order's)."""
    created_at: str = ""


@dataclass(frozen=True, slots=True)
class DeliveryAttempt:
    """One POST of a notification and what came of it."""

    at: str
    status: int | None
    """The HTTP status answered (None: no answer)."""
    error: str | None
    """Why it failed (None: a 2xx answer)."""
    ms: float
    """How long it took."""


@dataclass(frozen=True, slots=True)
class Notification:
    """One event for one webhook, kept until it is delivered or given up (the outbox)."""

    id: str
    """The ``webhook-id``, the same on every attempt, so a receiver can deduplicate."""
    webhook_id: str
    event: str
    order_id: str
    payload: dict[str, Any]
    """The JSON body (``type``, ``timestamp``, ``data``) without the page link, which the
    deliverer adds."""
    created_at: str
    state: NotificationStateName = "pending"
    next_at: str = ""
    """When it is next due (pending), or the last time it moved."""
    attempts: tuple[DeliveryAttempt, ...] = ()
    error: str | None = None
    """Why it is dead."""


class OrderStore(Protocol):
    """Orders and their event logs (with the reports and reviews events carry)."""

    def create_order(self, order: WorkOrder, event: Event) -> None:
        """Store a new order with its first event (seq 1); its state is ``event.to``.

        Conflict if the id exists; BadRequest if ``event.seq`` is not 1. Atomic, durable."""
        ...

    def load(self, order_id: str) -> OrderRecord:
        """The order and all it carries. NotFound if absent."""
        ...

    def append(
        self,
        order_id: str,
        event: Event,
        *,
        state: str,
        report: WorkReport | None = None,
        review: Review | None = None,
    ) -> None:
        """Append ``event`` (its seq must be the current seq + 1, else Conflict) and set
        the order's state, storing the report or review with it, all in one transaction.

        The Conflict carries ``expected_seq`` (``event.seq - 1``, what the caller read) and
        ``actual_seq`` (the stored seq). NotFound if the order is absent. Atomic, durable.
        The same transaction writes the notifications the event calls for (HOOK-3)."""
        ...

    def events(self, order_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """Events with seq > ``after``, in order (at most ``limit``). NotFound if absent."""
        ...

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
        """Orders matching every filter given, most recently created first.

        ``limit=None`` returns every match (for bulk reads). ``before`` (an order's id, the
        last of the page before) keeps only the orders created before that one: the next
        page, found by position, so it costs the same however deep (NotFound if there is no
        such order). ``party`` keeps the orders issued by or to that principal (its manager
        or its worker). An ``offset`` walks index entries to its page, never documents
        (BIND-18)."""
        ...

    def blocked_orders(self, answerer: str | None = None, *, after: QueueKey | None = None,
                       limit: int | None = None) -> list[BlockedRow]:
        """One :class:`BlockedRow` per blocked order (only those ``answerer`` may answer, as
        manager or ``escalate_to``, if given), in the queue's order (:mod:`awl.store.queue`:
        most blocking first, then the oldest asked, then by order id): the first ``limit``
        (None: all) of those whose key comes after ``after`` (None: from the start).

        Read without parsing documents, from indexes of the queue by its key (for every
        question, by manager and by ``escalate_to``), so a page costs the same however deep;
        past deadlines are not checked (the desk does, with :meth:`overdue_blocked`)."""
        ...

    def overdue_blocked(self, now: datetime) -> list[str]:
        """The ids of the blocked orders whose deadline is before ``now``, read from the
        question queue by an index of its deadlines (only those, not every question)."""
        ...


class ReviewStore(Protocol):
    """What the reports and reviews of a worker's orders add up to, read in bulk."""

    def track_rows(self, worker: str) -> list[TrackRow]:
        """One :class:`TrackRow` per order addressed to ``worker``, newest first.

        Equal to ``TrackRow.of(record, seq 2 event)`` for each of the worker's records, but
        read in bulk: a store may pick the few fields from its documents without parsing
        them (the SQLite store does, in one query)."""
        ...

    def track_record(self, worker: str, *, manager: str | None = None) -> TrackRecord:
        """The worker's track record (only its orders ``manager`` issued, if given), read
        from tallies the store keeps in the transaction of every write that changes them
        (:mod:`awl.store.tally`): its cost does not grow with the worker's orders.

        Equal to :func:`awl.desk.track.summarize` over :meth:`track_rows` (those of
        ``manager``'s orders), the spend sums up to float rounding."""
        ...


class CallStore(Protocol):
    """Gateway call records, numbered per order, and the budgets they count against."""

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
        """Atomically number and record a call that counts against the budget.

        The call gets the next N of the order (from 1, across all attempts and all calls,
        refused ones included) and is stored with outcome ``pending`` and ``ended_at`` equal
        to ``started_at`` until :meth:`finish_call`; ``usd`` is what it counts against the
        budget. Every scope is checked against the order's counted calls in the same
        transaction, so concurrent reservations (from any process, on any host) never
        overshoot and never lose a count.

        The order's own scope (``jtis`` None) counts its sub-orders' calls too. A call under
        a sub-order is also charged to every order above it (its parent, the parent's
        parent, ...; LC-15), and refused when it would exceed the ``tool_calls`` or ``usd``
        budget of any of them, read from the stored orders: the check and the charges are
        part of the same transaction.

        Returns :class:`Reserved` with the new record, or :class:`OverBudget` naming the
        first scope the call would exceed (``max_calls`` counted calls, or ``max_usd``
        summed usd; ``order <id>`` for an order above), in which case nothing is written.
        NotFound if the order is absent. With ``seq`` (the last event the caller read), the
        order's log is checked in the same transaction: if it has moved past ``seq``,
        nothing is written and :func:`~awl.store.rules.stale_order` is raised (a Conflict),
        so a caller that decided on the order as of ``seq`` never reserves on a stale
        decision. Atomic, at least crash-safe (durable on PostgreSQL, GW-20).
        """
        ...

    def record_call(self, record_fields: dict[str, Any]) -> CallRecord:
        """Number and store a call that does not count (a refusal), in one transaction.

        Like a counted call, it is charged to every order above (as a call that adds
        nothing but may be the first, which starts their ``seconds``).

        ``record_fields`` are the CallRecord fields except ``ref``, which the store makes
        from the next N. BadRequest if they do not form a valid record; NotFound if the
        order is absent. Atomic, at least crash-safe (durable on PostgreSQL, GW-20)."""
        ...

    def finish_call(
        self, order_id: str, ref: str, *, outcome: str, result: dict[str, Any] | None,
        error: str | None, ended_at: str,
    ) -> None:
        """Set the outcome (not ``pending``, nor ``held``: see :meth:`hold_call`) of a
        reserved call.

        BadRequest if the fields do not end a call validly (checked first, so nothing invalid
        is stored); NotFound if there is no such call; Conflict if its outcome is already
        set. Returns nothing: the gateway calls this on every forwarded call, and reading
        the finished record back would cost as much again (:meth:`calls` reads it).
        Atomic, at least crash-safe (durable on PostgreSQL, GW-20)."""
        ...

    def calls(self, order_id: str, *, attempt: int | None = None) -> list[CallRecord]:
        """The order's call records by N (only ``attempt``'s if given). NotFound if absent."""
        ...

    def charges(self, order_id: str) -> list[float | None]:
        """What each of the order's calls counts against its budget, by N: the ``usd``
        given at reservation, or None for a call that does not count (a refusal).

        With :meth:`calls` this is everything the store keeps of the calls (what a copy
        of the desk needs). NotFound if the order is absent."""
        ...

    def usage(self, order_id: str, jtis: frozenset[str] | None = None) -> Usage:
        """Counted calls and USD so far (for the calls under ``jtis`` if given).

        ``tool_calls`` counts every reserved call whatever its outcome (pending, ok, error,
        held); calls stored with :meth:`record_call` never count. ``usd`` sums the usd given
        at reservation. ``first_call_at`` is the earliest ``started_at`` of any call, counted
        or not. Without ``jtis`` the calls of the order's sub-orders, at any depth, are
        included: what is charged to its budget (LC-15). NotFound if the order is absent."""
        ...


class EffectStore(Protocol):
    """Held calls on their way to running at most once."""

    def effects(self, order_id: str) -> list[EffectState]:
        """Every effect state of the order, by N."""
        ...

    def hold_call(
        self, order_id: str, ref: str, *, result: dict[str, Any] | None, ended_at: str,
    ) -> EffectState:
        """Hold a reserved call: set its outcome to ``held`` and create its effect in state
        ``held``, both in one transaction (CM-14), and return the effect.

        Durability: like :meth:`set_effect`, the transaction is on stable storage (fsynced)
        before this returns, and a crash leaves either both writes or neither; so every call
        with outcome ``held`` has an effect state, and :meth:`finish_call` refuses outcome
        ``held``. The effect's attempt is the call's and its ``updated_at`` is ``ended_at``.

        BadRequest if the fields do not end a call validly (checked first); NotFound if there
        is no such call; Conflict if its outcome is already set or it has an effect."""
        ...

    def set_effect(
        self, order_id: str, ref: str, *, expect: Sequence[str] | None, state: str,
        attempt: int | None = None, result: dict[str, Any] | None = None,
        error: str | None = None, settlement: Settlement | None = None,
        count_dispatch: bool = False, at: str,
    ) -> EffectState:
        """Move an effect to ``state`` if it is in one of ``expect`` (None: it must not
        exist yet); Conflict when the state differs. Atomic, durable: a ``dispatching``
        mark is on stable storage before the call it guards is sent.

        Creating one needs a recorded call with that ref (NotFound otherwise); ``attempt``
        defaults to the call's. ``result`` and ``error`` describe the new state and replace
        the old ones (None clears them); ``attempt`` and ``settlement`` are kept unless
        given. ``count_dispatch`` adds one to ``dispatches``. NotFound if ``expect`` is given
        and the effect does not exist; BadRequest for an unknown state name;
        InvalidTransition when the move is not a row of the effect state table
        (:data:`awl.documents.effect_states.TABLE`, CM-13), checked after the state. The
        same transaction writes the notifications the new state calls for (HOOK-3)."""
        ...

    def restore_effect(self, effect: EffectState) -> None:
        """Store ``effect`` exactly as given, replacing any state the call's effect has: what
        a copy of a desk writes (:mod:`awl.store.copy`), never a move. No expected state and
        no move is checked; everything else that works an effect uses :meth:`set_effect`.

        NotFound if the order has no recorded call ``effect.ref``; BadRequest for an unknown
        state name or a result that is not JSON data. Atomic, durable."""
        ...


class LockStore(Protocol):
    """Named leases: the commit lock that lets one committer at a time work an order."""

    def acquire_lock(self, info: LockInfo, *, replace: LockInfo | None = None) -> bool:
        """Take the named lock if free, or if it is still exactly ``replace`` (a takeover).

        Exactly means every field equal, so two processes taking over the same stale lock
        cannot both win; renewing a lease is a takeover of one's own lock. Returns whether
        the lock was taken. Atomic, durable."""
        ...

    def get_lock(self, name: str) -> LockInfo | None:
        """The current holder of the named lock, if any."""
        ...

    def release_lock(self, name: str, holder: str) -> None:
        """Release the lock if ``holder`` holds it. Atomic, durable."""
        ...


@runtime_checkable
class FreedLocks(Protocol):
    """A lock store that frees a dead holder's lock itself (PostgreSQL lets a session's
    advisory lock go with its connection) and still names that holder to the next taker.

    Optional: in a store without it a dead holder's record stays until it is taken over
    (:meth:`LockStore.acquire_lock` with ``replace``), which names it already."""

    def freed_lock(self, name: str, holder: str) -> LockInfo | None:
        """The record of the holder that died holding the named lock, when ``holder`` took
        it just after through this store object; None if the lock was free, or ``holder``
        did not take it here."""
        ...


class PassStore(Protocol):
    """The Delegation Passes a desk issued, and their revocations."""

    def revoke(self, jti: str, *, reason: str, at: str) -> None:
        """Record that a pass is revoked at ``at`` (idempotent: the first reason and time
        are kept). Atomic, durable."""
        ...

    def revoked(self) -> dict[str, str]:
        """Every revoked jti with its reason (what :func:`awl.verify_pass` needs)."""
        ...

    def revocations(self) -> dict[str, Revocation]:
        """Every revoked jti with its reason and time (what the commit path needs: an effect
        held before its pass was revoked may still run), in the order first revoked."""
        ...

    def save_pass(self, record: PassRecord) -> None:
        """Remember an issued pass (saving a jti again replaces its record). Atomic,
        durable."""
        ...

    def passes(self, order_id: str) -> list[PassRecord]:
        """The passes saved for an order, in the order they were first saved."""
        ...

    def saved_pass(self, jti: str) -> PassRecord | None:
        """The pass saved under ``jti``, or None when this store has none."""
        ...


class TokenStore(Protocol):
    """Desk access tokens, kept by their hash."""

    def save_token(self, token_hash: str, principal: str, *, created_at: str) -> None:
        """Remember a desk access token by its hash (saving a hash again replaces it).
        Atomic, durable."""
        ...

    def principal_for(self, token_hash: str) -> str | None:
        """The principal a token hash was issued to."""
        ...

    def tokens(self) -> list[TokenRecord]:
        """Every desk access token (by hash), oldest first."""
        ...

    def drop_token(self, token_hash: str) -> bool:
        """Forget a token, so it no longer authenticates; False if there was no such token.
        Atomic, durable."""
        ...

@runtime_checkable
class WebhookStore(Protocol):
    """Subscriptions and outbox (HOOK-1 to HOOK-6): the webhooks, and the notifications that
    :meth:`OrderStore.append` and :meth:`EffectStore.set_effect` write in their own
    transaction (see the module's docstring).

    Optional: the memory, SQLite and PostgreSQL stores implement it (the SQL ones through
    :class:`awl.store.sql.SQLStore`); a desk on a store that does not refuses webhooks in one
    line and delivers nothing."""

    def add_webhook(self, webhook: Webhook) -> None:
        """Keep a webhook subscription. Conflict if its id exists."""
        ...

    def webhooks(self) -> list[Webhook]:
        """Every webhook subscription, oldest first."""
        ...

    def remove_webhook(self, webhook_id: str, *, at: str) -> bool:
        """Forget a webhook; its pending notifications become ``dead`` (as of ``at``) in the
        same transaction. False if there was no such webhook."""
        ...

    def claim_notifications(self, *, now: str, lease_until: str,
                            limit: int) -> list[tuple[Notification, Webhook]]:
        """Take up to ``limit`` pending notifications due at ``now`` (oldest due first), each
        with its webhook, and make them due again only at ``lease_until``, in one transaction:
        two deliverers never claim one notification at once, and one whose deliverer dies
        is claimed again when the lease runs out. A store with nothing due writes nothing."""
        ...

    def record_attempt(self, notification_id: str, attempt: DeliveryAttempt, *,
                       state: str, next_at: str, error: str | None = None) -> Notification:
        """Add ``attempt`` to the notification and move it to ``state`` (due again at
        ``next_at`` when pending; ``error`` says why when dead). A delivered notification
        stays delivered (a late attempt is still recorded). NotFound if absent; BadRequest
        for an unknown state name."""
        ...

    def notifications(self, *, state: str | None = None, webhook_id: str | None = None,
                      order_id: str | None = None, limit: int | None = 100) -> list[Notification]:
        """Notifications matching every filter given, newest first."""
        ...

    def notifications_after(self, after: str | None = None, *,
                            limit: int = 500) -> list[Notification]:
        """The notifications kept after the one ``after`` names (from the first kept when
        None), oldest first, at most ``limit``: the whole outbox read in pages, in the order
        it was written (a copy of a desk). None after an id not kept."""
        ...

    def restore_notification(self, note: Notification) -> None:
        """Keep a notification exactly as it stands, its id, state and attempts included (a
        copy of a desk, :mod:`awl.store.copy`), after those kept before it. Conflict if its id
        is kept already. Atomic, durable."""
        ...


@runtime_checkable
class WebSessions(Protocol):
    """The approval page's sessions (BIND-9), kept by the hash of their id, so a restart of
    ``awl web`` keeps everyone signed in and every ``awl web`` on one store shares them.

    Optional: the memory, SQLite and PostgreSQL stores implement it (the SQL ones through
    :class:`awl.store.sql.SQLStore`); ``awl web`` on another store keeps its sessions in
    memory."""

    def start_web_session(self, session: WebSession, *, now: float) -> None:
        """Keep a new session, forgetting every one expired by ``now`` (seconds since the
        epoch) in the same transaction. Conflict if its hash is kept already. Atomic,
        durable."""
        ...

    def web_session(self, id_hash: str, *, now: float) -> WebSession | None:
        """The session kept under ``id_hash``, None if there is none or it expired by
        ``now``."""
        ...

    def end_web_session(self, id_hash: str) -> bool:
        """Forget a session (sign-out); False if there was none. Atomic, durable."""
        ...


class Store(OrderStore, ReviewStore, CallStore, EffectStore, LockStore, PassStore, TokenStore,
            Protocol):
    """Durable, multi-process-safe storage for a desk: every concern above in one object."""

    def close(self) -> None:
        """Release connections and files; calls after this raise."""
        ...

    def __enter__(self) -> Store:
        """The store itself, closed when the block ends."""
        ...

    def __exit__(self, *exc: object) -> None:
        ...


@runtime_checkable
class Subscriptions(Protocol):
    """A store that can tell a waiter about news of an order as it is written.

    Optional: a desk asks ``isinstance(store, Subscriptions)`` and otherwise polls.
    """

    def wait_for_events(self, order_id: str, after: int, timeout: float) -> bool:
        """Block until the order's log is past seq ``after`` (written by any process the
        store can hear), at most ``timeout`` seconds; whether it is past ``after`` now.

        May return early (False) on news that turns out not to be the order's, so a caller
        reads the order again either way. NotFound if the order is absent."""
        ...


@runtime_checkable
class KeyDirectory(Protocol):
    """A store that keeps the desk's public key set (its JWKS) for verifiers on other hosts.

    Optional: a gateway on another host verifies passes with the keys published here,
    never holding the desk's private keys (those stay in the desk's home folder).
    """

    def publish_keys(self, jwks: Mapping[str, Any]) -> None:
        """Replace the published public key set. Atomic, durable."""
        ...

    def published_keys(self) -> dict[str, Any] | None:
        """The published public key set; None if none was ever published."""
        ...


@dataclass(frozen=True, slots=True)
class DeskOrder:
    """One order with everything a store keeps under it: what a copy of a desk moves."""

    record: OrderRecord
    events: tuple[Event, ...] = ()
    calls: tuple[CallRecord, ...] = ()
    """By N."""
    charges: tuple[float | None, ...] = ()
    """What each call counts against the budgets (:meth:`CallStore.charges`), by N."""
    effects: tuple[EffectState, ...] = ()
    passes: tuple[PassRecord, ...] = ()


@runtime_checkable
class BulkRead(Protocol):
    """A store that reads many orders' contents at once (what a copy of a desk reads).

    Optional: :mod:`awl.store.copy` reads a store without it one order at a time."""

    def desk_orders(self, records: Sequence[OrderRecord]) -> list[DeskOrder]:
        """Each record with its order's events, calls, charges, effects and passes, in the
        order given, read in a few statements of one snapshot. NotFound if one is absent."""
        ...

    def usages(self, order_ids: Sequence[str]) -> list[Usage]:
        """Each order's :meth:`CallStore.usage` (without ``jtis``), in the order given, read
        in one snapshot. NotFound if one is absent."""
        ...


@runtime_checkable
class Restore(Protocol):
    """A store that loads a whole desk in one transaction (what a copy of a desk writes).

    Optional: :mod:`awl.store.copy` fills a store without it through the other operations,
    one durable write per record, so a copy killed half way leaves it half full."""

    def restore(self, orders: Iterable[Sequence[DeskOrder]], *,
                revocations: Mapping[str, Revocation], tokens: Sequence[TokenRecord],
                keys: Mapping[str, Any] | None = None, webhooks: Sequence[Webhook] = (),
                notifications: Iterable[Notification] = ()) -> None:
        """Store every order of ``orders`` (batches, oldest order first, each order after
        the orders above it) with everything it carries, then the revocations (in the order
        given), the tokens, for a :class:`KeyDirectory` the published key set, and for a
        :class:`WebhookStore` the webhooks and the notifications as they stand (oldest first;
        restoring the orders writes none), all in one transaction, keeping every total and
        charge a store derives from calls as the calls' own writes would.

        The store must be empty: BadRequest (:func:`~awl.store.rules.not_empty`) when it
        holds orders, revocations, tokens, published keys, webhooks or notifications, checked
        inside the transaction
        (which holds off other writers until it ends). A call's ref must be numbered as the
        store would number it, after the calls before it. Nothing is written unless all of it
        is: a restore that raises, or whose process is killed, leaves the store as it was.
        Atomic, durable."""
        ...
