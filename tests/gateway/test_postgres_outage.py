"""A PostgreSQL desk that goes away mid-call (GW-7, GW-20): a throwaway server of the test's
own, on a port of its own (never the shared one), stopped with ``pg_ctl stop -m immediate``
(a crash: no shutdown checkpoint) while a forwarded call is at the upstream, then started
again. What reached the upstream is read from the receiver's own log and compared with the
records."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import mcp_types as types
import psycopg
import pytest
from mcp.shared.exceptions import MCPError

from awl.store.postgres import PostgresStore
from tests.gateway.gateway_support import (
    ROOT,
    connect,
    gateway_client,
    make_env,
    server_entry,
    text,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SCRIPT = ROOT / "scripts" / "postgres.sh"


@dataclass
class Server:
    """A PostgreSQL cluster of this test's own."""

    url: str
    folder: str
    port: int

    def _env(self) -> dict[str, str]:
        return {**os.environ, "AWL_PG_DIR": self.folder, "AWL_PG_PORT": str(self.port)}

    def start(self) -> None:
        subprocess.run(["bash", str(SCRIPT)], env=self._env(), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def crash(self) -> None:
        """Stop the server as a crash would: no checkpoint, every connection cut."""
        pg_ctl = next(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), None)
        command = [str(pg_ctl or shutil.which("pg_ctl") or "pg_ctl"), "-D", self.folder,
                   "-m", "immediate", "stop"]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=self._env(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server() -> Iterator[Server]:
    port = _free_port()
    folder = f"/tmp/awl-pg-outage-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env={
        **os.environ, "AWL_PG_DIR": folder, "AWL_PG_PORT": str(port)})
    assert made.returncode == 0, made.stderr[-2000:]
    own = Server(made.stdout.strip(), folder, port)
    try:
        yield own
    finally:
        own.stop()


def _delivered(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [json.loads(line)["ref"] for line in log.read_text().splitlines() if line.strip()]


@pytest.mark.spec("GW-7", "GW-20")
async def test_a_call_whose_outcome_cannot_be_recorded_is_said_to_have_maybe_run(
        tmp_path: Path, server: Server) -> None:
    """The server crashes while a forwarded call is at the upstream (which has logged it).
    The worker is told the truth: the call may have run, with its ref, never that nothing
    was written. The gateway keeps the outcome and records it once the server is back, so
    the records end as the receiver's log says."""
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"delay": 2}))
    store = PostgresStore(server.url, timeout=5)
    log = tmp_path / "receiver.jsonl"
    env = make_env(tmp_path, store=store, servers={"receiver": server_entry(
        "receiver", env={"RECEIVER_LOG": str(log), "RECEIVER_CONTROL": str(control)})},
        tools=["receiver/*"], staged=[])
    answers: list[types.CallToolResult] = []
    try:
        with anyio.fail_after(120):
            async with connect(env) as (gw, client):
                async def deliver() -> None:
                    answers.append(await client.call_tool("receiver__deliver", {"to": "ops"}))

                async with anyio.create_task_group() as tg:
                    began = time.monotonic()
                    tg.start_soon(deliver)
                    while not _delivered(log):  # at the upstream now
                        await anyio.sleep(0.05)
                    await anyio.to_thread.run_sync(server.crash)
                took = time.monotonic() - began
                assert gw.unrecorded.refs() == ["receiver/deliver#1"]
                await anyio.to_thread.run_sync(server.start)
                while gw.unrecorded.refs():  # written by the gateway's own thread
                    await anyio.sleep(0.1)
                control.write_text("{}")
                after = await client.call_tool("receiver__deliver", {"to": "again"})
        records = {c.ref: c.outcome for c in env.calls()}
    finally:
        store.close()
    (answer,) = answers
    assert answer.is_error
    said = text(answer)
    assert said.startswith("AWL_NOT_RECORDED: the call receiver/deliver#1 was sent"), said
    assert "may have run" in said and "nothing was written" not in said
    assert (answer.meta or {})["awl/ref"] == "receiver/deliver#1"
    assert took < 20, f"answered after {took:.1f} s"
    assert not after.is_error
    assert _delivered(log) == ["receiver/deliver#1", "receiver/deliver#2"]
    assert records == {"receiver/deliver#1": "ok", "receiver/deliver#2": "ok"}


