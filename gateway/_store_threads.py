"""The threads a gateway hands its per-call store work to when the store must not run on
the event loop (PostgreSQL, GW-20).

A call hands its work over twice (the reservation, then the outcome), so the hand-off is
kept to one queue put and one ``call_soon_threadsafe``: no ``concurrent.futures.Future``
chained to an asyncio one as ``run_in_executor`` makes, which costs about twice the CPU a
hand-off (``bench.steps`` shows the difference per call). Threads start when every
started one is busy, up to a bound, so a call waiting for the server or for another
gateway's row lock delays no other call; they are kept for the process's life and joined
at its exit, once what they were given is done.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import queue
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

_T = TypeVar("_T")

STORE_THREADS = 16
"""Threads the gateways of one process share for store work they do not run on their loop."""

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context,
             Callable[..., Any], tuple[Any, ...]]


def _deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Set ``future`` on its loop, unless whoever waited for it has gone."""
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


class StoreThreads:
    """Up to ``limit`` threads taking blocking work from one queue; see the module text."""

    def __init__(self, limit: int = STORE_THREADS, name: str = "awl-store") -> None:
        self._limit = limit
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # started threads free for a job, less the jobs waiting for one

    def run(self, func: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """Run ``func(*args)`` in a thread, in a copy of the caller's context; the future
        (of the running loop) holds what it returned or raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        with self._lock:
            self._idle -= 1  # a free thread takes this job, or it waits for one
            if self._idle < 0 and len(self._threads) < self._limit:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
                self._idle += 1  # the new thread takes it
        self._jobs.put((loop, future, contextvars.copy_context(), func, args))
        return future

    def _work(self) -> None:
        jobs, lock = self._jobs, self._lock
        while True:
            job = jobs.get()
            if job is None:
                return
            loop, future, context, func, args = job
            del job
            result: Any = None
            error: BaseException | None = None
            try:
                result = context.run(func, *args)
            except BaseException as exc:  # handed to the caller, whatever it is
                error = exc
            # Free before the caller hears: its next job, handed over the moment it is
            # answered, finds this thread free rather than starting another.
            with lock:
                self._idle += 1
            with suppress(RuntimeError):  # the loop has closed: nobody waits any more
                loop.call_soon_threadsafe(_deliver, future, result, error)
            del loop, future, context, func, args, result, error

    def join(self) -> None:
        """Stop every thread once the work queued before has run, and wait for them."""
        with self._lock:
            threads, self._threads, self._idle = self._threads, [], 0
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            thread.join()


_shared: list[StoreThreads] = []
_shared_guard = threading.Lock()


def store_threads() -> StoreThreads:
    """The process's store threads, made on first use and joined at exit."""
    with _shared_guard:
        if not _shared:
            _shared.append(StoreThreads())
            atexit.register(_shared[0].join)
        return _shared[0]
