"""An order's ancestors, and the rules that look up the chain of sub-orders (SPEC section 12).

A sub-order names its parent (``parent_id``), which may itself be a sub-order. Three rules
need the whole chain, not just the parent, and each has its one home here:

- :func:`self_review_problem`: an order's worker is never its manager, nor the manager of
  any order above it, so nobody approves, up the chain, a result that holds their own
  work (LC-13). Its escalation contact is neither its worker nor its manager.
- :func:`staging_ancestor`: the order above that stages a tool. A sub-order may not carry
  a tool its parent stages (C5, so by C2 no tool any ancestor stages); the gateway and the
  commit check it again (LC-14), because an effect's only approval is its own order's
  manager's.
- :func:`remaining_of`: what is left of an order's budget, its sub-orders' spending
  included, which caps a new sub-order's budget (C1, LC-15). Tokens, which no gateway
  counts, are what the sub-orders' latest reports say (:func:`reports_below`), which the
  order's own report must cover (RX6).
- :func:`ended_above`: why nothing more reaches the world under a sub-order, when an order
  above it has ended: the commit and a retry send none of its effects (LC-22). The rule
  itself, which order above has ended, is :func:`first_ended`, which the gateway also
  asks before every call (LC-16).

Orders never change (LC-4), so a chain read once stays true.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from awl.documents.checks import reported_tokens
from awl.documents.errors import NotFound
from awl.documents.lifecycle import TERMINAL
from awl.documents.models import WorkOrder, WorkReport, parse_time
from awl.documents.patterns import matches_any
from awl.store.protocol import OrderRecord, Store, Usage

__all__ = ["MAX_DEPTH", "ancestors", "ended_above", "first_ended", "remaining_of",
           "reports_below", "self_review_problem", "staging_ancestor"]

MAX_DEPTH = 64
"""The most orders above any order: the desk refuses a sub-order that would have more, and
a longer (or cyclic, corrupt) chain stops there. It is the store's ``MAX_CHAIN``, the most
orders above one that a reservation charges, so every order a call is made under is charged
and checked by every rule that walks up."""


def ancestors(store: Store, order: WorkOrder) -> tuple[WorkOrder, ...]:
    """The orders above ``order``, its parent first.

    A parent missing from the store ends the chain there (the desk never stores one;
    only a damaged store can hold such a sub-order). A cycle, possible only in a damaged
    store, ends at the first repeat.
    """
    return tuple(record.order for record in _records_above(store, order))


def _records_above(store: Store, order: WorkOrder) -> Iterator[OrderRecord]:
    """The stored records of the orders above ``order``, its parent first, read one at a
    time as the caller walks up (see :func:`ancestors` for where the walk ends)."""
    seen = {order.id}
    parent_id = order.parent_id
    while parent_id is not None and parent_id not in seen and len(seen) <= MAX_DEPTH:
        try:
            record = store.load(parent_id)
        except NotFound:
            return
        yield record
        seen.add(parent_id)
        parent_id = record.order.parent_id


def self_review_problem(doc: Mapping[str, Any], above: Sequence[WorkOrder]) -> str | None:
    """Why an order (as fields) would let someone review their own work, or None.

    ``above`` is the chain of orders above it (:func:`ancestors` of its parent, parent
    first). The worker (``to``) must differ from the manager (``from``) and from the
    manager of every order above; ``escalate_to`` must differ from both ``to`` and
    ``from``. Fields that are not strings are left to the schema checks.
    """
    manager, worker, escalation = (doc.get(k) for k in ("from", "to", "escalate_to"))
    if isinstance(worker, str):
        if worker == manager:
            return (f"{worker} cannot be the worker of an order it issues: it would review "
                    "its own work; name another principal as `to`")
        for order in above:
            if order.manager == worker:
                return (f"{worker} manages order {order.id}, which this sub-order is split "
                        "from, so it cannot be this sub-order's worker: it would approve its "
                        "own work up the chain; name another principal as `to`")
    if isinstance(escalation, str) and escalation in (manager, worker):
        role = "manager" if escalation == manager else "worker"
        return (f"{escalation} is the order's {role} and cannot also be its escalate_to: "
                + ("it answers anyway" if role == "manager" else
                   "it would answer its own questions") + "; name another principal or "
                "leave escalate_to out")
    return None


def staging_ancestor(tool: str, above: Iterable[WorkOrder]) -> WorkOrder | None:
    """The first order of ``above`` whose ``staged`` patterns match ``tool``, if any."""
    return next((order for order in above if matches_any(order.staged, tool)), None)


def ended_above(store: Store, order: WorkOrder) -> str | None:
    """Why ``order``'s approved effects may no longer run, or None: the first order above it
    that has ended (approved, declined, expired or cancelled), as stored now (LC-22).

    A manager's approval of a sub-order was given under its parent's authority; once any
    order above has ended that authority is gone, so nothing more reaches the world under
    it. States change, so they are read anew on every call.
    """
    record = first_ended(_records_above(store, order))
    if record is None:
        return None
    return (f"order {record.order.id}, which order {order.id} is split from, is "
            f"{record.state}; nothing more runs under an order whose parent ended")


def first_ended(above: Iterable[OrderRecord]) -> OrderRecord | None:
    """The first of ``above`` (the records of the orders above one, parent first, as stored
    now) that has ended, approved, declined, expired or cancelled, or None: the one rule
    behind LC-16 (the gateway, on the ids it read at start) and LC-22 (:func:`ended_above`).
    It stops reading ``above`` at the first that has ended."""
    for record in above:
        if record.state in TERMINAL:
            return record
    return None


def remaining_of(order: WorkOrder, spent: Usage, now: datetime, *,
                 below: Sequence[WorkReport]) -> dict[str, float]:
    """What is left of each unit of ``order``'s budget after ``spent`` (never below 0).

    ``spent`` is the order's usage with its sub-orders' charged to it
    (:meth:`awl.Store.usage`). ``seconds`` runs from the first call under the order or any
    sub-order. ``tokens`` are counted by no gateway: what is taken of them is what the
    direct sub-orders have reported, ``below`` (:func:`reports_below`), each report
    covering the sub-orders under it (RX6).
    """
    left: dict[str, float] = {}
    for unit, limit in order.budget.units().items():
        used: float = 0.0
        if unit == "tool_calls":
            used = spent.tool_calls
        elif unit == "usd":
            used = spent.usd
        elif unit == "tokens":
            used = reported_tokens(below)
        elif unit == "seconds" and spent.first_call_at is not None:
            used = (now - parse_time(spent.first_call_at)).total_seconds()
        left[unit] = max(0.0, limit - used)
    return left


def reports_below(store: Store, order_id: str) -> list[WorkReport]:
    """The latest report of each direct sub-order of ``order_id`` that has reported, read
    in one listing by ``parent_id``: what the order's tokens went to below it, as far as
    anyone has said (LC-15, RX6). A sub-order with no report yet has taken none."""
    return [record.reports[-1]
            for record in store.list_orders(parent_id=order_id, limit=None)
            if record.reports]
