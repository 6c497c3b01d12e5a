"""The desk's reading side: orders, events, questions, track records and briefings.
"""

from __future__ import annotations

import base64
import builtins
import json
from collections.abc import Mapping, Sequence
from typing import Any

from awl.desk.access import check_reader
from awl.desk.briefing import briefing
from awl.desk.core import DeskCore
from awl.desk.criteria import latest_checks
from awl.desk.lineage import ancestors
from awl.desk.pending import settle_stale_calls
from awl.desk.track import TrackRecord, track_record
from awl.desk.views import OrderView, Question, QuestionPage
from awl.documents.errors import BadRequest
from awl.documents.lifecycle import ACTIVE, TERMINAL
from awl.documents.limits import (
    INT64_MAX,
    MAX_QUESTION_PAGE,
    QUESTION_PAGE,
    check_integer,
    show_value,
)
from awl.documents.models import CallRecord, Event, parse_time, stored_time
from awl.store.protocol import QueueKey
from awl.store.queue import queue_key, queue_time

__all__ = ["DeskQueries", "read_cursor", "write_cursor"]

_CURSOR = "q1."
"""What every cursor of the question queue starts with (its format's version)."""


def write_cursor(key: QueueKey) -> str:
    """The cursor of the question at ``key`` (BIND-20): ``q1.`` then the URL-safe base64,
    unpadded, of the JSON array ``[weight, asked, order_id]``, so it can be typed as one
    command word and sits in a URL as it is."""
    rank, asked, order_id = key
    data = json.dumps([-rank, asked, order_id], separators=(",", ":")).encode()
    return _CURSOR + base64.urlsafe_b64encode(data).decode().rstrip("=")


def read_cursor(text: object) -> QueueKey:
    """The queue key a cursor from :func:`write_cursor` names.

    Raises:
        BadRequest: ``text`` is not such a cursor (one line, saying what to give).
    """
    refusal = BadRequest(f"after: {show_value(text)} is not a cursor of the question queue; "
                         "give the `next` of the page before, or nothing for the first page")
    if not isinstance(text, str) or not text.startswith(_CURSOR) or len(text) > 2000:
        raise refusal
    body = text[len(_CURSOR):]
    try:
        weight, asked, order_id = json.loads(base64.urlsafe_b64decode(
            body + "=" * (-len(body) % 4)).decode())
        fits = (type(weight) is int and 1 <= weight <= INT64_MAX and isinstance(order_id, str)
                and isinstance(asked, str) and queue_time(asked) == asked)
    except (ValueError, TypeError):
        raise refusal from None
    if not fits:
        raise refusal
    return -weight, asked, order_id


