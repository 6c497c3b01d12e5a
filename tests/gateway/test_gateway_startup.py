"""Upstreams start in the background (GW-17): a hanging one holds up neither ``initialize`` nor
``tools/list``, one that comes up late is announced with ``tools/list_changed``, and one that
cannot start answers its tools with the reason and is tried again after a short backoff."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, stdio_client

from gateway._gateway import UNRESOLVED_TOOL
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
async def test_a_hanging_upstream_holds_up_neither_initialize_nor_tools_list(
        tmp_path: Path) -> None:
    """`awl gateway` with one upstream that never finishes its handshake (default
    connect_timeout, 60 s) answers initialize and tools/list within 5 s; the healthy
    upstream's tools work, and are listed once it is up."""
    env = make_env(tmp_path, gateway={}, servers={
        "hang": HANGING,
        "receiver": server_entry("receiver", env={"RECEIVER_LOG": str(tmp_path / "r.jsonl")}),
    })
    with anyio.fail_after(60), open(env.home / "gateway.err", "w") as errlog:
        began = time.monotonic()
        async with Client(stdio_client(gateway_params(env), errlog=errlog)) as client:
            initialized = time.monotonic()
            first = {t.name for t in (await client.list_tools()).tools}
            listed = time.monotonic()
            echo = await client.call_tool("receiver__echo", {"text": "here"})
            names = {t.name for t in (await client.list_tools()).tools}
    # tools/list itself waits at most the default startup_wait (3 s); the whole start (the
    # Python interpreter starting, on a busy machine) stays far from the 60 s connect_timeout.
    assert listed - initialized < 5 and listed - began < 20, (began, initialized, listed)
    assert "awl_get_order" in first
    assert text(echo) == "here"
    assert {"receiver__echo", "receiver__deliver", "awl_get_order"} <= names
    assert not any(n.startswith("hang__") for n in names)


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
