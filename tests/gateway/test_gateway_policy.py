"""The pure decision for one call, and the held call's argument checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from awl.documents.models import Budget, CallRecord, Grant, WorkOrder
from awl.store.protocol import Scope, Usage
from awl.store.rules import exceeded_scope
from gateway._policy import (
    AWL_BUDGET_EXHAUSTED,
    AWL_EXPIRED,
    AWL_FORBIDDEN,
    AWL_NOT_ACTIVE,
    AWL_PASS_INVALID,
    Decision,
    budget_refusal,
    decide,
    is_staged,
)
from gateway._staging import check_arguments, placeholders

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _order(**changes: Any) -> WorkOrder:
    data: dict[str, Any] = {
        "spec": "awl/work-order@0.3",
        "id": "wo_1",
        "created_at": "2026-11-01T00:00:00Z",
        "from": "human:ana",
        "to": "agent:w",
        "goal": "Do it",
        "criteria": [{"id": "c1", "text": "done"}],
        "budget": {"tool_calls": 10, "usd": 1.0, "seconds": 600},
        "deadline": "2026-11-02T00:00:00Z",
        "tools": ["notes/*", "time/get_current_time"],
        "staged": ["notes/add"],
    }
    data.update(changes)
    return WorkOrder.model_validate(data)


def _decide(**changes: Any) -> Decision:
    args: dict[str, Any] = {
        "order": _order(), "state": "working", "now": NOW, "tool": "notes/search",
        "usage": Usage(),
    }
    args.update(changes)
    return decide(**args)


def test_an_allowed_read_is_forwarded() -> None:
    """A call the order allows, with budget left, is forwarded."""
    assert _decide().action == "forward"


@pytest.mark.spec("GW-9")
def test_a_staged_tool_is_held() -> None:
    """A call matched by the order's staged patterns is held."""
    assert _decide(tool="notes/add").action == "hold"


@pytest.mark.spec("GW-9")
def test_the_operator_hold_list_holds() -> None:
    """A call matched by the operator's hold list is held even if the order does not stage it."""
    assert _decide(hold=["notes/search"]).action == "hold"


@pytest.mark.spec("GW-9")
def test_safe_mode_holds_unless_read_only() -> None:
    """Safe mode holds a tool unless its upstream says it is read-only."""
    assert _decide(safe=True).action == "hold"
    assert _decide(safe=True, read_only=False).action == "hold"
    assert _decide(safe=True, read_only=True).action == "forward"
    assert is_staged("notes/add", _order(), safe=True, read_only=True)


@pytest.mark.spec("GW-4", "GW-6")
def test_refusals_carry_their_codes() -> None:
    """Each failed check refuses with its own code and a CODE: message text."""
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tool": "mail/send"}, AWL_FORBIDDEN),
        ({"tool": None, "requested": "NOTES__search"}, AWL_FORBIDDEN),
        ({"state": "submitted"}, AWL_NOT_ACTIVE),
        ({"state": "offered"}, AWL_NOT_ACTIVE),
        ({"now": NOW + timedelta(days=2)}, AWL_EXPIRED),
        ({"pass_problem": "revoked"}, AWL_PASS_INVALID),
        ({"usage": Usage(tool_calls=10)}, AWL_BUDGET_EXHAUSTED),
        ({"usage": Usage(usd=0.9), "usd": 0.2}, AWL_BUDGET_EXHAUSTED),
        ({"usage": Usage(first_call_at="2026-11-01T11:49:00Z")}, AWL_BUDGET_EXHAUSTED),
    ]
    for changes, code in cases:
        decision = _decide(**changes)
        assert (decision.action, decision.code) == ("refuse", code), changes
        assert decision.text.startswith(f"{code}: ")


@pytest.mark.spec("GW-5")
def test_budget_allows_up_to_the_limit() -> None:
    """The last call within each limit is still allowed."""
    assert _decide(usage=Usage(tool_calls=9)).action == "forward"
    assert _decide(usage=Usage(usd=0.8), usd=0.2).action == "forward"
    assert _decide(usage=Usage(first_call_at="2026-11-01T11:51:00Z")).action == "forward"


@pytest.mark.spec("GW-5")
def test_the_gateway_and_the_store_share_one_usd_tolerance() -> None:
    """A float sum a hair above the limit (0.1 + 0.1 + 0.1 > 0.3) fits in both the gateway's
    decision and the store's reservation; a real overrun is refused by both."""
    order = _order(budget={"usd": 0.3})
    for used, usd, fits in [(0.1 + 0.1, 0.1, True), (0.3, 1e-10, True), (0.3, 1e-8, False),
                            (0.2, 0.2, False)]:

        def spent(_jtis: frozenset[str] | None, used: float = used) -> tuple[int, float]:
            return 0, used

        decided = _decide(order=order, usage=Usage(usd=used), usd=usd).action
        reserved = exceeded_scope([Scope(None, max_usd=0.3)], spent, usd)
        assert (decided == "forward", reserved is None) == (fits, fits), (used, usd)


@pytest.mark.spec("GW-4")
def test_a_pass_narrows_tools_and_budget() -> None:
    """A pass grant refuses tools outside it and spends its own smaller budget."""
    grant = Grant(order_id="wo_1", tools=("time/*",), budget=Budget(tool_calls=2))
    assert _decide(grant=grant).code == AWL_FORBIDDEN
    assert _decide(grant=grant, tool="time/get_current_time").action == "forward"
    assert _decide(grant=grant, tool="time/get_current_time",
                   pass_usage=Usage(tool_calls=2)).code == AWL_BUDGET_EXHAUSTED


