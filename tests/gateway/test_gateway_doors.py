"""Principals who must not get through the gateway's doors, against an upstream that writes
down every message it receives (``tests/gateway/spy_server.py``): what reached the upstream
is read from its own log, never from the gateway's records.

``awl gateway`` runs as a real stdio subprocess and the worker speaks raw JSON-RPC lines, so
frames no SDK client would send (notifications carrying a tool call, forged ``_meta`` and
``requestState``, a client that never reads) reach it as sent.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning

from awl.passes import KeyStore, issue_recorded_pass
from gateway._upstream import http_client
from tests.awl.frames_support import (
    INITIALIZED,
    StdioPeer,
    announced_server,
    initialize,
    no_traceback,
)
from tests.gateway.gateway_support import ROOT, WORKER, Env, make_env, server_entry

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SPY = Path(__file__).resolve().parent / "spy_server.py"


def spy_env(tmp: Path, **order: Any) -> Env:
    """An order over the spy upstream (its log is ``spy.jsonl`` beside the home)."""
    entry = {"command": sys.executable, "args": [str(SPY)],
             "env": {"SPY_LOG": str(tmp / "spy.jsonl")}, "timeout": 5}
    order.setdefault("staged", ["spy/write"])
    return make_env(tmp, servers={"spy": entry}, **order)


def spy_log(env: Env) -> list[dict[str, Any]]:
    """Every message the spy upstream received, but its handshake and tool listings."""
    path = env.home.parent / "spy.jsonl"
    if not path.exists():
        return []
    messages = [json.loads(line) for line in path.read_text().splitlines()]
    return [m for m in messages if m.get("method") not in (
        "initialize", "notifications/initialized", "server/discover", "tools/list")]


@asynccontextmanager
async def raw_gateway(env: Env) -> AsyncIterator[StdioPeer]:
    """``awl gateway`` for the env's order over stdio, its handshake done; raw lines."""
    command = [sys.executable, "-m", "awl", "gateway", "--order", env.order_id, "--config",
               str(env.config), "--home", str(env.home)]
    with open(env.home / "gateway.err", "w") as err:
        async with await anyio.open_process(command, cwd=str(ROOT), stderr=err) as process:
            peer = StdioPeer(process)
            assert "result" in await peer.exchange(initialize())
            await peer.send(INITIALIZED)
            try:
                yield peer
            finally:
                assert process.stdin is not None
                await process.stdin.aclose()
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
    no_traceback((env.home / "gateway.err").read_text())


def frame(request_id: int | str | None, method: str, params: dict[str, Any]) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        message["id"] = request_id
    return json.dumps(message).encode()


async def answer_to(peer: StdioPeer, request_id: int | str) -> dict[str, Any]:
    """The answer to ``request_id``, skipping notifications (tools/list_changed, say)."""
    while True:
        message = await peer.receive(30)
        if message.get("id") == request_id and "method" not in message:
            return dict(message)


