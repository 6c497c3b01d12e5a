"""Closing the upstream pool while an upstream is still being launched.

The pool cannot cancel a start while its process is being spawned (that could leave the
process running), so a close that comes then must end the start as soon as it can: the
close ends promptly, and the upstream's process with it. It used to wait for a launch that
nothing would end any more (forever for a server that answers, until ``connect_timeout``
for one that does not); ``awl gateway --http`` on a port in use then hung about every other
run instead of saying the port is taken.

The pool is closed after 0, 1, 2, ... turns of the event loop, which lands the close at
every stage of a launch in turn: before its task runs, while its process is spawned, during
the handshake. Every upstream writes its pid to a file first, so the test can see it gone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from gateway._config import load_config
from gateway._upstream import UpstreamPool
from tests.gateway.gateway_support import ROOT, SERVERS, make_env
from tests.gateway.test_upstream import alive  # a zombie counts: it was not reaped

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SILENT = "while read -r _; do :; done"
"""A server that reads its stdin and never answers; it leaves once its stdin closes."""
SLOW = f"sleep 0.2; exec {sys.executable} {SERVERS / 'flaky.py'}"
"""A real MCP server that answers ``initialize`` only after a while."""
BOUND = 5.0
"""Seconds a close may take: generous (a prompt close takes a fraction of one)."""


def upstream(pids: Path, script: str) -> dict[str, Any]:
    """A stdio upstream that appends its pid to ``pids`` and then runs ``script``."""
    return {"command": "sh", "args": ["-c", f'echo $$ >> "$0"; {script}', str(pids)],
            "env": {"PYTHONPATH": str(ROOT)}, "connect_timeout": 60}


def recorded(pids: Path) -> list[int]:
    return [int(x) for x in pids.read_text().split()] if pids.exists() else []


async def close_while_launching(pids: Path, script: str, turns: range) -> list[int]:
    """Open a pool on one upstream and close it after each number of loop ``turns``, with
    the body failing; each close must end within :data:`BOUND`. The upstreams' pids."""
    config = load_config({"mcpServers": {"up": upstream(pids, script)}})
    for turn in turns:
        with anyio.fail_after(BOUND):
            with pytest.raises(RuntimeError, match="the body failed"):
                async with UpstreamPool(config, wait=False, errlog=sys.stderr):
                    for _ in range(turn):
                        await anyio.lowlevel.checkpoint()
                    raise RuntimeError("the body failed")
    return recorded(pids)


async def test_a_close_during_a_launch_ends_at_once_and_stops_the_server(
        tmp_path: Path) -> None:
    """Whenever the pool closes during a launch of a server that never answers, the close
    ends within the bound (not at its connect_timeout) and the server is gone."""
    pids = await close_while_launching(tmp_path / "pids", SILENT, range(40))
    assert len(pids) >= 30  # most closes came once the process was spawned
    assert [pid for pid in pids if alive(pid)] == []


async def test_a_close_during_a_launch_does_not_wait_for_a_slow_server(tmp_path: Path) -> None:
    """A real server that answers after a while: a close during its launch does not wait
    for it (it used to wait forever), and the server is gone."""
    pids = await close_while_launching(tmp_path / "pids", SLOW, range(12))
    assert len(pids) >= 8
    assert [pid for pid in pids if alive(pid)] == []


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_the_command_on_a_port_in_use_exits_with_one_line(tmp_path: Path,
                                                          taken_port: int) -> None:
    """``awl gateway --http`` on a port in use says so in one line naming the flag and exits
    non-zero, every time, and its upstream does not outlive it.

    It finds the port taken while its upstream is being launched or shaking hands, as it
    happens: the old pool hung in 10-50 % of these runs (the tests above hit that window
    every time)."""
    pids = tmp_path / "pids"
    env = make_env(tmp_path, servers={"up": upstream(pids, SLOW)}, tools=["up/*"], staged=[])
    command = [sys.executable, "-m", "awl", "gateway", "--order", env.order_id,
               "--config", str(env.config), "--home", str(env.home),
               "--http", f"127.0.0.1:{taken_port}"]
    outcomes: list[tuple[int | None, bytes, bytes]] = []
    for _ in range(3):
        runs = [subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, cwd=env.home,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
                for _ in range(3)]
        try:
            for run in runs:
                out, err = run.communicate(timeout=20)
                outcomes.append((run.returncode, out, err))
        finally:
            for run in runs:  # a hung gateway; its upstream leaves once its stdin closes
                if run.poll() is None:
                    run.kill()
                    run.communicate()
    for code, out, err in outcomes:
        lines = err.decode().splitlines()
        assert code == 1 and out == b"", (code, lines)
        assert len(lines) == 1 and lines[0].startswith(
            f"awl: BAD_REQUEST: --http '127.0.0.1:{taken_port}': cannot listen on "
            f"127.0.0.1:{taken_port} ("), lines
    assert [pid for pid in recorded(pids) if alive(pid)] == []
