"""The desk: where orders are issued, worked, reported, reviewed and followed.

:class:`Desk` is the one place that enforces who may do what (the roles of
:mod:`awl.documents.lifecycle`) and when, validates every document with the numbered checks, and
writes each step as one event appended to the order's log in the store. A refused
operation writes nothing, with one deliberate exception: an order found past its deadline
is expired first (the desk's own event), so nobody ever sees a stale active state.

Conflicts: every operation reads the order, decides, and appends with an optimistic ``seq``
check. When another writer got there first, the desk reads again and decides again
(``conflict_retries`` times, once by default): the retried write happens only if it is
still allowed and valid against the new state, otherwise the caller gets the error the new
state calls for (for example ``InvalidTransition`` when someone else approved first). A
conflict that outlasts the retries is raised as :class:`~awl.Conflict`.

Ends. Right after the event that ends an attempt or an order, the same operation tidies
what the end leaves dangling: a rework drops the held calls of the attempt it ends, an
order reaching a terminal state has its Delegation Passes revoked (DP-8), and one ending
unapproved drops all its held calls (CM-4); each drop is one ``drop`` event by
``awl:desk``.

:class:`AsyncDesk` offers the same operations as coroutines; each runs the synchronous one
in a worker thread so the event loop is never blocked on the store.
"""

from __future__ import annotations

import builtins
import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

import anyio
import anyio.to_thread

from awl.desk.access import (
    ACTION_ROLE,
    check_action,
    check_author,
    check_manager,
    check_reader,
    check_splitter,
)
from awl.desk.effects import drop_held, held_calls
from awl.desk.lineage import ancestors, remaining_of, self_review_problem
from awl.documents.errors import (
    AWLError,
    BadRequest,
    Conflict,
    InvalidTransition,
    NotFound,
    ValidationFailed,
)
from awl.documents.findings import Finding
from awl.documents.lifecycle import (
    ACTIVE,
    DESK_ACTOR,
    NOTE_ACTIONS,
    TABLE,
    TERMINAL,
    is_desk_principal,
    targets,
)
from awl.documents.limits import check_integer
from awl.documents.models import (
    Event,
    Handoff,
    Review,
    WorkOrder,
    WorkReport,
    format_time,
    parse_time,
    utc_now,
)
from awl.documents.patterns import parse_ref
from awl.store.protocol import OrderRecord, Store

if TYPE_CHECKING:
    from awl.desk.criteria import CheckRun
    from awl.desk.track import TrackRecord

__all__ = ["AsyncDesk", "Desk", "OrderView", "Question", "Subscription"]

log = logging.getLogger("awl.desk")

ORDER_SPEC = "awl/work-order@0.3"
REPORT_SPEC = "awl/work-report@0.3"

Clock = Callable[[], datetime]
Decision = Literal["approve", "rework"]

# The states each action is allowed in, for error messages.
_ALLOWED_IN: dict[str, tuple[str, ...]] = {
    action: tuple(sorted({str(f) for (f, a, _t) in TABLE if a == action and f is not None}))
    for action in ACTION_ROLE
}


def new_order_id() -> str:
    """A fresh order id: ``wo_`` + milliseconds since the epoch (hex) + 8 random hex digits.

    The time prefix makes ids sort roughly by creation, which keeps listings readable.
    """
    return f"wo_{int(time.time() * 1000):011x}{secrets.token_hex(4)}"


# --------------------------------------------------------------------------- views

@dataclass(frozen=True, slots=True)
class OrderView(OrderRecord):
    """An order as the desk shows it: never a stale active state past the deadline.

    The fields are those of the store's record: ``order`` (as issued), ``state`` (what its
    log folds to), ``seq`` (its latest event, so also how many events it has), ``reports``
    and ``reviews`` (every one, oldest first) and ``updated_at``.
    """

    @classmethod
    def of(cls, record: OrderRecord) -> OrderView:
        """The view of a store record."""
        return cls(order=record.order, state=record.state, seq=record.seq,
                   reports=record.reports, reviews=record.reviews,
                   updated_at=record.updated_at)

    @property
    def id(self) -> str:
        """The order's id."""
        return self.order.id

    @property
    def events(self) -> int:
        """How many events the log holds."""
        return self.seq

    @property
    def active(self) -> bool:
        """Whether the order can still move."""
        return self.state in ACTIVE

    @property
    def latest_report(self) -> WorkReport | None:
        """The most recent report, if any."""
        return self.reports[-1] if self.reports else None

    @property
    def latest_review(self) -> Review | None:
        """The most recent review, if any."""
        return self.reviews[-1] if self.reviews else None

    @property
    def open_questions(self) -> tuple[str, ...]:
        """The questions the worker is waiting on (only while blocked)."""
        report = self.latest_report
        if self.state != "blocked" or report is None:
            return ()
        return tuple(report.questions or ())

    def to_json(self) -> dict[str, Any]:
        """The view as JSON-ready data."""
        return {
            "order": self.order.to_json(),
            "state": self.state,
            "seq": self.seq,
            "attempt": self.attempt,
            "reports": [r.to_json() for r in self.reports],
            "reviews": [r.to_json() for r in self.reviews],
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, slots=True)
class Question:
    """An open question in a manager's queue: a blocked order and what it asks."""

    order_id: str
    """The blocked order."""
    goal: str
    """Its goal, to recognise it."""
    worker: str
    """Who asks."""
    answerers: tuple[str, ...]
    """Who may answer (the manager and ``escalate_to``)."""
    attempt: int
    """The attempt the questions came from."""
    questions: tuple[str, ...]
    """What the worker asks."""
    asked_at: str
    """When the blocked report came in."""
    blocking: int
    """How many active orders wait on the answer: the order and its active sub-orders,
    transitively."""

    def to_json(self) -> dict[str, Any]:
        """The question as JSON-ready data."""
        return {
            "order_id": self.order_id, "goal": self.goal, "worker": self.worker,
            "answerers": list(self.answerers), "attempt": self.attempt,
            "questions": list(self.questions), "asked_at": self.asked_at,
            "blocking": self.blocking,
        }


