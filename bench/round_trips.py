"""Round trips to the PostgreSQL server per gateway call, counted on the wire.

A :class:`Relay` listens on 127.0.0.1 in front of the server and passes bytes both ways,
counting, over every connection a process opens through it, each *turn*: the client sending
after the server last spoke (or first, on a new connection). A client that waits for an
answer before it sends again makes one turn per round trip; a pipeline that sends several
statements before reading makes one turn for them all. So the count is what a network
between a gateway and a database on another host would charge the gateway in latency:
libpq's statements, BEGIN and COMMIT, connection checks, new connections (their start-up
and authentication counted like any other turn), and whatever a gateway's background work
sends, all alike, whatever code sent them.

:func:`count` drives one gateway through the relay, apart from the timed runs (the relay's
own hop would slow the gateway it counts): it warms the gateway up, then counts the turns of
a stretch of sequential calls and of a stretch of calls from concurrent callers.
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

import anyio
from mcp import Client, StdioServerParameters

_CHUNK = 65536


class Relay:
    """A counting TCP relay from 127.0.0.1 to ``host``:``port``, in a thread of its own
    (``with Relay(...) as relay``); see the module text."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._turns = 0
        self.connections = 0
        """Connections opened through the relay so far."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-relay", daemon=True)
        # Per socket: its peer, whether it is the client's end, and the pair's last speaker.
        self._pairs: dict[socket.socket, _End] = {}

    @classmethod
    def to(cls, url: str) -> Relay:
        """A relay in front of the server the libpq URL ``url`` names."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the relay's."""
        parts = urlsplit(url)
        auth = parts.netloc.rpartition("@")[0]
        return parts._replace(
            netloc=f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        ).geturl()

    @property
    def turns(self) -> int:
        """Round trips counted so far, over every connection."""
        with self._lock:
            return self._turns

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in [*self._pairs, self._listener]:
            with suppress(OSError):
                sock.close()
        self._selector.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept()
                else:
                    self._pass(sock)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        server = socket.create_connection(self._target, timeout=10)
        for sock in (client, server):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = _Pair()
        self._pairs[client] = _End(server, True, pair)
        self._pairs[server] = _End(client, False, pair)
        self._selector.register(client, selectors.EVENT_READ, None)
        self._selector.register(server, selectors.EVENT_READ, None)
        with self._lock:
            self.connections += 1

    def _pass(self, sock: socket.socket) -> None:
        end = self._pairs.get(sock)
        if end is None:
            return
        try:
            data = sock.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock, end)
            return
        if end.from_client and not end.pair.client_spoke:
            with self._lock:
                self._turns += 1
        end.pair.client_spoke = end.from_client
        try:
            end.peer.setblocking(True)
            end.peer.sendall(data)
            end.peer.setblocking(False)
        except OSError:
            self._drop(sock, end)

    def _drop(self, sock: socket.socket, end: _End) -> None:
        for each in (sock, end.peer):
            self._pairs.pop(each, None)
            with suppress(KeyError, ValueError):
                self._selector.unregister(each)
            with suppress(OSError):
                each.close()


@dataclass(slots=True)
class _Pair:
    client_spoke: bool = False
    """Whether the client was the last of the two to send."""


@dataclass(slots=True)
class _End:
    peer: socket.socket
    from_client: bool
    pair: _Pair


@dataclass(frozen=True)
class Counted:
    """Round trips per call of one gateway, and the calls they were counted over."""

    sequential: float
    concurrent: float
    callers: int
    calls: int
    connections: int
    """Connections the gateway opened to the server from its start to the end of the count."""

    def text(self) -> str:
        """``2.00 seq / 1.31 at 16`` as the table prints it."""
        return f"{self.sequential:.2f} seq / {self.concurrent:.2f} at {self.callers}"


async def count(params: Callable[[str], StdioServerParameters], url: str, tool: str, *,
                calls: int, callers: int, per_caller: int) -> Counted:
    """The round trips per call of the gateway ``params(relayed_url)`` starts, counted over
    ``calls`` sequential calls of ``tool``, then ``callers`` x ``per_caller`` concurrent ones.
    """
    with Relay.to(url) as relay:
        async with Client(params(relay.url(url))) as client:
            async def once() -> None:
                result = await client.call_tool(tool, {"id": "n1"})
                if result.is_error:
                    raise RuntimeError(f"{tool} failed through the relay: {result.content}")

            for _ in range(max(calls // 10, 5)):
                await once()
            start = relay.turns
            for _ in range(calls):
                await once()
            middle = relay.turns

            async def caller() -> None:
                for _ in range(per_caller):
                    await once()

            async with anyio.create_task_group() as tg:
                for _ in range(callers):
                    tg.start_soon(caller)
            end = relay.turns
            return Counted((middle - start) / calls, (end - middle) / (callers * per_caller),
                           callers, calls, relay.connections)
