"""Who may do what with an order: the one place that decides it.

The desk (:class:`awl.Desk`) asks before every write, the desk's MCP server before every
read and before issuing a pass, and the gateway's worker tools to know who their caller
acts as. Each check either returns or raises :class:`~awl.Forbidden` with a sentence that
says who may: by name only to a party of the order, so a principal with no role in it learns
no more from a refused write than from a refused read. The roles are those of
:data:`awl.documents.lifecycle.TABLE`: the order's ``from`` is its manager, ``to`` its
worker, and the manager and ``escalate_to`` answer questions; the desk's own events are
written as ``awl:`` principals (SEC-1, BIND-3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from awl.documents.errors import Forbidden
from awl.documents.lifecycle import DESK_ACTOR, TABLE, Role, is_desk_principal
from awl.documents.models import WorkOrder

__all__ = [
    "ACTION_ROLE",
    "acting_as",
    "check_action",
    "check_author",
    "check_manager",
    "check_party",
    "check_pass_deriver",
    "check_pass_issuer",
    "check_reader",
    "check_splitter",
    "check_track_viewer",
    "roles",
]

ACTION_ROLE: dict[str, Role] = {action: role for (_f, action, _t), role in TABLE.items()}
"""Whose each lifecycle action is."""

_ROLE_NAMES: dict[Role, str] = {
    "worker": "worker", "manager": "manager",
    "answerer": "manager or escalation contact", "desk": "desk",
}


def roles(order: WorkOrder, principal: str) -> list[Role]:
    """The roles ``principal`` has in ``order``: manager, worker, answerer (in that order)."""
    out: list[Role] = []
    if principal == order.manager:
        out.append("manager")
    if principal == order.to:
        out.append("worker")
    if principal in order.answerers:
        out.append("answerer")
    return out


def _named(order: WorkOrder, actor: str, principals: Iterable[str]) -> str:
    """`` (a, b)``: who holds the role, told only to a party of ``order``."""
    return f" ({', '.join(principals)})" if roles(order, actor) else ""


def check_action(order: WorkOrder, action: str, actor: str) -> None:
    """Refuse a lifecycle ``action`` by anyone but the role the table gives it.

    Desk actions (expiry, drops) are taken by ``awl:`` principals only.
    """
    role = ACTION_ROLE[action]
    allowed: tuple[str, ...]
    if role == "worker":
        allowed = (order.to,)
    elif role == "manager":
        allowed = (order.manager,)
    elif role == "answerer":
        allowed = order.answerers
    else:
        if is_desk_principal(actor):
            return
        allowed = (DESK_ACTOR,)
    if actor not in allowed:
        raise Forbidden(
            f"{actor} may not {action} order {order.id!r}: only its {_ROLE_NAMES[role]}"
            f"{_named(order, actor, allowed)} may", actor=actor, action=action)


def check_author(author: object, actor: str) -> None:
    """Refuse an order whose ``from`` is not the one creating it: its manager creates it."""
    if author != actor:
        raise Forbidden(f"{actor} may not create an order from {author}; an order is "
                        "created by its manager", actor=actor, action="create")


def check_splitter(parent: WorkOrder, actor: str) -> None:
    """Refuse splitting a sub-order from ``parent`` by anyone but its worker or manager."""
    if actor not in (parent.to, parent.manager):
        raise Forbidden(f"{actor} may not split order {parent.id!r}: only its worker or "
                        f"manager{_named(parent, actor, (parent.to, parent.manager))} may",
                        actor=actor, action="create sub-order")


def check_manager(order: WorkOrder, actor: str, action: str, doing: str) -> None:
    """Refuse ``action`` (``doing``, as a message says it: "settle effects", "run the
    checks") by anyone but the order's manager."""
    if actor != order.manager:
        raise Forbidden(f"{actor} may not {doing} of order {order.id!r}: only its "
                        f"manager{_named(order, actor, (order.manager,))} may", actor=actor,
                        action=action)


def check_party(order: WorkOrder, actor: str) -> None:
    """Refuse anyone with no role in the order itself (the approval page shows an order only
    to its manager, worker and answerers, BIND-13; the MCP desk's reads go further up, see
    :func:`check_reader`)."""
    if not roles(order, actor):
        raise Forbidden(f"{actor} is not a party to order {order.id!r}; only its manager, "
                        "worker and answerers see it", actor=actor, action="read")


def check_reader(order: WorkOrder, actor: str,
                 above: Callable[[], Iterable[WorkOrder]]) -> None:
    """Refuse reading ``order`` to anyone with no role in it or in an order it was split from.

    ``above()`` gives the orders above it (:func:`awl.desk.lineage.ancestors`); it is asked
    only when ``actor`` has no role in ``order`` itself.
    """
    if roles(order, actor) or any(roles(o, actor) for o in above()):
        return
    raise Forbidden(f"{actor} is not part of order {order.id!r}: only its manager, worker "
                    "and escalation contact (and those of the orders it was split from) "
                    "may read it", actor=actor, action="read")


def check_pass_issuer(order: WorkOrder, actor: str) -> None:
    """Refuse issuing the worker's Delegation Pass of ``order`` by anyone but its worker or
    manager."""
    if actor not in (order.to, order.manager):
        raise Forbidden(f"{actor} may not issue the worker's pass of order {order.id!r}: "
                        f"only its worker or manager"
                        f"{_named(order, actor, (order.to, order.manager))} may",
                        actor=actor, action="issue_pass")


def check_pass_deriver(actor: str, holder: object) -> None:
    """Refuse deriving a pass from one ``actor`` does not hold (``holder``: its ``sub``)."""
    if holder != actor:
        raise Forbidden(f"{actor} may derive passes only from a pass it holds; this "
                        f"one is held by {holder}", actor=actor, action="issue_pass")


def check_track_viewer(worker: str, viewer: str, issued: bool) -> None:
    """Refuse ``viewer`` the track record of ``worker`` unless it is the worker or issued it
    at least one order (``issued``); it then sees those orders only (SEC-8)."""
    if viewer != worker and not issued:
        raise Forbidden(f"{viewer} may not read the track record of {worker}: only the worker "
                        "itself, and the managers of its orders (for those orders), may",
                        actor=viewer, action="track")


def acting_as(order: WorkOrder, pass_subject: str | None) -> str:
    """Who a caller of the gateway's worker tools acts as: the holder of the Delegation Pass
    it runs under, or else the order's worker. The desk then decides what that may do."""
    return pass_subject if pass_subject is not None else order.to
