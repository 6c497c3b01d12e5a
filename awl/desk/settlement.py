"""Settling an effect: the manager records what they found out about an ``unknown`` one.

:func:`settle` writes a ``settle`` event (``happened`` or ``did_not_happen``, with the
evidence) through the desk; a settlement stays valid until the effect is dispatched again
(the event records the effect's dispatch count; :func:`~awl.desk.effects.valid_settlement`
compares it), and only one counts per dispatch (CM-11). It sends nothing upstream: the
gateway's ``retry`` sends an effect settled as ``did_not_happen``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime

from awl.desk.desk import Desk
from awl.desk.effects import (
    EffectView,
    Verdict,
    effect_of,
    find_call,
    list_effects,
    manager_only,
    record_event,
    settle_events,
    valid_settlement,
)
from awl.documents.errors import BadRequest, Conflict, InvalidTransition
from awl.documents.models import format_time, utc_now
from awl.store.protocol import EffectState, Settlement, Store

__all__ = ["settle"]


def settle(order_id: str, ref: str, verdict: Verdict, evidence: str, by: str, *,
           store: Store, desk: Desk | None = None,
           now: Callable[[], datetime] | None = None) -> EffectView:
    """Record the manager's finding about an ``unknown`` effect, as a ``settle`` event.

    Args:
        order_id: The order.
        ref: The unknown effect, ``server/tool#N``.
        verdict: ``happened`` (it ran; it can never be retried) or ``did_not_happen``
            (it did not run; the gateway's ``retry`` may send it).
        evidence: What the finding rests on, for the record.
        by: Who settles; must be the order's manager.
        store: The desk's store.
        desk: The desk whose log gets the event (default one over ``store``).
        now: The clock for timestamps (default UTC now).

    Raises:
        Forbidden: ``by`` is not the order's manager.
        InvalidTransition: The effect is not ``unknown``.
        BadRequest: No evidence, or an unknown verdict.
        NotFound: No such order or call.
    """
    if verdict not in ("happened", "did_not_happen"):
        raise BadRequest(f"verdict must be happened or did_not_happen, not {verdict!r}")
    if not evidence.strip():
        raise BadRequest("a settlement says what it rests on; give --evidence")
    clock = now or utc_now
    desk = desk or Desk(store, clock=clock, conflict_retries=5)
    record = store.load(order_id)
    manager_only(record.order, by, "settle")
    call = find_call(store, order_id, ref)
    state = effect_of(store, order_id, call, "settle")
    if state.state != "unknown":
        raise InvalidTransition(f"effect {call.ref} of order {order_id!r} is {state.state}; "
                                "only an unknown effect is settled", state=state.state,
                                action="settle")
    _refuse_settled(order_id, call.ref, state, store)
    at = format_time(clock())
    # The event is the authority for a retry (it carries the dispatch count it describes);
    # the copy on the effect is for readers of the store.
    record_event(desk, order_id, by, "settle", note=evidence,
                 data={"ref": call.ref, "verdict": verdict, "evidence": evidence,
                       "dispatches": state.dispatches})
    # Another manager's settlement may have been logged between the check and ours: the
    # first one counts, and ours is refused.
    _refuse_settled(order_id, call.ref, state, store, mine=(by, verdict, evidence))
    settlement = Settlement(verdict=verdict, evidence=evidence, by=by, at=at)
    # Conflict: it was retried meanwhile; the event's dispatch count makes it stale anyway.
    with contextlib.suppress(Conflict):
        store.set_effect(order_id, call.ref, expect=["unknown"], state="unknown",
                         result=state.result, error=state.error, settlement=settlement, at=at)
    return next(v for v in list_effects(order_id, store=store) if v.ref == call.ref)


def _refuse_settled(order_id: str, ref: str, state: EffectState, store: Store, *,
                    mine: tuple[str, str, str] | None = None) -> None:
    """InvalidTransition when the effect was already settled for its current dispatch
    (by another settlement than ``mine``, when given: actor, verdict, evidence)."""
    first = valid_settlement(state, settle_events(store.events(order_id)).get(ref))
    if first is None or (mine is not None
                         and (first.by, first.verdict, first.evidence) == mine):
        return
    verdict = first.verdict.replace("_", " ")
    then = ("it will never be sent again" if first.verdict == "happened"
            else f"retry it with `awl effects retry {order_id} {ref}`")
    raise InvalidTransition(
        f"effect {ref} of order {order_id!r} was already settled as {verdict} by {first.by} "
        f"at {first.at}; a settlement is final: {then}", state="unknown", action="settle")
