"""Waiting for an order's events: a blocking wait, a follow iterator and subscriptions.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable, Iterator

from awl.desk.queries import DeskQueries
from awl.documents.errors import AWLError, BadRequest, debugging
from awl.documents.lifecycle import TERMINAL
from awl.documents.limits import check_integer, show_value
from awl.documents.models import Event, parse_time
from awl.store.protocol import Subscriptions

__all__ = ["DeskWaiting", "Subscription", "check_timeout", "follow_slices"]

log = logging.getLogger("awl.desk")


def follow_slices(timeout: float | None) -> Iterator[float]:
    """The waits a follow is made of: 5 s each, until ``timeout`` seconds have passed
    (None: no limit); the caller stops early when the order ends.

    Raises:
        BadRequest: ``timeout`` is not a number of seconds.
    """
    if timeout is not None:
        timeout = check_timeout(timeout)
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        slice_ = 5.0 if end is None else min(5.0, end - time.monotonic())
        if slice_ <= 0:
            return
        yield slice_


def check_timeout(timeout: object) -> float:
    """``timeout`` as a number of seconds, or :class:`BadRequest` (a boolean, a string or
    NaN is none)."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout != timeout:
        raise BadRequest(f"timeout must be a number of seconds, not {show_value(timeout)}")
    return float(timeout)


class Subscription:
    """A live subscription to an order's events; :meth:`close` ends it.

    The callback runs in the subscription's own thread, once per event, in seq order.
    Usable as a context manager.
    """

    def __init__(self, desk: DeskWaiting, order_id: str, callback: Callable[[Event], object],
                 after: int) -> None:
        self._desk = desk
        self._order_id = order_id
        self._callback = callback
        self._after = after
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"awl-follow-{order_id}",
                                        daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        """Whether the subscription has ended."""
        return self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._desk.wait(self._order_id, self._after, timeout=0.5,
                                         _stop=self._stop)
            except AWLError as exc:
                log.warning("subscription to %s ended: %s", self._order_id, exc)
                self._stop.set()
                return
            for event in events:
                if self._stop.is_set():
                    return
                self._after = event.seq
                try:
                    self._callback(event)
                except Exception as exc:  # a subscriber's bug must not stop the others'
                    log.error("subscriber of %s failed on event %d: %s: %s", self._order_id,
                              event.seq, type(exc).__name__, " ".join(str(exc).split())[:300],
                              exc_info=debugging())

    def close(self) -> None:
        """Stop delivering events (waits for a callback in progress, unless called from it)."""
        self._stop.set()
        self._desk._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    __call__ = close

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DeskWaiting(DeskQueries):
    """Waiting for an order's next events: :meth:`wait`, :meth:`follow`, :meth:`subscribe`.

    Writes through the same desk wake the waiters at once; writes by other processes wake
    them at once too when the store has :class:`~awl.store.protocol.Subscriptions`, and are
    found by polling the store with a short, growing pause otherwise.
    """

    def wait(self, order_id: str, after: int = 0, timeout: float = 30.0, *,
             _stop: threading.Event | None = None) -> builtins.list[Event]:
        """Wait until the order has events after ``after``, at most ``timeout`` seconds.

        Returns the new events, or an empty list when the time ran out. Writes through this
        desk wake the wait at once; writes by other processes wake it at once too when the
        store has :class:`~awl.store.protocol.Subscriptions`, and are found by polling the
        store with a short, growing pause otherwise. When the deadline passes during the
        wait, the order is expired and the expire event is returned.

        Raises:
            NotFound: no such order.
        """
        after = check_integer(after, name="after")
        end = time.monotonic() + max(0.0, check_timeout(timeout))
        pause = self._poll
        while True:
            with self._changed:
                seen = self._generation
            view = self.get(order_id)
            if view.seq > after:
                return self.store.events(order_id, after=after)
            remaining = end - time.monotonic()
            if remaining <= 0 or (_stop is not None and _stop.is_set()):
                return []
            # A store that hears every writer is waited on rather than polled (in slices a
            # stop can interrupt, when there is one).
            store = self.store if isinstance(self.store, Subscriptions) else None
            nap = min(pause if store is None or _stop is not None else remaining, remaining)
            if view.active:
                to_deadline = (parse_time(view.order.deadline) - self.now()).total_seconds()
                nap = min(nap, max(to_deadline, 0.0) + 0.001)
            if store is not None:
                store.wait_for_events(order_id, after, nap)
            else:
                with self._changed:
                    if self._generation == seen:
                        self._changed.wait(nap)
            pause = min(pause * 2, self._max_poll)

    def follow(self, order_id: str, after: int = 0, *, timeout: float | None = None,
               until_terminal: bool = True) -> Iterator[Event]:
        """Yield the order's events after ``after`` as they come.

        Stops once the order is terminal (when ``until_terminal``) or when ``timeout``
        seconds have passed without the order ending (None: no limit).
        """
        for slice_ in follow_slices(timeout):
            for event in self.wait(order_id, after, timeout=slice_):
                after = event.seq
                yield event
            if until_terminal and self.get(order_id).state in TERMINAL:
                # Events written right after the terminal one (the desk's drop) come here.
                yield from self.store.events(order_id, after=after)
                return

    def subscribe(self, order_id: str, callback: Callable[[Event], object], *,
                  after: int | None = None) -> Subscription:
        """Call ``callback`` with each new event of the order, in order, until closed.

        Args:
            order_id: the order to follow.
            callback: receives each :class:`~awl.Event`, in the subscription's thread.
            after: deliver events after this seq (default: only events from now on).

        Returns:
            The subscription; call :meth:`Subscription.close` (or the subscription itself)
            to unsubscribe.

        Raises:
            NotFound: no such order.
        """
        start = self.get(order_id).seq if after is None else after
        return Subscription(self, order_id, callback, start)
