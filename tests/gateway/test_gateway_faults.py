"""Upstream faults become tool errors, and no request, however malformed, stops the gateway."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from mcp_types import RequestParamsMeta

from awl.passes import KeyStore, issue_recorded_pass
from gateway._gateway import UNRESOLVED_TOOL
from gateway._results import TRUNCATED_META_KEY
from gateway._serve import PASS_ENV
from tests.gateway.gateway_support import (
    ROOT,
    WORKER,
    Env,
    connect,
    gateway_client,
    make_env,
    server_entry,
    text,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.mark.spec("GW-8")
async def test_upstream_faults_become_tool_errors_and_the_rest_keeps_serving(
        tmp_path: Path) -> None:
    """A crash, a timeout and an oversized answer are bounded; other upstreams keep working."""
    servers = {
        "flaky": server_entry("flaky", timeout=1, max_result_bytes=2048),
        "notes": server_entry("notes", env={"OUTBOX_PATH": str(tmp_path / "outbox.jsonl")}),
    }
    env = make_env(tmp_path, servers=servers, staged=[], budget={"tool_calls": 20})
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            before = await client.call_tool("flaky__pid", {})
            crash = await client.call_tool("flaky__crash", {})
            notes = await client.call_tool("notes__search_notes", {"query": "refund"})
            after = await client.call_tool("flaky__pid", {})
            slow = await client.call_tool("flaky__slow", {"seconds": 30})
            big = await client.call_tool("flaky__big", {"n": 100_000})
            # An open map on the wire; mypy does not read the TypedDict's extra_items yet.
            meta = cast(RequestParamsMeta, {"awl/ref": "flaky/echo#99", "trace": "t-1"})
            echo = await client.call_tool("flaky__echo", {"a": 1}, meta=meta)
    assert not before.is_error and not after.is_error
    assert crash.is_error and text(crash).startswith("AWL_UPSTREAM_UNAVAILABLE: ")
    assert not notes.is_error
    assert before.structured_content != after.structured_content  # a restarted process
    assert slow.is_error and text(slow).startswith("AWL_UPSTREAM_TIMEOUT: ")
    assert not big.is_error and big.meta is not None and TRUNCATED_META_KEY in big.meta
    assert echo.structured_content is not None
    sent = echo.structured_content["meta"]
    assert (sent["awl/ref"], sent["awl/order"], sent["awl/attempt"]) == (
        "flaky/echo#7", env.order_id, 1)
    assert sent["trace"] == "t-1"
    records = env.calls()
    assert [r.outcome for r in records] == ["ok", "error", "ok", "ok", "error", "ok", "ok"]
    assert records[1].error == text(crash)
    assert len(json.dumps(records[5].result)) < 4096


async def _answers(process: Process, wanted: set[int]) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    assert process.stdout is not None
    buffer = ""
    async for chunk in TextReceiveStream(process.stdout):
        buffer += chunk
        while "\n" in buffer:
            line, buffer = buffer.split("\n", 1)
            message = json.loads(line)
            if message.get("id") in wanted:
                found[message["id"]] = message
        if wanted <= found.keys():
            return found
    raise AssertionError(f"the gateway stopped answering; got {sorted(found)}")


INITIALIZE = [
    json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}),
    json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
]


def _call(request_id: int, name: str, arguments: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": name, "arguments": arguments}})


async def _raw_session(env: Env, lines: list[str], wanted: set[int], *,
                       kill: bool = False) -> dict[int, dict[str, Any]]:
    """Run awl gateway, write ``lines`` to it, and wait for the answers to ``wanted``.

    Then close its input and let it exit, or (``kill``) SIGKILL it at once.
    """
    args = ["-m", "awl", "gateway", "--order", env.order_id, "--config", str(env.config),
            "--home", str(env.home)]
    with open(env.home / "gateway.err", "w") as errlog:
        async with await anyio.open_process([sys.executable, *args], cwd=str(ROOT),
                                            stderr=errlog) as process:
            assert process.stdin is not None
            for line in lines:
                await process.stdin.send((line + "\n").encode())
            answers = await _answers(process, wanted)
            if kill:
                process.kill()
            else:
                await process.stdin.aclose()
            await process.wait()
    return answers


@pytest.mark.spec("GW-7")
async def test_an_answered_call_is_on_record_when_the_gateway_is_killed(tmp_path: Path) -> None:
    """kill -9 of the gateway right after an answer leaves that call recorded with its result."""
    env = make_env(tmp_path, staged=["receiver/create_issue"])
    lines = [*INITIALIZE, _call(2, "receiver__deliver", {"to": "ops"}),
             _call(3, "receiver__create_issue", {"title": "x"}), _call(4, "mail__send", {})]
    with anyio.fail_after(60):
        answers = await _raw_session(env, lines, {2, 3, 4}, kill=True)
    # The gateway may take the three requests in any order, so records are matched by ref.
    records = {r.ref: r for r in env.calls()}
    delivered = records[answers[2]["result"]["_meta"]["awl/ref"]]
    held = records[answers[3]["result"]["_meta"]["awl/ref"]]
    [refused] = [r for r in records.values() if r.outcome == "refused"]
    assert len(records) == 3
    assert (delivered.tool, delivered.outcome) == ("receiver/deliver", "ok")
    assert delivered.result is not None
    assert delivered.result["structuredContent"] == answers[2]["result"]["structuredContent"]
    assert (held.tool, held.outcome, held.arguments) == (
        "receiver/create_issue", "held", {"title": "x"})
    assert answers[4]["result"]["isError"] is True
    assert (refused.tool, refused.error) == (
        UNRESOLVED_TOOL, answers[4]["result"]["content"][0]["text"])


@pytest.mark.spec("GW-8")
async def test_malformed_requests_get_protocol_errors_and_the_gateway_lives(
        tmp_path: Path) -> None:
    """Garbage, bad params and unknown methods get errors; the next good call still works."""
    env = make_env(tmp_path, staged=[])
    lines = [
        "this is not json",
        json.dumps([1, 2, 3]),
        *INITIALIZE,
        json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": 5}}),
        _call(3, "receiver__echo", "not an object"),
        json.dumps({"jsonrpc": "2.0", "id": 4, "method": "no/such/method"}),
        _call(5, "receiver__echo", {"text": ""}),
        _call(6, "receiver__echo", {"text": "alive"}),
    ]
    with anyio.fail_after(60):
        answers = await _raw_session(env, lines, {1, 2, 3, 4, 5, 6})
    assert "result" in answers[1]
    for bad in (2, 3, 4):
        assert "error" in answers[bad], answers[bad]
    assert answers[4]["error"]["code"] == -32601
    assert answers[6]["result"]["structuredContent"] == {"text": "alive"}
    assert [r.outcome for r in env.calls()] == ["ok", "ok"]


async def test_the_gateway_command_serves_over_stdio(tmp_path: Path) -> None:
    """awl gateway runs as a stdio MCP server, here under a pass taken from AWL_PASS."""
    env = make_env(tmp_path)
    token = issue_recorded_pass(env.store, env.order_id, keys=KeyStore(env.home),
                                subject=WORKER)
    with anyio.fail_after(60):
        async with gateway_client(env, env_extra={PASS_ENV: token}) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            held = await client.call_tool("receiver__create_issue", {"title": "Outage"})
            echo = await client.call_tool("receiver__echo", {"text": "hi"})
    assert {"receiver__deliver", "notes__send_email", "awl_submit_report"} <= names
    assert text(held) == "pending:receiver/create_issue#1"
    assert echo.structured_content == {"text": "hi"}
    assert env.deliveries() == []
    jtis = {r.pass_jti for r in env.calls()}
    assert len(jtis) == 1 and None not in jtis


@pytest.mark.spec("SEC-4", "GW-8")
async def test_an_upstream_writing_lines_that_are_not_json_rpc_costs_one_line_each(
        tmp_path: Path) -> None:
    """An upstream that writes a blank line, [1,2], a 5,000-digit number and plain text before
    each answer is still served; each such line is one line on the gateway's stderr naming
    the upstream, never a traceback."""
    env = make_env(tmp_path, staged=[], tools=["junk/*"],
                   servers={"junk": server_entry("junk")})
    with anyio.fail_after(60):
        async with gateway_client(env) as client:
            first = await client.call_tool("junk__echo", {"text": "one"})
            second = await client.call_tool("junk__echo", {"text": "two"})
    assert (text(first), text(second)) == ("one", "two")
    stderr = (env.home / "gateway.err").read_text()
    assert "Traceback" not in stderr, stderr[-3000:]
    ignored = [line for line in stderr.splitlines() if "not a JSON-RPC message" in line]
    assert ignored and all("'junk'" in line for line in ignored), stderr[-3000:]
