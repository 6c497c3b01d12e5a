"""Sub-orders cannot get around the manager (issue 14): each attack through the door it used.

- A worker splits its order into a sub-order carrying a tool the order stages, so that it
  would approve the sub-agent's held call itself (C6, LC-14).
- Sub-orders multiply the budget: each asks the parent's whole budget (C1 against what is
  left, LC-15; the charging itself is tested here on both stores and through the real
  gateway in tests/gateway/test_suborder_attacks.py).
- An order issued to its own manager, at any depth, so one principal approves its own work
  (LC-13).

Doors: the library (:class:`awl.Desk`), the CLI (``awl order create``) and the MCP desk
(``create_work_order``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from awl import BadRequest, Desk, ValidationFailed
from awl.cli import main
from awl.desk.lineage import ended_above, first_ended
from awl.store.memory import MemoryStore
from awl.store.protocol import OrderRecord, OverBudget, Scope, Store
from tests.awl.desk_support import (
    MANAGER,
    WORKER,
    Clock,
    open_store,
    order_fields,
    report_fields,
    working,
)

HELPER = "agent:helper"
DEEP = "agent:deep"
T = "2030-01-01T09:00:00Z"


@pytest.fixture(params=["memory", "sqlite"])
def desk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Desk]:
    """A desk on each kind of store."""
    opened = open_store(request.param, tmp_path)
    yield Desk(opened, clock=Clock())
    opened.close()


def child_fields(parent_id: str, creator: str, **over: Any) -> dict[str, Any]:
    """A sub-order that stays inside ``order_fields()`` and hands down no staged tool."""
    fields = order_fields(to=HELPER, parent_id=parent_id, budget={"usd": 1, "tool_calls": 3},
                          tools=["filings/*"], staged=None, **{"from": creator})
    fields.update(over)
    return {k: v for k, v in fields.items() if v is not None}


def spend(store: Store, order_id: str, n: int, *, usd: float = 0.0,
          scopes: list[Scope] | None = None) -> list[str]:
    """Reserve ``n`` calls as the gateway does; the refs made, or the scope names refused."""
    out = []
    for _ in range(n):
        made = store.reserve_call(order_id, attempt=1, tool="filings/search", arguments={},
                                  pass_jti=None, usd=usd, started_at=T,
                                  scopes=scopes or [])
        out.append(made.scope if isinstance(made, OverBudget) else made.record.ref)
    return out


# --------------------------------------------------------------------------- LC-13: library

@pytest.mark.spec("LC-13")
def test_the_library_refuses_an_order_to_its_own_manager(desk: Desk) -> None:
    """Desk.create refuses `to` = `from`, and an escalation contact who is the worker or the
    manager, with one line saying why; nothing is stored."""
    for fields, why in (({"to": MANAGER}, "own work"), ({"escalate_to": WORKER}, "own questions"),
                        ({"escalate_to": MANAGER}, "answers anyway")):
        message = _refusal(desk, order_fields(**fields), MANAGER)
        assert why in message and "\n" not in message, fields
    assert desk.list() == []


@pytest.mark.spec("LC-13")
def test_a_sub_order_is_never_issued_to_a_manager_above_it(desk: Desk) -> None:
    """A worker cannot hand a sub-order (or a sub-sub-order) to the manager of any order above
    it: that manager would approve, up the chain, a result holding its own work."""
    root = working(desk)
    for worker in (WORKER, MANAGER):
        message = _refusal(desk, child_fields(root.id, WORKER, to=worker), WORKER)
        assert "own work" in message, worker
    child = desk.create(child_fields(root.id, WORKER), WORKER)
    desk.accept(child.id, HELPER)
    desk.start(child.id, HELPER)
    for worker in (HELPER, WORKER, MANAGER):  # its own manager, the parent's, the root's
        fields = child_fields(child.id, HELPER, to=worker, budget={"usd": 1, "tool_calls": 1})
        assert "own work" in _refusal(desk, fields, HELPER), worker
    deep = desk.create(child_fields(child.id, HELPER, to=DEEP,
                                    budget={"usd": 1, "tool_calls": 1}), HELPER)
    assert [v.id for v in desk.list(parent_id=child.id)] == [deep.id]
    # The root's manager may split its own order, to anyone but itself.
    assert desk.create(child_fields(root.id, MANAGER, to=DEEP), MANAGER).state == "offered"


def _refusal(desk: Desk, fields: dict[str, Any], actor: str) -> str:
    before = len(desk.list(limit=None))
    with pytest.raises(BadRequest) as caught:
        desk.create(fields, actor)
    assert len(desk.list(limit=None)) == before
    return str(caught.value)


# --------------------------------------------------------------------------- C6 / LC-14

@pytest.mark.spec("C6", "LC-14", "LC-12")
def test_a_worker_cannot_hand_a_staged_tool_to_a_sub_order(desk: Desk) -> None:
    """The attack: the worker splits its order into a sub-order to a sub-agent carrying the
    tool the order stages (staged there too), to approve the held call itself. Refused as
    C6, staged or not, by the worker and by the manager; nothing is stored."""
    root = working(desk)  # tools filings/* and mail/send, staging mail/send
    for staged in (["mail/send"], None):
        for creator in (WORKER, MANAGER):
            fields = child_fields(root.id, creator, to=HELPER,
                                  tools=["filings/*", "mail/send"], staged=staged)
            with pytest.raises(ValidationFailed) as caught:
                desk.create(fields, creator)
            assert [(f.rule, f.path) for f in caught.value.findings] == [("C6", "/tools/1")]
    assert desk.list(parent_id=root.id) == []


@pytest.mark.spec("C6", "LC-14")
def test_no_order_below_reaches_a_tool_staged_above(desk: Desk) -> None:
    """A child that leaves the staged tool out cannot give it to its own child: C2 keeps the
    grandchild within the child's tools, so no tool any ancestor stages reaches it."""
    root = working(desk)
    child = desk.create(child_fields(root.id, WORKER, tools=["filings/*"]), WORKER)
    with pytest.raises(ValidationFailed) as caught:
        desk.create(child_fields(child.id, HELPER, to=DEEP, tools=["mail/send"],
                                 staged=["mail/send"], budget={"usd": 1, "tool_calls": 1}),
                    HELPER)
    assert {f.rule for f in caught.value.findings} == {"C2"}


