"""Sub-orders through the real gateway and the real commit (issue 14), with the receiver as
the upstream: what reached it is read from its own log.

- Defect 2: a sub-order carrying a tool its parent stages, approved by its own manager (the
  parent's worker), sends nothing: the desk refuses to create it (C6), and one stored around
  the desk is stopped by the commit (LC-14).
- Defect 3: sub-orders do not multiply the budget: under an order with ``tool_calls: 3`` and
  two sub-orders of 3, served by three gateways (two of them separate processes) at once,
  exactly 3 calls reach the upstream (LC-15); a parent's ``seconds`` stop its sub-orders too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from awl._desk import format_time
from awl._errors import ValidationFailed
from awl._models import Event, WorkOrder
from tests.gateway.gateway_support import (
    ROOT,
    WORKER,
    Clock,
    Env,
    connect,
    gateway_client,
    make_env,
    text,
)

pytestmark = pytest.mark.anyio

SUB = "agent:sub"
SUB2 = "agent:sub2"


def _child(env: Env, to: str, **over: Any) -> dict[str, Any]:
    parent = env.view().order
    fields: dict[str, Any] = {
        "to": to, "parent_id": env.order_id, "goal": "deliver the notices",
        "criteria": [{"id": "c1", "text": "delivered"}], "budget": {"tool_calls": 3, "usd": 1},
        "deadline": parent.deadline, "tools": ["receiver/deliver"],
    }
    fields.update(over)
    return fields


def _working_child(env: Env, to: str, **over: Any) -> Env:
    view = env.desk.create(_child(env, to, **over), WORKER)
    env.desk.accept(view.id, to)
    env.desk.start(view.id, to)
    return replace(env, order_id=view.id)


@pytest.mark.spec("C6", "LC-14", "CM-3")
async def test_a_staged_write_split_into_a_sub_order_never_runs(tmp_path: Path) -> None:
    """The attack as found: the worker splits a sub-order to a sub-agent with the staged
    create_issue in its tools and staged list, the sub-agent's call is held, the worker
    approves it as the sub-order's manager and runs ``awl gateway --commit``. The desk
    refuses the sub-order (C6); one written to the store around the desk is held, approved,
    and then stopped by the commit (staged_above): 0 calls reach the upstream."""
    env = make_env(tmp_path, staged=["receiver/create_issue"])
    attack = _child(env, SUB, tools=["receiver/create_issue"],
                    staged=["receiver/create_issue"])
    with pytest.raises(ValidationFailed) as caught:
        env.desk.create(attack, WORKER)
    assert [(f.rule, f.path) for f in caught.value.findings] == [("C6", "/tools/0")]

    now = format_time(env.desk.now())
    legacy = WorkOrder.model_validate({
        **attack, "spec": "awl/work-order@0.3", "id": "wo_legacy", "created_at": now,
        "from": WORKER})
    env.store.create_order(legacy, Event.model_validate({
        "seq": 1, "at": now, "actor": WORKER, "action": "create", "from": None,
        "to": "offered"}))
    env.desk.accept(legacy.id, SUB)
    env.desk.start(legacy.id, SUB)
    sub = replace(env, order_id=legacy.id)
    with anyio.fail_after(60):
        async with connect(sub) as (_gw, client):
            held = await client.call_tool("receiver__create_issue", {"title": "wire $1M"})
            assert not held.is_error and text(held) == "pending:receiver/create_issue#1"
            report = await client.call_tool("awl_submit_report", {"report": {
                "status": "done", "result": {"summary": "filed"},
                "evidence": [{"criterion": "c1", "type": "tool_call",
                              "ref": "receiver/create_issue#1"}],
                "cost": {"tool_calls": 1, "usd": 0}, "tools_used": ["receiver/create_issue"],
                "effects": [{"ref": "receiver/create_issue#1", "tool": "receiver/create_issue",
                             "arguments": {"title": "wire $1M"}}]}})
            assert not report.is_error, report.content
    sub.desk.review(legacy.id, WORKER, "approve")  # the worker, as the sub-order's manager
    command = [sys.executable, "-m", "awl", "gateway", "--order", legacy.id, "--config",
               str(env.config), "--commit", "--home", str(env.home), "--json"]
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        command, capture_output=True, text=True, cwd=str(ROOT), timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)}))
    assert done.returncode != 0
    summary = json.loads(done.stdout)
    assert [(m["ref"], m["problem"]) for m in summary["mismatches"]] == [
        ("receiver/create_issue#1", "staged_above")]
    assert env.order_id in summary["mismatches"][0]["message"]
    assert env.deliveries() == []
    assert [e.state for e in env.store.effects(legacy.id)] == ["held"]


async def _deliver_many(client: Client, tag: str, n: int,
                        answers: list[types.CallToolResult]) -> None:
    async def one(i: int) -> None:
        answers.append(await client.call_tool("receiver__deliver", {"to": f"{tag}{i}"}))

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)


@pytest.mark.spec("LC-15", "GW-5")
async def test_two_sub_orders_of_three_under_three_deliver_exactly_three(
        tmp_path: Path) -> None:
    """The attack as found: an order with tool_calls 3 and two sub-orders of 3 each (each
    within what the parent had left when it was made). The order's gateway in-process and
    one ``awl gateway`` process per sub-order call at once, 5 calls each: exactly 3 reach
    the upstream, every other call is refused as over budget, and the order's usage is 3."""
    env = make_env(tmp_path, staged=[], budget={"tool_calls": 3, "usd": 1})
    first = _working_child(env, SUB)
    second = _working_child(env, SUB2)
    answers: list[types.CallToolResult] = []
    with anyio.fail_after(120):
        async with (connect(env) as (_gw, mine), gateway_client(first) as one,
                    gateway_client(second) as two, anyio.create_task_group() as tg):
            tg.start_soon(_deliver_many, mine, "w", 5, answers)
            tg.start_soon(_deliver_many, one, "a", 5, answers)
            tg.start_soon(_deliver_many, two, "b", 5, answers)
    assert len(answers) == 15
    assert len(env.deliveries()) == 3
    assert sum(1 for a in answers if not a.is_error) == 3
    refused = [text(a) for a in answers if a.is_error]
    assert all(t.startswith("AWL_BUDGET_EXHAUSTED: ") for t in refused)
    assert env.store.usage(env.order_id).tool_calls == 3
    delivered_orders = {d["order"] for d in env.deliveries()}
    assert delivered_orders <= {env.order_id, first.order_id, second.order_id}
    under_subs = [t for t in refused if "split from" in t]
    assert all(env.order_id in t for t in under_subs)


