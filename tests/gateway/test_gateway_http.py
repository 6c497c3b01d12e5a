"""Streamable HTTP on loopback: an upstream reached over HTTP, and the gateway served over HTTP
to workers that authenticate with their Delegation Pass."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from awl.cli import main
from awl.documents.errors import BadRequest
from awl.passes import KeyStore, issue_recorded_pass, revoke_pass
from gateway._serve import is_loopback, open_gateway, parse_address, serve_http
from gateway._upstream import http_client
from tests.gateway.gateway_support import ROOT, WORKER, make_env, text

pytestmark = pytest.mark.anyio

OUTBOX_SERVER = ROOT / "examples" / "outbox_server.py"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "raw", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


@asynccontextmanager
async def http_upstream(outbox: Path) -> AsyncIterator[str]:
    """The example outbox server over streamable HTTP on 127.0.0.1; yields its URL."""
    env = {**os.environ, "OUTBOX_PATH": str(outbox)}
    async with await anyio.open_process([sys.executable, str(OUTBOX_SERVER), "--http", "0"],
                                        env=env, stderr=subprocess.PIPE) as process:
        assert process.stderr is not None
        seen = b""
        while b"listening on " not in seen or not seen.endswith(b"\n"):
            seen += await process.stderr.receive()
        url = seen.decode().split("listening on ", 1)[1].split()[0]
        try:
            yield url
        finally:
            process.terminate()


def _forge(token: str) -> str:
    """The token with one signature character changed (still well-formed base64url)."""
    swap = "A" if token[-10] != "A" else "B"
    return token[:-10] + swap + token[-9:]


@asynccontextmanager
async def _client(url: str, token: str) -> AsyncIterator[Client]:
    # The transport does not close an HTTP client it is given; this block does.
    async with (http_client({"Authorization": f"Bearer {token}"}) as http,
                Client(streamable_http_client(url, http_client=http)) as client):
        yield client


@pytest.mark.slow
@pytest.mark.spec("BIND-6")
async def test_the_gateway_serves_http_to_workers_with_a_pass(tmp_path: Path) -> None:
    """Over HTTP a worker with a valid pass is served; no pass, a bad or revoked pass get 401."""
    outbox = tmp_path / "outbox.jsonl"
    with anyio.fail_after(90):
        async with http_upstream(outbox) as upstream_url:
            env = make_env(tmp_path, servers={"notes": {"url": upstream_url}},
                           tools=["notes/*"], staged=["notes/send_email"])
            keys = KeyStore(env.home)
            token = issue_recorded_pass(env.store, env.order_id, keys=keys, subject=WORKER)
            async with (open_gateway(env.order_id, env.config, store=env.store, home=env.home,
                                     load_keys=True) as gw,
                        anyio.create_task_group() as tg):
                url = await tg.start(serve_http, gw)
                assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
                async with httpx2.AsyncClient() as raw:
                    missing = await raw.post(url, json=INITIALIZE, headers=ACCEPT)
                    forged = await raw.post(url, json=INITIALIZE, headers={
                        **ACCEPT, "Authorization": f"Bearer {_forge(token)}"})
                    async with _client(url, token) as client:
                        names = {t.name for t in (await client.list_tools()).tools}
                        found = await client.call_tool("notes__search_notes", {"query": "refund"})
                        held = await client.call_tool("notes__send_email", {
                            "to": "a@example.com", "subject": "s", "body": "b"})
                        jti = env.calls()[0].pass_jti
                        assert jti is not None
                        revoke_pass(env.store, jti, "stop")
                        # A revoked pass is stopped at the door: 401 before any MCP is read.
                        with pytest.raises(MCPError):
                            await client.call_tool("notes__search_notes", {"query": "x"})
                    revoked = await raw.post(url, json=INITIALIZE, headers={
                        **ACCEPT, "Authorization": f"Bearer {token}"})
                tg.cancel_scope.cancel()
    assert missing.status_code == 401 and forged.status_code == 401
    assert "bad_signature" in forged.json()["error_description"]
    assert revoked.status_code == 401 and "revoked" in revoked.json()["error_description"]
    assert {"notes__search_notes", "notes__send_email", "awl_get_order"} <= names
    assert not found.is_error
    assert text(held) == "pending:notes/send_email#2"
    assert not outbox.exists()
    assert [r.outcome for r in env.calls()] == ["ok", "held"]


@pytest.mark.spec("BIND-6")
async def test_a_non_loopback_address_needs_allow_remote(tmp_path: Path) -> None:
    """Serving HTTP on a non-loopback address is refused unless remote workers are allowed."""
    env = make_env(tmp_path, servers={}, tools=["notes/*"], staged=[])
    with anyio.fail_after(30):
        async with open_gateway(env.order_id, env.config, store=env.store, home=env.home,
                                load_keys=True) as gw:
            with pytest.raises(BadRequest, match="--allow-remote"):
                await serve_http(gw, "0.0.0.0", 0)
            async with anyio.create_task_group() as tg:
                url = await tg.start(lambda task_status: serve_http(
                    gw, "0.0.0.0", 0, allow_remote=True, task_status=task_status))
                port = int(url.rsplit(":", 1)[1].split("/")[0])
                async with httpx2.AsyncClient() as raw:
                    answer = await raw.post(f"http://127.0.0.1:{port}/mcp", json=INITIALIZE,
                                            headers=ACCEPT)
                tg.cancel_scope.cancel()
    assert answer.status_code == 401


def test_the_command_refuses_a_remote_address_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """awl gateway --http on a public address without --allow-remote is one clear error."""
    env = make_env(tmp_path, servers={}, tools=["notes/*"], staged=[])
    code = main(["gateway", "--order", env.order_id, "--config", str(env.config),
                 "--home", str(env.home), "--http", "0.0.0.0:8080"])
    err = capsys.readouterr().err
    assert code != 0
    assert len(err.strip().splitlines()) == 1 and "--allow-remote" in err


def test_addresses_parse_and_loopback_is_recognised() -> None:
    """HOST:PORT parses (IPv6 in brackets, bare port on 127.0.0.1); loopback is recognised."""
    assert parse_address("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_address("[::1]:0") == ("::1", 0)
    assert parse_address("9000") == ("127.0.0.1", 9000)
    with pytest.raises(BadRequest):
        parse_address("localhost:http")
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert not is_loopback("example.com")


@pytest.mark.spec("SEC-9")
async def test_the_gateway_refuses_a_huge_declared_body_at_once(tmp_path: Path) -> None:
    """A worker's POST declaring a terabyte (its body two bytes) is answered 413 at once,
    its connection closed, instead of after the 30 s the body may take to arrive."""
    env = make_env(tmp_path, servers={}, tools=["notes/*"], staged=[])
    token = issue_recorded_pass(env.store, env.order_id, keys=KeyStore(env.home),
                                subject=WORKER)
    with anyio.fail_after(30):
        async with (open_gateway(env.order_id, env.config, store=env.store, home=env.home,
                                 load_keys=True) as gw,
                    anyio.create_task_group() as tg):
            url = await tg.start(serve_http, gw)
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            stream = await anyio.connect_tcp("127.0.0.1", port)
            async with stream:
                started = anyio.current_time()
                await stream.send(
                    f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                    "Accept: application/json, text/event-stream\r\n"
                    "Content-Length: 1000000000000\r\n\r\n{}".encode())
                answer = b""
                with anyio.move_on_after(20):
                    while True:
                        try:
                            answer += await stream.receive()
                        except (anyio.EndOfStream, anyio.BrokenResourceError):
                            break
                took = anyio.current_time() - started
            async with _client(url, token) as client:
                names = {t.name for t in (await client.list_tools()).tools}
            tg.cancel_scope.cancel()
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"connection: close" in answer.lower()
    assert took < 10, f"answered after {took:.1f} s"
    assert "awl_get_order" in names