# --------------------------------------------------------------------------- C1 / LC-15

@pytest.mark.spec("C1", "LC-15")
def test_a_sub_order_is_carved_from_what_the_parent_has_left(desk: Desk) -> None:
    """The attack: with tool_calls 3 spent, the worker splits two sub-orders of 3. Each is
    refused as C1 against the 0 left; once some is left, a child fits only within it."""
    store = desk.store
    root = working(desk, budget={"usd": 10, "tool_calls": 3})
    assert spend(store, root.id, 3, scopes=[Scope(None, max_calls=3)]) == [
        f"filings/search#{n}" for n in (1, 2, 3)]
    with pytest.raises(ValidationFailed) as caught:
        desk.create(child_fields(root.id, WORKER), WORKER)
    assert [(f.rule, f.path) for f in caught.value.findings] == [("C1", "/budget/tool_calls")]
    assert "0 left" in caught.value.findings[0].message

    other = working(desk, budget={"usd": 10, "tool_calls": 3})
    spend(store, other.id, 1, usd=9.5)
    with pytest.raises(ValidationFailed) as caught:
        desk.create(child_fields(other.id, WORKER, budget={"usd": 1, "tool_calls": 2}), WORKER)
    assert [(f.rule, f.path) for f in caught.value.findings] == [("C1", "/budget/usd")]
    fits = desk.create(child_fields(other.id, WORKER, budget={"usd": 0.5, "tool_calls": 2}),
                       WORKER)
    assert fits.order.budget.tool_calls == 2


@pytest.mark.spec("LC-15", "GW-5")
def test_a_sub_order_s_calls_are_charged_to_every_order_above(desk: Desk) -> None:
    """Calls reserved under a grandchild count in the child's and the root's usage (calls,
    usd, first call), and are refused, whatever the grandchild's own budget, once any order
    above has none left; the scope refused is named ``order <id>``."""
    store = desk.store
    root = working(desk, budget={"usd": 10, "tool_calls": 4})
    child = desk.create(child_fields(root.id, WORKER, budget={"usd": 10, "tool_calls": 4}),
                        WORKER)
    deep = desk.create(child_fields(child.id, HELPER, to=DEEP,
                                    budget={"usd": 10, "tool_calls": 4}), HELPER)
    mine = [Scope(None, max_calls=4, max_usd=10)]
    assert spend(store, deep.id, 2, usd=1.0, scopes=mine) == ["filings/search#1",
                                                              "filings/search#2"]
    assert spend(store, child.id, 1, scopes=mine) == ["filings/search#1"]
    assert (store.usage(deep.id).tool_calls, store.usage(child.id).tool_calls,
            store.usage(root.id).tool_calls) == (2, 3, 3)
    assert store.usage(root.id).usd == pytest.approx(2.0)
    assert store.usage(root.id).first_call_at == T
    assert spend(store, root.id, 1, scopes=mine) == ["filings/search#1"]  # the root's 4th
    assert spend(store, deep.id, 1, scopes=mine) == [f"order {root.id}"]
    assert spend(store, child.id, 1, scopes=mine) == [f"order {root.id}"]
    assert spend(store, root.id, 1, scopes=mine) == ["order"]  # its own scope, sub-orders in
    assert store.usage(root.id).tool_calls == 4
    assert len(store.calls(deep.id)) == 2  # nothing written for the refused reservations


