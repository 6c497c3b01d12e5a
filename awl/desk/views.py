"""How the desk shows orders and questions, and the time text it writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from awl.documents.lifecycle import ACTIVE
from awl.documents.models import Review, WorkReport
from awl.store.protocol import OrderRecord

__all__ = ["OrderView", "Question", "QuestionPage"]


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


class Question(NamedTuple):
    """An open question in a manager's queue: a blocked order and what it asks (a named
    tuple: a whole queue is thousands of them, and a frozen dataclass costs several times
    as much to build)."""

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


class QuestionPage(NamedTuple):
    """One page of the question queue (BIND-20): its questions in the queue's order, and
    ``next``, the cursor to pass as ``after`` for the page after it (None on the last)."""

    questions: list[Question]
    next: str | None

    def to_json(self) -> dict[str, Any]:
        """The page as JSON-ready data: ``{questions, next}`` (``next`` null on the last)."""
        return {"questions": [q.to_json() for q in self.questions], "next": self.next}
