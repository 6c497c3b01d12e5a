"""The lifecycle of a work order, as data: SPEC §10's table (LC-1, LC-3) as :data:`TABLE`.

An order's state is what its append-only event log folds to; every event's ``(from, action,
to)`` must be a row, which also says whose action it is. The report action has two rows (its
outcome depends on the report's status), so the table is keyed by the whole triple rather
than by ``(from, action)``; :func:`targets` gives the states an action may lead to. The
non-transition events (``progress``, ``settle``, ``retry``, ``drop``, ``check``) keep the
state and are rows too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from awl.documents.errors import InvalidTransition
from awl.documents.models import Event

__all__ = [
    "ACTIVE",
    "DESK_ACTOR",
    "NOTE_ACTIONS",
    "ROLES",
    "STATES",
    "TABLE",
    "TERMINAL",
    "WORKING",
    "Role",
    "fold",
    "is_desk_principal",
    "is_row",
    "role_of",
    "targets",
]

Role = Literal["worker", "manager", "answerer", "desk"]

ROLES: tuple[Role, ...] = ("worker", "manager", "answerer", "desk")

ACTIVE: frozenset[str] = frozenset({"offered", "accepted", "working", "blocked", "submitted"})
"""States in which the order can still move."""

TERMINAL: frozenset[str] = frozenset({"approved", "declined", "expired", "cancelled"})
"""States no transition leaves."""

STATES: frozenset[str] = ACTIVE | TERMINAL

WORKING: frozenset[str] = frozenset({"accepted", "working"})
"""States in which the work happens: tools run under the order (GW-4) and Delegation Passes
are issued for it (DP-7)."""

DESK_ACTOR = "awl:desk"
"""The actor of events the desk writes itself (expiry). Principals under ``awl:`` are the
desk's own; no order may name one as manager, worker or escalation contact."""


def is_desk_principal(name: str) -> bool:
    """Whether ``name`` is one of the desk's own principals (``awl:...``), which no person or
    agent may act as or be named as."""
    return name.startswith("awl:")

NOTE_ACTIONS: frozenset[str] = frozenset({"progress", "settle", "retry", "drop"})
"""Actions that record something without changing the state (``from == to``)."""


def _build() -> dict[tuple[str | None, str, str], Role]:
    rows: dict[tuple[str | None, str, str], Role] = {
        (None, "create", "offered"): "manager",
        ("offered", "accept", "accepted"): "worker",
        ("offered", "decline", "declined"): "worker",
        ("accepted", "start", "working"): "worker",
        ("working", "report", "submitted"): "worker",
        ("working", "report", "blocked"): "worker",
        ("blocked", "answer", "working"): "answerer",
        ("submitted", "approve", "approved"): "manager",
        ("submitted", "rework", "working"): "manager",
    }
    for state in sorted(ACTIVE):
        rows[(state, "cancel", "cancelled")] = "manager"
        rows[(state, "expire", "expired")] = "desk"
    for state in ("accepted", "working", "blocked"):
        rows[(state, "progress", state)] = "worker"
    # The desk blocks a working order whose check failed the same way twice in a row, and
    # records each run of the criteria's checks (on a report, or when the manager re-runs).
    rows[("working", "block", "blocked")] = "desk"
    for state in ("working", "blocked", "submitted", "approved"):
        rows[(state, "check", state)] = "desk"
    for action in ("settle", "retry"):
        rows[("approved", action, "approved")] = "manager"
    # Held calls are dropped on rework (working), on a partial approval (approved) and when
    # an order ends without approval; never before the worker could have made a call.
    for state in sorted(STATES - {"offered"}):
        rows[(state, "drop", state)] = "desk"
    return rows


TABLE: Mapping[tuple[str | None, str, str], Role] = _build()
"""Every allowed ``(from, action, to)`` with the role that may perform it."""


def is_row(from_: str | None, action: str, to: str) -> bool:
    """Whether ``(from_, action, to)`` is a row of the table."""
    return (from_, action, to) in TABLE


def targets(state: str | None, action: str) -> tuple[str, ...]:
    """The states ``action`` may lead to from ``state`` (empty when it is not allowed)."""
    return tuple(sorted(to for (f, a, to) in TABLE if f == state and a == action))


def role_of(state: str | None, action: str) -> Role | None:
    """Whose action ``action`` is in ``state``, or None when the state does not allow it."""
    for (f, a, _to), role in TABLE.items():
        if f == state and a == action:
            return role
    return None


def fold(events: Iterable[Event]) -> str:
    """Replay an order's log and return the state it reaches.

    Args:
        events: the order's events, in log order, starting with seq 1.

    Raises:
        InvalidTransition: a seq is not the previous one + 1, an event's ``from`` is not the
            current state, or an event is not a row of the table.
    """
    state: str | None = None
    seq = 0
    for event in events:
        if event.seq != seq + 1:
            raise InvalidTransition(
                f"event seq {event.seq} follows seq {seq}; a log counts up by one",
                state=str(state), action=event.action)
        if event.from_ != state:
            raise InvalidTransition(
                f"event {event.seq} ({event.action}) starts from {event.from_!r} but the "
                f"order is {state!r}", state=str(state), action=event.action)
        if not is_row(event.from_, event.action, event.to):
            raise InvalidTransition(
                f"event {event.seq}: {event.action!r} from {state!r} to {event.to!r} is not "
                f"in the lifecycle table", state=str(state), action=event.action)
        state = event.to
        seq = event.seq
    if state is None:
        raise InvalidTransition("an order's log is never empty", state="none", action="fold")
    return state