@pytest.mark.spec("LC-15")
def test_usd_is_charged_up_the_chain_too() -> None:
    """A parent's usd budget stops a child whose own usd budget still has room."""
    store = MemoryStore()
    desk = Desk(store, clock=Clock())
    root = working(desk, budget={"usd": 1, "tool_calls": 40})
    child = desk.create(child_fields(root.id, WORKER), WORKER)
    spend(store, root.id, 1, usd=0.5)
    mine = [Scope(None, max_usd=1)]  # the child's own budget
    assert spend(store, child.id, 2, usd=0.4, scopes=mine) == [
        "filings/search#1", f"order {root.id}"]
    assert store.usage(child.id).usd == pytest.approx(0.4)
    assert store.usage(root.id).usd == pytest.approx(0.9)


@pytest.mark.spec("C1", "LC-15", "R7")
def test_tokens_are_only_reported_so_they_are_not_charged_up_the_chain(desk: Desk) -> None:
    """``tokens`` are what a worker's report says it spent (R6, R7 against its own order):
    no gateway or store counts them, so, as LC-15 says, they stay whole down the chain. A
    sub-order that reported the parent's whole token budget spent takes none of it from a
    sibling made afterwards, and the parent's own report of its whole budget has no limit finding.
    (The counted units are exact up the chain: tests/awl/test_suborder_chain_processes.py.)"""
    tokens = {"usd": 1, "tool_calls": 3, "tokens": 1000}
    root = working(desk, budget={"usd": 10, "tool_calls": 40, "tokens": 1000})
    child = desk.create(child_fields(root.id, WORKER, budget=tokens), WORKER)
    desk.accept(child.id, HELPER)
    desk.start(child.id, HELPER)
    spent = {"usd": 0, "tool_calls": 0, "tokens": 1000}
    assert desk.report(child.id, HELPER, report_fields(cost=spent)).state == "submitted"
    sibling = desk.create(child_fields(root.id, WORKER, to=DEEP, budget=tokens), WORKER)
    assert sibling.order.budget.tokens == 1000
    mine = desk.report(root.id, WORKER, report_fields(cost={**spent, "usd": 2, "tool_calls": 7}))
    assert mine.state == "submitted"  # a limit finding (R7) would have expired it


# --------------------------------------------------------------------------- LC-16 / LC-22

@pytest.mark.spec("LC-16", "LC-22")
def test_the_order_above_that_ended_is_found_parent_first_by_one_rule(desk: Desk) -> None:
    """first_ended is the one rule the gateway (before each call, on the ids it read at
    start) and the commit (ended_above) ask: the nearest order above that has ended, read
    as stored now, and nothing read past it."""
    root = working(desk)
    child = desk.create(child_fields(root.id, WORKER), WORKER)
    desk.accept(child.id, HELPER)
    desk.start(child.id, HELPER)
    deep = desk.create(child_fields(child.id, HELPER, to=DEEP,
                                    budget={"usd": 1, "tool_calls": 1}), HELPER)
    store, order = desk.store, desk.store.load(deep.id).order
    above = (child.id, root.id)
    assert first_ended(store.load(i) for i in above) is None
    assert ended_above(store, order) is None
    desk.cancel(root.id, MANAGER, "no longer needed")
    ended = first_ended(store.load(i) for i in above)
    assert ended is not None and (ended.order.id, ended.state) == (root.id, "cancelled")
    assert f"order {root.id}, which order {deep.id} is split from, is cancelled" in (
        ended_above(store, order) or "")
    desk.cancel(child.id, WORKER, "done without it")
    read: list[str] = []

    def loaded() -> Iterator[OrderRecord]:
        for order_id in above:
            read.append(order_id)
            yield store.load(order_id)

    ended = first_ended(loaded())
    assert ended is not None and (ended.order.id, ended.state) == (child.id, "cancelled")
    assert read == [child.id]
    assert f"order {child.id}, which" in (ended_above(store, order) or "")


