"""Effects in the store: listing, settling and dropping held calls (CM-4).

Everything here reads and writes the desk's store and log and sends nothing upstream, so
it lives in ``awl``, which imports nothing from the gateway: the desk, the desk server and
the CLI use it directly, and the gateway's commit path (:mod:`gateway._commit`, which does
the sending) builds on it.

Listing. :func:`list_effects` shows every held call of an order with its effect state and,
while it still describes the effect, the manager's settlement.

Settling (:mod:`awl.desk.settlement`, which logs through the desk) records the manager's
finding about an ``unknown`` effect as a ``settle`` event; :func:`settle_events` and
:func:`valid_settlement` read it back: a settlement stays valid until the effect is
dispatched again (the event records the effect's dispatch count).

Dropping. A held call is dropped when it can never run: its attempt was sent back for
rework, its order ended unapproved, or the approval left it out. The desk drops on rework
and on an unapproved end, the commit path drops what an approval leaves out; both come to
:func:`drop_held`, so a drop always looks the same: each effect moves ``held → dropped``
with its reason, by a compare-and-set (a call already dispatched, or dropped by someone
else meanwhile, is left alone), and one non-transition ``drop`` event names the refs
dropped.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from awl.desk.access import check_manager
from awl.documents.errors import Conflict, InvalidTransition, NotFound
from awl.documents.models import CallRecord, Event, WorkOrder
from awl.documents.patterns import canonical_ref
from awl.store.protocol import EffectState, Settlement, Store

__all__ = [
    "ApprovalScope",
    "EffectView",
    "EventLog",
    "Settles",
    "Verdict",
    "drop_held",
    "effect_of",
    "find_call",
    "held_calls",
    "list_effects",
    "manager_only",
    "record_event",
    "scope_of",
    "settle_events",
    "valid_settlement",
]

Verdict = Literal["happened", "did_not_happen"]
"""What the manager found out about an ``unknown`` effect."""

# A drop event only needs a free seq; other writers (progress notes, settlements, other
# drops) can take it first, so a drop tries again this many times.
_LOG_ATTEMPTS = 20


class EventLog(Protocol):
    """What effects need of a desk: its store, and :meth:`~awl.Desk.record` to log a
    non-transition event (``drop``, ``settle``, ``retry``). A :class:`~awl.Desk` is one."""

    store: Store

    def record(self, order_id: str, actor: str, action: str, *, note: str | None = None,
               data: Mapping[str, Any] | None = None) -> object: ...


def held_calls(store: Store, order_id: str, *,
               attempts: Container[int] | None = None) -> list[CallRecord]:
    """The order's calls that are held and may still run, by N: outcome ``held`` and
    effect ``held`` (the store writes the two together, CM-14).

    Args:
        store: the desk's store.
        order_id: the order.
        attempts: only calls of these attempts (all when None).
    """
    held = {e.ref for e in store.effects(order_id) if e.state == "held"}
    return [
        call for call in store.calls(order_id)
        if call.outcome == "held" and call.ref in held
        and (attempts is None or call.attempt in attempts)
    ]


def record_event(desk: EventLog, order_id: str, actor: str, action: str, *, note: str | None,
                 data: Mapping[str, Any]) -> None:
    """Append a non-transition event, deciding again after every lost race."""
    for round_ in range(_LOG_ATTEMPTS):
        try:
            desk.record(order_id, actor, action, note=note, data=data)
            return
        except Conflict:
            if round_ == _LOG_ATTEMPTS - 1:
                raise


def drop_held(desk: EventLog, order_id: str, reasons: Mapping[str, str], *, actor: str,
              at: str, note: str | None = None,
              data: Mapping[str, Any] | None = None) -> list[str]:
    """Drop the held calls named in ``reasons`` (ref → why) and log one ``drop`` event.

    Each still-held effect moves to ``dropped`` with its reason as the error; one that is
    past ``held`` (or moves on meanwhile) is left alone. The ``drop`` event, written only
    when something was dropped, carries ``refs`` (those dropped, in the order given),
    ``reasons`` and any extra ``data``.

    Args:
        desk: the desk whose store holds the effects and whose log gets the event.
        order_id: the order.
        reasons: why each ref is dropped.
        actor: who drops (``awl:desk`` or ``awl:gateway``).
        at: the time written on the effects.
        note: the event's note (default: how many were dropped).
        data: more fields for the event's data.

    Returns:
        The refs dropped.
    """
    store = desk.store
    states = {e.ref: e.state for e in store.effects(order_id)}
    done: list[str] = []
    for ref, why in reasons.items():
        if states.get(ref) != "held":
            continue
        try:
            store.set_effect(order_id, ref, expect=["held"], state="dropped", error=why, at=at)
        except Conflict:  # it moved on meanwhile (dispatched, or dropped by another)
            continue
        done.append(ref)
    if done:
        record_event(desk, order_id, actor, "drop",
                     note=note or f"dropped {len(done)} held call(s) that will never run",
                     data={**(data or {}), "refs": done,
                           "reasons": {ref: reasons[ref] for ref in done}})
    return done


# --------------------------------------------------------------------------- listing

@dataclass(frozen=True, slots=True)
class EffectView:
    """One held call of an order with its effect state, for listings."""

    ref: str
    tool: str
    attempt: int
    arguments: dict[str, Any]
    state: str
    """The effect state."""
    dispatches: int = 0
    result: dict[str, Any] | None = None
    error: str | None = None
    settlement: Settlement | None = None
    """The manager's settlement, if one is still valid (the effect was not dispatched since)."""
    updated_at: str = ""

    @property
    def retryable(self) -> bool:
        """Whether the gateway's ``retry`` may send it: unknown, settled as did_not_happen."""
        return (self.state == "unknown" and self.settlement is not None
                and self.settlement.verdict == "did_not_happen")

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        out: dict[str, Any] = {
            "ref": self.ref, "tool": self.tool, "attempt": self.attempt,
            "arguments": self.arguments, "state": self.state, "dispatches": self.dispatches,
            "updated_at": self.updated_at, "retryable": self.retryable,
        }
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        if self.settlement is not None:
            s = self.settlement
            out["settlement"] = {"verdict": s.verdict, "evidence": s.evidence, "by": s.by,
                                 "at": s.at}
        return out


