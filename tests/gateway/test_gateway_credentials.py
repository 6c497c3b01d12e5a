"""Credential attacks on the HTTP gateway, sent as raw HTTP headers to 127.0.0.1.

A sub-agent holds a pass granting one read (``receiver/echo``, one call) under an order
whose worker may call every receiver tool. The receiver upstream logs every write that
reaches it, so what got through is read from its own log. Each attack first opens a session
with the sub-agent's own pass, then sends requests carrying a second credential next to it
or in place of it; each must be refused with 401 before any MCP message is read.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from awl.cli import main
from awl.mcp.transport import serve_http as serve_mcp_http
from awl.passes import KeyStore, issue_recorded_pass, unverified_claims
from gateway._serve import open_gateway, serve_http
from tests.gateway.gateway_support import (
    WORKER,
    Env,
    gateway_client,
    gateway_params,
    make_env,
    server_entry,
)

pytestmark = pytest.mark.anyio

SUB_AGENT = "agent:helper"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "raw", "version": "0"}}}


@dataclass
class Served:
    """A gateway served over HTTP for an env, and the passes of its worker and sub-agent."""

    env: Env
    url: str
    worker_pass: str
    sub_pass: str


@asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    log = tmp_path / "receiver.jsonl"
    env = make_env(tmp_path, servers={"receiver": server_entry(
        "receiver", env={"RECEIVER_LOG": str(log)})}, tools=["receiver/*"], staged=[])
    keys = KeyStore(env.home)
    worker_pass = issue_recorded_pass(env.store, env.order_id, keys=keys, subject=WORKER)
    sub_pass = issue_recorded_pass(env.store, env.order_id, keys=keys, subject=SUB_AGENT,
                                   parent_token=worker_pass, tools=["receiver/echo"],
                                   budget={"tool_calls": 1, "usd": 0})
    async with (open_gateway(env.order_id, env.config, store=env.store, home=env.home,
                             load_keys=True) as gw,
                anyio.create_task_group() as tg):
        url = await tg.start(serve_http, gw)
        yield Served(env, url, worker_pass, sub_pass)
        tg.cancel_scope.cancel()


def _rpc(n: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": n, "method": method, "params": params or {}}


async def _session(raw: httpx2.AsyncClient, url: str, token: str) -> str:
    """Open an MCP session with ``token`` alone, as an honest client would; its id."""
    headers = {**ACCEPT, "Authorization": f"Bearer {token}"}
    answer = await raw.post(url, json=INITIALIZE, headers=headers)
    assert answer.status_code == 200, answer.text
    session = answer.headers["mcp-session-id"]
    done = await raw.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                          headers={**headers, "mcp-session-id": session})
    assert done.status_code in (200, 202)
    return session


ATTACKS = {
    "basic_before_bearer": ["Basic eA==", "Bearer {sub}"],
    "bare_bearer_before_bearer": ["Bearer", "Bearer {sub}"],
    "token_scheme_before_bearer": ["Token abc", "Bearer {sub}"],
    "bearer_then_basic": ["Bearer {sub}", "Basic eA=="],
    "two_bearer_passes": ["Bearer {sub}", "Bearer {worker}"],
    "basic_alone": ["Basic eA=="],
    "bare_bearer_alone": ["Bearer"],
    "token_scheme_alone": ["Token abc"],
    "bearer_with_two_tokens": ["Bearer {sub} {worker}"],
    "bearer_comma_list": ["Bearer {sub}, Bearer {worker}"],
    "padded_pass": ["Bearer {sub}=="],
}


@pytest.mark.slow
@pytest.mark.spec("SEC-7", "BIND-7")
async def test_a_second_or_malformed_authorization_header_never_lifts_a_pass_to_the_worker(
        tmp_path: Path) -> None:
    """For every attack of :data:`ATTACKS`, each request with more than one Authorization
    header, or one that is not a single ``Bearer <token>``, gets 401: tools/list, a forbidden
    tool and the desk tools are never served, nothing reaches the upstream, nobody is
    ``acting_as`` the worker. (One gateway serves all of them, in one open session.)"""
    codes: dict[str, list[int]] = {}
    leaked: list[str] = []
    with anyio.fail_after(60):
        async with served(tmp_path) as s, httpx2.AsyncClient(timeout=30) as raw:
            session = await _session(raw, s.url, s.sub_pass)
            for attack, template in sorted(ATTACKS.items()):
                values = [v.format(sub=s.sub_pass, worker=s.worker_pass) for v in template]
                headers = [*ACCEPT.items(), ("mcp-session-id", session),
                           *(("Authorization", v) for v in values)]
                for n, (method, params) in enumerate([
                        ("tools/list", {}),
                        ("tools/call", {"name": "receiver__deliver",
                                        "arguments": {"to": "x", "body": "forbidden"}}),
                        ("tools/call", {"name": "awl_get_order", "arguments": {}}),
                ], start=2):
                    answer = await raw.post(s.url, content=json.dumps(_rpc(n, method, params)),
                                            headers=headers)
                    codes.setdefault(attack, []).append(answer.status_code)
                    if answer.status_code != 401 or answer.json()["error"] != "invalid_token":
                        leaked.append(f"{attack} {method}: {answer.text[:200]}")
            calls = s.env.calls()
    log = tmp_path / "receiver.jsonl"
    assert codes == {attack: [401, 401, 401] for attack in ATTACKS}, leaked
    assert not log.exists() or log.read_text() == ""
    assert calls == []


@pytest.mark.slow
@pytest.mark.spec("SEC-7", "BIND-7")
async def test_the_sub_agents_own_pass_alone_still_sees_only_its_grant(tmp_path: Path) -> None:
    """The control for the attacks above: one well-formed Bearer header with the sub-agent's
    pass lists only its granted tool and acts as the sub-agent."""
    with anyio.fail_after(60):
        async with served(tmp_path) as s, httpx2.AsyncClient(timeout=30) as raw:
            session = await _session(raw, s.url, s.sub_pass)
            headers = {**ACCEPT, "mcp-session-id": session,
                       "Authorization": f"bearer  {s.sub_pass}"}
            listed = await raw.post(s.url, json=_rpc(2, "tools/list"), headers=headers)
            order = await raw.post(s.url, json=_rpc(3, "tools/call", {
                "name": "awl_get_order", "arguments": {}}), headers=headers)
    assert listed.status_code == 200 and order.status_code == 200
    names = [t["name"] for t in _message(listed.text)["result"]["tools"]]
    assert [n for n in names if "__" in n] == ["receiver__echo"]
    assert _message(order.text)["result"]["structuredContent"]["acting_as"] == SUB_AGENT


def _message(body: str) -> dict[str, Any]:
    """The JSON-RPC message of an answer sent as JSON or as one server-sent event."""
    text = body.strip()
    if text.startswith("{"):
        found: dict[str, Any] = json.loads(text)
        return found
    data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    found = json.loads(data[-1])
    return found


@pytest.mark.slow
@pytest.mark.spec("BIND-7")
async def test_an_http_request_without_a_verified_pass_never_runs_as_the_worker(
        tmp_path: Path) -> None:
    """Even served by a transport that lets every request in unauthenticated (a wiring
    mistake), the gateway lists no upstream tool, forwards nothing and answers no desk tool:
    over HTTP it acts only under the pass the transport verified."""
    log = tmp_path / "receiver.jsonl"
    env = make_env(tmp_path, servers={"receiver": server_entry(
        "receiver", env={"RECEIVER_LOG": str(log)})}, tools=["receiver/*"], staged=[])

    async def let_in(token: str | None) -> None:
        return None

    with anyio.fail_after(60):
        async with (open_gateway(env.order_id, env.config, store=env.store, home=env.home,
                                 load_keys=True) as gw,
                    anyio.create_task_group() as tg,
                    httpx2.AsyncClient(timeout=30) as raw):
            url = await tg.start(serve_mcp_http, gw.server, "127.0.0.1", 0, let_in)
            first = await raw.post(url, json=INITIALIZE, headers=ACCEPT)
            headers = {**ACCEPT, "mcp-session-id": first.headers["mcp-session-id"]}
            answers = [await raw.post(url, json=_rpc(n, method, params), headers=headers)
                       for n, (method, params) in enumerate([
                           ("tools/list", {}),
                           ("tools/call", {"name": "receiver__deliver",
                                           "arguments": {"to": "x", "body": "b"}}),
                           ("tools/call", {"name": "awl_get_order", "arguments": {}}),
                       ], start=2)]
            tg.cancel_scope.cancel()
    messages = [_message(a.text) for a in answers]
    assert [("error" in m) or m["result"].get("isError") for m in messages] == [True] * 3
    assert not any(WORKER in a.text for a in answers)
    assert not log.exists() or log.read_text() == ""
    assert env.calls() == []


@pytest.mark.slow
@pytest.mark.spec("DP-11")
def test_a_padded_pass_is_refused_by_awl_gateway_pass(tmp_path: Path) -> None:
    """``awl gateway --pass "$T=="`` (the same bytes, padded) refuses to start, in one line
    naming the problem; the pass as issued starts and serves (stdin closed: it ends)."""
    env = make_env(tmp_path, servers={}, tools=["notes/*"], staged=[])
    token = issue_recorded_pass(env.store, env.order_id, keys=KeyStore(env.home),
                                subject=WORKER)
    runs = {}
    for name, presented in (("padded", token + "=="), ("as issued", token)):
        params = gateway_params(env, "--pass", presented)
        runs[name] = subprocess.run([params.command, *params.args], env=params.env,
                                    cwd=params.cwd, stdin=subprocess.DEVNULL,
                                    capture_output=True, text=True, timeout=60)
    padded = runs["padded"]
    assert padded.returncode != 0
    assert len(padded.stderr.strip().splitlines()) == 1 and "not canonical" in padded.stderr
    assert runs["as issued"].returncode == 0, runs["as issued"].stderr


@pytest.mark.slow
@pytest.mark.spec("DP-13")
async def test_a_running_gateway_trusts_rotated_keys_and_drops_retired_ones(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With the gateway serving, ``awl pass rotate`` makes a new key whose passes are accepted
    at once, and ``awl pass retire OLD`` makes every pass the old key signed (and the
    sub-agent's pass derived from one) 401 from the next request, an open session included."""
    with anyio.fail_after(60):
        async with served(tmp_path) as s, httpx2.AsyncClient(timeout=30) as raw:
            keys = KeyStore(s.env.home)
            old = keys.current_kid
            session = await _session(raw, s.url, s.worker_pass)
            assert main(["pass", "rotate", "--home", str(s.env.home)]) == 0
            fresh = issue_recorded_pass(s.env.store, s.env.order_id, keys=keys, subject=WORKER)
            after_rotate = await raw.post(s.url, json=INITIALIZE, headers={
                **ACCEPT, "Authorization": f"Bearer {fresh}"})
            assert main(["pass", "retire", old, "--home", str(s.env.home)]) == 0
            retired = {name: await raw.post(s.url, json=INITIALIZE, headers={
                **ACCEPT, "Authorization": f"Bearer {token}"})
                for name, token in (("worker", s.worker_pass), ("sub", s.sub_pass),
                                    ("fresh", fresh))}
            in_session = await raw.post(s.url, json=_rpc(2, "tools/call", {
                "name": "receiver__deliver", "arguments": {"to": "x", "body": "b"}}), headers={
                **ACCEPT, "mcp-session-id": session, "Authorization": f"Bearer {s.worker_pass}"})
    out = capsys.readouterr().out
    assert after_rotate.status_code == 200
    assert f"retired key {old}" in out
    assert retired["worker"].status_code == 401 and retired["sub"].status_code == 401
    assert "unknown_kid" in retired["worker"].json()["error_description"]
    assert retired["fresh"].status_code == 200
    assert in_session.status_code == 401
    assert not (tmp_path / "receiver.jsonl").exists()