# --------------------------------------------------------------------------- the CLI

@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("AWL_ACTOR", raising=False)
    monkeypatch.setenv("AWL_HOME", str(tmp_path / "home"))
    return tmp_path


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _create(capsys: pytest.CaptureFixture[str], folder: Path, actor: str,
            fields: dict[str, Any]) -> tuple[int, str, str]:
    path = folder / "order.json"
    path.write_text(json.dumps(fields), encoding="utf-8")
    return _cli(capsys, "order", "create", str(path), "--as", actor, "--json")


def _cli_working(capsys: pytest.CaptureFixture[str], folder: Path) -> str:
    code, out, err = _create(capsys, folder, MANAGER, order_fields())
    assert code == 0, err
    order_id: str = json.loads(out)["order"]["id"]
    for verb in ("accept", "start"):
        assert _cli(capsys, "work", verb, order_id, "--as", WORKER)[0] == 0
    return order_id


@pytest.mark.spec("LC-13")
def test_the_cli_refuses_an_order_to_its_own_manager(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`awl order create` as the order's own worker, or a sub-order to the manager above,
    exits non-zero with one line naming the problem, and stores nothing."""
    code, out, err = _create(capsys, home, MANAGER, order_fields(to=MANAGER))
    assert code != 0 and out == ""
    assert err.startswith("awl: ") and err.count("\n") == 1 and "own work" in err
    root = _cli_working(capsys, home)
    code, _, err = _create(capsys, home, WORKER, child_fields(root, WORKER, to=MANAGER))
    assert code != 0 and err.count("\n") == 1 and "up the chain" in err
    listed = _cli(capsys, "order", "list", "--json", "--as", MANAGER)
    assert [o["order"]["id"] for o in json.loads(listed[1])] == [root]


@pytest.mark.spec("C6", "LC-14", "C1", "LC-15")
def test_the_cli_refuses_a_sub_order_with_a_staged_tool_or_more_than_is_left(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The two sub-order attacks as the worker ran them, with `awl order create`: a sub-order
    carrying the staged mail/send, and one asking more tool_calls than the order has left."""
    root = _cli_working(capsys, home)
    code, _, err = _create(capsys, home, WORKER, child_fields(
        root, WORKER, tools=["filings/*", "mail/send"], staged=["mail/send"]))
    assert code != 0 and err.count("\n") == 1 and "C6 /tools/1" in err
    code, _, err = _create(capsys, home, WORKER, child_fields(
        root, WORKER, budget={"usd": 1, "tool_calls": 41}))
    assert code != 0 and "C1 /budget/tool_calls" in err
    code, out, err = _create(capsys, home, WORKER, child_fields(root, WORKER))
    assert code == 0, err
    assert json.loads(out)["order"]["parent_id"] == root


# --------------------------------------------------------------------------- the MCP desk

@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("LC-13", "C6", "LC-14")
async def test_the_mcp_desk_refuses_the_same_sub_orders() -> None:
    """create_work_order, bound to the worker, refuses a sub-order to the manager above it
    (BAD_REQUEST) and one carrying the staged tool (VALIDATION_FAILED, C6)."""
    from tests.awl.test_server_tools import desks

    store = MemoryStore()
    with anyio.fail_after(30):
        async with desks(store, MANAGER, WORKER) as (m, w):
            created = await m.call("create_work_order", order=order_fields(to=WORKER))
            oid = created["order"]["id"]
            await w.call("accept_work_order", order_id=oid)
            await w.call("start_work_order", order_id=oid)
            upward = await w.refused("create_work_order",
                                     order=child_fields(oid, WORKER, to=MANAGER))
            assert upward["code"] == "BAD_REQUEST" and "own work" in upward["message"]
            staged = await w.refused("create_work_order", order=child_fields(
                oid, WORKER, tools=["filings/*", "mail/send"], staged=["mail/send"]))
            assert staged["code"] == "VALIDATION_FAILED"
            assert [(f["rule"], f["path"]) for f in staged["findings"]] == [("C6", "/tools/1")]
    assert [r.order.id for r in store.list_orders()] == [oid]