@pytest.mark.spec("BIND-16", "SEC-4")
@pytest.mark.parametrize("debug", [False, True])
async def test_a_call_while_the_store_is_away_fails_within_its_bound_in_one_line(
        tmp_path: Path, server: Server, debug: bool) -> None:
    """``awl gateway`` (its own process) on a PostgreSQL desk whose server then crashes: the
    next call is refused within ``AWL_STORE_TIMEOUT`` of its start, never forwarded, with
    the store's one line (nothing listening: is the server running at HOST:PORT?) to the
    worker and on the gateway's stderr, no traceback and none of the pool's retries; with
    ``AWL_DEBUG=1`` the traceback too, down to the driver's own error."""
    store = PostgresStore(server.url, timeout=5)
    log = tmp_path / "receiver.jsonl"
    env = make_env(tmp_path, store=store, servers={"receiver": server_entry(
        "receiver", env={"RECEIVER_LOG": str(log)})}, tools=["receiver/*"], staged=[])
    store.close()
    bound = 3.0
    try:
        with anyio.fail_after(120):
            async with gateway_client(env, "--store", server.url, env_extra={
                    "AWL_STORE_TIMEOUT": str(bound),
                    **({"AWL_DEBUG": "1"} if debug else {})}) as client:
                first = await client.call_tool("receiver__deliver", {"to": "ops"})
                assert not first.is_error, first
                await anyio.to_thread.run_sync(server.crash)
                began = time.monotonic()
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("receiver__deliver", {"to": "lost"})
                took = time.monotonic() - began
    finally:
        await anyio.to_thread.run_sync(server.start)
    said = refused.value.error.message
    assert said.startswith("STORE_UNAVAILABLE: cannot reach PostgreSQL at 127.0.0.1:"), said
    assert f"is the server running at 127.0.0.1:{server.port}?" in said, said
    assert bound - 0.5 < took < bound + 3, f"refused after {took:.1f} s"
    assert _delivered(log) == ["receiver/deliver#1"]
    err = (env.home / "gateway.err").read_text()
    lines = [line for line in err.splitlines() if line.startswith("awl gateway:")]
    assert len(lines) == 1 and lines[0].endswith(said), err[-3000:]
    if debug:
        assert "Traceback (most recent call last)" in err, err[-3000:]
        assert "psycopg_pool.PoolTimeout" in err, err[-3000:]
    else:  # that line is all the gateway said
        assert err.splitlines() == lines, err[-3000:]


@pytest.mark.spec("BIND-16")
def test_a_server_shutting_down_says_to_retry_once_it_is_up(tmp_path: Path,
                                                           server: Server) -> None:
    """A server in a smart shutdown (it waits for its sessions to end and refuses new ones,
    57P03): a command is told, in one line, that it is shutting down and to retry."""
    held = psycopg.connect(server.url)  # keeps the server in its shutdown
    try:
        pg_ctl = next(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), None)
        command = [str(pg_ctl or shutil.which("pg_ctl") or "pg_ctl"), "-D", server.folder,
                   "-m", "smart", "-W", "stop"]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True)
        done = subprocess.run(
            [sys.executable, "-m", "awl", "order", "list"], cwd=str(ROOT), capture_output=True,
            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT),
                                        "AWL_HOME": str(tmp_path), "AWL_STORE": server.url})
    finally:
        held.close()
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "is restarting or shutting down (the database system is shutting down)" in \
        done.stderr and "retry once it is up" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.spec("BIND-16")
async def test_calls_go_through_again_within_seconds_of_the_server_coming_back(
        tmp_path: Path, server: Server) -> None:
    """The server is away for 20 s, calls failing meanwhile: once it is back, a call goes
    through within a few seconds (the pool tries again every 2 s at most, where its own
    backoff, 1, 2, 4, 8, 16 s, would have kept the next try up to 16 s away)."""
    store = PostgresStore(server.url, timeout=4)
    log = tmp_path / "receiver.jsonl"
    env = make_env(tmp_path, store=store, servers={"receiver": server_entry(
        "receiver", env={"RECEIVER_LOG": str(log)})}, tools=["receiver/*"], staged=[])
    try:
        with anyio.fail_after(120):
            async with connect(env) as (_gw, client):
                await anyio.to_thread.run_sync(server.crash)
                away = time.monotonic()
                while time.monotonic() - away < 20:  # the pool's tries back off meanwhile
                    with pytest.raises(MCPError):
                        await client.call_tool("receiver__deliver", {"to": "lost"})
                await anyio.to_thread.run_sync(server.start)
                back = time.monotonic()
                while True:
                    try:
                        answer = await client.call_tool("receiver__deliver", {"to": "ops"})
                        break
                    except MCPError:
                        assert time.monotonic() - back < 30, "never came back"
                took = time.monotonic() - back
    finally:
        store.close()
    assert not answer.is_error, answer
    assert took < 5, f"the first call after the server came back went through {took:.1f} s on"
    assert _delivered(log) == ["receiver/deliver#1"]
