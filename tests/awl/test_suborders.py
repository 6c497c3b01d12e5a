"""Sub-orders cannot get around the manager (issue 14): each attack through the door it used.

- A worker splits its order into a sub-order carrying a tool the order stages, so that it
  would approve the sub-agent's held call itself (C5, LC-14).
- Sub-orders multiply the budget: each asks the parent's whole budget (C1 against what is
  left, LC-15; the charging itself is tested here on both stores and through the real
  gateway in tests/gateway/test_suborder_attacks.py). Tokens, which no gateway counts, are
  taken from the parent as its sub-orders report them, and its own report must cover
  theirs (LC-15, RX6).
- An order issued to its own manager, at any depth, so one principal approves its own work
  (LC-13).

Doors: the library (:class:`awl.Desk`), the CLI (``awl order create``, ``awl work report``)
and the MCP desk (``create_work_order``, ``submit_work_report``).
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
from awl.desk import OrderView
from awl.desk.lineage import ended_above, first_ended, reports_below
from awl.documents.checks import iter_report_findings
from awl.store.memory import MemoryStore
from awl.store.protocol import OrderRecord, OverBudget, Scope, Store
from awl.store.urls import open_store as open_url
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
THIRD = "agent:third"
T = "2030-01-01T09:00:00Z"
EVERY_STORE = pytest.mark.parametrize("desk", ["memory", "sqlite", "postgresql"], indirect=True)
"""For the rules that read sub-orders' reports through the store's listing by parent."""


@pytest.fixture(params=["memory", "sqlite"])
def desk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Desk]:
    """A desk on each kind of store (PostgreSQL too where a test asks for EVERY_STORE)."""
    if request.param == "postgresql":
        opened = open_url(request.getfixturevalue("pg_url"))
    else:
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


# --------------------------------------------------------------------------- C5 / LC-14

@pytest.mark.spec("C5", "LC-14", "LC-12")
def test_a_worker_cannot_hand_a_staged_tool_to_a_sub_order(desk: Desk) -> None:
    """The attack: the worker splits its order into a sub-order to a sub-agent carrying the
    tool the order stages (staged there too), to approve the held call itself. Refused as
    C5, staged or not, by the worker and by the manager; nothing is stored."""
    root = working(desk)  # tools filings/* and mail/send, staging mail/send
    for staged in (["mail/send"], None):
        for creator in (WORKER, MANAGER):
            fields = child_fields(root.id, creator, to=HELPER,
                                  tools=["filings/*", "mail/send"], staged=staged)
            with pytest.raises(ValidationFailed) as caught:
                desk.create(fields, creator)
            assert [(f.rule, f.path) for f in caught.value.findings] == [("C5", "/tools/1")]
    assert desk.list(parent_id=root.id) == []


@pytest.mark.spec("C5", "LC-14")
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


TOKENS = {"usd": 1, "tool_calls": 3, "tokens": 1000}
"""A sub-order's budget asking the parent's whole 1000 tokens."""


def tokens_root(desk: Desk) -> OrderView:
    """A working order with a budget of 1000 tokens."""
    return working(desk, budget={"usd": 10, "tool_calls": 40, "tokens": 1000})


def spent(tokens: int, **cost: float) -> dict[str, Any]:
    """A report's fields stating ``tokens`` spent (and nothing of the counted units)."""
    return report_fields(cost={"usd": 0, "tool_calls": 0, "tokens": tokens, **cost})


def reported(desk: Desk, order_id: str, worker: str, tokens: int) -> OrderView:
    """Accept, start and report on a sub-order as its worker, ``tokens`` spent."""
    desk.accept(order_id, worker)
    desk.start(order_id, worker)
    return desk.report(order_id, worker, spent(tokens))


