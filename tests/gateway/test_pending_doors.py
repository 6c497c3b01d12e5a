"""A call cut off by kill -9 of its gateway (forwarded, never answered) reads as may-have-run
at every door that shows calls, once it is pending past the bound (GW-7): the library's
``Desk.calls``, a worker's next gateway (``awl_list_calls``), the approval page's order and
call pages, and a worker's report. Before the bound it stays ``pending`` (it may still be in
flight). The receiver's own log is the truth: each cut-off call reached it once, and nothing
resent it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.testclient import TestClient

from awl.desk import AWL_OUTCOME_UNKNOWN, Desk
from awl.desk.pending import STALE_ENV
from awl.desk.tokens import issue_token
from awl.documents import BadRequest, parse_time
from awl.web import Sessions, WebConfig, build_app
from tests.gateway.gateway_support import (
    MANAGER,
    ROOT,
    WORKER,
    Env,
    gateway_client,
    make_env,
    server_entry,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

INITIALIZE = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
]


def hanging_env(tmp_path: Path) -> Env:
    """An order whose receiver logs each delivery, then never answers."""
    log = tmp_path / "receiver.jsonl"
    receiver = server_entry("receiver", env={"RECEIVER_LOG": str(log), "RECEIVER_HANG_AFTER": "*"})
    return make_env(tmp_path, servers={"receiver": receiver})


async def cut_off(env: Env, n: int) -> str:
    """Run the gateway, send one delivery, kill -9 the gateway once the receiver has it
    (the ``n``-th delivery); the delivery's ref."""
    args = ["-m", "awl", "gateway", "--order", env.order_id, "--config", str(env.config),
            "--home", str(env.home)]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "receiver__deliver", "arguments": {"to": "ops", "body": f"#{n}"}}}
    with open(env.home / "gateway.err", "a") as errlog:
        async with await anyio.open_process([sys.executable, *args], cwd=str(ROOT),
                                            stderr=errlog) as process:
            assert process.stdin is not None
            for message in [*INITIALIZE, call]:
                await process.stdin.send((json.dumps(message) + "\n").encode())
            with anyio.fail_after(60):
                while len(env.deliveries()) < n:
                    await anyio.sleep(0.05)
            process.kill()
            await process.wait()
    ref: str = env.deliveries()[-1]["ref"]
    [record] = [c for c in env.calls() if c.ref == ref]
    assert record.outcome == "pending"
    return ref


def past_the_bound(env: Env, ref: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound set to 1 s, and that second passed since the call started."""
    monkeypatch.setenv(STALE_ENV, "1")
    [record] = [c for c in env.calls() if c.ref == ref]
    while time.time() < parse_time(record.started_at).timestamp() + 1.2:
        time.sleep(0.05)


def may_have_run(env: Env, ref: str) -> None:
    [record] = [c for c in env.calls() if c.ref == ref]
    assert record.outcome == "error", record
    assert (record.error or "").startswith(f"{AWL_OUTCOME_UNKNOWN}: ")
    assert "may have run" in (record.error or "")


def page(env: Env) -> TestClient:
    client = TestClient(build_app(env.store, Sessions(), WebConfig(), desk=env.desk),
                        follow_redirects=False)
    answer = client.post("/signin", data={"token": issue_token(env.store, MANAGER)})
    assert answer.status_code == 303
    return client


async def test_a_call_cut_off_by_kill_9_reads_as_may_have_run_at_every_door(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STALE_ENV, raising=False)
    env = hanging_env(tmp_path)
    doors: dict[str, Any] = {}

    # The library: inside the default bound (an hour) the call may still be in flight.
    ref = await cut_off(env, 1)
    assert [c.outcome for c in Desk(env.store).calls(env.order_id) if c.ref == ref] == [
        "pending"]
    past_the_bound(env, ref, monkeypatch)
    assert [c.outcome for c in Desk(env.store).calls(env.order_id) if c.ref == ref] == [
        "error"]
    may_have_run(env, ref)
    doors["library"] = ref

    # The worker's next gateway: awl_list_calls shows it as may-have-run.
    monkeypatch.delenv(STALE_ENV)
    ref = await cut_off(env, 2)
    past_the_bound(env, ref, monkeypatch)
    async with gateway_client(env, env_extra={STALE_ENV: "1"}) as worker:
        listed = await worker.call_tool("awl_list_calls", {})
    assert listed.structured_content is not None
    shown = {c["ref"]: c["outcome"] for c in listed.structured_content["calls"]}
    assert shown[ref] == "error"
    may_have_run(env, ref)
    doors["gateway"] = ref

    # The approval page: the order's page lists it as error, its call page says why.
    monkeypatch.delenv(STALE_ENV)
    ref = await cut_off(env, 3)
    past_the_bound(env, ref, monkeypatch)
    client = page(env)
    order_page = client.get("/order", params={"id": env.order_id})
    assert order_page.status_code == 200
    may_have_run(env, ref)
    call_page = client.get("/order/call", params={"id": env.order_id, "ref": ref})
    assert call_page.status_code == 200 and "may have run" in call_page.text
    assert '<dd id="outcome">error</dd>' in call_page.text
    doors["page"] = ref

    # A worker's report: the desk reads the calls first, so the report answers for it.
    monkeypatch.delenv(STALE_ENV)
    ref = await cut_off(env, 4)
    past_the_bound(env, ref, monkeypatch)
    env.desk.report(env.order_id, WORKER, {
        "status": "failed", "error": "the receiver never answered",
        "result": {"summary": "cut off"}, "evidence": [],
        "cost": {"tool_calls": 4, "usd": 0}, "tools_used": ["receiver/deliver"]})
    may_have_run(env, ref)
    doors["report"] = ref

    # The truth: each cut-off call reached the receiver exactly once; nothing resent it.
    delivered = [d["ref"] for d in env.deliveries()]
    assert sorted(delivered) == sorted(doors.values()), (delivered, doors)


def test_a_bound_that_is_not_seconds_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    env = make_env(tmp_path)
    for bad in ("soon", "0", "-5", "nan", "inf", "40000000"):
        monkeypatch.setenv(STALE_ENV, bad)
        with pytest.raises(BadRequest) as refused:
            env.desk.calls(env.order_id)
        assert refused.value.message.startswith(f"${STALE_ENV} is {bad!r}: give the seconds")
        assert "\n" not in refused.value.message
    monkeypatch.setenv(STALE_ENV, " 90 ")
    assert env.desk.calls(env.order_id) == []