@pytest.mark.spec("LC-15", "C1", "GW-5")
async def test_a_parent_s_seconds_stop_its_sub_orders(tmp_path: Path) -> None:
    """The parent's seconds run from the first call under it; a sub-order made 30 seconds in
    gets at most the 30 left (C1), and once the parent's run out, the sub-order's calls are
    refused although its own clock, started later, has room: nothing more is sent."""
    clock = Clock()
    env = make_env(tmp_path, staged=[], budget={"tool_calls": 10, "seconds": 60}, clock=clock)
    with anyio.fail_after(60):
        async with connect(env, clock=clock) as (_gw, mine):
            assert not (await mine.call_tool("receiver__deliver", {"to": "w"})).is_error
        clock.advance(seconds=30)
        with pytest.raises(ValidationFailed) as caught:
            env.desk.create(_child(env, SUB, budget={"tool_calls": 5, "seconds": 45}), WORKER)
        assert [(f.rule, f.path) for f in caught.value.findings] == [("C1", "/budget/seconds")]
        child = _working_child(env, SUB, budget={"tool_calls": 5, "seconds": 30})
        clock.advance(seconds=10)
        async with connect(child, clock=clock) as (_gw, theirs):
            assert not (await theirs.call_tool("receiver__deliver", {"to": "a"})).is_error
            clock.advance(seconds=21)  # the parent's 60 are over, the child's 30 are not
            late = await theirs.call_tool("receiver__deliver", {"to": "b"})
    assert late.is_error and text(late).startswith("AWL_BUDGET_EXHAUSTED: ")
    assert "split from" in text(late) and env.order_id in text(late)
    assert [d["arguments"]["to"] for d in env.deliveries()] == ["w", "a"]
