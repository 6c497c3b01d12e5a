"""``awl connect``: the stdio bridge to ``awl gateway --http`` (SPEC BIND-30, BIND-31).

Every test runs real processes: the gateway as ``awl gateway --http`` on 127.0.0.1 in front
of the chatty test server (a subprocess that logs every request reaching it), the bridge as
``python -m awl connect``, and the worker as the MCP SDK's client over the bridge's stdio
(or raw JSON lines, where a test needs to see each message). What reached the upstream is
read from its own log.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters, stdio_client

from awl.passes import KeyStore, issue_recorded_pass
from tests.connect_support import ROOT, connect_command, http_gateway
from tests.gateway.gateway_support import WORKER, Env, make_env, server_entry, text
from tests.gateway.test_gateway_relay import elicitation, list_roots, sampling
from tests.servers.receiver import read_log

pytestmark = [pytest.mark.slow]

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "raw", "version": "0"}}}


def _env(tmp: Path, *, upstream: str = "modern") -> tuple[Env, Path]:
    era = {"CHATTY_ERA": "legacy"} if upstream == "legacy" else {}
    env = make_env(tmp, servers={"chatty": server_entry(
        "chatty", env={"CHATTY_LOG": str(tmp / "chatty.jsonl"), **era})},
        tools=["chatty/*"], staged=[])
    token = issue_recorded_pass(env.store, env.order_id, keys=KeyStore(env.home),
                                subject=WORKER)
    pass_file = tmp / "worker.pass"
    pass_file.write_text(token + "\n", encoding="utf-8")
    pass_file.chmod(0o600)
    return env, pass_file


def _upstream_log(tmp: Path) -> list[dict[str, Any]]:
    return read_log(str(tmp / "chatty.jsonl"))


def _params(url: str, pass_file: Path) -> StdioServerParameters:
    command = connect_command(url, pass_file)
    return StdioServerParameters(command=command[0], args=list(command[1:]),
                                 env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"]})


@pytest.fixture
def gateway(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Env, Path, str]]:
    """The chatty order served by ``awl gateway --http``: (env, pass file, URL)."""
    upstream = getattr(request, "param", "modern")
    env, pass_file = _env(tmp_path, upstream=upstream)
    with http_gateway(env.order_id, env.config, env.home,
                      errlog=tmp_path / "gateway.err") as (url, _):
        yield env, pass_file, url


@pytest.mark.anyio
@pytest.mark.spec("BIND-30")
@pytest.mark.parametrize(("mode", "gateway"), [("legacy", "legacy"),
                                               ("2026-07-28", "modern")],
                         indirect=["gateway"])
async def test_every_message_passes_both_ways(tmp_path: Path, mode: str,
                                              gateway: tuple[Env, Path, str]) -> None:
    """Through the bridge, in either protocol era: the tool list, a call's progress, a log
    message, the upstream's questions (sampling, elicitation, roots: server-to-client
    requests in the handshake era, input_required rounds in 2026-07-28) and their answers,
    and a cancellation, which reaches the upstream."""
    env, pass_file, url = gateway
    steps: list[tuple[float, float | None, str | None]] = []
    logs: list[Any] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append((progress, total, message))

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append((params.level, params.data))

    answers: dict[str, str] = {}
    with anyio.fail_after(90), open(tmp_path / "bridge.err", "w") as errlog:
        async with Client(stdio_client(_params(url, pass_file), errlog=errlog), mode=mode,
                          sampling_callback=sampling, elicitation_callback=elicitation,
                          list_roots_callback=list_roots, logging_callback=on_log,
                          log_level="info") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            stepped = await client.call_tool("chatty__steps", {"n": 3},
                                             progress_callback=on_progress)
            said = await client.call_tool("chatty__say", {"text": "half way there"})
            for kind in ("sampling", "elicitation", "roots"):
                answer = await client.call_tool("chatty__ask", {"kind": kind})
                answers[kind] = text(answer)
            async with anyio.create_task_group() as tg:
                async def sleep() -> None:
                    await client.call_tool("chatty__sleep", {"seconds": 30})

                tg.start_soon(sleep)
                while not any(e.get("name") == "sleep" for e in _upstream_log(tmp_path)):
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
            while not any("cancelled" in e for e in _upstream_log(tmp_path)):
                await anyio.sleep(0.05)
            after = await client.call_tool("chatty__steps", {"n": 1})
    assert {"chatty__steps", "chatty__ask", "awl_get_order"} <= names
    assert text(stepped) == "done 3" and text(after) == "done 1"
    assert steps == [(1, 3, "step 1 of 3"), (2, 3, "step 2 of 3"), (3, 3, "step 3 of 3")]
    assert text(said) == "said" and logs == [("info", "half way there")]
    assert answers == {"sampling": "sampled: 4",
                       "elicitation": 'elicited: accept {"name": "Ana"}',
                       "roots": "roots: file:///work/repo"}
    sleep_ref = next(r.ref for r in env.calls() if r.tool == "chatty/sleep")
    assert {"cancelled": sleep_ref} in _upstream_log(tmp_path)
    assert (tmp_path / "bridge.err").read_text() == ""


def _bridge(url: str, pass_file: Path | str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*connect_command(url, Path(pass_file)), *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"]})


def _send(process: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert process.stdin is not None
    process.stdin.write(json.dumps(message).encode() + b"\n")
    process.stdin.flush()


def _receive(process: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, "the bridge closed stdout"
    answer: dict[str, Any] = json.loads(line)
    return answer


def _ended(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    """The bridge's exit code and stderr, once it exits by itself (stdin still open)."""
    assert process.stderr is not None
    code = process.wait(30)
    return code, process.stderr.read().decode()