class Subscription:
    """A live subscription to an order's events; :meth:`close` ends it.

    The callback runs in the subscription's own thread, once per event, in seq order.
    Usable as a context manager.
    """

    def __init__(self, desk: Desk, order_id: str, callback: Callable[[Event], object],
                 after: int) -> None:
        self._desk = desk
        self._order_id = order_id
        self._callback = callback
        self._after = after
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"awl-follow-{order_id}",
                                        daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        """Whether the subscription has ended."""
        return self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._desk.wait(self._order_id, self._after, timeout=0.5,
                                         _stop=self._stop)
            except AWLError as exc:
                log.warning("subscription to %s ended: %s", self._order_id, exc)
                self._stop.set()
                return
            for event in events:
                if self._stop.is_set():
                    return
                self._after = event.seq
                try:
                    self._callback(event)
                except Exception:  # a subscriber's bug must not stop the others' deliveries
                    log.exception("subscriber of %s failed on event %d", self._order_id,
                                  event.seq)

    def close(self) -> None:
        """Stop delivering events (waits for a callback in progress, unless called from it)."""
        self._stop.set()
        self._desk._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    __call__ = close

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- the desk

@dataclass(frozen=True, slots=True)
class _Write:
    """What an operation decided to append."""

    event: Event
    report: WorkReport | None = None
    review: Review | None = None
    # Raised after the write: the desk expired a stale order and now refuses the operation.
    refusal: AWLError | None = None


def _invalid(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.kind == "invalid"]


def _raise_invalid(what: str, findings: Sequence[Finding]) -> None:
    bad = _invalid(findings)
    if bad:
        first = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ValidationFailed(
            f"invalid {what}: {first.rule} {first.path or '/'}: {first.message}{more}",
            findings=findings)


def _whole_percent(value: object) -> int:
    """``value`` as an integer from 0 to 100 (LC-11), or :class:`BadRequest`.

    A float with no fractional part is the same JSON number as the integer (DOC-5), so
    ``40.0`` is accepted and stored as ``40``; a boolean is not a number at all.
    """
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or not 0 <= number <= 100:
        raise BadRequest(f"percent must be a whole number from 0 to 100, not {value!r}")
    return number


def _same_ref(a: str, b: str) -> bool:
    pa, pb = parse_ref(a), parse_ref(b)
    return a == b if pa is None or pb is None else pa == pb


