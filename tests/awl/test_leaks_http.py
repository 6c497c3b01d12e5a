"""What a long-running HTTP server (``awl serve --http``, ``awl gateway --http``) keeps of
clients that went away: connections that never finish a request, and the owners of sessions
that ended. Each test counts what is held after hundreds of such clients: the server's open
file descriptors, or the session owners it remembers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from awl.mcp import frames, transport
from awl.mcp.transport import BearerAuth
from awl.server import DeskServer, issue_token, serve_desk_http
from awl.store.sqlite import SQLiteStore
from tests.awl.server_support import MANAGER, ROOT, WORKER

_INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "0"}}}
_HEADERS = {"Accept": "application/json, text/event-stream",
            "Content-Type": "application/json"}

# A desk server as `awl serve --http` runs it, with its deadlines for a request's head and
# body shortened so a test need not wait the real 30 seconds each.
_SERVE = textwrap.dedent("""
    import sys, anyio
    from awl.mcp import frames, transport
    from awl.server import DeskServer, serve_desk_http
    from awl.store.sqlite import SQLiteStore
    transport.HEAD_SECONDS = frames.BODY_SECONDS = 0.5

    async def main():
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_desk_http, DeskServer(SQLiteStore(sys.argv[1])))
            print(url, flush=True)

    anyio.run(main)
""")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _half_request(port: int, token: str, kind: str) -> socket.socket:
    """A connection that stops partway: before its head, inside it, or inside its body."""
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'
    head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sent = {"nothing": b"", "head": head[:50], "body": head + body[:10]}[kind]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(sent)
    return sock


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/PID/fd")
@pytest.mark.spec("SEC-13")
def test_connections_that_stop_before_their_request_is_whole_are_closed(
        tmp_path: Path) -> None:
    """Clients that crash or lose their network mid-request leave connections that send
    nothing more: one that never sent a byte, one that stopped inside its headers, one that
    stopped inside its body. uvicorn times out none of these, so each held a descriptor for
    as long as the server ran (450 of them: 450 descriptors more, never freed), until the
    process could accept no one. Now each is closed once its head (or its body) is late,
    and the descriptors come back."""
    path = tmp_path / "desk.sqlite3"
    with closing(SQLiteStore(path)) as store:
        token = issue_token(store, MANAGER)
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    with subprocess.Popen([sys.executable, "-c", _SERVE, str(path)], env=env,
                          stdout=subprocess.PIPE, cwd=tmp_path) as server:
        try:
            assert server.stdout is not None
            url = server.stdout.readline().decode().strip()
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            before = _fds(server.pid)
            held = [_half_request(port, token, kind)
                    for kind in ("nothing", "head", "body") for _ in range(150)]
            try:
                # Descriptors fall back within a second or two; wait up to 20 s, then count.
                deadline = time.monotonic() + 20
                while _fds(server.pid) > before + 50 and time.monotonic() < deadline:
                    time.sleep(0.2)
                after = _fds(server.pid)
            finally:
                for sock in held:
                    sock.close()
            assert after <= before + 50, f"{after - before} descriptors more than at the start"
            # The server still serves.
            answer = httpx2.post(url, json=_INITIALIZE, timeout=10, headers={
                **_HEADERS, "Authorization": f"Bearer {token}"})
            assert answer.status_code == 200
        finally:
            server.terminate()


@pytest.mark.anyio
@pytest.mark.spec("SEC-13")
async def test_a_body_that_stops_halfway_is_refused_with_408(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A POST whose body stops halfway is answered ``408`` with a JSON-RPC error and its
    connection closed, instead of waiting for the rest for ever."""
    monkeypatch.setattr(frames, "BODY_SECONDS", 0.3, raising=False)
    with closing(SQLiteStore(tmp_path / "desk.sqlite3")) as store:
        token = issue_token(store, MANAGER)
        async with _desk_over_http(store) as url:
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            with anyio.fail_after(20):
                sock = await anyio.to_thread.run_sync(_half_request, port, token, "body")
                with closing(sock):
                    answer = await anyio.to_thread.run_sync(_read_all, sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"did not arrive within 0.3 seconds" in answer
    assert b"connection: close" in answer.lower()


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(15)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@asynccontextmanager
async def _desk_over_http(store: SQLiteStore) -> AsyncIterator[str]:
    async with anyio.create_task_group() as tg:
        url = await tg.start(partial(serve_desk_http, DeskServer(store), "127.0.0.1", 0))
        yield url
        tg.cancel_scope.cancel()


@pytest.fixture
def doors(monkeypatch: pytest.MonkeyPatch) -> list[BearerAuth]:
    """Each BearerAuth the test's servers make, in order."""
    made: list[BearerAuth] = []

    class Noted(BearerAuth):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(transport, "BearerAuth", Noted)
    return made


async def _open(http: httpx2.AsyncClient, url: str, token: str) -> dict[str, str]:
    """Open a session with ``token``; the headers of a request in it."""
    auth = {**_HEADERS, "Authorization": f"Bearer {token}"}
    opened = await http.post(url, json=_INITIALIZE, headers=auth)
    assert opened.status_code == 200
    inside = {**auth, "Mcp-Session-Id": opened.headers["mcp-session-id"],
              "MCP-Protocol-Version": "2025-11-25"}
    done = await http.post(url, headers=inside, json={
        "jsonrpc": "2.0", "method": "notifications/initialized"})
    assert done.status_code == 202
    return inside


async def _open_and_end(http: httpx2.AsyncClient, url: str, token: str, times: int) -> None:
    for _ in range(times):
        auth = {**_HEADERS, "Authorization": f"Bearer {token}"}
        opened = await http.post(url, json=_INITIALIZE, headers=auth)
        ended = await http.delete(url, headers={
            **auth, "Mcp-Session-Id": opened.headers["mcp-session-id"],
            "MCP-Protocol-Version": "2025-11-25"})
        assert ended.status_code == 200


_LISTING = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}


