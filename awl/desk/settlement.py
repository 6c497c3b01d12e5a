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

from awl.desk.core import Write
from awl.desk.desk import Desk
from awl.desk.effects import (
    EffectView,
    Verdict,
    effect_of,
    find_call,
    list_effects,
    manager_only,
    settle_events,
    valid_settlement,
)
from awl.documents.errors import BadRequest, Conflict, InvalidTransition
from awl.documents.lifecycle import targets
from awl.documents.models import format_time, utc_now
from awl.store.protocol import EffectState, OrderRecord, Settlement, Store

__all__ = ["settle"]

_ATTEMPTS = 20
"""How many times a settlement is decided again after another event took its seq."""


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
        InvalidTransition: The effect is not ``unknown``, or was already settled for its
            latest dispatch (by another manager at the same moment, too: the first
            settlement logged counts, and a refused one writes nothing).
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
    data = {"ref": call.ref, "verdict": verdict, "evidence": evidence,
            "dispatches": state.dispatches}

    def plan(record: OrderRecord, moment: datetime) -> Write:
        # Decided against the log as of the order's seq the event is appended after: a
        # settlement another manager logged meanwhile moves the seq, so this is decided
        # again and refused, writing nothing (the first settlement counts, CM-11).
        fresh = effect_of(store, order_id, call, "settle")
        if fresh.state != "unknown" or fresh.dispatches != state.dispatches:
            raise InvalidTransition(
                f"effect {call.ref} of order {order_id!r} moved on while being settled (it is "
                f"{fresh.state}, sent {fresh.dispatches}x); list it again and settle what "
                "it shows", state=fresh.state, action="settle")
        _refuse_settled(order_id, call.ref, fresh, store)
        return Write(desk._event(record, "settle", by, targets(record.state, "settle")[0],
                                 moment, note=evidence, data=data))

    # The event is the authority for a retry (it carries the dispatch count it describes);
    # the copy on the effect is for readers of the store.
    for round_ in range(_ATTEMPTS):
        try:
            desk._run(order_id, "settle", by, plan)
            break
        except Conflict:  # another event took the seq (a progress note, a drop): again
            if round_ == _ATTEMPTS - 1:
                raise
    settlement = Settlement(verdict=verdict, evidence=evidence, by=by, at=at)
    # Conflict: it was retried meanwhile; the event's dispatch count makes it stale anyway.
    with contextlib.suppress(Conflict):
        store.set_effect(order_id, call.ref, expect=["unknown"], state="unknown",
                         result=state.result, error=state.error, settlement=settlement, at=at)
    return next(v for v in list_effects(order_id, store=store) if v.ref == call.ref)


def _refuse_settled(order_id: str, ref: str, state: EffectState, store: Store) -> None:
    """InvalidTransition when the effect was already settled for its current dispatch."""
    first = valid_settlement(state, settle_events(store.events(order_id)).get(ref))
    if first is None:
        return
    verdict = first.verdict.replace("_", " ")
    then = ("it will never be sent again" if first.verdict == "happened"
            else f"retry it with `awl effects retry {order_id} {ref}`")
    raise InvalidTransition(
        f"effect {ref} of order {order_id!r} was already settled as {verdict} by {first.by} "
        f"at {first.at}; a settlement is final: {then}", state="unknown", action="settle")