class Desk:
    """The work-order desk over a :class:`~awl.store.protocol.Store`.

    Every operation takes the acting principal explicitly and enforces its role: only the
    order's worker accepts, declines, starts, posts progress and reports; only its manager
    reviews and cancels; the manager or ``escalate_to`` answers. A wrong actor raises
    :class:`~awl.Forbidden`, a wrong state :class:`~awl.InvalidTransition`, an invalid
    document :class:`~awl.ValidationFailed`; in every case nothing is written.

    Args:
        store: where orders live; default the SQLite store of the home folder.
        clock: returns the current time as an aware datetime (tests pass a fake one).
        conflict_retries: how many times an operation that lost a write race is decided
            again against the new state before :class:`~awl.Conflict` is raised.
        poll_interval: the first pause between store polls in :meth:`wait` (seconds); it
            doubles up to ``max_poll_interval``. Writes through this desk wake waiters at
            once; the polls find writes by other processes.
        max_poll_interval: the longest pause between polls.

    Example:
        >>> from awl import Desk, MemoryStore
        >>> desk = Desk(MemoryStore())
    """

    def __init__(self, store: Store | None = None, *, clock: Clock | None = None,
                 conflict_retries: int = 1, poll_interval: float = 0.02,
                 max_poll_interval: float = 0.25) -> None:
        if store is None:
            from awl.desk.home import default_store
            store = default_store()
        self.store: Store = store
        self._clock: Clock = clock or utc_now
        self._retries = max(0, conflict_retries)
        self._poll = poll_interval
        self._max_poll = max(poll_interval, max_poll_interval)
        self._changed = threading.Condition()
        self._generation = 0

    # ----------------------------------------------------------------- time and notices

    def now(self) -> datetime:
        """The desk's current time."""
        return self._clock()

    def _wake(self) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    # ----------------------------------------------------------------- reading

    def get(self, order_id: str, *, viewer: str | None = None) -> OrderView:
        """The order with its reports and reviews, as ``viewer`` may see it.

        An active order past its deadline is expired first, so the view is never stale.
        ``viewer`` None is the desk's operator, who holds the whole store anyway; any other
        viewer must be part of the order or of one it was split from
        (:func:`awl.desk.access.check_reader`).

        Raises:
            NotFound: no such order.
            Forbidden: ``viewer`` is not part of the order nor of any order above it.
        """
        view = self._fresh(self.store.load(order_id))
        if viewer is not None:
            check_reader(view.order, viewer, self._parent_order)
        return view

    def _parent_order(self, order_id: str) -> WorkOrder | None:
        try:
            return self.get(order_id).order
        except NotFound:
            return None

    def list(self, *, state: str | Sequence[str] | None = None, worker: str | None = None,
             manager: str | None = None, parent_id: str | None = None,
             limit: int | None = 100, offset: int = 0) -> builtins.list[OrderView]:
        """Orders matching every filter given, most recently created first.

        Listed orders found past their deadline are expired first; when a ``state`` filter
        is given, those that no longer match it are left out (so a page may be short).
        """
        states = None if state is None else {state} if isinstance(state, str) else set(state)
        unknown = sorted((states or set()) - (ACTIVE | TERMINAL))
        if unknown:
            raise BadRequest(f"unknown state {unknown[0]!r}; use one of "
                             f"{', '.join(sorted(ACTIVE | TERMINAL))}")
        if limit is not None:
            limit = check_integer(limit, name="limit")
        offset = check_integer(offset, name="offset")
        records = self.store.list_orders(state=state, worker=worker, manager=manager,
                                         parent_id=parent_id, limit=limit, offset=offset)
        views = [self._fresh(r) for r in records]
        return [v for v in views if states is None or v.state in states]

    def events(self, order_id: str, after: int = 0,
               limit: int | None = None) -> builtins.list[Event]:
        """The order's events with seq > ``after``, oldest first.

        Raises:
            NotFound: no such order.
        """
        after = check_integer(after, name="after")
        if limit is not None:
            limit = check_integer(limit, name="limit")
        self.get(order_id)
        return self.store.events(order_id, after=after, limit=limit)

    def wait(self, order_id: str, after: int = 0, timeout: float = 30.0, *,
             _stop: threading.Event | None = None) -> builtins.list[Event]:
        """Wait until the order has events after ``after``, at most ``timeout`` seconds.

        Returns the new events, or an empty list when the time ran out. Writes through this
        desk wake the wait at once; writes by other processes are found by polling the store
        with a short, growing pause. When the deadline passes during the wait, the order is
        expired and the expire event is returned.

        Raises:
            NotFound: no such order.
        """
        after = check_integer(after, name="after")
        end = time.monotonic() + max(0.0, timeout)
        pause = self._poll
        while True:
            with self._changed:
                seen = self._generation
            view = self.get(order_id)
            if view.seq > after:
                return self.store.events(order_id, after=after)
            remaining = end - time.monotonic()
            if remaining <= 0 or (_stop is not None and _stop.is_set()):
                return []
            nap = min(pause, remaining)
            if view.active:
                to_deadline = (parse_time(view.order.deadline) - self.now()).total_seconds()
                nap = min(nap, max(to_deadline, 0.0) + 0.001)
            with self._changed:
                if self._generation == seen:
                    self._changed.wait(nap)
            pause = min(pause * 2, self._max_poll)

    def follow(self, order_id: str, after: int = 0, *, timeout: float | None = None,
               until_terminal: bool = True) -> Iterator[Event]:
        """Yield the order's events after ``after`` as they come.

        Stops once the order is terminal (when ``until_terminal``) or when ``timeout``
        seconds have passed without the order ending (None: no limit).
        """
        if timeout is not None and (isinstance(timeout, bool) or timeout != timeout):
            raise BadRequest(f"timeout must be a number of seconds, not {timeout!r}")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            slice_ = 5.0 if end is None else min(5.0, end - time.monotonic())
            if slice_ <= 0:
                return
            for event in self.wait(order_id, after, timeout=slice_):
                after = event.seq
                yield event
            if until_terminal and self.get(order_id).state in TERMINAL:
                # Events written right after the terminal one (the desk's drop) come here.
                yield from self.store.events(order_id, after=after)
                return

    def subscribe(self, order_id: str, callback: Callable[[Event], object], *,
                  after: int | None = None) -> Subscription:
        """Call ``callback`` with each new event of the order, in order, until closed.

        Args:
            order_id: the order to follow.
            callback: receives each :class:`~awl.Event`, in the subscription's thread.
            after: deliver events after this seq (default: only events from now on).

        Returns:
            The subscription; call :meth:`Subscription.close` (or the subscription itself)
            to unsubscribe.

        Raises:
            NotFound: no such order.
        """
        start = self.get(order_id).seq if after is None else after
        return Subscription(self, order_id, callback, start)

    def questions(self, actor: str | None = None) -> builtins.list[Question]:
        """The open questions of blocked orders, most blocking first.

        Args:
            actor: only the questions this principal may answer (as manager or
                ``escalate_to``); None for every open question.

        The weight of a question is how many active orders wait on its answer: the blocked
        order itself plus its active sub-orders, transitively. Ties go to the oldest.
        """
        out: builtins.list[Question] = []
        for view in self.list(state="blocked", limit=None):
            order = view.order
            if actor is not None and actor not in order.answerers:
                continue
            report = view.latest_report
            out.append(Question(
                order_id=order.id, goal=order.goal, worker=order.to,
                answerers=order.answerers,
                attempt=(report.attempt or view.attempt) if report else view.attempt,
                questions=self.open_questions(view),
                asked_at=view.updated_at,
                blocking=1 + self._active_descendants(order.id),
            ))
        out.sort(key=lambda q: (-q.blocking, parse_time(q.asked_at), q.order_id))
        return out

    def _active_descendants(self, order_id: str) -> int:
        count = 0
        seen = {order_id}
        frontier = [order_id]
        while frontier:
            parent = frontier.pop()
            for child in self.store.list_orders(parent_id=parent, state=sorted(ACTIVE),
                                                limit=None):
                if child.order.id not in seen:  # guards against a (corrupt) cycle
                    seen.add(child.order.id)
                    count += 1
                    frontier.append(child.order.id)
        return count

    def track(self, worker: str, *, viewer: str | None = None) -> TrackRecord:
        """How the worker's orders turned out, as ``viewer`` may see it (SEC-8); see
        :func:`awl.desk.track.track_record`.

        Raises:
            Forbidden: ``viewer`` is neither the worker nor a manager of its orders.
        """
        from awl.desk.track import track_record
        return track_record(self.store, worker, viewer=viewer)

    def handoff(self, order_id: str) -> str:
        """A Markdown briefing for whoever continues the order.

        Raises:
            NotFound: no such order.
        """
        from awl.desk.briefing import briefing
        view = self.get(order_id)
        return briefing(view, self.store.events(order_id))

    def expire_overdue(self) -> builtins.list[str]:
        """Expire every active order past its deadline; return their ids."""
        now = self.now()
        expired = []
        for record in self.store.list_orders(state=sorted(ACTIVE), limit=None):
            overdue = parse_time(record.order.deadline) < now
            if overdue and self._fresh(record).state == "expired":
                expired.append(record.order.id)
        return expired

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
            view = self._after(record, _Write(event))
            self._tidy(view, event)
            return view
        raise Conflict(f"order {record.order.id!r} keeps changing while being expired; "
                       "read it again")

    # ----------------------------------------------------------------- creating

    def create(self, order: WorkOrder | Mapping[str, Any], actor: str, *,
               copy_handoff: bool = False,
               workspace: str | os.PathLike[str] | None = None) -> OrderView:
        """Issue an order; ``actor`` becomes (and must be) its manager.

        Args:
            order: a full Work Order, or its fields: ``spec``, ``id``, ``created_at`` and
                ``from`` are filled in when absent (``awl/work-order@0.3``, a fresh id, now,
                ``actor``).
            actor: the manager issuing it.
            copy_handoff: when the order ``continues`` another and has no handoff of its
                own, copy the latest handoff of the continued order (from its latest report
                that has one, else its own).
            workspace: the folder the work happens in, the top of a git work tree. The
                desk snapshots it when the order starts and runs the criteria's checks in
                it (LC-17); an order whose criteria carry checks needs one. It is kept in
                the create event, never in the order document, so only the manager's side
                gives it.

        Raises:
            ValidationFailed: the order, or the sub-order against its parent, is invalid.
            Forbidden: ``from`` is not ``actor``, or ``actor`` may not split the parent.
            NotFound: the parent or the continued order does not exist.
            InvalidTransition: the parent is finished, or the continued order is not.
            BadRequest: the deadline has passed, a principal is reserved (``awl:``), or
                the worker is the manager of the order or of an order above it, or the
                escalation contact is its worker or manager (LC-13).
            Conflict: the id is taken.
        """
        from awl.documents.checks import iter_order_findings, iter_suborder_findings, to_plain

        doc = order.to_json() if isinstance(order, WorkOrder) else to_plain(dict(order))
        if not isinstance(doc, dict):
            raise BadRequest("an order is a JSON object")
        now = self.now()
        doc.setdefault("spec", ORDER_SPEC)
        doc.setdefault("id", new_order_id())
        doc.setdefault("created_at", format_time(now))
        doc.setdefault("from", actor)
        check_author(doc["from"], actor)
        for field in ("from", "to", "escalate_to"):
            value = doc.get(field)
            if isinstance(value, str) and is_desk_principal(value):
                raise BadRequest(f"{field} {value!r} is reserved for the desk; name an agent "
                                 "or a human")
        continues = doc.get("continues")
        if isinstance(continues, str) and continues != doc.get("id"):
            previous = self._continued(continues, doc)
            if copy_handoff and "handoff" not in doc:
                handoff = _latest_handoff(previous)
                if handoff is not None:
                    doc["handoff"] = handoff.to_json()
        parent_id = doc.get("parent_id")
        parent: OrderView | None = None
        above: tuple[WorkOrder, ...] = ()
        if isinstance(parent_id, str) and parent_id != doc.get("id"):
            parent = self._parent(parent_id, actor)
            above = (parent.order, *ancestors(self.store, parent.order))
        problem = self_review_problem(doc, above)
        if problem is not None:
            raise BadRequest(problem)
        if parent is not None:
            left = remaining_of(parent.order, self.store.usage(parent.id), now)
            findings = list(iter_suborder_findings(doc, parent.order, left))
            _raise_invalid("sub-order", findings)
        else:
            findings = list(iter_order_findings(doc))
            _raise_invalid("work order", findings)
        model = WorkOrder.model_validate(doc, by_alias=True, by_name=False)
        if parse_time(model.deadline) <= now:
            raise BadRequest(f"the deadline {model.deadline} has already passed; set a later "
                             "deadline")
        fields: dict[str, Any] = {
            "seq": 1, "at": format_time(now), "actor": actor, "action": "create",
            "from": None, "to": "offered",
        }
        if workspace is not None:
            from awl.desk.criteria import workspace_root

            fields["data"] = {"workspace": str(workspace_root(workspace))}
        elif _checked(model):
            raise BadRequest(f"order {model.id!r} has criteria with checks but no workspace; "
                             "give the folder they run in (awl order create --workspace DIR)")
        event = Event.model_validate(fields)
        self.store.create_order(model, event)
        self._wake()
        return OrderView(order=model, state="offered", seq=1, updated_at=event.at)

    def _continued(self, order_id: str, doc: Mapping[str, Any]) -> OrderView:
        try:
            previous = self.get(order_id)
        except NotFound:
            raise NotFound(f"order {doc.get('id')!r} continues {order_id!r}, which does not "
                           "exist") from None
        if previous.state not in TERMINAL:
            raise InvalidTransition(
                f"order {order_id!r} is still {previous.state}; only a finished order can be "
                "continued (cancel it first, or wait for it to end)",
                state=previous.state, action="continue")
        return previous

    def _parent(self, parent_id: str, actor: str) -> OrderView:
        try:
            parent = self.get(parent_id)
        except NotFound:
            raise NotFound(f"parent order {parent_id!r} does not exist") from None
        check_splitter(parent.order, actor)
        if parent.state not in ACTIVE:
            raise InvalidTransition(
                f"parent order {parent_id!r} is {parent.state}; sub-orders are split from "
                "active orders only", state=parent.state, action="create sub-order")
        return parent

    # ----------------------------------------------------------------- worker operations

    def accept(self, order_id: str, actor: str) -> OrderView:
        """The worker takes the offered order."""
        return self._simple(order_id, "accept", actor)

    def decline(self, order_id: str, actor: str, reason: str | None = None) -> OrderView:
        """The worker turns the offered order down (optionally saying why)."""
        return self._simple(order_id, "decline", actor, note=reason or None)

    def start(self, order_id: str, actor: str) -> OrderView:
        """The worker starts the accepted order.

        When the order has a workspace the desk records a snapshot of it in the start event
        (LC-17): what the criteria's checks are later compared with.
        """
        workspace = self.workspace(order_id)
        if workspace is None:
            return self._simple(order_id, "start", actor)
        record = self.store.load(order_id)
        check_action(record.order, "start", actor)
        if not targets(record.state, "start"):
            raise self._wrong_state(record.order, record.state, "start")
        from awl.desk.criteria import take_snapshot

        return self._simple(order_id, "start", actor,
                            data={"snapshot": take_snapshot(workspace)})

    # ----------------------------------------------------------------- criteria's checks

    def workspace(self, order_id: str) -> str | None:
        """The order's workspace, as its manager gave it at creation, or None."""
        first = self.store.events(order_id, after=0, limit=1)
        data = first[0].data if first else None
        folder = (data or {}).get("workspace")
        return folder if isinstance(folder, str) else None

    def _snapshot(self, order_id: str) -> dict[str, Any] | None:
        for event in self.store.events(order_id, after=0, limit=None):
            if event.action == "start" and event.data and "snapshot" in event.data:
                snapshot = event.data["snapshot"]
                return dict(snapshot) if isinstance(snapshot, Mapping) else None
        return None

    def check_results(self, order_id: str) -> dict[str, dict[str, Any]]:
        """The latest recorded run of each criterion's check, by criterion id (LC-21).

        Each value is desk evidence of type ``check``: ``{criterion, type, check: {outcome,
        exit_code, duration, tail, signature, signals?, timed_out?, error?, snapshot?}}``.
        """
        from awl.desk.criteria import latest_checks

        return latest_checks(self.store.events(order_id, after=0, limit=None))

    def _run_criteria_checks(self, order: WorkOrder) -> builtins.list[CheckRun]:
        from awl.desk.criteria import run_checks

        workspace = self.workspace(order.id)
        if workspace is None:
            raise BadRequest(f"order {order.id!r} has criteria with checks but no workspace "
                             "to run them in")
        checks = [(c.id, c.check) for c in order.criteria if c.check is not None]
        return list(run_checks(workspace, checks, self._snapshot(order.id)))

    def run_checks(self, order_id: str, actor: str) -> builtins.list[dict[str, Any]]:
        """The manager re-runs the order's checks; the runs are recorded (LC-21).

        Raises:
            Forbidden: ``actor`` is not the order's manager.
            BadRequest: the order has no checks or no workspace.
            InvalidTransition: the order has not started, or has ended unapproved.
        """
        record = self.store.load(order_id)
        order = record.order
        check_manager(order, actor, "check", "run the checks")
        if not _checked(order):
            raise BadRequest(f"order {order_id!r} has no criteria with checks")
        state = self._fresh(record).state
        if not targets(state, "check"):
            raise self._wrong_state(order, state, "check")
        runs = self._run_criteria_checks(order)
        items = [run.to_json() for run in runs]
        self._simple(order_id, "check", DESK_ACTOR, note=f"re-run by {actor}",
                     data={"by": actor, "checks": items})
        return items

    def _checks_on_done(self, order_id: str, actor: str,
                        doc: Mapping[str, Any]) -> builtins.list[CheckRun]:
        """Run the checks of a ``done`` report before it is decided (LC-18 to LC-20).

        A failing check refuses the report with an R19 finding; the run is recorded in a
        ``check`` event, or, when the same check failed the same way on its previous run,
        in a ``block`` event that puts the question to the manager.
        """
        from awl.documents.checks import check_run_findings

        record = self.store.load(order_id)
        late = parse_time(record.order.deadline) < self.now()
        if doc.get("status") != "done" or not _checked(record.order) or late:
            return []  # a late report is kept and the order expired, as without checks
        check_action(record.order, "report", actor)
        if record.state != "working":
            raise self._wrong_state(record.order, record.state, "report")
        runs = self._run_criteria_checks(record.order)
        failed = [run for run in runs if run.outcome in ("failed", "timeout")]
        if not failed:
            return runs
        from awl.desk.criteria import latest_checks

        before = latest_checks(self.store.events(order_id, after=0, limit=None), on_report=True)
        again = [run for run in failed
                 if before.get(run.criterion, {}).get("check", {}).get("signature")
                 == run.signature]
        items = [run.to_json() for run in runs]
        attempt = OrderView.of(record).attempt
        findings = check_run_findings(record.order, items)
        if again:
            questions = [f"the check of criterion {run.criterion} failed the same way twice "
                         f"({run.summary()}); last output: {' | '.join(run.tail[-3:])}"
                         for run in again]
            self._simple(order_id, "block", DESK_ACTOR, note="; ".join(questions),
                         data={"attempt": attempt, "checks": items, "questions": questions})
            raise ValidationFailed(
                f"order {order_id!r} is blocked: {questions[0]}; the manager decides how to "
                "go on", findings=findings)
        self._simple(order_id, "check", DESK_ACTOR, data={"attempt": attempt, "checks": items})
        _raise_invalid("work report", findings)
        return runs  # pragma: no cover - _raise_invalid raised

    def open_questions(self, view: OrderView) -> tuple[str, ...]:
        """What a blocked order asks: the worker's questions, or those of a block the desk
        put on it itself when a check failed the same way twice (LC-20)."""
        if view.state != "blocked":
            return ()
        if view.open_questions:
            return view.open_questions
        last = self.store.events(view.id, after=view.seq - 1, limit=1)
        if not last or last[0].action != "block":
            return ()
        return tuple(str(q) for q in (last[0].data or {}).get("questions", ()))

    def progress(self, order_id: str, actor: str, note: str,
                 percent: int | float | None = None) -> OrderView:
        """The worker posts a progress note (with an optional percentage).

        Args:
            order_id: The order.
            actor: The worker.
            note: What happened; not empty.
            percent: A whole number from 0 to 100 (``40.0`` counts as ``40``; LC-11).

        Raises:
            BadRequest: An empty note, or a percent that is fractional, a boolean, not a
                number or outside 0 to 100.
        """
        if not note.strip():
            raise BadRequest("a progress note says what happened; it cannot be empty")
        data = None if percent is None else {"percent": _whole_percent(percent)}
        return self._simple(order_id, "progress", actor, note=note, data=data)

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

    def report(self, order_id: str, actor: str,
               report: WorkReport | Mapping[str, Any]) -> OrderView:
        """The worker reports on the working order.

        ``done`` and ``failed`` reports submit the order for review; ``blocked`` blocks it
        until a question is answered. When given as fields, ``spec``, ``order_id``,
        ``from``, ``finished_at`` and ``attempt`` are filled in when absent. The attempt is
        1 + the reworks so far; a report naming another attempt is refused.

        The report is checked against the order (and against its gateway call records when
        there are any: R16-R18). ``limit`` findings (cost over budget, finished after the
        deadline) are accepted: the report is kept and the order expires. A report that
        arrives after the deadline is kept the same way.

        Raises:
            ValidationFailed: the report has ``invalid`` findings.
            BadRequest: ``from`` or ``attempt`` does not match.
        """
        from awl.documents.checks import iter_report_findings, to_plain

        doc = report.to_json() if isinstance(report, WorkReport) else to_plain(dict(report))
        if not isinstance(doc, dict):
            raise BadRequest("a report is a JSON object")
        runs = self._checks_on_done(order_id, actor, doc)

        def plan(record: OrderRecord, now: datetime) -> _Write:
            order = record.order
            view = OrderView.of(record)
            full = dict(doc)
            full.setdefault("spec", REPORT_SPEC)
            full.setdefault("order_id", order.id)
            full.setdefault("from", actor)
            full.setdefault("finished_at", format_time(now))
            if full["from"] != actor:
                raise BadRequest(f"the report says it is from {full['from']!r} but "
                                 f"{actor} is submitting it; they must match")
            attempt = view.attempt
            if "attempt" in full and full["attempt"] != attempt:
                raise BadRequest(f"the report names attempt {full['attempt']!r}, but order "
                                 f"{order.id!r} is on attempt {attempt}")
            full["attempt"] = attempt
            calls = self.store.calls(order.id)
            findings = list(iter_report_findings(full, order, calls or None,
                                                 [run.to_json() for run in runs]
                                                 if runs else None))
            late = parse_time(order.deadline) < now
            if _invalid(findings):
                if late:  # the order is over either way; expire it, keep nothing invalid
                    return _Write(
                        self._event(record, "expire", DESK_ACTOR, "expired", now,
                                    note="the deadline passed"),
                        refusal=InvalidTransition(
                            f"order {order.id!r} expired at its deadline {order.deadline} "
                            "before a valid report came in", state="expired", action="report"))
                _raise_invalid("work report", findings)
            model = WorkReport.model_validate(full, by_alias=True, by_name=False)
            limits = [f for f in findings if f.kind == "limit"]
            if limits or late:
                reasons = [f"{f.rule} {f.path}: {f.message}" for f in limits]
                if late and not any(f.rule == "R8" for f in limits):
                    reasons.append("the deadline passed before the report came in")
                return _Write(
                    self._event(record, "expire", DESK_ACTOR, "expired", now,
                                note="; ".join(reasons),
                                data={"attempt": attempt, "status": model.status,
                                      "findings": [f.to_dict() for f in limits]}),
                    report=model)
            to = "blocked" if model.status == "blocked" else "submitted"
            data: dict[str, Any] = {"attempt": attempt, "status": model.status}
            if runs:
                data["checks"] = [run.to_json() for run in runs]
            return _Write(
                self._event(record, "report", actor, to, now, note=model.result.summary or None,
                            data=data),
                report=model)

        return self._run(order_id, "report", actor, plan, expire_stale=False)

    # ----------------------------------------------------------------- manager operations

    def answer(self, order_id: str, actor: str, answer: str) -> OrderView:
        """The manager (or ``escalate_to``) answers the blocked order's questions."""
        if not answer.strip():
            raise BadRequest("an answer cannot be empty")

        def plan(record: OrderRecord, now: datetime) -> _Write:
            view = OrderView.of(record)
            return _Write(self._event(record, "answer", actor, "working", now, note=answer,
                                      data={"attempt": view.attempt,
                                            "questions": list(self.open_questions(view))}))

        return self._run(order_id, "answer", actor, plan)

    def review(self, order_id: str, actor: str, decision: Decision, reason: str | None = None,
               *, effects: Sequence[str] | None = None) -> OrderView:
        """The manager approves the submitted report or sends it back for rework.

        Args:
            order_id: the submitted order.
            actor: its manager.
            decision: ``approve`` or ``rework``.
            reason: why; required for a rework.
            effects: for an approval, the refs of the report's effects to run (default all
                of them); every ref must be one of the report's effects.

        Raises:
            ValidationFailed: a rework without a reason (W2), effects named on a rework or
                a malformed effect ref (W3).
            BadRequest: an effect ref the report does not list, or an approval of a failed
                report.
        """
        from awl.documents.checks import iter_review_findings

        if decision not in ("approve", "rework"):
            raise BadRequest(f"decision must be approve or rework, not {decision!r}")

        def plan(record: OrderRecord, now: datetime) -> _Write:
            report = record.reports[-1]
            attempt = report.attempt or OrderView.of(record).attempt
            chosen: builtins.list[str] | None = None
            if decision == "approve":
                if report.status == "failed":
                    raise BadRequest(f"attempt {attempt} of order {order_id!r} failed; send "
                                     "it back for rework or cancel the order")
                if effects is not None:
                    chosen = self._chosen_effects(order_id, report, effects)
            doc: dict[str, Any] = {"order_id": order_id, "attempt": attempt, "actor": actor,
                                   "decision": decision, "at": format_time(now)}
            if reason is not None:
                doc["reason"] = reason
            if effects is not None:
                doc["effects"] = chosen if chosen is not None else list(effects)
            _raise_invalid("review", list(iter_review_findings(doc)))
            model = Review.model_validate(doc, by_alias=True, by_name=False)
            data: dict[str, Any] = {"attempt": attempt}
            if chosen is not None:
                data["effects"] = chosen
            to = "approved" if decision == "approve" else "working"
            return _Write(self._event(record, decision, actor, to, now, note=reason or None,
                                      data=data), review=model)

        return self._run(order_id, decision, actor, plan)

    @staticmethod
    def _chosen_effects(order_id: str, report: WorkReport,
                        effects: Sequence[str]) -> builtins.list[str] | None:
        listed = [e.ref for e in report.effects or ()]
        chosen: builtins.list[str] = []
        unknown: builtins.list[str] = []
        for ref in effects:
            match = next((r for r in listed if _same_ref(r, ref)), None)
            if match is None:
                if parse_ref(ref) is not None:
                    unknown.append(ref)
                else:
                    return None  # malformed: the review check names it (W3)
            elif match not in chosen:
                chosen.append(match)
        if unknown:
            raise BadRequest(
                f"the report of order {order_id!r} lists no effect {', '.join(unknown)}; "
                f"approve only effects it lists ({', '.join(listed) or 'none'})")
        return chosen

    def cancel(self, order_id: str, actor: str, reason: str) -> OrderView:
        """The manager cancels the active order, saying why."""
        if not reason.strip():
            raise BadRequest("a cancellation says why; give a reason")
        return self._simple(order_id, "cancel", actor, note=reason)

    # ----------------------------------------------------------------- machinery

    def _simple(self, order_id: str, action: str, actor: str, *, note: str | None = None,
                data: dict[str, Any] | None = None) -> OrderView:
        def plan(record: OrderRecord, now: datetime) -> _Write:
            to = targets(record.state, action)[0]
            return _Write(self._event(record, action, actor, to, now, note=note, data=data))

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
             plan: Callable[[OrderRecord, datetime], _Write], *,
             expire_stale: bool = True) -> OrderView:
        """Read, check actor and state, decide, append; decide again after a lost race."""
        for round_ in range(self._retries + 1):
            record = self.store.load(order_id)
            check_action(record.order, action, actor)
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

    def _tidy(self, view: OrderView, event: Event) -> None:
        """Right after ``event`` is written, undo what it leaves dangling.

        A rework drops the held calls of the attempt it ends (and of any earlier one): they
        can never run. An order that reaches a terminal state has every Delegation Pass
        issued for it revoked (DP-8), as of the event's time, so the effects the manager
        approved still commit (the commit path accepts a pass revoked after the hold); an
        unapproved end also drops every held call (CM-4). An approval drops nothing: the
        commit drops what the approval leaves out.

        The event is written whatever happens here, so a failure is logged, not raised;
        everything here is idempotent and the commit path checks again before running.
        """
        ends_attempt = event.action == "rework"
        if event.from_ == event.to or not (ends_attempt or event.to in TERMINAL):
            return
        order_id = view.id
        try:
            if event.to in TERMINAL:
                from awl.passes.passes import revoke_order_passes

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
                drop_held(self, order_id, reasons, actor=DESK_ACTOR, at=event.at, note=note,
                          data=extra)
        except AWLError as exc:
            log.warning("order %s is %s (event %d), but tidying after it failed: %s",
                        order_id, event.to, event.seq, exc)

    @staticmethod
    def _after(record: OrderRecord, write: _Write) -> OrderView:
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


