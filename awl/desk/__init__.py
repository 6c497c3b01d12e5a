"""The desk: commands, queries and waiting over a store; effects, track records, briefings.

Above documents, store and passes; below the gateway and the servers. :class:`Desk` is
built in layers, each a module importing only those before it: ``views`` (what a reader
gets), ``core`` (the write path), ``queries``, ``waiting``, ``desk`` (the commands), then
``asyncdesk`` (every operation as a coroutine). Who may do what is decided in ``access``
alone, which the desk, the MCP desk server, the approval page and the gateway's worker tools
all ask.
"""

from awl.desk.asyncdesk import AsyncDesk
from awl.desk.desk import Desk
from awl.desk.views import OrderView, Question
from awl.desk.waiting import Subscription

__all__ = ["AsyncDesk", "Desk", "OrderView", "Question", "Subscription"]
