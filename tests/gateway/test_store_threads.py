"""The threads offloaded store work runs in (GW-20): answers, errors and context reach the
waiting call, a job that blocks delays no other, and the bound holds."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from gateway._store_threads import StoreThreads

pytestmark = pytest.mark.anyio

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


async def test_the_caller_gets_the_result_the_error_and_its_own_context() -> None:
    threads = StoreThreads(limit=2)
    try:
        WHO.set("the caller")
        assert await threads.run(lambda a, b: (a + b, WHO.get(), threading.current_thread()
                                               is threading.main_thread()), 2, 3) == (
            5, "the caller", False)

        def fail() -> None:
            raise KeyError("no such call")

        with pytest.raises(KeyError, match="no such call"):
            await threads.run(fail)
        # The thread that raised serves the next call; no other was started.
        assert await threads.run(lambda: 7) == 7
        assert len(threads._threads) == 1
    finally:
        threads.join()


async def test_a_blocked_job_delays_no_other_and_the_bound_holds() -> None:
    threads = StoreThreads(limit=2)
    release = threading.Event()
    try:
        first = threads.run(release.wait, 30)
        # The first job holds its thread: a second one starts and answers at once.
        assert await asyncio.wait_for(threads.run(lambda: "second"), 10) == "second"
        assert len(threads._threads) == 2
        second = threads.run(release.wait, 30)
        # Both threads are busy and the bound is reached: a third job waits in the queue.
        third = threads.run(lambda: "third")
        await asyncio.sleep(0.2)
        assert not third.done() and len(threads._threads) == 2
        release.set()
        assert list(await asyncio.wait_for(asyncio.gather(first, second, third), 10)) == [
            True, True, "third"]
        # With both threads free again, a burst of jobs needs no third thread.
        assert await asyncio.gather(*(threads.run(lambda i=i: i) for i in range(20))) == list(
            range(20))
        assert len(threads._threads) == 2
    finally:
        release.set()
        threads.join()


async def test_a_result_nobody_waits_for_is_dropped() -> None:
    """A call cancelled while its store work ran does not make the work's answer fail."""
    threads = StoreThreads(limit=1)
    release = threading.Event()
    try:
        waiting = threads.run(release.wait, 30)
        waiting.cancel()
        release.set()
        assert await asyncio.wait_for(threads.run(lambda: "next"), 10) == "next"
    finally:
        threads.join()


def test_join_runs_what_was_queued_then_stops_every_thread() -> None:
    threads = StoreThreads(limit=2)
    done: list[int] = []

    async def queue_work() -> None:
        futures = [threads.run(done.append, i) for i in range(5)]
        await asyncio.gather(*futures)

    asyncio.run(queue_work())
    started = list(threads._threads)
    threads.join()
    assert sorted(done) == list(range(5))
    assert started and not any(thread.is_alive() for thread in started)
