"""A real webhook receiver on 127.0.0.1 for the notification tests.

It answers each POST with the next of its ``answers`` (an HTTP status, or ``HANG``: hold the
connection and never answer), then with the last one for ever after, and keeps every request
it received: its headers and its body.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook as Verifier

HANG = -1
"""An answer: hold the connection open and never reply."""


@dataclass(frozen=True)
class Received:
    """One request as the receiver read it."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def verified(self, secret: str) -> Any:
        """The body, after checking its Standard Webhooks signature with ``secret``."""
        return Verifier(secret).verify(self.body, self.headers)


class Receiver:
    """A webhook receiver in a thread; use it as a context manager."""

    def __init__(self, *answers: int) -> None:
        self.answers = list(answers) or [204]
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.received.append(Received(self.path, dict(self.headers), body))
                    k = len(receiver.received) - 1
                    status = receiver.answers[min(k, len(receiver.answers) - 1)]
                if status == HANG:
                    receiver._release.wait(60)
                    return
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        """The requests once there are ``count`` of them (AssertionError after ``timeout``)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.02)
        raise AssertionError(f"the receiver got {len(self.received)} requests, not {count}")


class DeadReceiver:
    """An address that accepts connections and never reads or answers them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def __enter__(self) -> DeadReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
