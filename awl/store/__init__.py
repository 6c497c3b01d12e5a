"""Where a desk keeps its state: the :class:`~awl.store.protocol.Store` protocol and its backends.

``protocol`` says what every backend promises, ``rules`` holds the checks they all share,
``memory`` and ``sqlite`` are the backends, ``sql`` the statements the SQL backends share
(SQLite's and PostgreSQL's differ there only in their dialect), ``urls`` opens the one a URL
names (PostgreSQL's is loaded from ``postgres`` only then) and ``copy`` copies a whole desk
between two of them.
A store imports documents only.

The gateway talks to a store only through the protocol, and imports only the names
re-exported here: :class:`Store` and the records it reads and writes (and
:class:`Reservation`, what a reservation returns: :class:`Reserved` or
:class:`OverBudget`), and
:func:`stale_order`, the Conflict a store raises when an order's log moved past the ``seq``
a caller decided on (the gateway raises the same one when it sees that before reserving).
"""

from awl.store.protocol import (
    EffectState,
    FreedLocks,
    KeyDirectory,
    LockInfo,
    OrderRecord,
    OverBudget,
    Reservation,
    Reserved,
    Revocation,
    Scope,
    Store,
    Usage,
)
from awl.store.rules import over_limit, stale_order

__all__ = [
    "EffectState",
    "FreedLocks",
    "KeyDirectory",
    "LockInfo",
    "OrderRecord",
    "OverBudget",
    "Reservation",
    "Reserved",
    "Revocation",
    "Scope",
    "Store",
    "Usage",
    "over_limit",
    "stale_order",
]
