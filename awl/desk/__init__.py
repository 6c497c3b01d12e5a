"""The desk: commands, queries and waiting over a store; effects, track records, briefings.

Above documents, store and passes; below the gateway and the servers. :class:`Desk` is
built in layers, each a module importing only those before it: ``views`` (what a reader
gets), ``core`` (the write path), ``queries``, ``waiting``, ``desk`` (the commands), then
``asyncdesk`` (every operation as a coroutine).

The interface the gateway uses, and the only names it imports from here:

- :class:`Desk` (and its :data:`Clock` type), through which the gateway's desk tools act as
  the worker or pass holder (:func:`acting_as`), so the desk alone decides what they may do:
  who may do what is decided in :mod:`~awl.desk.access` only, which the desk, the MCP desk
  server, the approval page and the gateway's worker tools all ask;
- the effects of held calls (:mod:`~awl.desk.effects`): which calls are still held, dropping
  them, finding a call, listing effects, logging a ``retry`` (:func:`record_event`), the
  manager-only rule, and reading settlements back; :func:`settle` records one;
- an order's lineage: the orders above it, which of them stages a tool, and whether one
  ended (so a sub-order's effects no longer run);
- the desk's home folder and default store, for ``awl gateway`` run without a store;
- :func:`settle_stale_calls`: calls a gateway left ``pending`` read as may-have-run.
"""

from awl.desk.access import acting_as
from awl.desk.asyncdesk import AsyncDesk
from awl.desk.core import Clock
from awl.desk.desk import Desk
from awl.desk.effects import (
    EffectView,
    drop_held,
    effect_of,
    find_call,
    held_calls,
    list_effects,
    manager_only,
    record_event,
    settle_events,
    valid_settlement,
)
from awl.desk.home import default_store, home_dir
from awl.desk.lineage import ancestors, ended_above, first_ended, staging_ancestor
from awl.desk.pending import AWL_OUTCOME_UNKNOWN, STALE_PENDING_SECONDS, settle_stale_calls
from awl.desk.settlement import settle
from awl.desk.views import OrderView, Question, QuestionPage
from awl.desk.waiting import Subscription

__all__ = [
    "AWL_OUTCOME_UNKNOWN",
    "STALE_PENDING_SECONDS",
    "AsyncDesk",
    "Clock",
    "Desk",
    "EffectView",
    "OrderView",
    "Question",
    "QuestionPage",
    "Subscription",
    "acting_as",
    "ancestors",
    "default_store",
    "drop_held",
    "effect_of",
    "ended_above",
    "find_call",
    "first_ended",
    "held_calls",
    "home_dir",
    "list_effects",
    "manager_only",
    "record_event",
    "settle",
    "settle_events",
    "settle_stale_calls",
    "staging_ancestor",
    "valid_settlement",
]
