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

from collections.abc import Iterable

from awl.desk.access import check_track_viewer
from awl.store.protocol import Store, TrackRecord, TrackRow, UnitSpend
from awl.store.tally import ALL, OUTCOMES, Tally, outcome_of

__all__ = ["OUTCOMES", "TrackRecord", "TrackRow", "UnitSpend", "outcome_of", "summarize",
           "track_record"]


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
    if viewer is None or viewer == worker:
        return store.track_record(worker)
    record = store.track_record(worker, manager=viewer)
    check_track_viewer(worker, viewer, record.orders > 0)
    return record


def summarize(worker: str, rows: Iterable[TrackRow]) -> TrackRecord:
    """Fold the worker's rows into a track record, from scratch: what the tallies a store
    keeps (:meth:`~awl.store.protocol.ReviewStore.track_record`) must agree with."""
    tally = Tally()
    for row in rows:
        tally.write(worker, ALL, row.order_id, None, row)
    return tally.record(worker)