def _checked(order: WorkOrder) -> bool:
    """Whether any criterion of ``order`` carries a check."""
    return any(c.check is not None for c in order.criteria)


def _latest_handoff(view: OrderView) -> Handoff | None:
    for report in reversed(view.reports):
        if report.handoff is not None:
            return report.handoff
    return view.order.handoff


# --------------------------------------------------------------------------- async

_P = ParamSpec("_P")
_T = TypeVar("_T")


class AsyncDesk:
    """The desk for async code: every operation runs in a worker thread.

    Takes the same arguments as :class:`Desk` (or wraps an existing one with
    ``AsyncDesk.of(desk)``). :meth:`wait` and :meth:`follow` wait without holding a thread:
    writes made through this object wake them at once; others are found by polling.
    """

    def __init__(self, store: Store | None = None, *, clock: Clock | None = None,
                 conflict_retries: int = 1, poll_interval: float = 0.02,
                 max_poll_interval: float = 0.25, desk: Desk | None = None) -> None:
        self.desk = desk or Desk(store, clock=clock, conflict_retries=conflict_retries,
                                 poll_interval=poll_interval,
                                 max_poll_interval=max_poll_interval)
        self._bump: anyio.Event | None = None

    @classmethod
    def of(cls, desk: Desk) -> AsyncDesk:
        """An async face for an existing desk (both share the store and the wake-ups)."""
        return cls(desk=desk)

    @property
    def store(self) -> Store:
        """The underlying store."""
        return self.desk.store

    async def _call(self, func: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return await anyio.to_thread.run_sync(functools.partial(func, *args, **kwargs))

    async def _write(self, func: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await self._call(func, *args, **kwargs)
        finally:
            # Wake this object's async waiters, whatever happened (an expiry may have been
            # written before a refusal).
            bump, self._bump = self._bump, None
            if bump is not None:
                bump.set()

    async def get(self, order_id: str, *, viewer: str | None = None) -> OrderView:
        """See :meth:`Desk.get`."""
        return await self._write(self.desk.get, order_id, viewer=viewer)

    async def list(self, *, state: str | Sequence[str] | None = None,
                   worker: str | None = None, manager: str | None = None,
                   parent_id: str | None = None, limit: int | None = 100,
                   offset: int = 0) -> builtins.list[OrderView]:
        """See :meth:`Desk.list`."""
        return await self._write(self.desk.list, state=state, worker=worker, manager=manager,
                                 parent_id=parent_id, limit=limit, offset=offset)

    async def events(self, order_id: str, after: int = 0,
                     limit: int | None = None) -> builtins.list[Event]:
        """See :meth:`Desk.events`."""
        return await self._write(self.desk.events, order_id, after, limit)

    async def create(self, order: WorkOrder | Mapping[str, Any], actor: str, *,
                     copy_handoff: bool = False,
                     workspace: str | os.PathLike[str] | None = None) -> OrderView:
        """See :meth:`Desk.create`."""
        return await self._write(self.desk.create, order, actor, copy_handoff=copy_handoff,
                                 workspace=workspace)

    async def open_questions(self, view: OrderView) -> tuple[str, ...]:
        """See :meth:`Desk.open_questions`."""
        return await self._call(self.desk.open_questions, view)

    async def run_checks(self, order_id: str, actor: str) -> builtins.list[dict[str, Any]]:
        """See :meth:`Desk.run_checks`."""
        return await self._write(self.desk.run_checks, order_id, actor)

    async def accept(self, order_id: str, actor: str) -> OrderView:
        """See :meth:`Desk.accept`."""
        return await self._write(self.desk.accept, order_id, actor)

    async def decline(self, order_id: str, actor: str, reason: str | None = None) -> OrderView:
        """See :meth:`Desk.decline`."""
        return await self._write(self.desk.decline, order_id, actor, reason)

    async def start(self, order_id: str, actor: str) -> OrderView:
        """See :meth:`Desk.start`."""
        return await self._write(self.desk.start, order_id, actor)

    async def progress(self, order_id: str, actor: str, note: str,
                       percent: int | float | None = None) -> OrderView:
        """See :meth:`Desk.progress`."""
        return await self._write(self.desk.progress, order_id, actor, note, percent)

    async def record(self, order_id: str, actor: str, action: str, *, note: str | None = None,
                     data: Mapping[str, Any] | None = None) -> OrderView:
        """See :meth:`Desk.record`."""
        return await self._write(self.desk.record, order_id, actor, action, note=note,
                                 data=data)

    async def report(self, order_id: str, actor: str,
                     report: WorkReport | Mapping[str, Any]) -> OrderView:
        """See :meth:`Desk.report`."""
        return await self._write(self.desk.report, order_id, actor, report)

    async def answer(self, order_id: str, actor: str, answer: str) -> OrderView:
        """See :meth:`Desk.answer`."""
        return await self._write(self.desk.answer, order_id, actor, answer)

    async def review(self, order_id: str, actor: str, decision: Decision,
                     reason: str | None = None, *,
                     effects: Sequence[str] | None = None) -> OrderView:
        """See :meth:`Desk.review`."""
        return await self._write(self.desk.review, order_id, actor, decision, reason,
                                 effects=effects)

    async def cancel(self, order_id: str, actor: str, reason: str) -> OrderView:
        """See :meth:`Desk.cancel`."""
        return await self._write(self.desk.cancel, order_id, actor, reason)

    async def questions(self, actor: str | None = None) -> builtins.list[Question]:
        """See :meth:`Desk.questions`."""
        return await self._write(self.desk.questions, actor)

    async def track(self, worker: str, *, viewer: str | None = None) -> TrackRecord:
        """See :meth:`Desk.track`."""
        return await self._call(self.desk.track, worker, viewer=viewer)

    async def handoff(self, order_id: str) -> str:
        """See :meth:`Desk.handoff`."""
        return await self._write(self.desk.handoff, order_id)

    async def expire_overdue(self) -> builtins.list[str]:
        """See :meth:`Desk.expire_overdue`."""
        return await self._write(self.desk.expire_overdue)

    async def wait(self, order_id: str, after: int = 0,
                   timeout: float = 30.0) -> builtins.list[Event]:
        """See :meth:`Desk.wait`; waits without holding a worker thread."""
        with anyio.move_on_after(max(0.0, timeout)):
            pause = self.desk._poll
            while True:
                if self._bump is None:
                    self._bump = anyio.Event()
                bump = self._bump  # taken before reading, so no wake-up is lost
                # Read without _write: bumping our own event here would wake this very loop
                # at once and turn the wait into a busy loop. A read that expires the order
                # raises seq, so this waiter returns anyway.
                view = await self._call(self.desk.get, order_id)
                if view.seq > after:
                    return await self._call(self.desk.store.events, order_id, after)
                nap = pause
                if view.active:
                    left = (parse_time(view.order.deadline) - self.desk.now()).total_seconds()
                    nap = min(nap, max(left, 0.0) + 0.001)
                with anyio.move_on_after(nap):
                    await bump.wait()
                pause = min(pause * 2, self.desk._max_poll)
        return []

    async def follow(self, order_id: str, after: int = 0, *, timeout: float | None = None,
                     until_terminal: bool = True) -> AsyncIterator[Event]:
        """See :meth:`Desk.follow`."""
        if timeout is not None and (isinstance(timeout, bool) or timeout != timeout):
            raise BadRequest(f"timeout must be a number of seconds, not {timeout!r}")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            slice_ = 5.0 if end is None else min(5.0, end - time.monotonic())
            if slice_ <= 0:
                return
            for event in await self.wait(order_id, after, timeout=slice_):
                after = event.seq
                yield event
            if until_terminal and (await self.get(order_id)).state in TERMINAL:
                for event in await self._call(self.desk.store.events, order_id, after):
                    yield event
                return

    def subscribe(self, order_id: str, callback: Callable[[Event], object], *,
                  after: int | None = None) -> Subscription:
        """See :meth:`Desk.subscribe` (the callback runs in the subscription's thread)."""
        return self.desk.subscribe(order_id, callback, after=after)
