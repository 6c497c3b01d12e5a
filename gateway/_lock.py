"""A named lock in the desk's store with a holder, a lease, and safe takeover.

One process at a time commits an order's effects. The lock lives in the store (so it works
across processes and, for a shared database, across hosts) and records who holds it: a
random holder id, the process id, the host name, when the process started, and a lease
(seconds since the epoch) that the holder renews while it works.

A lock is stale, and the next taker replaces it without any manual step, when

- its lease has run out (the holder stopped renewing: it is gone, hung, or on a host we
  cannot inspect), or
- it was taken on this host and the holder's process no longer exists: ``os.kill(pid, 0)``
  finds no such process, the process is a zombie (killed, not yet reaped), or the pid now
  belongs to a process that started at another moment (the pid was reused).

A takeover is :meth:`Store.acquire_lock` with ``replace=`` the exact stale record, a
compare-and-set: when two processes take over the same stale lock, one wins. Renewal is
the same compare-and-set against the holder's own last record, so a holder that was taken
over learns it on its next renewal and stops (:attr:`OrderLock.lost`); before each send the
committer asks the store whether the lock is still its own (:meth:`OrderLock.check`).

The lock does not by itself make an effect run at most once; the write-ahead marks do
(see :mod:`gateway._commit`). The lock keeps committers from racing each other, and it is
what lets a committer conclude that a ``dispatching`` mark it finds belongs to one that is
gone.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from dataclasses import replace
from types import TracebackType

import anyio

from awl.documents import AWLError, Conflict, StoreUnavailable
from awl.store import FreedLocks, LockInfo, Store

EXIT_LOCKED = 3
"""The exit code of ``awl gateway --commit`` and ``awl effects retry`` when another live
committer holds the order's lock: nothing was sent (CM-10)."""


class LockBusy(Conflict):
    """Someone alive holds the lock and did not let go in time; nothing was done."""

DEFAULT_LEASE = 30.0
"""Seconds a lock stays valid without renewal; the holder renews it every third of that."""

HOST = socket.gethostname()


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (Linux), else None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields after the last
    # ")" are fixed: state is the first of them, starttime the 20th.
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] in ("Z", "X")


def holder_alive(info: LockInfo) -> bool | None:
    """Whether the lock's holder process still runs: None when it is on another host."""
    if info.host != HOST:
        return None
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    if _zombie(info.pid):
        return False
    started = info.data.get("started")
    return not (started is not None and process_start(info.pid) not in (None, started))


def is_stale(info: LockInfo, *, at: float | None = None) -> bool:
    """Whether ``info`` may be taken over: its lease ran out or its holder is gone."""
    now = time.time() if at is None else at
    return info.lease_until <= now or holder_alive(info) is False


def describe(info: LockInfo) -> str:
    """The holder of a lock in words, for error messages."""
    left = info.lease_until - time.time()
    return (f"pid {info.pid} on {info.host} (holder {info.holder[:8]}, lease "
            f"{'ran out' if left <= 0 else f'{left:.0f} s left'})")


class LockLost(AWLError):
    """The lock was taken over (or could not be renewed) while we held it."""


