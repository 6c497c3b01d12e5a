"""Every call re-checks authority: the order's state and deadline, and the pass it runs under."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from awl.documents.errors import PassError
from awl.passes import KeyStore, issue_recorded_pass, revoke_pass
from tests.gateway.gateway_support import (
    MANAGER,
    WORKER,
    Clock,
    Env,
    connect,
    final,
    make_env,
    text,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SUB = "agent:helper"


def _pass(env: Env, clock: Clock, *, parent: str | None = None, subject: str = WORKER,
          **grant: object) -> str:
    return issue_recorded_pass(env.store, env.order_id, keys=KeyStore(env.home),
                               subject=subject, parent_token=parent, now=clock.now,
                               **grant)  # type: ignore[arg-type]


@pytest.mark.spec("GW-4")
async def test_an_order_that_is_not_active_refuses_calls(tmp_path: Path) -> None:
    """Calls are refused before the order is accepted and after the report is submitted."""
    env = make_env(tmp_path, state="offered", staged=[])
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            early = await client.call_tool("receiver__echo", {"text": "x"})
            env.desk.accept(env.order_id, WORKER)
            accepted = await client.call_tool("receiver__echo", {"text": "x"})
            env.desk.start(env.order_id, WORKER)
            env.desk.report(env.order_id, WORKER, {
                "status": "failed", "result": {"summary": "gave up"}, "evidence": [],
                "cost": {"tool_calls": 1, "usd": 0}, "tools_used": ["receiver/echo"],
                "error": "the customer is unreachable"})
            late = await client.call_tool("receiver__echo", {"text": "x"})
    assert early.is_error and text(early).startswith("AWL_NOT_ACTIVE: ")
    assert "offered" in text(early)
    assert not accepted.is_error
    assert late.is_error and text(late).startswith("AWL_NOT_ACTIVE: ")
    assert [r.outcome for r in env.calls()] == ["refused", "ok", "refused"]
    assert env.store.usage(env.order_id).tool_calls == 1


@pytest.mark.spec("GW-4", "GW-6")
async def test_a_passed_deadline_refuses_calls(tmp_path: Path) -> None:
    """Once the deadline has passed, every call is refused as expired and nothing is sent."""
    clock = Clock()
    env = make_env(tmp_path, staged=[], clock=clock)
    with anyio.fail_after(60):
        async with connect(env, clock=clock) as (_gw, client):
            clock.advance(hours=3)
            late = await client.call_tool("receiver__deliver", {"to": "x"})
    assert late.is_error and text(late).startswith("AWL_EXPIRED: ")
    assert env.deliveries() == []
    [record] = env.calls()
    assert record.outcome == "refused" and record.error == text(late)


@pytest.mark.spec("GW-4", "GW-6")
async def test_a_tool_forwarded_before_the_deadline_is_refused_after_it(tmp_path: Path) -> None:
    """The gateway keeps a tool's decision between calls; the deadline still ends it, and
    a state change still refuses the next call."""
    clock = Clock()
    env = make_env(tmp_path, staged=[], clock=clock)
    with anyio.fail_after(60):
        async with connect(env, clock=clock) as (_gw, client):
            first = await client.call_tool("receiver__deliver", {"to": "a"})
            again = await client.call_tool("receiver__deliver", {"to": "b"})
            clock.advance(hours=3)
            late = await client.call_tool("receiver__deliver", {"to": "c"})
    assert not first.is_error and not again.is_error
    assert late.is_error and text(late).startswith("AWL_EXPIRED: ")
    assert [d["arguments"]["to"] for d in env.deliveries()] == ["a", "b"]
    assert [r.outcome for r in env.calls()] == ["ok", "ok", "refused"]


@pytest.mark.spec("GW-3", "GW-4")
async def test_a_pass_narrows_tools_and_budget(tmp_path: Path) -> None:
    """Under a pass, only its tools are listed and callable, and its own budget runs out."""
    clock = Clock()
    env = make_env(tmp_path, staged=[], clock=clock)
    token = _pass(env, clock, tools=["receiver/echo"], budget={"tool_calls": 2, "usd": 1})
    with anyio.fail_after(60):
        async with connect(env, clock=clock, pass_token=token) as (_gw, client):
            names = {t.name for t in (await client.list_tools()).tools}
            one = await client.call_tool("receiver__echo", {"text": "1"})
            other = await client.call_tool("receiver__deliver", {"to": "x"})
            two = await client.call_tool("receiver__echo", {"text": "2"})
            three = await client.call_tool("receiver__echo", {"text": "3"})
            order = await client.call_tool("awl_get_order", {})
    assert names == {"receiver__echo", "awl_get_order", "awl_post_progress", "awl_list_calls",
                     "awl_list_held_calls", "awl_submit_report"}
    assert not one.is_error and not two.is_error
    assert other.is_error and text(other).startswith("AWL_FORBIDDEN: ")
    assert three.is_error and text(three).startswith("AWL_BUDGET_EXHAUSTED: ")
    records = env.calls()
    jtis = {r.pass_jti for r in records}
    assert len(jtis) == 1 and None not in jtis
    assert env.store.usage(env.order_id).tool_calls == 2
    assert order.structured_content is not None
    assert order.structured_content["acting_as"] == WORKER


@pytest.mark.spec("GW-4")
async def test_a_revoked_or_expired_pass_stops_working_at_once(tmp_path: Path) -> None:
    """Revoking the pass, or letting it expire, refuses the very next call."""
    clock = Clock()
    env = make_env(tmp_path, staged=[], clock=clock)
    token = _pass(env, clock, expires_in=600)
    other = _pass(env, clock, expires_in=600)
    with anyio.fail_after(60):
        async with connect(env, clock=clock, pass_token=token) as (gw, client):
            before = await client.call_tool("receiver__echo", {"text": "1"})
            jti = env.calls()[0].pass_jti
            assert jti is not None
            revoke_pass(env.store, jti, "the manager changed their mind")
            after = await client.call_tool("receiver__echo", {"text": "2"})
            listed = {t.name for t in (await client.list_tools()).tools}
            desk = await client.call_tool("awl_get_order", {})
            # The other pass still works until it expires.
            fine = final(await gw.call("receiver__echo", {"text": "3"}, token=other))
            clock.advance(seconds=700)
            expired = final(await gw.call("receiver__echo", {"text": "4"}, token=other))
    assert not before.is_error
    assert after.is_error and text(after).startswith("AWL_PASS_INVALID: ")
    assert "revoked" in text(after)
    assert not any(name.startswith(("receiver__", "notes__")) for name in listed)
    assert desk.is_error
    assert not fine.is_error
    assert expired.is_error and text(expired).startswith("AWL_PASS_INVALID: ")
    assert "expired" in text(expired)
    assert [r.outcome for r in env.calls()] == ["ok", "refused", "ok", "refused"]


@pytest.mark.spec("GW-5")
async def test_a_derived_pass_spends_its_parents_budget(tmp_path: Path) -> None:
    """A sub-agent's calls count against its own pass and every pass above it."""
    clock = Clock()
    env = make_env(tmp_path, staged=[], clock=clock)
    parent = _pass(env, clock, budget={"tool_calls": 3, "usd": 1})
    child = _pass(env, clock, parent=parent, subject=SUB, tools=["receiver/echo"],
                  budget={"tool_calls": 2, "usd": 1})
    with anyio.fail_after(60):
        async with connect(env, clock=clock, pass_token=parent) as (gw, _client):
            sub = [final(await gw.call("receiver__echo", {"text": str(i)}, token=child))
                   for i in range(3)]
            mine = [final(await gw.call("receiver__echo", {"text": str(i)}))
                    for i in range(2)]
    assert [r.is_error for r in sub] == [False, False, True]
    assert [r.is_error for r in mine] == [False, True]
    assert text(mine[1]).startswith("AWL_BUDGET_EXHAUSTED: ")
    assert env.store.usage(env.order_id).tool_calls == 3


