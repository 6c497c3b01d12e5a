"""Where the gateway's extra CPU per call goes, in microseconds, inside its own call loop.

``python -m bench.steps [--quick] [--calls N] [--store sqlite,postgres] [--postgres-url URL]``

One process per store runs a gateway for a working order in front of the outbox server (a
subprocess, not counted) and takes turns, in rounds, between the pool's call (the upstream
call the bare proxy makes: the floor) and :meth:`gateway.Gateway.call`. The process's CPU
time over each kind of call gives its cost per call; the difference is the gateway's extra
work. Around each call the CPU time of the store's two writes (``reserve_call`` and
``finish_call`` on that store object, in whichever thread runs them; a PostgreSQL server's
own work is in neither figure) is taken, so the extra splits into:

- **store writes in the loop**: the reservation and the outcome, as the gateway pays them;
- **store's other threads**: CPU of the process's other threads beyond those writes (the
  SQLite store's checkpointer; a PostgreSQL store's worker threads);
- **garbage collection**: the collector's passes beyond the pool call's (the in-memory
  store keeps every call record, so its passes grow with them);
- **gateway's own work**: the rest of the extra (checks, decisions, evidence, meta, and
  handing store work to a thread and back);
- **store writes alone**: the same two writes in a tight loop of their own, a fresh order
  on the same store, for comparison: code run between upstream round trips (the process
  sleeping, its caches taken by the upstream and the client) costs several times what the
  same code costs run back to back, and that is the cost every call pays.

The worker's side of the connection (reading the request, writing the answer) is in
neither call, so these ratios are larger than :mod:`bench.gateway`'s, which judges whole
processes.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from bench.stores import Stores, add_options, columns, ratio

ROUNDS = 30
"""Turns each kind of call takes; the calls are split evenly between them."""


@dataclass(frozen=True)
class Steps:
    """One store's microseconds per call."""

    store: str
    pool_us: float
    gateway_us: float
    writes_us: float
    """The store's reservation and outcome, timed inside the gateway's calls."""
    background_us: float
    """Other threads' CPU beyond the writes: the SQLite checkpointer, the hand-offs to and
    from store threads."""
    collecting_us: float
    """The garbage collector's passes, beyond the pool call's."""
    alone_us: float
    """The same two writes, one call after another with nothing between them."""

    @property
    def extra_us(self) -> float:
        return self.gateway_us - self.pool_us

    @property
    def own_us(self) -> float:
        return self.extra_us - self.writes_us - self.background_us - self.collecting_us


