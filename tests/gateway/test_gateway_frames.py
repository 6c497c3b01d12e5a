"""Malformed frames reaching the gateway get JSON-RPC errors (GW-8, SEC-9), over stdio and over
streamable HTTP in both protocol eras, with no traceback; the worker's calls work after them
and nothing malformed reaches an upstream or the call records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from awl.documents.errors import DocumentError
from awl.passes import KeyStore, issue_recorded_pass
from tests.awl.frames_support import (
    INVALID_PARAMS,
    StdioPeer,
    announced_server,
    no_traceback,
    refuse_all_over_http,
    refuse_all_over_stdio,
)
from tests.awl.server_support import MODES
from tests.gateway.gateway_support import ROOT, WORKER, connect, make_env, text

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TOOL = "receiver__echo"


def _command(env_home: Path, order_id: str, config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "awl", "gateway", "--order", order_id, "--config",
            str(config), "--home", str(env_home), *extra]


@pytest.mark.spec("GW-8", "SEC-9", "SEC-4")
async def test_awl_gateway_over_stdio_answers_every_malformed_frame(tmp_path: Path) -> None:
    """Each malformed line gets its error; none is recorded or forwarded; a call works after."""
    env = make_env(tmp_path, staged=[])
    errlog = env.home / "gateway.err"
    with anyio.fail_after(60), open(errlog, "w") as err:
        async with await anyio.open_process(_command(env.home, env.order_id, env.config),
                                            cwd=str(ROOT), stderr=err) as process:
            peer = StdioPeer(process)
            await refuse_all_over_stdio(peer, TOOL)
            answer = await peer.exchange(json.dumps({
                "jsonrpc": "2.0", "id": 99, "method": "tools/call",
                "params": {"name": TOOL, "arguments": {"text": "alive"}}}).encode())
            assert process.stdin is not None
            await process.stdin.aclose()
            await process.wait()
    assert answer["id"] == 99 and answer["result"]["structuredContent"] == {"text": "alive"}
    assert [(r.tool, r.outcome) for r in env.calls()] == [("receiver/echo", "ok")]
    no_traceback(errlog.read_text())


@pytest.mark.spec("GW-8", "SEC-9", "SEC-4")
async def test_awl_gateway_over_http_answers_every_malformed_frame_in_both_eras(
        tmp_path: Path) -> None:
    """Each malformed POST (with a valid pass) gets 400 and its error, in a handshake session
    and in the 2026-07-28 era; SDK clients of both eras are served after them."""
    env = make_env(tmp_path, staged=[])
    token = issue_recorded_pass(env.store, env.order_id, keys=KeyStore(env.home),
                                subject=WORKER)
    command = _command(env.home, env.order_id, env.config, "--http", "127.0.0.1:0")
    echoed: list[object] = []
    with anyio.fail_after(90):
        async with announced_server(command, cwd=str(ROOT)) as (url, stderr):
            await refuse_all_over_http(url, token, TOOL)
            for mode in MODES:
                async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                               timeout=30) as http,
                            Client(streamable_http_client(url, http_client=http),
                                   mode=mode) as client):
                    result = await client.call_tool(TOOL, {"text": mode})
                    echoed.append(result.structured_content)
    assert echoed == [{"text": mode} for mode in MODES]
    assert [r.outcome for r in env.calls()] == ["ok", "ok"]
    no_traceback(stderr[0])


@pytest.mark.spec("GW-7", "SEC-4")
async def test_arguments_json_cannot_hold_are_a_protocol_error_and_not_recorded(
        tmp_path: Path) -> None:
    """In-process, where no wire checks the frame: a lone surrogate in a call's arguments is
    answered -32602 (the call cannot be recorded, GW-7), NaN through the library is a
    DocumentError; neither is recorded or forwarded, and the next call works."""
    env = make_env(tmp_path, staged=[])
    with anyio.fail_after(60):
        async with connect(env) as (gw, client):
            with pytest.raises(MCPError) as refused:
                await client.call_tool(TOOL, {"text": "\ud800"})
            with pytest.raises(DocumentError, match="JSON number"):
                await gw.call(TOOL, {"text": float("nan")})
            with pytest.raises(MCPError):
                await client.call_tool("awl_post_progress", {"message": "\udfff"})
            echo = await client.call_tool(TOOL, {"text": "alive"})
    assert refused.value.code == INVALID_PARAMS
    assert "surrogate" in refused.value.message
    assert text(echo) == "alive"
    assert [r.outcome for r in env.calls()] == ["ok"]
