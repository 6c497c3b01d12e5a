"""The approval page's addresses, made in one place.

An order id may be any string of 1 to 128 characters and a worker's name any of 1 to 512
(the work-order schema): ``.``, ``..``, a ``/``, ``?``, ``#``, ``%``, spaces, line breaks,
any Unicode. A path segment cannot carry every such string (clients fold ``.`` and ``..``
away, and an id ending in ``/call`` reads as the order ``…`` and its action ``call``), so the
page names an order or a worker in the query string, percent-encoded in full (UTF-8, nothing
left as is), where every string has one spelling that arrives unchanged:

- ``/order?id=ID``: the order's page; ``/order/call?id=ID&ref=REF``: one recorded call;
- ``/order/ACTION?id=ID`` (POST): ``review``, ``answer``, ``cancel``, ``settle``, ``retry``
  and ``commit``; a form names the order in its action address, not in a field, since a
  browser changes line breaks (and NUL) in field values but never an encoded address;
- ``/worker?name=NAME``: a worker's track record.

:func:`awl.desk.notify.order_link` makes a notification's link the same way (the desk is
below the page, so it cannot call this). The addresses used before, ``/orders/ID…`` and
``/workers/NAME``, are redirected here by :func:`legacy_target` when they name one order.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

__all__ = ["ORDER", "ORDER_ACTIONS", "ORDER_PAGES", "WORKER", "legacy_target", "link",
           "order_url", "worker_url"]

ORDER = "/order"
WORKER = "/worker"
ORDER_PAGES = frozenset({"call"})
"""What an order has besides its page, shown with GET: ``/order/call``."""
ORDER_ACTIONS = frozenset({"review", "answer", "cancel", "settle", "retry", "commit"})
"""What is done to an order, each a POST to ``/order/ACTION``."""


def link(path: str, **query: str | None) -> str:
    """``path`` with ``query`` (those not None, in the order given), each value
    percent-encoded in full, so it arrives exactly as given."""
    pairs = "&".join(f"{name}={quote(value, safe='')}" for name, value in query.items()
                     if value is not None)
    return f"{path}?{pairs}" if pairs else path


def order_url(order_id: str, action: str = "", **query: str | None) -> str:
    """The address of the order's page, or of one of its pages or actions (``call``,
    ``review``, …) with ``query`` after the id.

    Raises:
        ValueError: ``action`` is none of the page's.
    """
    if action and action not in ORDER_PAGES | ORDER_ACTIONS:
        raise ValueError(f"the page has no order action {action!r}")
    return link(f"{ORDER}/{action}" if action else ORDER, id=order_id, **query)


def worker_url(name: str) -> str:
    """The address of a worker's track record."""
    return link(WORKER, name=name)


def legacy_target(kind: str, rest: str, method: str, query: dict[str, str]) -> str | None:
    """Where an address of the old form goes now, or None when it names nothing.

    ``rest`` is what followed ``/orders/`` (``kind`` ``"orders"``) or ``/workers/``
    (``"workers"``) as it was sent, still percent-encoded: the old links encoded a ``/`` in an
    id as ``%2F``, so only a literal ``/`` can separate an id from an action (``…/call`` with
    GET, ``…/review`` and the others with POST), and an id such as ``x/call``, sent as
    ``x%2Fcall``, stays whole. ``.`` and ``..`` never arrive (clients fold them), so an old
    link to such an id names nothing.
    """
    if kind == "workers":
        return worker_url(unquote(rest)) if rest else None
    head, _, last = rest.rpartition("/")
    if head and (last in ORDER_PAGES if method == "GET" else last in ORDER_ACTIONS):
        extra = {"ref": query.get("ref")} if last == "call" else {}
        return order_url(unquote(head), last, **extra)
    if method != "GET" or not rest:
        return None
    return order_url(unquote(rest))
