"""The desk for async code: each operation of :class:`~awl.desk.desk.Desk` as a coroutine.

The coroutines are made from the desk's own methods by :class:`_InThread`, which runs the
method in a worker thread so the event loop is never blocked on the store; each takes
exactly the method's arguments and returns what it returns, for type checkers too. Only
the waits are written out here: they wait on the event loop without holding a thread.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import datetime
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast, overload

import anyio
import anyio.to_thread

from awl.desk.core import Clock
from awl.desk.desk import Desk
from awl.desk.waiting import Subscription, check_timeout, follow_slices
from awl.documents.lifecycle import TERMINAL
from awl.documents.limits import check_integer
from awl.documents.models import Event, parse_time
from awl.store.protocol import Store

__all__ = ["AsyncDesk"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class _InThread(Generic[_P, _T]):
    """A :class:`Desk` method as a coroutine method of :class:`AsyncDesk`.

    Args:
        method: the desk's method (``Desk.get``); the attribute must have its name.
        wakes: whether the method may write (expiring an order counts): this object's async
            waiters are then woken after it, whatever happened.
    """

    def __init__(self, method: Callable[Concatenate[Desk, _P], _T], *,
                 wakes: bool = True) -> None:
        self.method = method
        self.wakes = wakes
        self.__doc__ = method.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.method.__name__:
            raise TypeError(f"{owner.__name__}.{name} would run Desk.{self.method.__name__}")

    @overload
    def __get__(self, obj: None, owner: type) -> _InThread[_P, _T]: ...
    @overload
    def __get__(self, obj: AsyncDesk, owner: type) -> Callable[_P, Coroutine[Any, Any, _T]]: ...
    def __get__(self, obj: AsyncDesk | None, owner: type
                ) -> _InThread[_P, _T] | Callable[_P, Coroutine[Any, Any, _T]]:
        if obj is None:
            return self
        bound = cast(Callable[_P, _T], getattr(obj.desk, self.method.__name__))
        call = obj.run_write if self.wakes else obj.run

        @functools.wraps(bound)
        async def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
            return await call(bound, *args, **kwargs)

        return run


class AsyncDesk:
    """The desk for async code: every operation runs in a worker thread.

    Takes the same arguments as :class:`Desk` (or wraps an existing one with
    ``AsyncDesk.of(desk)``). :meth:`wait` and :meth:`follow` wait without holding a thread:
    writes made through this object wake them at once; others are found by polling.
    """

    def __init__(self, store: Store | None = None, *, clock: Clock | None = None,
                 conflict_retries: int = 1, poll_interval: float = 0.02,
                 max_poll_interval: float = 0.25, desk: Desk | None = None) -> None:
        self.desk = desk or Desk(store, clock=clock, conflict_retries=conflict_retries,
                                 poll_interval=poll_interval,
                                 max_poll_interval=max_poll_interval)
        self._bump: anyio.Event | None = None

    @classmethod
    def of(cls, desk: Desk) -> AsyncDesk:
        """An async face for an existing desk (both share the store and the wake-ups)."""
        return cls(desk=desk)

    @property
    def store(self) -> Store:
        """The underlying store."""
        return self.desk.store

    async def run(self, func: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``func(*args, **kwargs)`` in a worker thread: how async code reads the store (or
        runs anything else that blocks on it) without blocking the event loop."""
        return await anyio.to_thread.run_sync(functools.partial(func, *args, **kwargs))

    async def run_write(self, func: Callable[_P, _T], *args: _P.args,
                        **kwargs: _P.kwargs) -> _T:
        """:meth:`run` for a function that may write to the store: this object's waiters
        (:meth:`wait`, :meth:`follow`) are woken after it, whether it returned or raised."""
        try:
            return await self.run(func, *args, **kwargs)
        finally:
            # Wake this object's async waiters, whatever happened (an expiry may have been
            # written before a refusal).
            bump, self._bump = self._bump, None
            if bump is not None:
                bump.set()

    # Every operation of the desk but the waits, run in a worker thread. A test checks that
    # each public method of Desk is here.
    get = _InThread(Desk.get)
    list = _InThread(Desk.list)
    events = _InThread(Desk.events)
    calls = _InThread(Desk.calls)
    questions = _InThread(Desk.questions)
    track = _InThread(Desk.track, wakes=False)
    handoff = _InThread(Desk.handoff)
    expire_overdue = _InThread(Desk.expire_overdue)
    workspace = _InThread(Desk.workspace, wakes=False)
    check_results = _InThread(Desk.check_results, wakes=False)
    open_questions = _InThread(Desk.open_questions, wakes=False)
    create = _InThread(Desk.create)
    accept = _InThread(Desk.accept)
    decline = _InThread(Desk.decline)
    start = _InThread(Desk.start)
    run_checks = _InThread(Desk.run_checks)
    progress = _InThread(Desk.progress)
    record = _InThread(Desk.record)
    report = _InThread(Desk.report)
    answer = _InThread(Desk.answer)
    review = _InThread(Desk.review)
    cancel = _InThread(Desk.cancel)
    add_webhook = _InThread(Desk.add_webhook, wakes=False)
    webhooks = _InThread(Desk.webhooks, wakes=False)
    remove_webhook = _InThread(Desk.remove_webhook, wakes=False)
    notifications = _InThread(Desk.notifications, wakes=False)

    def now(self) -> datetime:
        """The desk's current time (no thread: the clock does not wait)."""
        return self.desk.now()

    async def wait(self, order_id: str, after: int = 0,
                   timeout: float = 30.0) -> builtins.list[Event]:
        """See :meth:`Desk.wait`; waits without holding a worker thread."""
        after = check_integer(after, name="after")
        with anyio.move_on_after(max(0.0, check_timeout(timeout))):
            pause = self.desk._poll
            while True:
                if self._bump is None:
                    self._bump = anyio.Event()
                bump = self._bump  # taken before reading, so no wake-up is lost
                # Read without run_write: bumping our own event here would wake this very loop
                # at once and turn the wait into a busy loop. A read that expires the order
                # raises seq, so this waiter returns anyway.
                view = await self.run(self.desk.get, order_id)
                if view.seq > after:
                    return await self.run(self.desk.store.events, order_id, after)
                nap = pause
                if view.active:
                    left = (parse_time(view.order.deadline) - self.desk.now()).total_seconds()
                    nap = min(nap, max(left, 0.0) + 0.001)
                with anyio.move_on_after(nap):
                    await bump.wait()
                pause = min(pause * 2, self.desk._max_poll)
        return []

    async def follow(self, order_id: str, after: int = 0, *, timeout: float | None = None,
                     until_terminal: bool = True) -> AsyncIterator[Event]:
        """See :meth:`Desk.follow`."""
        for slice_ in follow_slices(timeout):
            for event in await self.wait(order_id, after, timeout=slice_):
                after = event.seq
                yield event
            if until_terminal and (await self.get(order_id)).state in TERMINAL:
                for event in await self.run(self.desk.store.events, order_id, after):
                    yield event
                return

    def subscribe(self, order_id: str, callback: Callable[[Event], object], *,
                  after: int | None = None) -> Subscription:
        """See :meth:`Desk.subscribe` (the callback runs in the subscription's thread)."""
        return self.desk.subscribe(order_id, callback, after=after)