@pytest.mark.spec("DP-13")
def test_awl_pass_retire_refuses_the_current_key_and_unknown_kids(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Retiring the current key would stop all signing: it is refused in one line, as is a kid
    the desk does not have; neither deletes anything."""
    keys = KeyStore(tmp_path)
    current = keys.current_kid
    codes = [main(["pass", "retire", current, "--home", str(tmp_path)]),
             main(["pass", "retire", "no-such-kid", "--home", str(tmp_path)])]
    err = capsys.readouterr().err.splitlines()
    assert codes == [1, 1] and len(err) == 2
    assert "awl pass rotate" in err[0] and "NOT_FOUND" in err[1]
    assert keys.kids() == [current]


def _command_lines() -> list[str]:
    """Every process's command line on this machine, as ``ps`` would show it to anyone."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return lines


@pytest.mark.slow
@pytest.mark.spec("SEC-11")
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
@pytest.mark.parametrize("way", ["--pass-file", "AWL_PASS"])
async def test_a_pass_given_by_file_or_environment_never_shows_in_the_process_list(
        tmp_path: Path, way: str) -> None:
    """``awl gateway --pass-file PATH`` and ``AWL_PASS`` run the worker under the pass (the
    desk tools act as its holder) while no process's command line holds the token."""
    env = make_env(tmp_path, servers={}, tools=["notes/*"], staged=[])
    keys = KeyStore(env.home)
    worker = issue_recorded_pass(env.store, env.order_id, keys=keys, subject=WORKER)
    token = issue_recorded_pass(env.store, env.order_id, keys=keys, subject=SUB_AGENT,
                                parent_token=worker, tools=["notes/search_notes"])
    pass_file = tmp_path / "helper.pass"
    pass_file.write_text(token + "\n")
    extra, env_extra = ((["--pass-file", str(pass_file)], None) if way == "--pass-file"
                        else ([], {"AWL_PASS": token}))
    with anyio.fail_after(60):
        async with gateway_client(env, *extra, env_extra=env_extra) as client:
            order = await client.call_tool("awl_get_order", {})
            seen = _command_lines()
    assert order.structured_content is not None
    assert order.structured_content["acting_as"] == SUB_AGENT
    assert any("gateway" in line and str(env.home) in line for line in seen)
    assert not any(token in line or token[-40:] in line for line in seen)


@pytest.mark.spec("SEC-11")
@pytest.mark.parametrize(("content", "problem"), [
    (None, "cannot read the pass file"), ("", "must hold one pass token")])
def test_a_missing_or_empty_pass_file_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None,
        problem: str) -> None:
    """A pass file that cannot be read, or holds nothing, stops `awl gateway` in one line."""
    env = make_env(tmp_path, servers={}, tools=["notes/*"], staged=[])
    pass_file = tmp_path / "worker.pass"
    if content is not None:
        pass_file.write_text(content)
    code = main(["gateway", "--order", env.order_id, "--config", str(env.config),
                 "--home", str(env.home), "--pass-file", str(pass_file)])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and problem in err