@pytest.mark.spec("GW-5", "DP-6")
async def test_a_pass_derived_late_runs_no_longer_than_its_parents_seconds(
        tmp_path: Path) -> None:
    """A worker's pass with 60 seconds, 55 of them run, derives a sub-agent's pass with 60
    seconds of its own: the child's clock starts at its first call, and only the child's
    was checked, so work under the parent ran on past its 60 seconds. Each pass above the
    caller's with a seconds budget is now checked too."""
    clock = Clock()
    env = make_env(tmp_path, staged=[], clock=clock)
    parent = _pass(env, clock, budget={"seconds": 60, "tool_calls": 5, "usd": 1})
    with anyio.fail_after(60):
        async with connect(env, clock=clock, pass_token=parent) as (gw, _client):
            first = final(await gw.call("receiver__echo", {"text": "start"}))
            clock.advance(seconds=55)
            child = _pass(env, clock, parent=parent, subject=SUB, tools=["receiver/echo"],
                          budget={"seconds": 60, "tool_calls": 3, "usd": 1})
            early = final(await gw.call("receiver__echo", {"text": "a"}, token=child))
            clock.advance(seconds=10)  # the parent's 60 s are over; the child's 10 s are not
            late = final(await gw.call("receiver__echo", {"text": "b"}, token=child))
    assert not first.is_error and not early.is_error
    assert late.is_error and text(late).startswith("AWL_BUDGET_EXHAUSTED: ")
    assert "which your pass derives from, has run 65 of 60 seconds" in text(late)
    assert [r.outcome for r in env.calls()] == ["ok", "ok", "refused"]


async def test_a_bad_pass_keeps_the_gateway_from_starting(tmp_path: Path) -> None:
    """A gateway started with a forged pass, or one for another order, refuses to start."""
    clock = Clock()
    env = make_env(tmp_path, staged=[], clock=clock)
    second = env.desk.create({**env.view().order.to_json(), "id": "wo_other"}, MANAGER)
    env.desk.accept(second.id, WORKER)
    elsewhere = issue_recorded_pass(env.store, second.id, keys=KeyStore(env.home),
                                    subject=WORKER, now=clock.now)
    token = _pass(env, clock)
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    for bad, reason in ((forged, "bad_signature"), (elsewhere, "chain_broken")):
        with anyio.fail_after(60), pytest.raises(PassError) as caught:
            async with connect(env, clock=clock, pass_token=bad):
                pass
        assert caught.value.reason == reason
    assert env.calls() == []
