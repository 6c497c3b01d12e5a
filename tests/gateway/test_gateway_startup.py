"""Upstreams start in the background (GW-17): a hanging one holds up neither ``initialize`` nor
``tools/list``, one that comes up late is announced with ``tools/list_changed``, and one that
cannot start answers its tools with the reason and is tried again after a short backoff."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, stdio_client

from gateway._gateway import UNRESOLVED_TOOL
from gateway._serve import open_gateway
from gateway._upstream import RETRY_FIRST
from tests.awl.server_support import MODES
from tests.gateway.gateway_support import (
    ROOT,
    SERVERS,
    connect,
    gateway_params,
    make_env,
    server_entry,
    text,
    time_entry,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

HANGING = {"command": "sh", "args": ["-c", "cat > /dev/null"]}
"""Starts, reads its stdin, and never answers the handshake."""


def _late_server(path: Path, receiver_log: Path, *, delay: float = 0) -> Path:
    """A shell script that (after ``delay`` seconds) runs the receiver test server."""
    path.write_text(
        "#!/bin/sh\n"
        f"sleep {delay}\n"
        f"PYTHONPATH='{ROOT}' RECEIVER_LOG='{receiver_log}' "
        f"exec '{sys.executable}' '{SERVERS / 'receiver.py'}'\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.spec("GW-17")
async def test_a_hanging_upstream_costs_only_its_own_connect_timeout(
        tmp_path: Path) -> None:
    """`awl gateway` with one upstream that never finishes its handshake (connect_timeout
    2 s) answers initialize at once, and its first tools/list after that server's 2 s (not
    the 20 s startup_wait) with the healthy upstream's tools in it."""
    env = make_env(tmp_path, gateway={}, servers={
        "hang": {**HANGING, "connect_timeout": 2},
        "receiver": server_entry("receiver", env={"RECEIVER_LOG": str(tmp_path / "r.jsonl")}),
    })
    with anyio.fail_after(60), open(env.home / "gateway.err", "w") as errlog:
        began = time.monotonic()
        async with Client(stdio_client(gateway_params(env), errlog=errlog)) as client:
            initialized = time.monotonic()
            first = {t.name for t in (await client.list_tools()).tools}
            listed = time.monotonic()
            echo = await client.call_tool("receiver__echo", {"text": "here"})
    # initialize waits for no upstream; tools/list waits for the hanging one's own 2 s.
    assert listed - initialized < 10 and listed - began < 25, (began, initialized, listed)
    assert {"receiver__echo", "receiver__deliver", "awl_get_order"} <= first
    assert not any(n.startswith("hang__") for n in first)
    assert text(echo) == "here"


@pytest.mark.spec("GW-17")
async def test_the_first_tools_list_holds_every_healthy_server_on_a_loaded_machine(
        tmp_path: Path) -> None:
    """Five real upstreams started at once (four Python test servers and the published time
    server) beside two processes keeping both CPUs busy, and one that hangs with a 4 s
    connect_timeout: a client that lists once (as the MCP Inspector CLI and many agent
    frameworks do) sees every healthy server's tools in its first tools/list. Under the old
    3 s wait it saw only the servers up by then."""
    servers = {name: server_entry(name, env={"RECEIVER_LOG": str(tmp_path / "r.jsonl"),
                                             "OUTBOX_PATH": str(tmp_path / "o.jsonl")})
               for name in ("receiver", "notes", "chatty", "shapes")}
    servers["time"] = time_entry()
    servers["hang"] = {**HANGING, "connect_timeout": 4}
    env = make_env(tmp_path, gateway={}, servers=servers, tools=["*"], staged=[])
    hogs = [subprocess.Popen([sys.executable, "-c",
                              "import time\nend = time.monotonic() + 90\n"
                              "while time.monotonic() < end: pass"]) for _ in range(2)]
    try:
        with anyio.fail_after(90), open(env.home / "gateway.err", "w") as errlog:
            async with Client(stdio_client(gateway_params(env), errlog=errlog)) as client:
                began = time.monotonic()
                first = {t.name for t in (await client.list_tools()).tools}
                listed = time.monotonic() - began
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    prefixes = {name.split("__", 1)[0] for name in first if "__" in name}
    assert prefixes == {"receiver", "notes", "chatty", "shapes", "time"}, (prefixes, listed)
    assert listed < 20, f"the first tools/list took {listed:.1f} s"


