"""Malformed frames reaching the desk server get JSON-RPC errors (SEC-9), over stdio and over
streamable HTTP in both protocol eras, with no traceback; a valid call works after them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import mcp_types as types
import pytest

from awl.mcp.frames import MAX_FRAME_BYTES, Refused, check_frame
from awl.server import DeskServer, issue_token
from awl.store.sqlite import SQLiteStore
from tests.awl.frames_support import (
    INVALID_REQUEST,
    Frame,
    StdioPeer,
    announced_server,
    check_answer,
    malformed,
    no_traceback,
    refuse_all_over_http,
    refuse_all_over_stdio,
)
from tests.awl.server_support import MANAGER, MODES, ROOT, order_fields, text_of
from tests.awl.test_server_http import connect

pytestmark = pytest.mark.anyio

TOOL = "list_work_orders"


@pytest.mark.spec("SEC-9")
@pytest.mark.parametrize("frame", malformed(TOOL), ids=lambda f: f.label)
def test_each_malformed_frame_is_refused_with_its_error(frame: Frame) -> None:
    """check_frame answers every malformed frame with the code and id SEC-9 names."""
    checked = check_frame(frame.raw)
    assert isinstance(checked, Refused), frame.label
    assert checked.answer is not None
    check_answer(frame, checked.answer.model_dump(by_alias=True))


@pytest.mark.spec("SEC-9")
def test_sound_frames_pass_and_bad_notifications_are_dropped_with_a_reason() -> None:
    """Requests, notifications and responses pass as their messages; a notification with
    an unreadable value cannot be answered and is refused without an answer."""
    request = check_frame(b'{"jsonrpc": "2.0", "id": "a", "method": "tools/list"}')
    note = check_frame(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
    result = check_frame(b'{"jsonrpc": "2.0", "id": 3, "result": {}}')
    error = check_frame(b'{"jsonrpc": "2.0", "id": null, "error": {"code": 1, "message": "m"}}')
    assert isinstance(request, types.JSONRPCRequest) and request.id == "a"
    assert isinstance(note, types.JSONRPCNotification)
    assert isinstance(result, types.JSONRPCResponse)
    assert isinstance(error, types.JSONRPCError)
    dropped = check_frame(b'{"jsonrpc": "2.0", "method": "notifications/progress", '
                          b'"params": {"progress": NaN}}')
    assert isinstance(dropped, Refused) and dropped.answer is None
    assert "NaN" in dropped.reason or "nan" in dropped.reason
    big = check_frame(b" " * (MAX_FRAME_BYTES + 1))
    assert isinstance(big, Refused) and big.answer is not None
    assert big.answer.error.code == INVALID_REQUEST


def _serve_env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}


@pytest.mark.slow
@pytest.mark.spec("SEC-9", "SEC-4")
async def test_awl_serve_over_stdio_answers_every_malformed_frame(tmp_path: Path) -> None:
    """Each malformed line gets its error on stdout; the desk still serves after them."""
    command = [sys.executable, "-m", "awl", "serve", "--home", str(tmp_path), "--as", MANAGER]
    errlog = tmp_path / "serve.err"
    with anyio.fail_after(60), open(errlog, "w") as err:
        async with await anyio.open_process(command, env=_serve_env(), cwd=str(tmp_path),
                                            stderr=err) as process:
            peer = StdioPeer(process)
            await refuse_all_over_stdio(peer, TOOL)
            # A blank line is no message, and gets no answer: the next answer is the call's.
            await peer.send(b"   ")
            answer = await peer.exchange(json.dumps({
                "jsonrpc": "2.0", "id": 99, "method": "tools/call",
                "params": {"name": TOOL, "arguments": {}}}).encode())
            assert process.stdin is not None
            await process.stdin.aclose()
            assert await process.wait() == 0
    assert answer["id"] == 99 and answer["result"]["isError"] is False
    no_traceback(errlog.read_text())


@pytest.mark.slow
@pytest.mark.spec("SEC-9", "SEC-4")
async def test_awl_serve_over_http_answers_every_malformed_frame_in_both_eras(
        tmp_path: Path) -> None:
    """Each malformed POST gets 400 and its error, in a handshake session and in the
    2026-07-28 era; SDK clients of both eras are served after them."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    token = issue_token(store, MANAGER)
    store.close()
    command = [sys.executable, "-m", "awl", "serve", "--http", "127.0.0.1:0",
               "--home", str(tmp_path)]
    with anyio.fail_after(90):
        async with announced_server(command, env=_serve_env(), cwd=str(tmp_path)) as (
                url, stderr):
            await refuse_all_over_http(url, token, TOOL)
            for mode in MODES:
                async with connect(url, token, mode) as desk:
                    listed = await desk.call(TOOL)
                    assert listed["count"] == 0
    no_traceback(stderr[0])


@pytest.mark.spec("SEC-4")
@pytest.mark.parametrize("mode", MODES)
async def test_values_json_cannot_hold_are_a_bad_request_not_internal(
        tmp_path: Path, mode: str) -> None:
    """Arguments that reach a desk tool without passing a wire (in-process) and hold what
    JSON cannot (a lone surrogate) are refused BAD_REQUEST, nothing written."""
    from mcp import Client

    store = SQLiteStore(tmp_path / "desk.sqlite3")
    server = DeskServer(store, principal=MANAGER)
    async with Client(server.server, mode=mode) as client:
        created = await client.call_tool("create_work_order",
                                         {"order": order_fields(goal="bad \ud800 goal")})
        track = await client.call_tool("get_track_record", {"worker": "agent:\ud800"})
        listed = await client.call_tool("list_work_orders", {})
    for result in (created, track):
        assert result.is_error and text_of(result).startswith("BAD_REQUEST: "), text_of(result)
    assert listed.structured_content is not None and listed.structured_content["count"] == 0