class _Timed:
    """Wraps one store object's ``reserve_call`` and ``finish_call`` with a CPU timer, kept
    apart for the main thread (a store on the event loop) and any other (a store thread)."""

    def __init__(self, store: Any) -> None:
        self.main = threading.get_ident()
        self.on_main = 0.0
        self.elsewhere = 0.0
        for name in ("reserve_call", "finish_call"):
            setattr(store, name, self._timing(getattr(store, name)))

    def _timing(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                if threading.get_ident() == self.main:
                    self.on_main += spent
                else:
                    self.elsewhere += spent

        return timed


@dataclass
class _Clock:
    """CPU seconds one kind of call took: the whole process's, its main thread's, and the
    garbage collector's (in whichever thread it ran)."""

    process: float = 0.0
    main: float = 0.0
    collecting: float = 0.0
    _started: float = 0.0

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.collecting += time.thread_time() - self._started

    @contextmanager
    def running(self) -> Iterator[None]:
        process, main = time.process_time(), time.thread_time()
        gc.callbacks.append(self._collected)
        try:
            yield
        finally:
            gc.callbacks.remove(self._collected)
            self.process += time.process_time() - process
            self.main += time.thread_time() - main


def _alone(store: Any, calls: int) -> float:
    """Seconds per reservation and outcome, run back to back on a fresh order of ``store``."""
    from awl.documents.models import format_time, utc_now
    from bench.gateway import new_working_order

    order_id = new_working_order(store, calls * 2)
    seq = store.load(order_id).seq
    result = {"content": [{"type": "text", "text": "a note"}], "isError": False}
    total = 0.0
    for i in range(calls + 20):
        start = time.thread_time()
        reserved = store.reserve_call(
            order_id, attempt=1, tool="notes/get_note", arguments={"id": "n1"}, pass_jti=None,
            usd=0.0, started_at=format_time(utc_now()), scopes=[], seq=seq)
        store.finish_call(order_id, reserved.ref, outcome="ok", result=result, error=None,
                          ended_at=format_time(utc_now()))
        if i >= 20:  # the first ones warm the store's caches
            total += time.thread_time() - start
    return total / calls


async def _measure(name: str, store: Any, calls: int) -> Steps:
    from bench.gateway import new_working_order, outbox_config
    from gateway import open_gateway

    with tempfile.TemporaryDirectory(prefix="awl-steps-") as tmp:
        config = outbox_config(Path(tmp))
        order_id = new_working_order(store, calls * 3 + 100)
        async with open_gateway(order_id, str(config), store=store) as gw:
            await gw.pool.tools()
            for _ in range(max(calls // 10, 20)):
                await gw.call("notes__get_note", {"id": "n1"})
            timer = _Timed(store)
            pool, through = _Clock(), _Clock()
            per_round = max(calls // ROUNDS, 1)
            for _ in range(ROUNDS):
                with pool.running():
                    for _ in range(per_round):
                        await gw.pool.call("notes", "get_note", {"id": "n1"}, meta=None)
                with through.running():
                    for _ in range(per_round):
                        answer = await gw.call("notes__get_note", {"id": "n1"})
                        if getattr(answer, "is_error", True):
                            raise SystemExit(f"bench.steps: the gateway did not answer the "
                                             f"call with its result: {answer}")
            del store.reserve_call, store.finish_call  # the class's own methods again
    done = per_round * ROUNDS

    def us(seconds: float) -> float:
        return seconds / done * 1e6

    others = (through.process - through.main) - (pool.process - pool.main)
    return Steps(name, us(pool.process), us(through.process),
                 us(timer.on_main + timer.elsewhere), us(others - timer.elsewhere),
                 us(through.collecting - pool.collecting), _alone(store, done) * 1e6)


@contextmanager
def _opened(name: str, stores: Stores, folder: Path) -> Iterator[Any]:
    """A fresh store ``name``, set up as ``awl gateway`` sets up its own (SQLite with the
    background checkpointer, GW-18)."""
    from awl.store.memory import MemoryStore
    from awl.store.sqlite import SQLiteStore
    from awl.store.urls import open_store
    from gateway import CHECKPOINT_SECONDS

    if name == "memory":
        yield MemoryStore()
        return
    with stores.fresh(name, folder, "steps") as url, closing(
            SQLiteStore(url, checkpoint_every=CHECKPOINT_SECONDS) if name == "sqlite"
            else open_store(url)) as store:
        yield store


def measure(stores: Stores, calls: int) -> list[Steps]:
    """The in-memory store's steps, then each of ``stores``'."""
    found = []
    with tempfile.TemporaryDirectory(prefix="awl-steps-") as tmp:
        for name in ("memory", *stores.names):
            with _opened(name, stores, Path(tmp) / name) as store:
                found.append(anyio.run(_measure, name, store, calls))
    return found


def report(steps: list[Steps]) -> str:
    """The table: a measure per line, a column per store."""
    def us(value: float) -> str:
        return f"{round(value)} us"  # round(): never "-0 us"

    rows = [
        ("pool call (the floor)", [us(s.pool_us) for s in steps]),
        ("gateway call", [us(s.gateway_us) for s in steps]),
        ("extra over the pool call", [f"{us(s.extra_us)} ({ratio(s.gateway_us, s.pool_us)})"
                                      for s in steps]),
        ("  store writes in the loop", [us(s.writes_us) for s in steps]),
        ("  store's other threads", [us(s.background_us) for s in steps]),
        ("  garbage collection", [us(s.collecting_us) for s in steps]),
        ("  gateway's own work", [us(s.own_us) for s in steps]),
        ("store writes alone", [us(s.alone_us) for s in steps]),
        ("in the loop over alone", [ratio(s.writes_us, s.alone_us) for s in steps]),
    ]
    return columns(rows, [s.store for s in steps])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 calls of each kind")
    parser.add_argument("--calls", type=int, default=None,
                        help="calls of each kind (default 3000)")
    add_options(parser)
    args = parser.parse_args(argv)
    calls = args.calls if args.calls is not None else 300 if args.quick else 3000
    if calls < ROUNDS:
        parser.error(f"--calls must be at least {ROUNDS}")
    stores = Stores.of(parser, args)
    print(f"Gateway steps: CPU per call in one process, {calls} calls of each kind")
    print(report(measure(stores, calls)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