@pytest.mark.spec("GW-17")
@pytest.mark.parametrize("mode", MODES)
async def test_an_upstream_that_comes_up_late_is_announced_with_list_changed(
        tmp_path: Path, mode: str) -> None:
    """tools/list answers after startup_wait without the slow upstream; once it is up the
    worker is told (notifications/tools/list_changed on a handshake connection, an event on
    its subscriptions/listen stream in the 2026-07-28 era), and tools/list shows its tools."""
    script = _late_server(tmp_path / "slow.sh", tmp_path / "r.jsonl", delay=3)
    env = make_env(tmp_path, gateway={"startup_wait": 0.5}, staged=[],
                   servers={"slow": {"command": str(script)}}, tools=["slow/*"])
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    with anyio.fail_after(60), open(env.home / "gateway.err", "w") as errlog:
        async with Client(stdio_client(gateway_params(env), errlog=errlog), cache=None,
                          mode=mode, message_handler=on_message) as client:
            before = {t.name for t in (await client.list_tools()).tools}
            if mode == "legacy":
                await changed.wait()
            else:
                async with client.listen(tools_list_changed=True) as events:
                    async for _event in events:
                        break
            after = {t.name for t in (await client.list_tools()).tools}
    assert not any(n.startswith("slow__") for n in before)
    assert "slow__echo" in after


@pytest.mark.spec("GW-17", "GW-6")
async def test_a_server_that_cannot_start_answers_with_its_reason_and_is_retried(
        tmp_path: Path) -> None:
    """A server whose command is missing answers its tools AWL_UPSTREAM_UNAVAILABLE with the
    reason (not AWL_FORBIDDEN), unforwarded and uncounted; once its command exists, the
    first call after the backoff starts it and goes through."""
    script = tmp_path / "late.sh"
    log = tmp_path / "r.jsonl"
    env = make_env(tmp_path, staged=[], servers={"late": {"command": str(script)}},
                   tools=["late/*"])
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            first = await client.call_tool("late__deliver", {"to": "ops", "body": "b"})
            soon = await client.call_tool("late__deliver", {"to": "ops", "body": "b"})
            _late_server(script, log)
            await anyio.sleep(RETRY_FIRST * 2 + 0.2)  # past the second failure's backoff
            later = await client.call_tool("late__deliver", {"to": "ops", "body": "b"})
    for refused in (first, soon):
        assert refused.is_error
        assert text(refused).startswith("AWL_UPSTREAM_UNAVAILABLE: ")
        assert "late" in text(refused) and "AWL_FORBIDDEN" not in text(refused)
    assert "again" in text(soon)
    assert not later.is_error, text(later)
    records = env.calls()
    assert [(r.tool, r.outcome) for r in records] == [
        (UNRESOLVED_TOOL, "refused"), (UNRESOLVED_TOOL, "refused"), ("late/deliver", "ok")]
    assert records[0].error == text(first)
    assert len([line for line in log.read_text().splitlines() if line]) == 1
    assert os.path.exists(script)


def _rpc(proc: Any, message: dict[str, Any]) -> None:
    proc.stdin.write((json.dumps(message) + "\n").encode())
    proc.stdin.flush()


@pytest.mark.spec("GW-17")
def test_the_gateway_exits_by_itself_with_code_0_once_its_stdin_closes(tmp_path: Path) -> None:
    """The MCP SDK's client closes the server's stdin and sends SIGTERM 2 s later: the gateway
    ends on its own before that, so its exit handlers run. (Its upstream here ends at once on
    stdin EOF; upstreams that do not are the next test's.)"""
    env = make_env(tmp_path, servers={"hang": HANGING}, gateway={"startup_wait": 0.5})
    code, _ = _close_after_listing(gateway_params(env), set())
    assert code == 0  # neither signalled (< 0) nor failed


@pytest.mark.spec("GW-18")
async def test_the_gateways_own_store_checkpoints_from_a_thread_of_its_own(
        tmp_path: Path) -> None:
    env = make_env(tmp_path, servers={"hang": HANGING}, gateway={"startup_wait": 0.1})
    env.store.close()
    with open(os.devnull, "w") as quiet:
        async with open_gateway(env.order_id, env.config, home=env.home, errlog=quiet):
            names = [t.name for t in threading.enumerate()]
            assert names.count("awl-sqlite-checkpoint") == 1
    assert "awl-sqlite-checkpoint" not in [t.name for t in threading.enumerate()]


