"""The per-call path: what a crash between forwarding and answering leaves, call records
durable on PostgreSQL, store work off the event loop there, one arguments check per call."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import gateway._gateway as gateway_module
from awl.documents import check_json_value
from awl.store.postgres import PostgresStore
from awl.store.protocol import Store
from awl.store.sqlite import SQLiteStore
from tests.gateway.gateway_support import ROOT, connect, make_env, server_entry, text
from tests.servers.receiver import read_log

pytestmark = pytest.mark.anyio

INITIALIZE = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
]


def _open(tmp_path: Path, store_url: str | None) -> Store:
    if store_url is None:
        (tmp_path / "home").mkdir(exist_ok=True)
        return SQLiteStore(tmp_path / "home" / "desk.sqlite3")
    return PostgresStore(store_url)


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_url)
    yield store
    store.close()


async def _wait_for_line(path: Path, timeout: float) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while not (lines := read_log(str(path))):  # whole lines only: one may be under way
            await anyio.sleep(0.02)
    return lines[0]


@pytest.mark.spec("GW-7", "GW-5", "GW-20")
async def test_a_gateway_killed_between_forwarding_and_answering_leaves_the_call_counted(
        tmp_path: Path, store_url: str | None) -> None:
    """kill -9 of ``awl gateway`` while the upstream holds a call it received: the call is
    on record (its ref the one the upstream saw, its exact arguments, outcome ``pending``)
    and counts against the budget, on SQLite and on PostgreSQL."""
    log = tmp_path / "receiver.jsonl"
    store = _open(tmp_path, store_url)
    try:
        env = make_env(tmp_path, store=store, staged=[], servers={"receiver": server_entry(
            "receiver", env={"RECEIVER_LOG": str(log), "RECEIVER_HANG_AFTER": "*"})})
        args = ["-m", "awl", "gateway", "--order", env.order_id, "--config", str(env.config),
                "--home", str(env.home)]
        extra = {"AWL_STORE": store_url} if store_url is not None else {}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "receiver__deliver", "arguments": {"to": "ops", "body": {"n": 1}}}}
        with open(env.home / "gateway.err", "w") as errlog:
            async with await anyio.open_process(
                    [sys.executable, *args], cwd=str(ROOT), stderr=errlog,
                    env={**os.environ, "PYTHONPATH": str(ROOT), **extra}) as process:
                assert process.stdin is not None
                for message in [*INITIALIZE, call]:
                    await process.stdin.send((json.dumps(message) + "\n").encode())
                received = await _wait_for_line(log, 60)
                process.kill()  # SIGKILL: no answer left the gateway
                await process.wait()
        [record] = store.calls(env.order_id)
        assert record.ref == received["ref"] == "receiver/deliver#1"
        assert (record.outcome, record.arguments) == ("pending", {"to": "ops", "body": {"n": 1}})
        assert store.usage(env.order_id).tool_calls == 1
    finally:
        store.close()


@pytest.mark.spec("GW-20")
def test_postgres_commits_every_write_synchronously_whatever_the_url_says(
        pg_url: str) -> None:
    """Every pooled connection of the PostgreSQL store (the writes' and the reads') commits
    with ``synchronous_commit=on``, even under a URL asking for ``off``: call records are
    on the server's disk when their write returns."""
    given = str(conninfo_to_dict(pg_url).get("options") or "")
    url = make_conninfo(pg_url, options=f"{given} -c synchronous_commit=off".strip())
    with psycopg.connect(url) as plain:
        assert plain.execute("SHOW synchronous_commit").fetchone() == ("off",)
    with PostgresStore(url) as store:
        for pool in store._pools.values():
            with pool.connection() as conn:
                assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)


@pytest.mark.spec("GW-20")
async def test_a_call_waiting_for_postgres_does_not_block_the_gateways_loop(
        tmp_path: Path, pg_url: str, pg_store: PostgresStore) -> None:
    """While another connection holds the order's row, a call waits for it in a worker
    thread: the gateway's event loop keeps running, and the call goes through once the row
    is free."""
    env = make_env(tmp_path, store=pg_store, staged=[])
    taken, release = threading.Event(), threading.Event()

    def hold_the_order_row() -> None:
        with psycopg.connect(pg_url) as conn:
            conn.execute("SELECT 1 FROM orders WHERE id = %s FOR UPDATE", (env.order_id,))
            taken.set()
            release.wait(30)
            conn.rollback()

    holder = threading.Thread(target=hold_the_order_row)
    holder.start()
    try:
        with anyio.fail_after(60):
            async with connect(env) as (_gw, client), anyio.create_task_group() as tg:
                assert await anyio.to_thread.run_sync(taken.wait, 30)
                answers: list[Any] = []

                async def deliver() -> None:
                    answers.append(await client.call_tool("receiver__deliver", {"to": "ops"}))

                tg.start_soon(deliver)
                await anyio.sleep(0.3)  # the call is now waiting for the row
                ticks = []
                for _ in range(5):
                    start = time.perf_counter()
                    await anyio.sleep(0.02)
                    ticks.append(time.perf_counter() - start)
                assert not answers
                assert max(ticks) < 0.5, ticks  # the loop was never held by the wait
                release.set()
        [answer] = answers
        assert not answer.is_error, text(answer)
        assert [c.outcome for c in env.calls()] == ["ok"]
    finally:
        release.set()
        holder.join()


async def test_a_wire_call_checks_its_arguments_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``tools/call`` from a connected worker has its arguments checked for JSON values
    once, not once on the wire and again in the call."""
    env = make_env(tmp_path, staged=[])
    checked: list[str] = []
    real = check_json_value

    def counting(value: Any, *, where: str) -> Any:
        checked.append(where)
        return real(value, where=where)

    monkeypatch.setattr(gateway_module, "check_json_value", counting)
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            answer = await client.call_tool("receiver__echo", {"text": "hi"})
    assert not answer.is_error, text(answer)
    assert checked == ["the arguments"]
