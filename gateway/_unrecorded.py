"""Outcomes of forwarded calls that the store could not take when they ended (GW-7).

A call that was forwarded may have run, whatever happens to the store after: its outcome
is never dropped and the worker is never told that nothing was written. When
:meth:`~awl.Store.finish_call` fails for the store's sake (the server down or restarting,
its pool exhausted), the gateway keeps the outcome here, says so in one line naming the
ref, and a thread of its own writes the kept outcomes, oldest first, as soon as the store
takes them again. What is kept is bounded (:data:`MAX_KEPT` outcomes, :data:`MAX_KEPT_BYTES`
of results): past either bound the oldest is given up, in one line naming its ref; its
record stays ``pending``, which the desk reads as "may have run" once it is stale
(:data:`awl.store.STALE_PENDING_SECONDS`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from awl.documents import AWLError, Conflict, NotFound
from awl.store import Store

__all__ = ["MAX_KEPT", "MAX_KEPT_BYTES", "Unrecorded", "one_line"]

log = logging.getLogger("awl.gateway")

MAX_KEPT = 1000
"""The most outcomes one gateway keeps while its store is away."""
MAX_KEPT_BYTES = 64 * 1024 * 1024
"""The most bytes of results (as JSON) one gateway keeps while its store is away."""
RETRY_SECONDS = 1.0
"""How long the writer waits between tries while the store refuses."""


@dataclass(frozen=True, slots=True)
class _Kept:
    outcome: str
    result: dict[str, Any] | None
    error: str | None
    ended_at: str
    size: int


class Unrecorded:
    """The outcomes one gateway's order could not record yet, and the thread writing them."""

    def __init__(self, store: Store, order_id: str) -> None:
        self._store = store
        self._order_id = order_id
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        self._closed = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

    def refs(self) -> list[str]:
        """The refs whose outcomes are kept, oldest first."""
        with self._lock:
            return list(self._kept)

    def keep(self, ref: str, *, outcome: str, result: dict[str, Any] | None,
             error: str | None, ended_at: str, why: str) -> None:
        """Keep the outcome of ``ref`` until the store takes it (``why``: the store's error)."""
        size = len(json.dumps(result)) if result is not None else 0
        given_up: list[str] = []
        with self._lock:
            self._kept[ref] = _Kept(outcome, result, error, ended_at, size)
            self._bytes += size
            while len(self._kept) > MAX_KEPT or (self._bytes > MAX_KEPT_BYTES
                                                 and len(self._kept) > 1):
                old_ref, old = self._kept.popitem(last=False)
                self._bytes -= old.size
                given_up.append(old_ref)
            count = len(self._kept)
            if self._writer is None and not self._closed:
                self._writer = threading.Thread(target=self._write_all, daemon=True,
                                                name=f"awl-unrecorded-{self._order_id}")
                self._writer.start()
        self._wake.set()
        log.warning("awl gateway: the outcome of call %s could not be recorded (%s); kept in "
                    "this gateway (%d kept) and written as soon as the store is back",
                    ref, one_line(why), count)
        for old_ref in given_up:
            log.error("awl gateway: gave up the kept outcome of call %s (more than %d "
                      "outcomes or %d MiB kept); its record stays pending, read as may have "
                      "run", old_ref, MAX_KEPT, MAX_KEPT_BYTES // (1024 * 1024))

    def _write_all(self) -> None:
        while True:
            with self._lock:
                if not self._kept:
                    self._writer = None
                    return
                ref, kept = next(iter(self._kept.items()))
            if self._write(ref, kept):
                with self._lock:
                    if self._kept.get(ref) is kept:
                        del self._kept[ref]
                        self._bytes -= kept.size
                continue
            if self._closed:
                with self._lock:
                    self._writer = None
                return
            self._wake.clear()
            self._wake.wait(RETRY_SECONDS)

    def _write(self, ref: str, kept: _Kept) -> bool:
        """Try to record one outcome: True once it needs no more tries."""
        try:
            self._store.finish_call(self._order_id, ref, outcome=kept.outcome,
                                    result=kept.result, error=kept.error,
                                    ended_at=kept.ended_at)
        except (NotFound, Conflict) as exc:
            if isinstance(exc, Conflict) and "already has outcome" not in exc.message:
                return False  # the store was busy: try again
            # Set meanwhile (the desk marked it may-have-run), or gone: nothing to add.
            log.warning("awl gateway: the kept outcome of call %s was not written: %s",
                        ref, one_line(exc.message))
            return True
        except AWLError:
            return False
        except Exception as exc:  # a driver's own error: the store is still away
            log.debug("kept outcome of %s not written yet: %s", ref, exc)
            return False
        log.warning("awl gateway: the kept outcome of call %s is recorded now", ref)
        return True

    def close(self, wait: float = 2.0) -> None:
        """Try the kept outcomes once more for up to ``wait`` seconds; name in one line the
        refs still unrecorded (their records stay pending)."""
        self._closed = True
        self._wake.set()
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with self._lock:
                writer = self._writer
            if writer is None:
                break
            writer.join(max(0.0, deadline - time.monotonic()))
        left = self.refs()
        if left:
            log.error("awl gateway: stopped with %d outcomes never recorded (%s); those calls "
                      "may have run and stay pending in the store", len(left),
                      ", ".join(left[:10]) + (", ..." if len(left) > 10 else ""))


def one_line(text: str) -> str:
    """``text`` on one line (its white space runs made one space), at most 300 characters."""
    return " ".join(text.split())[:300]