@EVERY_STORE
@pytest.mark.spec("C1", "LC-15", "R7", "RX6")
def test_tokens_spent_through_sub_orders_are_charged_to_the_parent(desk: Desk) -> None:
    """The attack: under a budget of 1000 tokens the worker splits three sub-orders of 1000
    each (none has reported yet, so each fits) and every helper truthfully reports its 1000.
    A fourth is refused (C1: 0 left after their reports), and the worker's own report cannot
    pass as within budget: stating its budget's 1000 is less than its sub-orders reported
    (RX6), stating their 3000 is over its budget (R7). Either way the report is kept and the
    order expired, the finding in the expire event, as for every limit finding."""
    for mine, rule in ((1000, "RX6"), (3000, "R7")):
        root = tokens_root(desk)
        helpers = (HELPER, DEEP, THIRD)
        children = [desk.create(child_fields(root.id, WORKER, to=helper, budget=TOKENS), WORKER)
                    for helper in helpers]
        for child, helper in zip(children, helpers, strict=True):
            assert reported(desk, child.id, helper, 1000).state == "submitted"
        with pytest.raises(ValidationFailed) as caught:
            desk.create(child_fields(root.id, WORKER, budget=TOKENS), WORKER)
        assert [(f.rule, f.path) for f in caught.value.findings] == [("C1", "/budget/tokens")]
        assert "0 left of the parent's 1000" in caught.value.findings[0].message
        view = desk.report(root.id, WORKER, spent(mine, usd=2, tool_calls=7))
        assert view.state == "expired"
        assert view.latest_report is not None and view.latest_report.cost.tokens == mine
        last = desk.store.events(root.id)[-1]
        assert last.action == "expire" and last.data is not None
        assert [(f["rule"], f["path"]) for f in last.data["findings"]] == [(rule, "/cost/tokens")]
        if rule == "RX6":
            assert "tokens spent 1000 is less than the 3000 its sub-orders reported" in (
                last.note or "")


@EVERY_STORE
@pytest.mark.spec("C1", "LC-15", "RX6")
def test_tokens_are_taken_from_the_parent_as_its_sub_orders_report_them(desk: Desk) -> None:
    """A sub-order that has not reported has taken nothing: a sibling of the whole 1000
    still fits beside it. Once another reports 700 (its own sub-order's 500 inside), a new
    sub-order fits only within the 300 left, and the parent's report of those 700 has no
    finding: only direct sub-orders count, each report covering those below it."""
    root = tokens_root(desk)
    desk.create(child_fields(root.id, WORKER, budget=TOKENS), WORKER)  # never reports
    spender = desk.create(child_fields(root.id, WORKER, to=DEEP, budget=TOKENS), WORKER)
    desk.accept(spender.id, DEEP)
    desk.start(spender.id, DEEP)
    below = desk.create(child_fields(spender.id, DEEP, to=THIRD,
                                     budget={"usd": 1, "tool_calls": 1, "tokens": 500}), DEEP)
    assert reported(desk, below.id, THIRD, 500).state == "submitted"
    assert desk.report(spender.id, DEEP, spent(700)).state == "submitted"
    with pytest.raises(ValidationFailed) as caught:
        desk.create(child_fields(root.id, WORKER, to=THIRD, budget={**TOKENS, "tokens": 301}),
                    WORKER)
    assert [(f.rule, f.path) for f in caught.value.findings] == [("C1", "/budget/tokens")]
    assert "300 left" in caught.value.findings[0].message
    fits = desk.create(child_fields(root.id, WORKER, to=THIRD, budget={**TOKENS, "tokens": 300}),
                       WORKER)
    assert fits.order.budget.tokens == 300
    view = desk.report(root.id, WORKER, spent(700, usd=2, tool_calls=7))
    assert view.state == "submitted"
    report = view.latest_report
    assert report is not None
    assert list(iter_report_findings(report, view.order, None, None,
                                     reports_below(desk.store, root.id))) == []
    assert desk.review(root.id, MANAGER, "approve").state == "approved"