def _one_line(said: str) -> str:
    assert said.count("\n") == 1 and "Traceback" not in said, said
    return said.strip()


@pytest.mark.spec("BIND-31")
def test_a_bad_pass_file_or_url_is_one_line(tmp_path: Path) -> None:
    """A pass file that is missing, unreadable or holds no token, and a URL that is no
    http(s) address, stop the bridge before it connects, in one line each (exit 2)."""
    empty = tmp_path / "empty.pass"
    empty.write_text("  \n")
    two = tmp_path / "two.pass"
    two.write_text("one two\n")
    good = tmp_path / "good.pass"
    good.write_text("token\n")
    cases = [("http://127.0.0.1:9/mcp", str(tmp_path / "missing.pass"),
              "cannot read the pass file"),
             ("http://127.0.0.1:9/mcp", str(empty), "must hold one pass token"),
             ("http://127.0.0.1:9/mcp", str(two), "must hold one pass token"),
             ("127.0.0.1:8765", str(good), "is not an http:// or https:// address"),
             ("ftp://127.0.0.1/mcp", str(good), "is not an http:// or https:// address"),
             ("http://127.0.0.1:port/mcp", str(good), "is not an http:// or https:// address")]
    for url, pass_file, expected in cases:
        done = subprocess.run([*connect_command(url, Path(pass_file))], capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=ROOT,
                              env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"]})
        assert done.returncode == 2, (url, pass_file, done.stderr)
        assert expected in _one_line(done.stderr) and done.stdout == ""


@pytest.mark.spec("BIND-31")
def test_an_unreachable_gateway_is_one_line(tmp_path: Path) -> None:
    """Nothing listens at the URL: the first message ends the bridge, in one line."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pass_file = tmp_path / "w.pass"
    pass_file.write_text("token\n")
    url = f"http://127.0.0.1:{port}/mcp"
    with _bridge(url, pass_file) as process:
        _send(process, INITIALIZE)
        code, said = _ended(process)
    assert code == 1
    line = _one_line(said)
    assert line.startswith(f"awl: UNAVAILABLE: cannot reach the gateway at {url}"), line
    assert "awl gateway --http" in line


@pytest.mark.spec("BIND-31")
def test_a_refused_pass_is_one_line(gateway: tuple[Env, Path, str], tmp_path: Path) -> None:
    """A pass the gateway refuses (a forged signature): 401, said in one line with the
    gateway's reason, and the bridge ends; nothing reached the upstream."""
    env, pass_file, url = gateway
    token = pass_file.read_text().strip()
    forged = tmp_path / "forged.pass"
    forged.write_text(token[:-10] + ("A" if token[-10] != "A" else "B") + token[-9:])
    with _bridge(url, forged) as process:
        _send(process, INITIALIZE)
        code, said = _ended(process)
    assert code == 1
    line = _one_line(said)
    assert f"the gateway at {url} refused the pass (401: " in line, line
    assert "bad_signature" in line and "awl pass issue" in line
    assert _upstream_log(tmp_path) == [] and env.calls() == []


@pytest.mark.spec("BIND-30", "BIND-31")
def test_the_bridge_ends_when_stdin_closes_or_the_gateway_goes_away(tmp_path: Path) -> None:
    """Raw JSON lines over the bridge: it answers, ends with exit 0 when its stdin closes;
    a second bridge whose gateway is stopped mid-session ends (on losing its session stream,
    or at its next message), in one line saying the gateway went away."""
    env, pass_file = _env(tmp_path)
    with http_gateway(env.order_id, env.config, env.home) as (url, gateway_process):
        with _bridge(url, pass_file) as first:
            _send(first, INITIALIZE)
            assert _receive(first)["result"]["protocolVersion"] == "2025-11-25"
            _send(first, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            _send(first, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            listed = _receive(first)
            assert "chatty__steps" in {t["name"] for t in listed["result"]["tools"]}
            assert first.stdin is not None and first.stderr is not None
            first.stdin.close()
            assert first.wait(30) == 0
            assert first.stderr.read() == b""

        with _bridge(url, pass_file) as second:
            _send(second, INITIALIZE)
            assert "result" in _receive(second)
            _send(second, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            gateway_process.terminate()
            gateway_process.wait(30)
            # It may have ended already, on losing its session stream; else this ends it.
            with contextlib.suppress(BrokenPipeError):
                _send(second, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            code, said = _ended(second)
    assert code == 1
    line = _one_line(said)
    assert line.startswith(f"awl: UNAVAILABLE: the gateway at {url} went away"), line
    assert "restart the MCP client" in line


@pytest.mark.spec("BIND-31")
def test_a_session_the_restarted_gateway_does_not_have_is_one_line(tmp_path: Path) -> None:
    """The gateway restarted on the same address: it answers the old session 404, and the
    bridge ends in one line saying to restart the client. (No `initialized` is sent, so
    the bridge opens no session stream, whose loss would end it first as a gateway gone.)"""
    env, pass_file = _env(tmp_path)
    with (http_gateway(env.order_id, env.config, env.home) as (url, first),
          _bridge(url, pass_file) as process):
        _send(process, INITIALIZE)
        assert "result" in _receive(process)
        first.terminate()
        first.wait(30)
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        with http_gateway(env.order_id, env.config, env.home, port=port):
            _send(process, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            code, said = _ended(process)
    assert code == 1
    line = _one_line(said)
    assert f"the gateway at {url} no longer has this session" in line, line
    assert "restart the MCP client" in line


def test_a_line_that_is_no_message_is_answered_by_the_bridge(tmp_path: Path) -> None:
    """A line that is not JSON-RPC is answered with a JSON-RPC error (-32700 or -32600, id
    null) by the bridge itself, which goes on; nothing of it is sent anywhere."""
    pass_file = tmp_path / "w.pass"
    pass_file.write_text("token\n")
    with _bridge("http://127.0.0.1:9/mcp", pass_file) as process:
        assert process.stdin is not None
        process.stdin.write(b"not json\n\n[1, 2]\n")
        process.stdin.flush()
        parse, invalid = _receive(process), _receive(process)
        process.stdin.close()
        assert process.wait(30) == 0
    assert parse["error"]["code"] == -32700 and parse["id"] is None
    assert invalid["error"]["code"] == -32600 and invalid["id"] is None


def test_connect_is_in_the_command_s_help() -> None:
    """`awl --help` lists connect; its own help says it holds nothing but the pass."""
    listed = subprocess.run([sys.executable, "-m", "awl", "--help"], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    own = subprocess.run([sys.executable, "-m", "awl", "connect", "--help"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "connect" in listed.stdout
    assert "holds nothing but the pass" in " ".join(own.stdout.split())