class DeskQueries(DeskCore):
    """What the desk answers: orders, their events, open questions, track records, briefings.

    A read may still write one thing: an active order found past its deadline is expired
    first, so no reader ever sees a stale active state.
    """

    def get(self, order_id: str, *, viewer: str | None = None) -> OrderView:
        """The order with its reports and reviews, as ``viewer`` may see it.

        An active order past its deadline is expired first, so the view is never stale;
        what an ended order's end left undone is done (:meth:`_mend`).
        ``viewer`` None is the desk's operator, who holds the whole store anyway; any other
        viewer must be part of the order or of one it was split from
        (:func:`awl.desk.access.check_reader`).

        Raises:
            NotFound: no such order.
            Forbidden: ``viewer`` is not part of the order nor of any order above it.
        """
        record = self.store.load(order_id)
        view = self._fresh(record)
        if viewer is not None:
            check_reader(view.order, viewer, lambda: ancestors(self.store, view.order))
        if record.state in TERMINAL:  # one it just expired was tidied then
            self._mend(record)
        return view

    def calls(self, order_id: str, *, attempt: int | None = None) -> builtins.list[CallRecord]:
        """The order's recorded calls (of one attempt when given), oldest first, each call a
        gateway left ``pending`` past the bound recorded as may-have-run first (GW-7,
        :mod:`awl.desk.pending`): every door that shows calls reads them here."""
        return settle_stale_calls(self.store, self.store.calls(order_id, attempt=attempt),
                                  now=self.now())

    def list(self, *, state: str | Sequence[str] | None = None, worker: str | None = None,
             manager: str | None = None, parent_id: str | None = None,
             limit: int | None = 100, offset: int = 0, before: str | None = None,
             party: str | None = None) -> builtins.list[OrderView]:
        """Orders matching every filter given, most recently created first; ``party``: only
        those issued by or to that principal (as manager or as worker).

        ``before``, the id of the last order of a page, gives the next page (orders created
        before it) at the same cost however deep; ``offset`` works too. Listed orders found
        past their deadline are expired first; when a ``state`` filter is given, those that
        no longer match it are left out (so a page may be short).

        Raises:
            NotFound: ``before`` names no order.
        """
        if state is not None and not isinstance(state, str) and not (
                isinstance(state, Sequence | set | frozenset)
                and all(isinstance(s, str) for s in state)):
            raise BadRequest(f"state is a state or a list of states, not {show_value(state)}")
        states = None if state is None else {state} if isinstance(state, str) else set(state)
        unknown = sorted((states or set()) - (ACTIVE | TERMINAL))
        if unknown:
            raise BadRequest(f"unknown state {unknown[0]!r}; use one of "
                             f"{', '.join(sorted(ACTIVE | TERMINAL))}")
        if limit is not None:
            limit = check_integer(limit, name="limit")
        offset = check_integer(offset, name="offset")
        records = self.store.list_orders(state=state, worker=worker, manager=manager,
                                         parent_id=parent_id, limit=limit, offset=offset,
                                         before=before, party=party)
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

    def questions(self, actor: str | None = None, *, limit: int = QUESTION_PAGE,
                  after: str | None = None) -> QuestionPage:
        """A page of the open questions of blocked orders, most blocking first (BIND-20).

        Args:
            actor: only the questions this principal may answer (as manager or
                ``escalate_to``); None for every open question.
            limit: how many, from 1 to :data:`~awl.documents.limits.MAX_QUESTION_PAGE`.
            after: the ``next`` cursor of the page before; None for the first page.

        The weight of a question is how many active orders wait on its answer: the blocked
        order itself plus its active sub-orders, transitively; ties go to the oldest asked,
        then to the lower order id. The store keeps that order (:mod:`awl.store.queue`),
        so a page is read by index and costs the same however deep. Blocked orders past
        their deadline (found by an index of the queue's deadlines) are expired first and
        left out. The page's ``next`` is None when no question follows it.

        Raises:
            BadRequest: a limit out of range, or ``after`` not a cursor of this queue.
        """
        limit = check_integer(limit, name="limit", minimum=1, maximum=MAX_QUESTION_PAGE)
        start = None if after is None else read_cursor(after)
        now = self.now()
        for order_id in self.store.overdue_blocked(now):
            self._fresh(self.store.load(order_id))
        rows = self.store.blocked_orders(actor, after=start, limit=limit + 1)
        out = [Question(row.order_id, row.goal, row.worker, row.answerers, row.attempt,
                        row.questions or self._asked(row.order_id, row.seq, ()),
                        row.updated_at, row.blocking)
               for row in rows[:limit]
               if stored_time(row.deadline) >= now
               or self._fresh(self.store.load(row.order_id)).state == "blocked"]
        last = rows[limit - 1] if len(rows) > limit else None
        return QuestionPage(out, None if last is None else write_cursor(
            queue_key(last.blocking, last.updated_at, last.order_id)))

    def track(self, worker: str, *, viewer: str | None = None) -> TrackRecord:
        """How the worker's orders turned out, as ``viewer`` may see it (SEC-8); see
        :func:`awl.desk.track.track_record`.

        Raises:
            Forbidden: ``viewer`` is neither the worker nor a manager of its orders.
        """
        return track_record(self.store, worker, viewer=viewer)

    def handoff(self, order_id: str) -> str:
        """A Markdown briefing for whoever continues the order.

        Raises:
            NotFound: no such order.
        """
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

        return latest_checks(self.store.events(order_id, after=0, limit=None))

    def open_questions(self, view: OrderView) -> tuple[str, ...]:
        """What a blocked order asks: the worker's questions, or those of a block the desk
        put on it itself when a check failed the same way twice (LC-20)."""
        if view.state != "blocked":
            return ()
        return self._asked(view.id, view.seq, view.open_questions)

    def _asked(self, order_id: str, seq: int, reported: tuple[str, ...]) -> tuple[str, ...]:
        """What a blocked order at ``seq`` asks, given its latest report's questions."""
        if reported:
            return reported
        last = self.store.events(order_id, after=seq - 1, limit=1)
        if not last or last[0].action != "block":
            return ()
        return tuple(str(q) for q in (last[0].data or {}).get("questions", ()))