@EVERY_STORE
@pytest.mark.spec("RX6", "LC-7")
def test_a_parent_leaving_out_its_sub_orders_tokens_is_expired_with_rx6(desk: Desk) -> None:
    """A parent whose budget has room states fewer tokens than its sub-order reported: an
    RX6 limit finding naming both figures; the report is kept and the order expired. Its
    sub-order's later report does not reach back, and with no sub-order report a parent's
    figure is its own word (the order beside it is submitted)."""
    root = tokens_root(desk)
    child = desk.create(child_fields(root.id, WORKER, budget={**TOKENS, "tokens": 400}), WORKER)
    reported(desk, child.id, HELPER, 400)
    view = desk.report(root.id, WORKER, spent(150))
    assert view.state == "expired"
    last = desk.store.events(root.id)[-1]
    assert last.data is not None
    assert [(f["rule"], f["kind"]) for f in last.data["findings"]] == [("RX6", "limit")]
    assert ("tokens spent 150 is less than the 400 its sub-orders reported "
            f"(400 in '{child.id}')") in last.data["findings"][0]["message"]
    alone = tokens_root(desk)
    desk.create(child_fields(alone.id, WORKER, budget=TOKENS), WORKER)  # offered, no report
    assert desk.report(alone.id, WORKER, spent(0)).state == "submitted"


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



# --------------------------------------------------------------------------- depth

def _chain(desk: Desk, levels: int) -> list[str]:
    """A working root and ``levels`` sub-orders below it, each split from the one before by
    the root's worker alone (it manages every one of them), each to a fresh principal."""
    root = working(desk, budget={"usd": 10, "tool_calls": 3})
    ids = [root.id]
    for level in range(levels):
        ids.append(desk.create(child_fields(ids[-1], WORKER, to=f"agent:level{level}"),
                               WORKER).id)
    return ids


@EVERY_STORE
@pytest.mark.spec("LC-12", "LC-15", "LC-16", "LC-13")
def test_a_chain_of_sub_orders_deeper_than_the_store_charges_is_refused(desk: Desk) -> None:
    """A worker alone splits sub-order under sub-order. Every order above a call is charged
    and checked only to MAX_DEPTH (64) levels, so an order deeper than that would spend
    outside its top order's budget, keep working after the top order is cancelled, and be
    out of sight of its top manager. At 64 orders above, everything still reaches the top;
    the 65th level is refused and nothing is written."""
    from awl.desk.lineage import MAX_DEPTH

    store = desk.store
    ids = _chain(desk, MAX_DEPTH)
    bottom = ids[-1]
    assert spend(store, bottom, 4) == ["filings/search#1", "filings/search#2",
                                       "filings/search#3", f"order {ids[-2]}"]
    assert store.usage(ids[0]).tool_calls == 3  # the root, 64 orders up, is charged
    assert desk.get(bottom, viewer=MANAGER).id == bottom  # and its manager sees it
    with pytest.raises(BadRequest, match=f"already has {MAX_DEPTH} orders above it"):
        desk.create(child_fields(bottom, WORKER, to="agent:too-deep"), WORKER)
    assert [r.order.id for r in store.list_orders(parent_id=bottom)] == []
    desk.cancel(ids[0], MANAGER, "stop everything below")
    assert f"order {ids[0]}, which order {bottom} is split from, is cancelled" in (
        ended_above(store, store.load(bottom).order) or "")


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


def _cli_working(capsys: pytest.CaptureFixture[str], folder: Path, creator: str = MANAGER,
                 worker: str = WORKER, **fields: Any) -> str:
    code, out, err = _create(capsys, folder, creator, fields or order_fields())
    assert code == 0, err
    order_id: str = json.loads(out)["order"]["id"]
    for verb in ("accept", "start"):
        assert _cli(capsys, "work", verb, order_id, "--as", worker)[0] == 0
    return order_id


def _cli_report(capsys: pytest.CaptureFixture[str], folder: Path, order_id: str, worker: str,
                tokens: int) -> tuple[int, str, str]:
    path = folder / "report.json"
    path.write_text(json.dumps(spent(tokens)), encoding="utf-8")
    return _cli(capsys, "work", "report", order_id, str(path), "--as", worker)


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