@pytest.mark.spec("GW-4")
def test_the_first_failing_check_decides() -> None:
    """Pass, then state, then deadline, then tool, then budget: the first failure is the code."""
    late = NOW + timedelta(days=2)
    spent = Usage(tool_calls=10)
    assert _decide(pass_problem="expired", state="approved", now=late, tool="mail/send",
                   usage=spent).code == AWL_PASS_INVALID
    assert _decide(state="approved", now=late, tool="mail/send",
                   usage=spent).code == AWL_NOT_ACTIVE
    assert _decide(now=late, tool="mail/send", usage=spent).code == AWL_EXPIRED
    assert _decide(tool="mail/send", usage=spent).code == AWL_FORBIDDEN
    assert _decide(tool=None, requested="mail__send", usage=spent).code == AWL_FORBIDDEN
    assert _decide(usage=spent).code == AWL_BUDGET_EXHAUSTED


def test_a_reservation_turned_down_names_the_budget_it_would_pass() -> None:
    """The store refuses on the order's scope, on the pass's, or on an order above (which it
    names ``order <id>``): each refusal says whose budget it was."""
    own = budget_refusal(Scope(None, max_calls=3), "wo_1")
    assert own.code == AWL_BUDGET_EXHAUSTED
    assert "order wo_1 has spent its budget (3 tool_calls)" in own.text
    mine = budget_refusal(Scope(frozenset({"p"}), max_usd=0.5, name="pass p"), "wo_1")
    assert "your pass has spent its budget (0.5 usd)" in mine.text
    above = budget_refusal("order wo_0", "wo_1")
    assert above.code == AWL_BUDGET_EXHAUSTED
    assert above.text.startswith("AWL_BUDGET_EXHAUSTED: order wo_0, which order wo_1 is split from")


def _held(ref: str, tool: str) -> CallRecord:
    return CallRecord(ref=ref, order_id="wo_1", attempt=1, tool=tool, arguments={},
                      outcome="held", started_at="2026-11-01T00:00:00Z",
                      ended_at="2026-11-01T00:00:00Z")


SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "issue": {"type": "integer"}},
    "required": ["title"],
    "additionalProperties": False,
}


@pytest.mark.spec("GW-9")
def test_held_arguments_are_checked_against_the_schema() -> None:
    """Arguments that break the upstream's input schema keep a call from being held."""
    assert check_arguments({"title": "x"}, SCHEMA, earlier={}) == []
    assert check_arguments({"title": 3}, SCHEMA, earlier={})
    assert check_arguments({}, SCHEMA, earlier={})
    assert check_arguments({"title": "x", "other": 1}, SCHEMA, earlier={})


@pytest.mark.spec("GW-10")
def test_a_placeholder_skips_schema_checks_where_it_stands() -> None:
    """A $ref value to an earlier held call is accepted wherever a value goes."""
    earlier = {"gh/create_issue#3": _held("gh/create_issue#3", "gh/create_issue")}
    ref = {"$ref": "gh/create_issue#3", "pointer": "/structuredContent/number"}
    assert check_arguments({"title": "x", "issue": ref}, SCHEMA, earlier=earlier) == []
    assert check_arguments({"title": ref}, SCHEMA, earlier=earlier) == []
    draft = {"$ref": "gh/create_issue#call-3", "pointer": ""}
    assert check_arguments({"title": "x", "issue": draft}, SCHEMA, earlier=earlier) == []


@pytest.mark.spec("GW-10")
def test_a_placeholder_must_name_an_earlier_held_call() -> None:
    """A $ref to an unknown call, or a malformed one, is a problem."""
    earlier = {"gh/create_issue#3": _held("gh/create_issue#3", "gh/create_issue")}
    bad = [
        {"$ref": "gh/create_issue#4"},
        {"$ref": "not a ref"},
        {"$ref": "gh/create_issue#3", "pointer": "no-slash"},
        {"$ref": "gh/create_issue#3", "extra": 1},
    ]
    for value in bad:
        assert check_arguments({"title": "x", "issue": value}, SCHEMA, earlier=earlier), value


@pytest.mark.spec("GW-10")
def test_placeholders_are_found_anywhere() -> None:
    """Placeholders nested in lists and objects are all found, with their paths."""
    args = {"a": [{"$ref": "s/t#1"}, {"b": {"$ref": "s/t#2", "pointer": "/x"}}]}
    found = [p for p in placeholders(args) if not isinstance(p, str)]
    assert [(p.path, p.ref, p.pointer) for p in found] == [
        (("a", 0), "s/t#1", ""), (("a", 1, "b"), "s/t#2", "/x")]


def test_a_bad_placeholder_is_named_by_its_escaped_pointer() -> None:
    """The place of a malformed placeholder is an RFC 6901 pointer: ``/`` in a key is ``~1``,
    ``~`` is ``~0``; the top of the arguments is ``/``."""
    assert list(placeholders({"a/b": {"~c": {"$ref": "nope"}}})) == [
        "the $ref at /a~1b/~0c must be a call ref like server/tool#3"]
    assert list(placeholders({"$ref": "nope"})) == [
        "the $ref at / must be a call ref like server/tool#3"]
