"""Track records: how a worker's orders turned out.

Every order of the worker lands in exactly one outcome:

``approved_first_time``
    approved with no rework before it.
``approved_after_rework``
    approved after one or more reworks (``rework_rounds`` counts how often each number of
    rounds happened).
``failed``
    ended (cancelled or expired) with a latest report whose status is ``failed``: the
    worker said it could not do the job.
``expired`` / ``cancelled``
    ended that way otherwise.
``declined``
    turned down by the worker.
``active``
    not finished yet.

Spend: an order's spend is the cost of its latest report (a report states what the whole
order has cost so far, which is why it is checked against the whole budget). Per budget
unit the record sums spend and budget over the orders that reported that unit, and gives
the median of ``spend / budget`` per order.

Timing: the median time from the worker's accept to the manager's approval, over approved
orders.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from awl.desk.access import check_track_viewer
from awl.documents.models import parse_time
from awl.store.protocol import OrderRecord, Store, TrackRow

__all__ = ["OUTCOMES", "TrackRecord", "TrackRow", "UnitSpend", "outcome_of", "summarize",
           "track_record"]

OUTCOMES = ("approved_first_time", "approved_after_rework", "failed", "expired",
            "cancelled", "declined", "active")


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
    """How one worker's orders turned out."""

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


def outcome_of(row: TrackRow | OrderRecord) -> str:
    """The outcome an order counts under (one of :data:`OUTCOMES`)."""
    if isinstance(row, OrderRecord):
        row = TrackRow.of(row)
    if row.state == "approved":
        return "approved_after_rework" if row.reworks else "approved_first_time"
    if row.state in ("cancelled", "expired"):
        return "failed" if row.status == "failed" else row.state
    if row.state == "declined":
        return "declined"
    return "active"


def track_record(store: Store, worker: str, *, viewer: str | None = None) -> TrackRecord:
    """The track record of ``worker``, as ``viewer`` may see it (SEC-8).

    The worker itself sees every order addressed to it. Any other principal sees the record
    of only the orders it issued to the worker (as their manager), and is refused when it
    issued none: a track record tells nobody about orders they are not part of. ``viewer``
    None is the desk's operator (the library, the CLI without ``--as``), who holds the whole
    store anyway.

    Raises:
        Forbidden: ``viewer`` is neither the worker nor the manager of any of its orders.
    """
    rows = store.track_rows(worker)
    if viewer is None or viewer == worker:
        return summarize(worker, rows)
    issued = {r.order.id for r in store.list_orders(worker=worker, manager=viewer, limit=None)}
    check_track_viewer(worker, viewer, bool(issued))
    return summarize(worker, [row for row in rows if row.order_id in issued])


def summarize(worker: str, rows: Iterable[TrackRow]) -> TrackRecord:
    """Fold the worker's rows into a track record."""
    counts: Counter[str] = Counter()
    rounds: Counter[int] = Counter()
    spent: dict[str, list[float]] = {}
    budget: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    durations: list[float] = []
    total = 0
    for row in rows:
        total += 1
        outcome = outcome_of(row)
        counts[outcome] += 1
        if outcome == "approved_after_rework":
            rounds[row.reworks] += 1
        for unit, value in (row.cost or {}).items():
            limit = row.budget.get(unit)
            if limit is None:
                continue
            spent.setdefault(unit, []).append(value)
            budget.setdefault(unit, []).append(limit)
            if limit > 0:
                ratios.setdefault(unit, []).append(value / limit)
        if row.state == "approved" and row.accepted_at and row.approved_at:
            start, end = parse_time(row.accepted_at), parse_time(row.approved_at)
            durations.append((end - start).total_seconds())
    spend = {
        unit: UnitSpend(orders=len(values), spent=sum(values), budget=sum(budget[unit]),
                        median_ratio=statistics.median(ratios[unit]) if ratios.get(unit)
                        else None)
        for unit, values in spent.items()
    }
    return TrackRecord(
        worker=worker, orders=total,
        approved_first_time=counts["approved_first_time"],
        approved_after_rework=counts["approved_after_rework"],
        rework_rounds=dict(sorted(rounds.items())),
        failed=counts["failed"], expired=counts["expired"], cancelled=counts["cancelled"],
        declined=counts["declined"], active=counts["active"], spend=spend,
        median_seconds_to_approval=statistics.median(durations) if durations else None,
    )