Settles = Mapping[int, Event]
"""One effect's settlements: the first ``settle`` event for each dispatch count."""


def settle_events(events: Sequence[Event]) -> dict[str, Settles]:
    """Each ref's settlements from an order's log: per dispatch count, the first ``settle``
    event. A settlement is final (CM-11): a later one for the same dispatch never counts
    (:func:`settle` refuses to write one; a log from before that rule may hold one)."""
    found: dict[str, dict[int, Event]] = {}
    for event in events:
        data = event.data
        if event.action != "settle" or not data or not isinstance(data.get("ref"), str):
            continue
        dispatches = data.get("dispatches")
        if isinstance(dispatches, int) and not isinstance(dispatches, bool):
            found.setdefault(data["ref"], {}).setdefault(dispatches, event)
    return dict(found)


def valid_settlement(state: EffectState | None, settles: Settles | None) -> Settlement | None:
    """The settlement that still describes the effect: the first made while it was unknown
    with the dispatch count it has now (any later dispatch makes it stale)."""
    if state is None or state.state != "unknown" or not settles:
        return None
    event = settles.get(state.dispatches)
    if event is None or event.data is None:
        return None
    data = event.data
    verdict = data.get("verdict")
    if verdict not in ("happened", "did_not_happen"):
        return None
    return Settlement(verdict=verdict, evidence=str(data.get("evidence", "")),
                      by=event.actor, at=event.at)


def list_effects(order_id: str, *, store: Store) -> list[EffectView]:
    """Every held call of the order with its effect state, by call number."""
    states = {e.ref: e for e in store.effects(order_id)}
    settles = settle_events(store.events(order_id))
    return [
        EffectView(
            ref=call.ref, tool=call.tool, attempt=call.attempt, arguments=call.arguments,
            state=state.state, dispatches=state.dispatches, result=state.result,
            error=state.error, settlement=valid_settlement(state, settles.get(call.ref)),
            updated_at=state.updated_at,
        )
        for call in store.calls(order_id) if (state := states.get(call.ref)) is not None
    ]


@dataclass(frozen=True)
class ApprovalScope:
    """What an approval lets the commit send, while the commit has not run (BIND-25):
    ``covered``, the held effects it will send, and ``dropped``, the held calls of the
    approved attempt it will drop (not chosen, or not listed in the report)."""

    covered: tuple[EffectView, ...]
    dropped: tuple[EffectView, ...]

    def lines(self) -> list[str]:
        """The scope in words, one line each for what is sent and what is dropped."""
        def refs(views: Sequence[EffectView]) -> str:
            return ", ".join(f"{v.ref} ({v.tool})" for v in views) or "none"
        return [f"the approval covers {len(self.covered)}: {refs(self.covered)} (sent by the "
                "commit)", f"it drops {len(self.dropped)}: {refs(self.dropped)} (never sent)"]


def scope_of(view: Any, effects: Sequence[EffectView]) -> ApprovalScope | None:
    """What the approval of an :class:`~awl.OrderView` (its last review, an approve) covers
    and drops while any held call of the approved attempt is still ``held`` (the commit has
    not run), else None. ``effects``: the order's (:func:`list_effects`)."""
    review = view.reviews[-1] if view.reviews else None
    if view.state != "approved" or review is None or review.decision != "approve":
        return None
    held = [e for e in effects if e.attempt == view.attempt and e.state == "held"]
    if not held:
        return None
    report = view.latest_report
    listed = {e.ref for e in report.effects or ()} if report is not None else set()
    covered = tuple(e for e in held if e.ref in listed
                    and (review.effects is None or e.ref in review.effects))
    return ApprovalScope(covered, tuple(e for e in held if e not in covered))


def find_call(store: Store, order_id: str, ref: str, *,
              calls: Sequence[CallRecord] | None = None) -> CallRecord:
    """The order's recorded call that ``ref`` names (in either ref form), among ``calls``
    when given (the order's, as a door read them), else as the store has them.

    Raises:
        NotFound: The order has no such call.
    """
    canonical = canonical_ref(ref)
    for call in store.calls(order_id) if calls is None else calls:
        if call.ref == canonical:
            return call
    raise NotFound(f"order {order_id!r} has no recorded call {ref!r}; list its effects with "
                   f"`awl effects list {order_id}`")


def effect_of(store: Store, order_id: str, call: CallRecord, action: str) -> EffectState:
    """The effect of a recorded call, for ``action`` (``settle``, ``retry``).

    Raises:
        InvalidTransition: The call was not held, so it has no effect.
    """
    state = next((e for e in store.effects(order_id) if e.ref == call.ref), None)
    if state is None:
        raise InvalidTransition(
            f"call {call.ref} of order {order_id!r} was not held (its outcome is "
            f"{call.outcome}), so it has no effect to {action}", state="none", action=action)
    return state


def manager_only(order: WorkOrder, by: str, action: str) -> None:
    """Refuse ``action`` on the order's effects unless ``by`` is its manager.

    Raises:
        Forbidden: ``by`` is not the order's manager.
    """
    check_manager(order, by, action, f"{action} effects")
