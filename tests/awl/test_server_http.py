"""The desk MCP server over streamable HTTP on 127.0.0.1: desk tokens, identity per request,
loopback only, tokens kept as hashes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import httpx2
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from awl.cli import main
from awl.documents.errors import BadRequest
from awl.server import (
    DeskServer,
    issue_token,
    revoke_tokens,
    serve_desk_http,
    token_hash,
    token_id,
)
from awl.store.sqlite import SQLiteStore
from tests.awl.server_support import (
    MANAGER,
    MODES,
    OUTSIDER,
    ROOT,
    WORKER,
    Desk,
    order_fields,
)

_INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "0"}}}
_HEADERS = {"Accept": "application/json, text/event-stream",
            "Content-Type": "application/json"}


@asynccontextmanager
async def desk_over_http(store: SQLiteStore) -> AsyncIterator[str]:
    """A desk served over HTTP on 127.0.0.1 (a free port) for the block; yields its URL."""
    server = DeskServer(store)
    async with anyio.create_task_group() as tg:
        url = await tg.start(partial(serve_desk_http, server, "127.0.0.1", 0))
        yield url
        tg.cancel_scope.cancel()


@asynccontextmanager
async def connect(url: str, token: str, mode: str) -> AsyncIterator[Desk]:
    """An SDK client that sends ``token`` as its Bearer token on every request."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=30) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode) as client:
            yield Desk(client)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.spec("BIND-3", "SEC-1")
async def test_each_request_acts_as_the_principal_its_token_was_issued_to(
        tmp_path: Path, mode: str) -> None:
    """Over HTTP the manager's and the worker's tokens make them who they are: the worker
    sees its order, may not review it, and an order it creates is from itself."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    manager_token = issue_token(store, MANAGER)
    worker_token = issue_token(store, WORKER)
    try:
        with anyio.fail_after(60):
            async with desk_over_http(store) as url, \
                    connect(url, manager_token, mode) as m, \
                    connect(url, worker_token, mode) as w:
                created = await m.call("create_work_order", order=order_fields())
                oid = created["order"]["id"]
                assert created["order"]["from"] == MANAGER
                listed = await w.call("list_work_orders")
                assert [(o["id"], o["your_roles"]) for o in listed["orders"]] == [
                    (oid, ["worker"])]
                assert (await w.call("accept_work_order", order_id=oid))["state"] == "accepted"
                refused = await w.refused("cancel_work_order", order_id=oid, reason="mine")
                assert refused["code"] == "FORBIDDEN"
                own = await w.call("create_work_order", order=order_fields(to=OUTSIDER))
                assert own["order"]["from"] == WORKER
                assert own["your_roles"] == ["manager", "answerer"]
    finally:
        store.close()


@pytest.mark.anyio
@pytest.mark.spec("BIND-3", "SEC-2")
async def test_requests_without_a_desk_token_or_from_a_foreign_host_are_refused(
        tmp_path: Path) -> None:
    """No token, an unknown token or another scheme get 401 before any MCP is read; a
    request naming a non-loopback Host is refused even with a good token."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    token = issue_token(store, MANAGER)
    try:
        with anyio.fail_after(30):
            async with desk_over_http(store) as url, httpx2.AsyncClient(timeout=10) as http:
                for auth in (None, "Bearer awl_not-a-token", "Bearer " + token[:-1],
                             f"Basic {token}", "Bearer"):
                    headers = dict(_HEADERS)
                    if auth is not None:
                        headers["Authorization"] = auth
                    answer = await http.post(url, json=_INITIALIZE, headers=headers)
                    assert answer.status_code == 401, auth
                    assert answer.headers["WWW-Authenticate"].startswith("Bearer ")
                    assert answer.json()["error"] == "invalid_token"
                good = {**_HEADERS, "Authorization": f"Bearer {token}"}
                answer = await http.post(url, json=_INITIALIZE, headers=good)
                assert answer.status_code == 200
                rebound = {**good, "Host": "desk.attacker.example"}
                answer = await http.post(url, json=_INITIALIZE, headers=rebound)
                assert answer.status_code == 421
                with pytest.raises(Exception):  # noqa: B017 - the SDK's own error types
                    async with connect(url, "awl_forged", "legacy"):
                        pass
    finally:
        store.close()


