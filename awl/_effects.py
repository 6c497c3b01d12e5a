"""Dropping held calls: the one place where held effects become ``dropped`` (CM-4).

A held call is dropped when it can never run: its attempt was sent back for rework, its
order ended unapproved, or the approval left it out. The desk drops on rework and on an
unapproved end, the commit path drops what an approval leaves out; both come here, so a
drop always looks the same: each effect moves ``held → dropped`` with its reason, by a
compare-and-set (a call already dispatched, or dropped by someone else meanwhile, is left
alone), and one non-transition ``drop`` event names the refs dropped.

This module lives in ``awl`` (not ``gateway``) because the desk needs it and ``awl``
imports nothing from the gateway.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import TYPE_CHECKING, Any

from awl._errors import Conflict
from awl._models import CallRecord
from awl._store import Store

if TYPE_CHECKING:
    from awl._desk import Desk

__all__ = ["drop_held", "held_calls", "record_event"]

# A drop event only needs a free seq; other writers (progress notes, settlements, other
# drops) can take it first, so a drop tries again this many times.
_LOG_ATTEMPTS = 20


def held_calls(store: Store, order_id: str, *,
               attempts: Container[int] | None = None) -> list[CallRecord]:
    """The order's calls that are held and may still run, by N.

    A call counts when its outcome is ``held`` and its effect is ``held`` or not written
    yet (the gateway records the outcome and the effect in two steps).

    Args:
        store: the desk's store.
        order_id: the order.
        attempts: only calls of these attempts (all when None).
    """
    states = {e.ref: e.state for e in store.effects(order_id)}
    return [
        call for call in store.calls(order_id)
        if call.outcome == "held" and states.get(call.ref, "held") == "held"
        and (attempts is None or call.attempt in attempts)
    ]


def record_event(desk: Desk, order_id: str, actor: str, action: str, *, note: str | None,
                 data: Mapping[str, Any]) -> None:
    """Append a non-transition event, deciding again after every lost race."""
    for round_ in range(_LOG_ATTEMPTS):
        try:
            desk.record(order_id, actor, action, note=note, data=data)
            return
        except Conflict:
            if round_ == _LOG_ATTEMPTS - 1:
                raise


def drop_held(desk: Desk, order_id: str, reasons: Mapping[str, str], *, actor: str,
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
        current = states.get(ref)
        if current is not None and current != "held":
            continue
        try:
            store.set_effect(order_id, ref, expect=None if current is None else ["held"],
                             state="dropped", error=why, at=at)
        except Conflict:  # it moved on meanwhile (dispatched, or dropped by another)
            continue
        done.append(ref)
    if done:
        record_event(desk, order_id, actor, "drop",
                     note=note or f"dropped {len(done)} held call(s) that will never run",
                     data={**(data or {}), "refs": done,
                           "reasons": {ref: reasons[ref] for ref in done}})
    return done
