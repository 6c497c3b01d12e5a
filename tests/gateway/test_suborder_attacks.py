"""Sub-orders through the real gateway and the real commit (issue 14), with the receiver as
the upstream: what reached it is read from its own log.

- Defect 2: a sub-order carrying a tool its parent stages, approved by its own manager (the
  parent's worker), sends nothing: the desk refuses to create it (C5), and one stored around
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

from awl.desk.settlement import settle
from awl.documents.errors import InvalidTransition, ValidationFailed
from awl.documents.models import Event, WorkOrder, format_time
from gateway._commit import commit, retry
from gateway._config import load_config
from tests.gateway.commit_support import hold
from tests.gateway.gateway_support import (
    MANAGER,
    ROOT,
    WORKER,
    Clock,
    Env,
    connect,
    gateway_client,
    make_env,
    text,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

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


def _stored_around_the_desk(env: Env, order_id: str, fields: dict[str, Any]) -> Env:
    """A sub-order written straight into the store (as a desk before C5, or a damaged store,
    could hold it), accepted and started by its worker."""
    now = format_time(env.desk.now())
    legacy = WorkOrder.model_validate({
        **fields, "spec": "awl/work-order@0.3", "id": order_id, "created_at": now,
        "from": WORKER})
    env.store.create_order(legacy, Event.model_validate({
        "seq": 1, "at": now, "actor": WORKER, "action": "create", "from": None,
        "to": "offered"}))
    env.desk.accept(legacy.id, legacy.to)
    env.desk.start(legacy.id, legacy.to)
    return replace(env, order_id=legacy.id)


@pytest.mark.spec("C5", "LC-14", "CM-3", "CM-11")
async def test_a_staged_write_split_into_a_sub_order_never_runs(tmp_path: Path) -> None:
    """The attack as found: the worker splits a sub-order to a sub-agent with the staged
    create_issue in its tools and staged list, the sub-agent's call is held, the worker
    approves it as the sub-order's manager and runs ``awl gateway --commit``. The desk
    refuses the sub-order (C5). One written to the store around the desk, staging the tool
    or not, gets no such tool from the gateway (not listed, refused AWL_FORBIDDEN); and a
    call held under it before (recorded as the gateway recorded held calls), reported and
    approved by the worker, is stopped by the commit (staged_above). 0 calls reach the
    upstream."""
    env = make_env(tmp_path, staged=["receiver/create_issue"])
    attack = _child(env, SUB, tools=["receiver/create_issue"],
                    staged=["receiver/create_issue"])
    with pytest.raises(ValidationFailed) as caught:
        env.desk.create(attack, WORKER)
    assert [(f.rule, f.path) for f in caught.value.findings] == [("C5", "/tools/0")]

    staged = _stored_around_the_desk(env, "wo_legacy", attack)
    unstaged = _stored_around_the_desk(env, "wo_unstaged", {**attack, "staged": []})
    with anyio.fail_after(60):
        for sub in (staged, unstaged):
            async with connect(sub) as (_gw, client):
                listed = {t.name for t in (await client.list_tools()).tools}
                assert "receiver__create_issue" not in listed
                refused = await client.call_tool("receiver__create_issue", {"title": "wire"})
                assert refused.is_error and text(refused).startswith("AWL_FORBIDDEN: ")
                assert env.order_id in text(refused)
    assert env.deliveries() == []

    ref = hold(env.store, staged.order_id, "receiver/create_issue", {"title": "wire $1M"})
    staged.desk.report(staged.order_id, SUB, {
        "status": "done", "result": {"summary": "filed"},
        "evidence": [{"criterion": "c1", "type": "tool_call", "ref": ref}],
        "cost": {"tool_calls": 2, "usd": 0}, "tools_used": ["receiver/create_issue"],
        "effects": [{"ref": ref, "tool": "receiver/create_issue",
                     "arguments": {"title": "wire $1M"}}]})
    staged.desk.review(staged.order_id, WORKER, "approve")  # as the sub-order's manager
    command = [sys.executable, "-m", "awl", "gateway", "--order", staged.order_id, "--config",
               str(env.config), "--commit", "--home", str(env.home), "--json"]
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        command, capture_output=True, text=True, cwd=str(ROOT), timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)}))
    assert done.returncode != 0
    summary = json.loads(done.stdout)
    assert [(m["ref"], m["problem"]) for m in summary["mismatches"]] == [
        (ref, "staged_above")]
    assert env.order_id in summary["mismatches"][0]["message"]
    assert env.deliveries() == []
    assert [e.state for e in env.store.effects(staged.order_id)] == ["held"]

    # A retry rechecks it too: an effect a dead committer left dispatching becomes unknown,
    # the worker settles it as not sent, and the retry is refused before anything is sent.
    env.store.set_effect(staged.order_id, ref, expect=["held"], state="dispatching",
                         count_dispatch=True, at=format_time(env.desk.now()))
    config = load_config(env.config)
    await commit(staged.order_id, store=env.store, pool_or_config=config)
    settle(staged.order_id, ref, "did_not_happen", "no trace", WORKER, store=env.store)
    with pytest.raises(InvalidTransition, match=f"order {env.order_id}.*stages"):
        await retry(staged.order_id, ref, WORKER, store=env.store, pool_or_config=config)
    assert env.deliveries() == []


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


@pytest.mark.spec("LC-16", "GW-4")
async def test_a_sub_order_stops_when_the_order_above_it_ends(tmp_path: Path) -> None:
    """Once the manager cancels the order, calls under the sub-order split from it (and
    under that one's own sub-order) are refused as not active; nothing more is sent."""
    env = make_env(tmp_path, staged=[], budget={"tool_calls": 10, "usd": 1})
    child = _working_child(env, SUB)
    deep = child.desk.create({**_child(child, "agent:deep", budget={"tool_calls": 1, "usd": 1}),
                              "from": SUB}, SUB)
    env.desk.accept(deep.id, "agent:deep")
    env.desk.start(deep.id, "agent:deep")
    with anyio.fail_after(60):
        async with (connect(child) as (_gw, theirs),
                    connect(replace(env, order_id=deep.id)) as (_gw2, deepest)):
            assert not (await theirs.call_tool("receiver__deliver", {"to": "a"})).is_error
            env.desk.cancel(env.order_id, MANAGER, "the customer withdrew")
            late = [await c.call_tool("receiver__deliver", {"to": "b"})
                    for c in (theirs, deepest)]
    for answer in late:
        assert answer.is_error and text(answer).startswith("AWL_NOT_ACTIVE: ")
        assert env.order_id in text(answer) and "cancelled" in text(answer)
    assert [d["arguments"]["to"] for d in env.deliveries()] == ["a"]


def _commit_process(env: Env, order_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``awl gateway --commit`` for ``order_id`` as its own process."""
    command = [sys.executable, "-m", "awl", "gateway", "--order", order_id, "--config",
               str(env.config), "--commit", "--home", str(env.home), *extra]
    return subprocess.run(command, capture_output=True, text=True, cwd=str(ROOT), timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


async def _held_and_approved(child: Env, to: str) -> str:
    """One delivery held by the real gateway under ``child``, reported and approved by the
    sub-order's manager (the parent's worker); returns its ref."""
    async with connect(child) as (_gw, client):
        held = await client.call_tool("receiver__deliver", {"to": to})
    assert not held.is_error
    (call,) = child.store.calls(child.order_id)
    child.desk.report(child.order_id, child.view().order.to, {
        "status": "done", "result": {"summary": "ready to deliver"},
        "evidence": [{"criterion": "c1", "type": "tool_call", "ref": call.ref}],
        "cost": {"tool_calls": 1, "usd": 0}, "tools_used": ["receiver/deliver"],
        "effects": [{"ref": call.ref, "tool": call.tool, "arguments": call.arguments}]})
    child.desk.review(child.order_id, WORKER, "approve")
    return call.ref


@pytest.mark.spec("LC-22", "CM-4", "CM-12")
async def test_a_sub_order_s_approved_effects_never_run_after_the_order_above_ends(
        tmp_path: Path) -> None:
    """A sub-order staging its own delivery: while the order above is working, its approved
    effect commits through ``awl gateway --commit``; a second sub-order's approved effect,
    committed after the manager cancelled the order above, reaches nothing: the effect is
    dropped with the reason, one line says why, the exit is non-zero; a retry is refused."""
    env = make_env(tmp_path, staged=[], budget={"tool_calls": 10, "usd": 1})
    live = _working_child(env, SUB, staged=["receiver/deliver"])
    late = _working_child(env, SUB2, staged=["receiver/deliver"])
    with anyio.fail_after(90):
        live_ref = await _held_and_approved(live, "live")
        late_ref = await _held_and_approved(late, "late")
        done = await anyio.to_thread.run_sync(lambda: _commit_process(env, live.order_id))
        assert done.returncode == 0, done.stdout + done.stderr
        assert [d["arguments"]["to"] for d in env.deliveries()] == ["live"]
        assert [e.state for e in env.store.effects(live.order_id)] == ["committed"]

        env.desk.cancel(env.order_id, MANAGER, "the customer withdrew")
        done = await anyio.to_thread.run_sync(lambda: _commit_process(env, late.order_id))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == ""
    why = [line for line in done.stdout.splitlines() if "nothing ran" in line]
    assert len(why) == 1 and env.order_id in why[0] and "cancelled" in why[0], done.stdout
    assert [d["arguments"]["to"] for d in env.deliveries()] == ["live"]
    (effect,) = env.store.effects(late.order_id)
    assert effect.ref == late_ref and effect.state == "dropped"
    assert effect.error is not None and env.order_id in effect.error
    drops = [e for e in env.store.events(late.order_id) if e.action == "drop"]
    assert [d.data["refs"] for d in drops if d.data] == [[late_ref]]
    again = await anyio.to_thread.run_sync(
        lambda: _commit_process(env, late.order_id, "--json"))
    summary = json.loads(again.stdout)
    assert again.returncode == 1 and env.order_id in summary["refused"]
    assert [d["arguments"]["to"] for d in env.deliveries()] == ["live"]
    assert live_ref == late_ref  # each sub-order numbers its own calls


@pytest.mark.spec("LC-22", "CM-11")
async def test_a_sub_order_s_retry_is_refused_after_the_order_above_ends(
        tmp_path: Path) -> None:
    """An unknown effect of a sub-order, settled as not sent, is not retried once the order
    above has ended: refused with the reason, nothing sent, the effect stays unknown."""
    env = make_env(tmp_path, staged=[], budget={"tool_calls": 10, "usd": 1})
    child = _working_child(env, SUB, staged=["receiver/deliver"])
    with anyio.fail_after(60):
        ref = await _held_and_approved(child, "x")
    env.store.set_effect(child.order_id, ref, expect=["held"], state="dispatching",
                         count_dispatch=True, at=format_time(env.desk.now()))
    config = load_config(env.config)
    await commit(child.order_id, store=env.store, pool_or_config=config)  # finds it unknown
    settle(child.order_id, ref, "did_not_happen", "no trace at the receiver", WORKER,
           store=env.store)
    env.desk.cancel(env.order_id, MANAGER, "the customer withdrew")
    with pytest.raises(InvalidTransition, match=f"order {env.order_id}.*cancelled"):
        await retry(child.order_id, ref, WORKER, store=env.store, pool_or_config=config)
    assert env.deliveries() == []
    assert [e.state for e in env.store.effects(child.order_id)] == ["unknown"]