@pytest.mark.anyio
async def test_the_owners_of_ended_sessions_are_forgotten(
        tmp_path: Path, doors: list[BearerAuth]) -> None:
    """Every session's opener was remembered for ever (up to 100,000): 1,000 sessions
    opened and ended left 1,000 owners behind. Now those of ended sessions are swept out
    (here at most 512 remain), and an open session still answers only its own token."""
    with closing(SQLiteStore(tmp_path / "desk.sqlite3")) as store:
        mine, theirs = issue_token(store, MANAGER), issue_token(store, WORKER)
        async with _desk_over_http(store) as url, httpx2.AsyncClient(timeout=10) as http:
            with anyio.fail_after(60):
                inside = await _open(http, url, mine)
                await _open_and_end(http, url, theirs, 1000)
                (door,) = doors
                remembered = len(door._owners)
                stolen = await http.post(url, json=_LISTING, headers={
                    **inside, "Authorization": f"Bearer {theirs}"})
                still = await http.post(url, json=_LISTING, headers=inside)
    assert remembered <= 512, f"{remembered} session owners remembered"
    assert stolen.status_code == 404 and "opened with another token" in stolen.text
    assert still.status_code == 200


@pytest.mark.anyio
@pytest.mark.spec("BIND-3")
async def test_an_open_session_keeps_its_owner_however_many_come_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Owners were forgotten by age alone once 100,000 sessions had opened (here the
    limit is 100): a session still open then answered any token that named it, so whoever
    learned its id could read its stream, cancel its calls and end it. Now an open
    session's owner is never forgotten."""
    monkeypatch.setattr(transport, "MAX_SESSIONS", 100)
    with closing(SQLiteStore(tmp_path / "desk.sqlite3")) as store:
        mine, theirs = issue_token(store, MANAGER), issue_token(store, WORKER)
        async with _desk_over_http(store) as url, httpx2.AsyncClient(timeout=10) as http:
            with anyio.fail_after(60):
                inside = await _open(http, url, mine)
                await _open_and_end(http, url, theirs, 300)
                stolen = await http.post(url, json=_LISTING, headers={
                    **inside, "Authorization": f"Bearer {theirs}"})
                still = await http.post(url, json=_LISTING, headers=inside)
    assert stolen.status_code == 404 and "opened with another token" in stolen.text
    assert still.status_code == 200


def _declare_huge(port: int, token: str) -> tuple[float, bytes]:
    """POST a head declaring a terabyte and a body of two bytes: how long the answer took,
    and the answer."""
    head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\n"
            "Content-Length: 1000000000000\r\n\r\n{}").encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.monotonic()
        sock.sendall(head)
        answer = _read_all(sock)
    return time.monotonic() - started, answer


@pytest.mark.anyio
@pytest.mark.spec("SEC-9")
async def test_a_declared_length_over_the_limit_is_refused_413_at_once(
        tmp_path: Path) -> None:
    """A head declaring ``Content-Length: 1000000000000`` and a body of two bytes waited
    for the rest of the body (30 s) and got a 408; it is refused 413 at once, nothing read,
    its connection closed, and the server goes on serving."""
    with closing(SQLiteStore(tmp_path / "desk.sqlite3")) as store:
        token = issue_token(store, MANAGER)
        async with _desk_over_http(store) as url:
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            with anyio.fail_after(20):
                took, answer = await anyio.to_thread.run_sync(_declare_huge, port, token)
                async with httpx2.AsyncClient(timeout=10) as http:
                    still = await http.post(url, json=_INITIALIZE, headers={
                        **_HEADERS, "Authorization": f"Bearer {token}"})
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"larger than" in answer and b"connection: close" in answer.lower()
    assert took < frames.BODY_SECONDS / 3, f"answered after {took:.1f} s"
    assert still.status_code == 200