@pytest.mark.spec("SEC-11")
@pytest.mark.parametrize(("words", "problem"), [
    (["--pass", ""], "--pass is empty"),
    (["--pass", " \n"], "--pass is empty"),
    (["--http", ""], "is not HOST:PORT"),
    (["--commit", "--pass", ""], "drop --http, --pass"),
    (["--commit", "--pass-file", ""], "drop --http, --pass"),
    (["--commit", "--http", ""], "drop --http, --pass"),
])
def test_an_empty_pass_or_address_is_refused_not_dropped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str],
        problem: str) -> None:
    """``--pass "$T"`` with T unset is refused in one line: before, the gateway ran as the
    order's worker, with the whole order rather than the narrower pass; ``--http ""`` served
    stdio, and ``--commit`` took an empty --pass, --pass-file or --http silently."""
    env = make_env(tmp_path, servers={}, tools=["notes/*"], staged=[])
    code = main(["gateway", "--order", env.order_id, "--config", str(env.config),
                 "--home", str(env.home), *words])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and problem in err


@pytest.mark.slow
@pytest.mark.spec("DP-14", "P9")
async def test_a_pass_for_another_issuer_or_dated_ahead_gets_401(tmp_path: Path) -> None:
    """Signed with the desk's own key but naming another issuer, or dated a minute ahead of
    the gateway's clock: each is refused at the door with its reason, and nothing runs."""
    with anyio.fail_after(60):
        async with served(tmp_path) as s, httpx2.AsyncClient(timeout=30) as raw:
            keys = KeyStore(s.env.home)
            claims = unverified_claims(s.worker_pass)[1]
            forged = {"wrong_issuer": keys.sign({**claims, "iss": "awl:other-desk"}),
                      "issued_in_future": keys.sign({**claims, "iat": int(time.time()) + 90})}
            answers = {reason: await raw.post(s.url, json=INITIALIZE, headers={
                **ACCEPT, "Authorization": f"Bearer {token}"})
                for reason, token in forged.items()}
    for reason, answer in answers.items():
        assert answer.status_code == 401
        assert answer.json()["error_description"].startswith(f"{reason}:")
    assert not (tmp_path / "receiver.jsonl").exists()
