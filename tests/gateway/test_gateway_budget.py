"""Budgets are exact: under concurrent calls, across gateway processes, in every unit."""

from __future__ import annotations

from pathlib import Path

import anyio
import mcp_types as types
import psycopg
import pytest
from mcp import Client

from awl.documents.patterns import Ref, parse_ref
from awl.store.postgres import PostgresStore
from awl.store.protocol import Store
from awl.store.sqlite import SQLiteStore
from tests.gateway.gateway_support import (
    Clock,
    connect,
    gateway_client,
    make_env,
    require_host_names,
    server_entry,
    text,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.mark.spec("GW-5")
@pytest.mark.parametrize("offload_store", [False, True], ids=["on-the-loop", "in-threads"])
async def test_a_hundred_concurrent_calls_spend_exactly_ten(tmp_path: Path,
                                                            offload_store: bool) -> None:
    """100 concurrent calls against tool_calls 10 count exactly 10, held ones included, with
    the store's work on the event loop or in worker threads (where the reservations race)."""
    env = make_env(tmp_path, staged=["receiver/create_issue"], budget={"tool_calls": 10})
    results: list[types.CallToolResult] = []

    async def one(i: int, client: Client) -> None:
        if i % 3 == 0:
            results.append(await client.call_tool("receiver__create_issue", {"title": f"t{i}"}))
        else:
            results.append(await client.call_tool("receiver__deliver", {"to": f"r{i}"}))

    with anyio.fail_after(90):
        async with (connect(env, offload_store=offload_store) as (gw, client),
                    anyio.create_task_group() as tg):
            assert gw.offload_store is offload_store
            for i in range(100):
                tg.start_soon(one, i, client)
    records = env.calls()
    counted = [r for r in records if r.outcome in ("ok", "held")]
    refused = [r for r in records if r.outcome == "refused"]
    assert len(records) == 100
    assert len(counted) == 10 and len(refused) == 90
    assert env.store.usage(env.order_id).tool_calls == 10
    assert sorted(r.n for r in (_ref(x.ref) for x in records)) == list(range(1, 101))
    delivered = sorted(d["ref"] for d in env.deliveries())
    assert delivered == sorted(r.ref for r in counted if r.outcome == "ok")
    assert sum(1 for r in results if r.is_error) == 90
    assert all(text(r).startswith("AWL_BUDGET_EXHAUSTED: ") for r in results if r.is_error)


@pytest.mark.spec("GW-5", "GW-20")
async def test_four_gateway_processes_forward_exactly_the_budget(
        tmp_path: Path, store_url: str | None) -> None:
    """100 concurrent calls from 4 ``awl gateway`` processes, each on a host name of its own,
    on one order with ``tool_calls: 10``, on SQLite and on PostgreSQL, forward exactly 10,
    numbered 1 to 100 without a gap or a twin; the PostgreSQL server sees the four hosts."""
    require_host_names()
    (tmp_path / "home").mkdir()
    store: Store = (SQLiteStore(tmp_path / "home" / "desk.sqlite3") if store_url is None
                    else PostgresStore(store_url))
    try:
        env = make_env(tmp_path, staged=[], budget={"tool_calls": 10}, store=store)
        answers: list[types.CallToolResult] = []
        extra = {"AWL_STORE": store_url} if store_url is not None else None

        hosts: set[str] = set()

        async def hammer(tag: str) -> None:
            async with (gateway_client(env, env_extra=extra, host=f"gw-{tag}") as client,
                        anyio.create_task_group() as tg):
                await client.list_tools()
                if isinstance(store, PostgresStore):
                    hosts.update(await anyio.to_thread.run_sync(_hosts_connected, store_url))
                for i in range(25):
                    tg.start_soon(_deliver, client, f"{tag}{i}", answers)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for tag in "abcd":
                    tg.start_soon(hammer, tag)
        assert len(answers) == 100
        assert sum(1 for a in answers if not a.is_error) == 10
        assert all(text(a).startswith("AWL_BUDGET_EXHAUSTED: ") for a in answers if a.is_error)
        assert len(env.deliveries()) == 10
        assert store.usage(env.order_id).tool_calls == 10
        records = env.calls()
        assert sorted(int(r.ref.rpartition("#")[2]) for r in records) == list(range(1, 101))
        assert [r.outcome for r in records].count("ok") == 10
        if isinstance(store, PostgresStore):
            assert {"gw-a", "gw-b", "gw-c", "gw-d"} <= hosts
    finally:
        store.close()


def _hosts_connected(url: str | None) -> set[str]:
    """The host names of the awl processes connected to the server (their connections'
    ``application_name`` is ``awl HOST pid PID``)."""
    assert url is not None
    with psycopg.connect(url, autocommit=True) as conn:
        names = conn.execute("SELECT application_name FROM pg_stat_activity").fetchall()
    return {name.split()[1] for (name,) in names if name.startswith("awl ")}


@pytest.mark.spec("GW-5")
async def test_two_gateway_processes_share_one_budget(tmp_path: Path) -> None:
    """Two awl gateway processes on one SQLite order forward exactly the budget between them."""
    env = make_env(tmp_path, staged=[], budget={"tool_calls": 10})
    answers: list[types.CallToolResult] = []

    async def hammer(client: Client, tag: str) -> None:
        async with anyio.create_task_group() as tg:
            for i in range(30):
                tg.start_soon(_deliver, client, f"{tag}{i}", answers)

    with anyio.fail_after(90):
        async with (gateway_client(env) as first, gateway_client(env) as second,
                    anyio.create_task_group() as tg):
            tg.start_soon(hammer, first, "a")
            tg.start_soon(hammer, second, "b")
    assert len(answers) == 60
    assert sum(1 for a in answers if not a.is_error) == 10
    assert len(env.deliveries()) == 10
    assert env.store.usage(env.order_id).tool_calls == 10
    assert [r.outcome for r in env.calls()].count("ok") == 10


async def _deliver(client: Client, to: str, answers: list[types.CallToolResult]) -> None:
    answers.append(await client.call_tool("receiver__deliver", {"to": to}))


@pytest.mark.spec("GW-5")
async def test_usd_costs_come_from_the_config(tmp_path: Path) -> None:
    """Each call spends its configured price; the call that would pass the usd limit is refused."""
    log = tmp_path / "receiver.jsonl"
    servers = {"receiver": server_entry("receiver", env={"RECEIVER_LOG": str(log)},
                                        costs={"deliver": 0.4, "*": 0.05})}
    env = make_env(tmp_path, servers=servers, staged=[], budget={"usd": 1})
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            first = await client.call_tool("receiver__deliver", {"to": "a"})
            second = await client.call_tool("receiver__deliver", {"to": "b"})
            third = await client.call_tool("receiver__deliver", {"to": "c"})
            cheap = await client.call_tool("receiver__echo", {"text": "x"})
    assert not first.is_error and not second.is_error and not cheap.is_error
    assert third.is_error and text(third).startswith("AWL_BUDGET_EXHAUSTED: ")
    assert env.store.usage(env.order_id).usd == pytest.approx(0.85)
    assert len(env.deliveries()) == 2


@pytest.mark.spec("GW-5")
async def test_seconds_count_from_the_first_call(tmp_path: Path) -> None:
    """The seconds budget starts at the first call and refuses once it has run out."""
    clock = Clock()
    env = make_env(tmp_path, staged=[], budget={"seconds": 60}, clock=clock)
    with anyio.fail_after(60):
        async with connect(env, clock=clock) as (_gw, client):
            clock.advance(minutes=30)  # idle time before the first call does not count
            assert not (await client.call_tool("receiver__echo", {"text": "1"})).is_error
            clock.advance(seconds=59)
            assert not (await client.call_tool("receiver__echo", {"text": "2"})).is_error
            clock.advance(seconds=1)
            late = await client.call_tool("receiver__echo", {"text": "3"})
            free = await client.call_tool("awl_get_order", {})
    assert late.is_error and text(late).startswith("AWL_BUDGET_EXHAUSTED: ")
    assert "seconds" in text(late)
    assert not free.is_error


def _ref(ref: str) -> Ref:
    parsed = parse_ref(ref)
    assert parsed is not None
    return parsed