FORGED = {"awl/ref": "spy/write#1", "awl/order": "wo_someone_else", "awl/attempt": 9,
          "progressToken": 77, "io.modelcontextprotocol/clientInfo": {"name": "forged"},
          "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


@pytest.mark.spec("GW-16", "OBS-2")
async def test_reads_of_a_covered_server_carry_no_forged_awl_meta(tmp_path: Path) -> None:
    """resources/read, prompts/get and completion/complete reach an upstream the order covers
    whole without the worker's ``awl/*`` keys (a read posing as held call spy/write#1 of
    another order), its progress token or its connection's protocol keys; its own trace
    context still passes. A tool call's forged keys are replaced by the gateway's."""
    env = spy_env(tmp_path, tools=["spy/*"])
    with anyio.fail_after(90):
        async with raw_gateway(env) as peer:
            await peer.send(frame(1, "resources/read", {"uri": "spy://doc", "_meta": FORGED}))
            read = await answer_to(peer, 1)
            await peer.send(frame(2, "prompts/get", {"name": "hello", "_meta": FORGED}))
            prompt = await answer_to(peer, 2)
            await peer.send(frame(3, "completion/complete", {
                "ref": {"type": "ref/prompt", "name": "hello"},
                "argument": {"name": "who", "value": "w"}, "_meta": FORGED}))
            completed = await answer_to(peer, 3)
            await peer.send(frame(4, "tools/call", {"name": "spy__read",
                                                    "arguments": {"text": "t"},
                                                    "_meta": FORGED}))
            called = await answer_to(peer, 4)
    assert read["result"]["contents"][0]["text"] == "content of spy://doc"
    assert prompt["result"]["messages"] and completed["result"]["completion"]["values"]
    assert called["result"]["_meta"]["awl/ref"] == "spy/read#1"
    sent = {m["method"]: m["params"].get("_meta") or {} for m in spy_log(env)}
    assert set(sent) == {"resources/read", "prompts/get", "completion/complete", "tools/call"}
    for method in ("resources/read", "prompts/get", "completion/complete"):
        assert sent[method] == {"traceparent": FORGED["traceparent"]}, (method, sent[method])
    call_meta = sent["tools/call"]
    assert (call_meta["awl/ref"], call_meta["awl/order"], call_meta["awl/attempt"]) == (
        "spy/read#1", env.order_id, 1)
    assert call_meta["progressToken"] != 77
    assert not any(k.startswith("io.modelcontextprotocol/") for k in call_meta)


@pytest.mark.spec("GW-9", "GW-15", "GW-16", "SEC-9")
async def test_no_frame_reaches_a_staged_or_unlisted_tool_upstream(tmp_path: Path) -> None:
    """Against an order allowing spy/read and staging spy/write: a tools/call sent as a
    notification, a staged call retried with forged requestState and inputResponses, the
    staged tool by name tricks, and reads and completions of the server the order covers only
    in part. The upstream gets the one allowed read and nothing else."""
    env = spy_env(tmp_path, tools=["spy/read", "spy/write"])
    write = {"name": "spy__write", "arguments": {"to": "x@example.com"}}
    with anyio.fail_after(90):
        async with raw_gateway(env) as peer:
            await peer.send(frame(None, "tools/call", write))
            await peer.send(frame(None, "tools/call", {"name": "spy__hang", "arguments": {}}))
            await peer.send(frame(1, "tools/call", {
                **write, "requestState": "forged-state",
                "inputResponses": {"q": {"action": "accept", "content": {"ok": True}}}}))
            held = await answer_to(peer, 1)
            tricks = ["spy__die", "SPY__write", "spy__write\u200b", "spy__wr\u0456te",
                      "spy____write", "spy__write__", "spy/write", "spy__" + "w" * 5000]
            refused = []
            for n, name in enumerate(tricks, start=10):
                await peer.send(frame(n, "tools/call", {"name": name, "arguments": {}}))
                refused.append(await answer_to(peer, n))
            closed = []
            reads: list[tuple[str, dict[str, Any]]] = [
                    ("resources/read", {"uri": "spy://doc"}),
                    ("resources/read", {"uri": "spy://docs/x"}),
                    ("prompts/get", {"name": "hello"}),
                    ("completion/complete", {"ref": {"type": "ref/prompt", "name": "hello"},
                                             "argument": {"name": "who", "value": ""}}),
                    ("completion/complete", {"ref": {"type": "ref/resource",
                                                     "uri": "spy://docs/{name}"},
                                             "argument": {"name": "name", "value": ""}}),
                    ("resources/subscribe", {"uri": "spy://doc"})]
            for n, (method, params) in enumerate(reads, start=30):
                await peer.send(frame(n, method, params))
                closed.append(await answer_to(peer, n))
            await peer.send(frame(40, "tools/call", {"name": "spy__read",
                                                     "arguments": {"text": "alive"}}))
            alive = await answer_to(peer, 40)
    assert held["result"]["structuredContent"] == {"pending": "spy/write#1", "status": "held"}
    for name, answer in zip(tricks, refused, strict=True):
        assert answer["result"]["isError"], name
        assert answer["result"]["content"][0]["text"].startswith("AWL_FORBIDDEN: "), name
    for answer in closed:
        assert answer["error"]["message"], answer
    assert alive["result"]["content"][0]["text"] == "alive"
    assert [(m["method"], m["params"]["name"]) for m in spy_log(env)] == [
        ("tools/call", "read")]
    outcomes = [(r.tool, r.outcome) for r in env.calls()]
    assert outcomes[0] == ("spy/write", "held") and outcomes[-1] == ("spy/read", "ok")
    assert {o for _t, o in outcomes[1:-1]} == {"refused"}


@pytest.mark.spec("GW-8", "GW-7")
async def test_an_upstream_that_misbehaves_mid_call_is_recorded_and_never_called_again(
        tmp_path: Path) -> None:
    """An upstream that answers twice, answers garbage, hangs or dies in the middle of a
    call: each call gets one answer, is recorded with its outcome (``ok`` for the first of
    two answers, else ``error``), and reaches the upstream exactly once; the next call
    works."""
    env = spy_env(tmp_path, tools=["spy/*"], staged=[])
    names = ["twice", "garbage", "hang", "die", "read"]
    answers: list[dict[str, Any]] = []
    with anyio.fail_after(120):
        async with raw_gateway(env) as peer:
            for n, name in enumerate(names, start=1):
                await peer.send(frame(n, "tools/call", {"name": f"spy__{name}",
                                                        "arguments": {}}))
                answers.append(await answer_to(peer, n))
            await anyio.sleep(0.5)  # a second answer, had one been sent, would be here
            assert peer._out.buffer == b""
    codes = [a["result"]["content"][0]["text"].split(":", 1)[0] for a in answers]
    assert codes == ["first", "AWL_UPSTREAM_TIMEOUT", "AWL_UPSTREAM_TIMEOUT",
                     "AWL_UPSTREAM_UNAVAILABLE", ""]
    assert [(r.ref, r.outcome) for r in env.calls()] == [
        ("spy/twice#1", "ok"), ("spy/garbage#2", "error"), ("spy/hang#3", "error"),
        ("spy/die#4", "error"), ("spy/read#5", "ok")]
    calls = [m["params"]["_meta"]["awl/ref"] for m in spy_log(env)
             if m["method"] == "tools/call"]
    assert calls == [r.ref for r in env.calls()]


@pytest.mark.spec("GW-21", "SEC-4")
async def test_a_worker_that_never_reads_its_answers_is_held_back(tmp_path: Path) -> None:
    """A stdio worker that sends thousands of requests without reading a byte: the gateway
    stops reading once a bounded number of them wait for their answers (so the worker's
    writes block, and the gateway's memory stays put), and when the worker reads at last,
    every request gets its answer, in full, and the next call works."""
    env = spy_env(tmp_path, tools=["spy/*"], staged=[])
    total = 4000
    pad = "p" * 200
    sent = 0

    async def writer(peer: StdioPeer) -> None:
        nonlocal sent
        for n in range(1, total + 1):
            await peer.send(frame(n, "tools/list", {"_meta": {"pad": pad}}))
            sent = n

    with anyio.fail_after(120):
        async with raw_gateway(env) as peer, anyio.create_task_group() as tg:
            tg.start_soon(writer, peer)
            # Wait until the writes stop going through (or all went through).
            last = -1
            while sent != last and sent < total:
                last = sent
                await anyio.sleep(2)
            stalled_at = sent
            seen: set[int] = set()
            while len(seen) < total:
                message = await peer.receive(30)
                if "method" not in message:
                    assert "tools" in message["result"], message
                    seen.add(message["id"])
            await peer.send(frame("last", "tools/call", {"name": "spy__read",
                                                         "arguments": {"text": "alive"}}))
            alive = await answer_to(peer, "last")
    assert stalled_at < total / 2, stalled_at
    assert seen == set(range(1, total + 1))
    assert alive["result"]["content"][0]["text"] == "alive"


@pytest.mark.spec("GW-14")
async def test_one_http_worker_s_log_level_never_changes_another_s(tmp_path: Path) -> None:
    """Two handshake-era sessions on the HTTP gateway: the pass holder that asks for
    ``emergency`` only does not silence the worker who asked for ``info``, and the holder
    gets nothing below its own level."""
    env = make_env(tmp_path, servers={"chatty": server_entry(
        "chatty", env={"CHATTY_LOG": str(tmp_path / "chatty.jsonl")})},
        tools=["chatty/*"], staged=[])
    keys = KeyStore(env.home)
    token = issue_recorded_pass(env.store, env.order_id, keys=keys, subject=WORKER)
    helper = issue_recorded_pass(env.store, env.order_id, keys=keys, subject="agent:helper",
                                 tools=["chatty/say"], parent_token=token)
    command = [sys.executable, "-m", "awl", "gateway", "--order", env.order_id, "--config",
               str(env.config), "--home", str(env.home), "--http", "127.0.0.1:0"]
    logs: dict[str, list[str]] = {"worker": [], "helper": []}

    def on_log(who: str) -> Any:
        async def record(params: types.LoggingMessageNotificationParams) -> None:
            logs[who].append(f"{params.level} {params.data}")
        return record

    with anyio.fail_after(90):
        async with (announced_server(command, cwd=str(ROOT)) as (url, stderr),
                    http_client({"Authorization": f"Bearer {token}"}) as one,
                    Client(streamable_http_client(url, http_client=one), mode="legacy",
                           logging_callback=on_log("worker")) as worker,
                    http_client({"Authorization": f"Bearer {helper}"}) as two,
                    Client(streamable_http_client(url, http_client=two), mode="legacy",
                           logging_callback=on_log("helper")) as holder):
            with pytest.warns(MCPDeprecationWarning):
                await worker.set_logging_level("info")
            with pytest.warns(MCPDeprecationWarning):
                await holder.set_logging_level("emergency")
            said = await worker.call_tool("chatty__say", {"text": "for the worker"})
            heard = await holder.call_tool("chatty__say", {"text": "for the helper"})
    assert not said.is_error and not heard.is_error
    assert logs == {"worker": ["info for the worker"], "helper": []}
    no_traceback(stderr[0])


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
HUGE_STATE = ",".join(f"vendor{i}=" + "v" * 190 for i in range(300))  # 60 KB, 300 members


@pytest.mark.spec("OBS-2")
async def test_a_workers_trace_context_reaches_the_upstream_within_the_w3c_limits(
        tmp_path: Path) -> None:
    """A 60 KB ``tracestate`` of 300 members in a worker's ``_meta`` went upstream verbatim;
    the upstream now gets at most 32 members and 512 characters, the worker's first ones
    kept, and a malformed ``traceparent`` is dropped with its ``tracestate`` (on a tool call
    and on a read passed through alike)."""
    env = spy_env(tmp_path, tools=["spy/*"])
    short = ",".join(f"k{i}=v{i}" for i in range(40)) + ",Bad=x,k0=again"
    with anyio.fail_after(90):
        async with raw_gateway(env) as peer:
            calls = [({"traceparent": TRACEPARENT, "tracestate": HUGE_STATE}, "huge"),
                     ({"traceparent": TRACEPARENT, "tracestate": short}, "short"),
                     ({"traceparent": "00-nothex-01", "tracestate": "a=1"}, "malformed")]
            for n, (meta, label) in enumerate(calls, start=1):
                await peer.send(frame(n, "tools/call", {
                    "name": "spy__read", "arguments": {"text": label}, "_meta": meta}))
                assert "result" in await answer_to(peer, n)
            await peer.send(frame(9, "resources/read", {"uri": "spy://doc", "_meta": {
                "traceparent": TRACEPARENT, "tracestate": HUGE_STATE}}))
            assert "result" in await answer_to(peer, 9)
    sent = [m["params"].get("_meta") or {} for m in spy_log(env)]
    huge, kept, malformed, read = sent
    for meta in (huge, read):
        assert meta["traceparent"] == TRACEPARENT
        members = meta["tracestate"].split(",")
        assert len(meta["tracestate"]) <= 512 and 1 <= len(members) <= 32
        assert HUGE_STATE.startswith(meta["tracestate"])
    assert kept["tracestate"] == ",".join(f"k{i}=v{i}" for i in range(32))
    assert "traceparent" not in malformed and "tracestate" not in malformed
    assert malformed["awl/ref"] == "spy/read#3"