@pytest.mark.anyio
@pytest.mark.spec("BIND-3", "SEC-1")
async def test_a_session_answers_only_the_token_that_opened_it(tmp_path: Path) -> None:
    """Another token holder who learns a session's id could read its stream, cancel its
    calls and end it (each request ran as its own principal, but in the other's session).
    Now the session is not found for any token but its own, and lives on for that one."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    mine, theirs = issue_token(store, MANAGER), issue_token(store, WORKER)
    as_me = {**_HEADERS, "Authorization": f"Bearer {mine}"}
    as_them = {**_HEADERS, "Authorization": f"Bearer {theirs}"}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    try:
        with anyio.fail_after(30):
            async with desk_over_http(store) as url, httpx2.AsyncClient(timeout=10) as http:
                opened = await http.post(url, json=_INITIALIZE, headers=as_me)
                assert opened.status_code == 200
                session = opened.headers["mcp-session-id"]
                mine_in = {**as_me, "Mcp-Session-Id": session,
                           "MCP-Protocol-Version": "2025-11-25"}
                theirs_in = {**as_them, "Mcp-Session-Id": session,
                             "MCP-Protocol-Version": "2025-11-25"}
                done = await http.post(url, headers=mine_in, json={
                    "jsonrpc": "2.0", "method": "notifications/initialized"})
                assert done.status_code == 202
                for method, body in (("POST", listing), ("POST", {
                        "jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 2}}), ("GET", None), ("DELETE", None)):
                    answer = await http.request(method, url, headers=theirs_in, json=body)
                    assert answer.status_code == 404, (method, answer.text)
                    assert "opened with another token" in answer.text
                still = await http.post(url, headers=mine_in, json=listing)
                assert still.status_code == 200 and "create_work_order" in still.text
    finally:
        store.close()


@pytest.mark.anyio
@pytest.mark.spec("SEC-6")
async def test_a_revoked_token_is_refused_from_the_next_request_on(tmp_path: Path) -> None:
    """A token revoked while the desk serves gets 401 on its next request; others still
    work."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    token, other = issue_token(store, MANAGER), issue_token(store, WORKER)
    try:
        with anyio.fail_after(30):
            async with desk_over_http(store) as url, httpx2.AsyncClient(timeout=10) as http:
                def headers(t: str) -> dict[str, str]:
                    return {**_HEADERS, "Authorization": f"Bearer {t}"}

                assert (await http.post(url, json=_INITIALIZE, headers=headers(token))
                        ).status_code == 200
                assert [t.principal for t in revoke_tokens(store, token=token)] == [MANAGER]
                answer = await http.post(url, json=_INITIALIZE, headers=headers(token))
                assert answer.status_code == 401
                assert answer.json()["error"] == "invalid_token"
                assert (await http.post(url, json=_INITIALIZE, headers=headers(other))
                        ).status_code == 200
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.spec("SEC-6")
def test_awl_token_lists_and_revokes_tokens_by_id_token_or_principal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`awl token list` shows id, issue time and principal, never a token; `awl token revoke`
    takes an id (or 6+ of its digits), the token itself, or a principal; mistakes are one
    line each."""
    home = str(tmp_path / "home")
    tokens = {}
    for who in (MANAGER, WORKER, WORKER):
        assert main(["token", "issue", who, "--home", home]) == 0
        out, err = capsys.readouterr()
        tokens[out.strip()] = who
    assert main(["token", "list", "--home", home, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["principal"] for row in listed] == [MANAGER, WORKER, WORKER]
    ids = [row["id"] for row in listed]
    assert all(len(i) == 12 and int(i, 16) >= 0 for i in ids)
    by_token = {token_id(token_hash(t)): t for t in tokens}
    assert set(by_token) == set(ids)
    assert main(["token", "list", "--home", home]) == 0
    text = capsys.readouterr().out
    assert all(i in text for i in ids) and not any(t in text for t in tokens)

    assert main(["token", "revoke", ids[0][:6], "--home", home]) == 0
    assert MANAGER in capsys.readouterr().out
    for bad, words in ((["abc"], "at least 6"), ([ids[0]], "no desk token has id"),
                       (["--token", by_token[ids[0]]], "revoked already"),
                       (["--principal", "human:nobody"], "has no desk token")):
        assert main(["token", "revoke", *bad, "--home", home]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and words in err, (bad, err)
    assert main(["token", "revoke", "--token", by_token[ids[1]], "--home", home, "--json"]) == 0
    assert [row["id"] for row in json.loads(capsys.readouterr().out)] == [ids[1]]
    assert main(["token", "revoke", "--principal", WORKER, "--home", home]) == 0
    assert ids[2] in capsys.readouterr().out
    assert main(["token", "list", "--home", home]) == 0
    assert "no desk tokens" in capsys.readouterr().out
    store = SQLiteStore(tmp_path / "home" / "desk.sqlite3")
    try:
        assert all(store.principal_for(token_hash(t)) is None for t in tokens)
    finally:
        store.close()


@pytest.mark.anyio
@pytest.mark.spec("SEC-2")
async def test_a_non_loopback_address_needs_allow_remote(tmp_path: Path) -> None:
    """Serving on an address other machines can reach is refused unless asked for."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    try:
        with anyio.fail_after(10), pytest.raises(BadRequest, match="--allow-remote"):
            await serve_desk_http(DeskServer(store), "0.0.0.0", 0)
        with anyio.fail_after(10), pytest.raises(BadRequest, match="without a principal"):
            await serve_desk_http(DeskServer(store, principal=MANAGER), "127.0.0.1", 0)
    finally:
        store.close()


