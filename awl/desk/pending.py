"""Calls left ``pending`` by a gateway that stopped before recording their outcome (GW-7).

A gateway writes a call's reservation (outcome ``pending``) before it forwards the call and
its outcome once the upstream answered. A gateway that dies in between (or whose store was
away until it stopped, with outcomes it kept and could not write) leaves the record
``pending`` for good, though the call may have run. As a commit turns a ``dispatching``
effect it finds into ``unknown`` (CM-8), the desk turns such a call, when it next reads the
order's calls, into outcome ``error`` with an error starting ``AWL_OUTCOME_UNKNOWN:`` that
says it may have run. A call counts as left behind once it has been pending for
:data:`STALE_PENDING_SECONDS` (``AWL_PENDING_STALE_SECONDS`` sets another bound), longer than
a gateway holds a call by default (its upstream's 30 s timeout plus the store's waits). Every
door that shows an order's calls reads them through :meth:`awl.Desk.calls`, which applies it.
"""

from __future__ import annotations

import math
import os
from contextlib import suppress
from datetime import datetime, timedelta

from awl.documents import (
    BadRequest,
    CallRecord,
    Conflict,
    NotFound,
    format_time,
    parse_time,
    utc_now,
)
from awl.store.protocol import Store

__all__ = ["AWL_OUTCOME_UNKNOWN", "STALE_ENV", "STALE_PENDING_SECONDS", "settle_stale_calls",
           "stale_after"]

STALE_PENDING_SECONDS = 3600.0
"""How long a call may stay ``pending`` before the desk reads it as left behind."""

STALE_ENV = "AWL_PENDING_STALE_SECONDS"
"""Sets another bound: longer than the longest a gateway of this desk holds a call (its
upstreams' timeouts), or a call still in flight is read as left behind."""

_YEAR = 365 * 24 * 3600.0


def stale_after() -> float:
    """The bound in seconds: ``$AWL_PENDING_STALE_SECONDS`` when set, else the default.

    Raises:
        BadRequest: the variable is not a number of seconds from 1 to a year.
    """
    text = os.environ.get(STALE_ENV, "").strip()
    if not text:
        return STALE_PENDING_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (1 <= value <= _YEAR):
        raise BadRequest(f"${STALE_ENV} is {text!r}: give the seconds a call may stay pending "
                         "before the desk reads it as may-have-run, from 1 to 31536000 "
                         f"(unset: {STALE_PENDING_SECONDS:g})")
    return value

AWL_OUTCOME_UNKNOWN = "AWL_OUTCOME_UNKNOWN"


def settle_stale_calls(store: Store, calls: list[CallRecord], *, now: datetime | None = None,
                       after: float | None = None) -> list[CallRecord]:
    """``calls`` (one order's), each pending one older than ``after`` seconds (default:
    :func:`stale_after`) recorded first as may-have-run; the others as given. A gateway that
    records the outcome first wins (the desk's write is then refused, and the gateway's
    outcome is read back)."""
    at = now or utc_now()
    limit = at - timedelta(seconds=stale_after() if after is None else after)
    stale = [c for c in calls if c.outcome == "pending" and parse_time(c.started_at) < limit]
    if not stale:
        return calls
    for call in stale:
        with suppress(Conflict, NotFound):  # its gateway recorded it meanwhile
            store.finish_call(call.order_id, call.ref, outcome="error", result=None,
                              error=f"{AWL_OUTCOME_UNKNOWN}: the gateway that forwarded this "
                                    "call stopped before recording its outcome; the call "
                                    "may have run (check with the system it reached before "
                                    "calling again)", ended_at=format_time(at))
    fresh = {c.ref: c for c in store.calls(stale[0].order_id)}
    return [fresh.get(c.ref, c) for c in calls]