def _lingering_server(path: Path, pids: Path) -> Path:
    """A shell script that records its pid, runs the receiver test server, and once that has
    ended (its stdin closed) stays alive, ignoring SIGTERM: an upstream that will not go."""
    path.write_text(
        "#!/bin/sh\n"
        f"echo $$ >> '{pids}'\n"
        f"PYTHONPATH='{ROOT}' RECEIVER_LOG='{pids}.log' '{sys.executable}' "
        f"'{SERVERS / 'receiver.py'}'\n"
        "trap '' TERM\n"
        "exec sleep 60\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not yet reaped
        return f.read().rpartition(")")[2].split()[0] == "Z"


@pytest.mark.spec("GW-19")
def test_the_gateway_stops_upstreams_that_will_not_exit_at_once_and_leaves_none(
        tmp_path: Path) -> None:
    """Three upstreams ignore their stdin closing and SIGTERM too. Once its own stdin closes,
    the gateway ends them all together and exits by itself (code 0) well within the 2 s its
    client gives it (the MCP SDK's stdio client alone waited 2 s for each to exit and 2 s more
    after SIGTERM), and none of them is left running."""
    pids = tmp_path / "pids"
    script = _lingering_server(tmp_path / "linger.sh", pids)
    names = ("a", "b", "c")
    env = make_env(tmp_path, staged=[], tools=[f"{n}/*" for n in names],
                   gateway={"startup_wait": 30},
                   servers={n: {"command": str(script)} for n in names})
    params = gateway_params(env)
    try:
        code, took = _close_after_listing(params, {f"{n}__echo" for n in names})
        started = [int(p) for p in pids.read_text().split()]
        assert code == 0
        assert len(started) == 3
        assert took < 2.0, f"the gateway took {took:.2f} s to exit"
        assert all(_gone(pid) for pid in started), started
    finally:
        for pid in (int(p) for p in pids.read_text().split()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _close_after_listing(params: Any, tools: set[str]) -> tuple[int, float]:
    """Spawn the gateway, wait until ``tools/list`` lists ``tools``, close its stdin: its
    exit code and the seconds it took to exit."""
    proc = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=params.env, cwd=params.cwd)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        _rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}})
        assert json.loads(proc.stdout.readline())["id"] == 1
        _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _rpc(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        answer = json.loads(proc.stdout.readline())
        while answer.get("id") != 2:  # notifications may come first
            answer = json.loads(proc.stdout.readline())
        listed = {t["name"] for t in answer["result"]["tools"]}
        assert tools <= listed, listed  # every upstream is up
        closed = time.monotonic()
        proc.stdin.close()
        code = proc.wait(timeout=20)
        return code, time.monotonic() - closed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


_MODULES_AT_EXIT = '''
import atexit, os, sys
def _write():
    with open(os.environ["AWL_TEST_MODULES"], "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
atexit.register(_write)
'''
"""A sitecustomize.py: the process writes every module it imported when it exits."""

NOT_FOR_STDIO = ("jsonschema", "referencing", "rpds", "re2", "jwt",
                 "cryptography.hazmat.primitives.asymmetric", "cryptography.x509",
                 "awl.passes.keys", "awl.passes.chain", "awl.documents.conformance",
                 "gateway._commit")
"""What a stdio gateway without a pass, whose upstream tools have no schemas to check, never
needs: the JSON Schema stack, PyJWT and cryptography's keys, the commit path. (The MCP SDK
itself imports Starlette, uvicorn, sse-starlette, httpx and part of cryptography whatever
part of it is used, so those cannot be avoided.)"""


@pytest.mark.parametrize(("server", "loaded"), [
    ("receiver", ()), ("notes", ("jsonschema", "referencing", "rpds"))],
    ids=["no-output-schema", "an-output-schema"])
def test_a_stdio_gateway_imports_only_what_it_uses(tmp_path: Path, server: str,
                                                    loaded: tuple[str, ...]) -> None:
    """``awl gateway`` over stdio, without a pass, answers ``tools/list`` and exits having
    imported none of NOT_FOR_STDIO; the JSON Schema stack loads once an upstream lists a tool
    with an output schema (the notes server does), which the gateway must check (GW-12)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_MODULES_AT_EXIT, encoding="utf-8")
    found = tmp_path / "modules.txt"
    env = make_env(tmp_path, staged=[], tools=[f"{server}/*"], gateway={"startup_wait": 30},
                   servers={server: server_entry(server, env={
                       "RECEIVER_LOG": str(tmp_path / "r.jsonl"),
                       "OUTBOX_PATH": str(tmp_path / "o.jsonl")})})
    params = gateway_params(env, env_extra={"AWL_TEST_MODULES": str(found)})
    params.env = {**(params.env or {}), "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    code, _ = _close_after_listing(params, {f"{server}__search_notes" if server == "notes"
                                            else f"{server}__echo"})
    modules = set(found.read_text(encoding="utf-8").split())
    assert code == 0
    assert {"mcp", "gateway._serve", "awl.store.sqlite"} <= modules  # the hook did see them
    imported = sorted(m for m in modules if m.startswith(NOT_FOR_STDIO)
                      and not m.startswith(loaded))
    assert imported == [], imported
    assert all(any(m.startswith(want) for m in modules) for want in loaded), loaded