@pytest.mark.spec("SEC-4")
def test_a_taken_port_is_one_clear_line(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`awl serve --http` on a port already in use says so in one line and exits 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--http", f"127.0.0.1:{port}", "--home", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err


def test_served_connections_send_without_waiting_for_acks() -> None:
    """Each accepted connection has TCP_NODELAY, so a streamed answer never waits 40 ms."""
    import asyncio

    from awl.mcp.transport import listen

    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                conn = transport.get_extra_info("socket")
                seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        sock = listen("127.0.0.1", 0)
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname())
            value = await asyncio.wait_for(seen, 10)
            writer.close()
            await writer.wait_closed()
        return value

    assert asyncio.run(accepted_nodelay()) != 0


@pytest.mark.spec("SEC-3")
def test_the_desk_keeps_only_a_hash_of_each_token(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`awl token issue` prints a fresh token once; the desk file holds its hash, not the
    token, and the hash names the principal."""
    home = str(tmp_path / "home")
    tokens = []
    for _ in range(2):
        assert main(["token", "issue", WORKER, "--home", home]) == 0
        out, err = capsys.readouterr()
        tokens.append(out.strip())
        assert "keeps only its hash" in err
    assert tokens[0] != tokens[1] and all(t.startswith("awl_") for t in tokens)
    store = SQLiteStore(tmp_path / "home" / "desk.sqlite3")
    try:
        assert [store.principal_for(token_hash(t)) for t in tokens] == [WORKER, WORKER]
    finally:
        store.close()
    stored = b"".join(p.read_bytes() for p in (tmp_path / "home").glob("desk.sqlite3*"))
    assert token_hash(tokens[0]).encode() in stored
    for token in tokens:
        assert token.encode() not in stored
        assert token[4:].encode() not in stored
    assert main(["token", "issue", "awl:desk", "--home", home]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "reserved" in err


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("BIND-3")
async def test_awl_serve_http_announces_its_address_and_serves_token_holders(
        tmp_path: Path) -> None:
    """`awl serve --http 127.0.0.1:0` prints where it listens on stderr and serves a client
    holding a desk token as that token's principal."""
    home = tmp_path / "home"
    home.mkdir()
    store = SQLiteStore(home / "desk.sqlite3")
    token = issue_token(store, WORKER)
    store.close()
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    command = [sys.executable, "-m", "awl", "serve", "--http", "127.0.0.1:0",
               "--home", str(home)]
    with anyio.fail_after(60):
        async with await anyio.open_process(command, env=env, cwd=str(home),
                                            stderr=subprocess.PIPE) as process:
            assert process.stderr is not None
            stderr = BufferedByteReceiveStream(process.stderr)
            announced = (await stderr.receive_until(b"\n", 4096)).decode()
            assert announced.startswith("awl serve: serving the desk on http://127.0.0.1:")
            url = announced.split(" on ", 1)[1].split(";", 1)[0]
            try:
                async with connect(url, token, "legacy") as w:
                    listed = await w.call("list_work_orders")
                    assert listed == {"role": "any", "orders": [], "count": 0}
                    track = await w.call("get_track_record")
                    assert track["worker"] == WORKER
            finally:
                process.terminate()
            # uvicorn shuts down in order, then lets the signal end the process as usual.
            assert await process.wait() == -signal.SIGTERM
            rest = bytearray(stderr.buffer)
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    rest += await stderr.receive()
            assert b"Traceback" not in rest


@pytest.mark.anyio
@pytest.mark.spec("SEC-4", "SEC-9")
async def test_a_store_that_fails_while_checking_a_token_is_refused_in_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """When the store cannot answer whose a token is (here a desk file whose tokens table
    is gone), the request is refused (503, fail closed, try again) with a line saying so,
    and the desk
    logs one warning: no traceback, and no bare 500 that says nothing."""
    import sqlite3

    store = SQLiteStore(tmp_path / "desk.sqlite3")
    token = issue_token(store, MANAGER)
    try:
        with anyio.fail_after(30):
            async with desk_over_http(store) as url, httpx2.AsyncClient(timeout=10) as http:
                good = {**_HEADERS, "Authorization": f"Bearer {token}"}
                assert (await http.post(url, json=_INITIALIZE, headers=good)).status_code == 200
                with contextlib.closing(sqlite3.connect(tmp_path / "desk.sqlite3")) as raw:
                    raw.execute("DROP TABLE tokens")
                    raw.commit()
                caplog.clear()
                answer = await http.post(url, json=_INITIALIZE, headers=good)
                assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
                assert answer.json()["error"] == "temporarily_unavailable"
                assert "its store failed (OperationalError)" in answer.json()[
                    "error_description"]
    finally:
        store.close()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert any("cannot check a desk token" in r.getMessage() for r in caplog.records)