class OrderLock:
    """Hold a named store lock for the length of an ``async with`` block.

    Entering takes the lock (taking over a stale one) or raises :class:`awl.Conflict`
    after ``wait`` seconds; while held, a background task renews the lease every third of
    ``lease``. :meth:`check` raises :class:`LockLost` if the lock is no longer ours or its
    lease is nearly spent, which the committer calls before every write-ahead mark.

    Args:
        store: Where the lock lives.
        name: The lock's name, for example ``commit:wo_1``.
        lease: Seconds the lease lasts without renewal.
        wait: Seconds to wait for a live holder to finish before giving up.
        purpose: Recorded with the lock, for people reading it.
    """

    def __init__(self, store: Store, name: str, *, lease: float = DEFAULT_LEASE,
                 wait: float = 0.0, purpose: str = "") -> None:
        self.store = store
        self.name = name
        self.lease = lease
        self.wait = wait
        self.purpose = purpose
        self.holder = uuid.uuid4().hex
        self.info: LockInfo | None = None
        self.took_over: LockInfo | None = None
        """The stale record this lock replaced, if it was a takeover (or, in a store that
        frees a dead holder's lock itself, the record that holder left)."""
        self.lost = False
        self._tg: anyio.abc.TaskGroup | None = None

    def _fresh(self) -> LockInfo:
        data: dict[str, object] = {"purpose": self.purpose}
        started = process_start(os.getpid())
        if started is not None:
            data["started"] = started
        return LockInfo(name=self.name, holder=self.holder, pid=os.getpid(), host=HOST,
                        lease_until=time.time() + self.lease, data=data)

    def try_acquire(self) -> bool:
        """One attempt to take the lock, taking over a stale holder. No waiting."""
        mine = self._fresh()
        if self.store.acquire_lock(mine):
            self.info = mine
            self.took_over = self._freed()
            return True
        current = self.store.get_lock(self.name)
        if current is None:
            if self.store.acquire_lock(mine):  # released between our two reads
                self.info = mine
                self.took_over = self._freed()
                return True
            return False
        if is_stale(current) and self.store.acquire_lock(mine, replace=current):
            self.info = mine
            self.took_over = current
            return True
        return False

    def _freed(self) -> LockInfo | None:
        """The dead holder a store that frees its lock itself found when we took it."""
        store = self.store
        return store.freed_lock(self.name, self.holder) if isinstance(store, FreedLocks) else None

    async def acquire(self) -> None:
        """Take the lock, waiting up to ``wait`` seconds for a live holder.

        Raises:
            LockBusy: Someone alive holds the lock and did not let go in time.
        """
        deadline = time.monotonic() + self.wait
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                current = self.store.get_lock(self.name)
                who = describe(current) if current is not None else "another process"
                raise LockBusy(
                    f"lock {self.name} is held by {who}; nothing was sent: wait for it to "
                    "finish, or run again once its lease runs out")
            await anyio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def renew(self) -> bool:
        """Extend the lease; False (and :attr:`lost`) if the lock is no longer ours."""
        if self.info is None or self.lost:
            return False
        new = replace(self.info, lease_until=time.time() + self.lease)
        if self.store.acquire_lock(new, replace=self.info):
            self.info = new
            return True
        self.lost = True
        return False

    def check(self) -> None:
        """Raise :class:`LockLost` unless the store still says the lock is ours, with a
        third of its lease left.

        The store is asked every time (one read): a holder taken over by someone else
        (after its lease ran out, or, in PostgreSQL, once the server ended its lock's
        connection) learns it before its next send, not at its next renewal."""
        if self.info is None or self.lost:
            raise LockLost(self.name)
        if self.store.get_lock(self.name) != self.info:
            self.lost = True
            raise LockLost(self.name)
        if self.info.lease_until - time.time() < self.lease / 3 and not self.renew():
            raise LockLost(self.name)

    def release(self) -> None:
        """Let go of the lock if we still hold it.

        A desk that cannot be written just now (busy past its timeout, a database gone)
        keeps the lock: it is freed when our process is gone or our lease runs out. That is
        no reason to fail what ran under it, whose outcomes are already recorded."""
        if self.info is not None and not self.lost:
            with contextlib.suppress(Conflict, StoreUnavailable, OSError):
                self.store.release_lock(self.name, self.holder)
        self.info = None

    async def _renew_forever(self) -> None:
        while not self.lost:
            await anyio.sleep(self.lease / 3)
            try:
                self.renew()
            except Exception:
                # A store that cannot be written cannot vouch for our lease either; stop
                # committing rather than risk running past it.
                self.lost = True

    async def __aenter__(self) -> OrderLock:
        await self.acquire()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._renew_forever)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        self._tg = None
        self.release()