@pytest.mark.spec("C5", "LC-14", "C1", "LC-15")
def test_the_cli_refuses_a_sub_order_with_a_staged_tool_or_more_than_is_left(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The two sub-order attacks as the worker ran them, with `awl order create`: a sub-order
    carrying the staged mail/send, and one asking more tool_calls than the order has left."""
    root = _cli_working(capsys, home)
    code, _, err = _create(capsys, home, WORKER, child_fields(
        root, WORKER, tools=["filings/*", "mail/send"], staged=["mail/send"]))
    assert code != 0 and err.count("\n") == 1 and "C5 /tools/1" in err
    code, _, err = _create(capsys, home, WORKER, child_fields(
        root, WORKER, budget={"usd": 1, "tool_calls": 41}))
    assert code != 0 and "C1 /budget/tool_calls" in err
    code, out, err = _create(capsys, home, WORKER, child_fields(root, WORKER))
    assert code == 0, err
    assert json.loads(out)["order"]["parent_id"] == root


@pytest.mark.spec("C1", "LC-15", "RX6")
def test_the_cli_carves_tokens_by_report_and_shows_the_rx6_expiry(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With `awl`: a sub-order's report of 600 of the order's 1000 tokens leaves 400 for the
    next sub-order (one of 500 is refused in one line naming C1), and the worker's report of
    100 expires the order, `awl order show` naming RX6 and both figures."""
    root = _cli_working(capsys, home, **order_fields(
        budget={"usd": 10, "tool_calls": 40, "tokens": 1000}))
    child = _cli_working(capsys, home, WORKER, HELPER,
                         **child_fields(root, WORKER, budget={**TOKENS, "tokens": 600}))
    assert _cli_report(capsys, home, child, HELPER, 600)[0] == 0
    code, _, err = _create(capsys, home, WORKER, child_fields(
        root, WORKER, to=DEEP, budget={**TOKENS, "tokens": 500}))
    assert code != 0 and err.count("\n") == 1
    assert "C1 /budget/tokens: tokens 500 is more than the 400 left" in err
    code, out, err = _cli_report(capsys, home, root, WORKER, 100)
    assert code == 0, err
    assert out == f"reported on {root}: now expired (seq 4)\n"
    code, out, _ = _cli(capsys, "order", "show", root, "--as", MANAGER)
    assert code == 0
    assert "expire (working → expired): RX6 /cost/tokens: tokens spent 100 is less than the " \
           "600 its sub-orders reported" in out


# --------------------------------------------------------------------------- the MCP desk

@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("LC-13", "C5", "LC-14")
async def test_the_mcp_desk_refuses_the_same_sub_orders() -> None:
    """create_work_order, bound to the worker, refuses a sub-order to the manager above it
    (BAD_REQUEST) and one carrying the staged tool (VALIDATION_FAILED, C5)."""
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
            assert [(f["rule"], f["path"]) for f in staged["findings"]] == [("C5", "/tools/1")]
    assert [r.order.id for r in store.list_orders()] == [oid]


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("C1", "LC-15", "RX6")
async def test_the_mcp_desk_carves_tokens_by_report_and_expires_an_under_report() -> None:
    """Over MCP (create_work_order, submit_work_report, each client bound to its principal):
    after the helper reports 600 of the order's 1000 tokens, a sub-order of 500 is refused
    as VALIDATION_FAILED with C1 at /budget/tokens, and the worker's report of 100 tokens
    is kept and the order expired by RX6."""
    from tests.awl.test_server_tools import desks

    store = MemoryStore()
    with anyio.fail_after(30):
        async with desks(store, MANAGER, WORKER, HELPER) as (m, w, h):
            created = await m.call("create_work_order", order=order_fields(
                to=WORKER, budget={"usd": 10, "tool_calls": 40, "tokens": 1000}))
            oid = created["order"]["id"]
            await w.call("accept_work_order", order_id=oid)
            await w.call("start_work_order", order_id=oid)
            sub = await w.call("create_work_order", order=child_fields(
                oid, WORKER, budget={**TOKENS, "tokens": 600}))
            sid = sub["order"]["id"]
            await h.call("accept_work_order", order_id=sid)
            await h.call("start_work_order", order_id=sid)
            done = await h.call("submit_work_report", order_id=sid, report=spent(600))
            assert done["state"] == "submitted"
            over = await w.refused("create_work_order", order=child_fields(
                oid, WORKER, to=DEEP, budget={**TOKENS, "tokens": 500}))
            assert over["code"] == "VALIDATION_FAILED"
            assert [(f["rule"], f["path"]) for f in over["findings"]] == [("C1", "/budget/tokens")]
            mine = await w.call("submit_work_report", order_id=oid, report=spent(100))
            assert mine["state"] == "expired"
            assert mine["reports"][-1]["cost"]["tokens"] == 100
    last = store.events(oid)[-1]
    assert last.action == "expire" and last.data is not None
    assert [(f["rule"], f["path"]) for f in last.data["findings"]] == [("RX6", "/cost/tokens")]


@pytest.mark.anyio
@pytest.mark.spec("LC-12", "LC-15", "LC-16")
async def test_the_mcp_desk_refuses_a_sub_order_deeper_than_the_chain_is_charged() -> None:
    """Over MCP the worker alone, bound to its connection, splits sub-order under sub-order
    (it manages each one it splits). The one that would have 65 orders above it, past what
    a call is charged to and what an ended order above can stop, is BAD_REQUEST."""
    from awl.desk.lineage import MAX_DEPTH
    from tests.awl.test_server_tools import desks

    store = MemoryStore()
    with anyio.fail_after(60):
        async with desks(store, MANAGER, WORKER) as (m, w):
            top = await m.call("create_work_order", order=order_fields(to=WORKER))
            parent: str = top["order"]["id"]
            await w.call("accept_work_order", order_id=parent)
            await w.call("start_work_order", order_id=parent)
            for level in range(MAX_DEPTH):
                made = await w.call("create_work_order", order=child_fields(
                    parent, WORKER, to=f"agent:level{level}"))
                parent = made["order"]["id"]
            refused = await w.refused("create_work_order", order=child_fields(
                parent, WORKER, to="agent:too-deep"))
    assert refused["code"] == "BAD_REQUEST"
    assert f"already has {MAX_DEPTH} orders above it" in refused["message"]
    assert len(store.list_orders(limit=None)) == MAX_DEPTH + 1


@pytest.mark.spec("LC-16", "DP-8")
def test_no_pass_is_issued_under_a_sub_order_whose_parent_has_ended(
        desk: Desk, tmp_path: Path) -> None:
    """The parent cancelled, the sub-order still stored as working: the desk signed a pass
    for it that every gateway refuses (LC-16) but a verifier holding only the key set
    accepts. Now no pass is issued while any order above has ended."""
    from awl import InvalidTransition
    from awl.passes import KeyStore, issue_recorded_pass

    parent = working(desk)
    child = desk.create(child_fields(parent.id, WORKER), WORKER)
    desk.accept(child.id, HELPER)
    desk.start(child.id, HELPER)
    keys = KeyStore(tmp_path / "keys")
    assert issue_recorded_pass(desk.store, child.id, keys=keys, subject=HELPER)
    desk.cancel(parent.id, MANAGER, "not needed any more")
    assert desk.store.load(child.id).state == "working"
    with pytest.raises(InvalidTransition, match=f"order {parent.id}, which order "
                                                f"{child.id} is split from, is cancelled"):
        issue_recorded_pass(desk.store, child.id, keys=keys, subject=HELPER)
    assert len(desk.store.passes(child.id)) == 1
