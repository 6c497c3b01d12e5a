"""A bound on the requests a stdio client may have in flight (GW-21).

The MCP SDK's server reads every request as it arrives and handles each in a task of its
own; the task holds its answer until the answer is written. A client that keeps sending and
never reads its answers (stdout full, so nothing more can be written) would make those tasks,
and the server's memory, grow without bound: 20,000 ``tools/list`` requests held 630 MB of
a gateway.

:func:`~awl.mcp.frames.stdio_frames` counts with an :class:`InFlightGate`: once
:data:`MAX_IN_FLIGHT` requests have been read and not yet answered, the next request is
held, and nothing more is read from the client until an answer has gone out (or the client
cancelled one of them): the client's own writes then block, as a pipe's do. A client that
reads its answers is held back only while that many of its requests are being worked on at
once (and then whatever it sent after the held request, answers to the server's own
questions included, waits too, until an answer goes out: at worst until the calls in flight
time out). What is counted: each request read (by its id, a duplicate id counts again), less
each answer written and each ``notifications/cancelled`` the client sends for one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio

__all__ = ["MAX_IN_FLIGHT", "InFlightGate"]

MAX_IN_FLIGHT = 256
"""Requests of one stdio client a server reads ahead of the answers it has written."""


class InFlightGate:
    """The client's requests read and not yet answered, by id."""

    def __init__(self, limit: int = MAX_IN_FLIGHT) -> None:
        self.limit = limit
        self._ids: Counter[str | int] = Counter()
        self._count = 0
        self._freed = anyio.Event()

    @property
    def count(self) -> int:
        """How many requests are in flight."""
        return self._count

    async def admit(self, request_id: str | int) -> None:
        """Wait for room, then count ``request_id`` in flight."""
        while self._count >= self.limit:
            await self._freed.wait()
        self._ids[request_id] += 1
        self._count += 1

    def release(self, request_id: Any) -> None:
        """``request_id`` was answered or cancelled (an id not in flight is ignored)."""
        if not isinstance(request_id, str | int) or request_id not in self._ids:
            return
        if self._ids[request_id] > 1:
            self._ids[request_id] -= 1
        else:
            del self._ids[request_id]
        self._count -= 1
        if self._count == self.limit - 1:  # it was full: a request may wait for room
            self._freed.set()
            self._freed = anyio.Event()
