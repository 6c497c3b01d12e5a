"""The worker reports through the gateway; the report's refs are checked against the call log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from awl.mcp.errors import ERROR_META
from tests.gateway.gateway_support import connect, make_env, text

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

EMAIL = {"to": "cfo@example.com", "subject": "Q3", "body": "Three risks."}


def _report(**over: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "status": "done",
        "result": {"summary": "answered and queued the email"},
        "evidence": [{"criterion": "c1", "type": "tool_call", "ref": "notes/search_notes#1"}],
        "cost": {"tool_calls": 2, "usd": 0},
        "tools_used": ["notes/search_notes", "notes/send_email"],
        "effects": [{"ref": "notes/send_email#2", "tool": "notes/send_email",
                     "arguments": EMAIL}],
    }
    report.update(over)
    return {k: v for k, v in report.items() if v is not None}


def _rules(result: Any) -> set[tuple[str, str]]:
    assert result.structured_content is None
    findings = result.meta[ERROR_META]["findings"]
    return {(f["rule"], f["path"]) for f in findings if f["kind"] == "invalid"}


@pytest.mark.spec("GW-11")
async def test_report_refs_are_checked_against_the_call_log(tmp_path: Path) -> None:
    """A report citing unknown refs, other arguments or other tools is refused; the truth passes."""
    env = make_env(tmp_path)
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            search = await client.call_tool("notes__search_notes", {"query": "refund"})
            held = await client.call_tool("notes__send_email", EMAIL)
            held_list = await client.call_tool("awl_list_held_calls", {})
            order = await client.call_tool("awl_get_order", {})
            unknown = await client.call_tool("awl_submit_report", {"report": _report(
                evidence=[{"criterion": "c1", "type": "tool_call",
                           "ref": "notes/search_notes#7"}])})
            swapped = await client.call_tool("awl_submit_report", {"report": _report(
                effects=[{"ref": "notes/send_email#2", "tool": "notes/send_email",
                          "arguments": {**EMAIL, "to": "everyone@example.com"}}])})
            unlisted = await client.call_tool("awl_submit_report", {"report": _report(
                tools_used=["notes/send_email"])})
            good = await client.call_tool("awl_submit_report", {"report": _report(
                effects=held_list.structured_content["effects"])})
            after = await client.call_tool("notes__search_notes", {"query": "x"})
    assert not search.is_error and text(held) == "pending:notes/send_email#2"
    assert order.structured_content is not None
    assert order.structured_content["tools_used"] == ["notes/search_notes", "notes/send_email"]
    assert unknown.is_error and text(unknown).startswith("VALIDATION_FAILED: ")
    assert ("RX2", "/evidence/0/ref") in _rules(unknown)
    assert swapped.is_error and ("RX3", "/effects/0") in _rules(swapped)
    assert unlisted.is_error and ("RX4", "/tools_used") in _rules(unlisted)
    assert not good.is_error, text(good)
    assert good.structured_content == {"state": "submitted", "attempt": 1, "seq": 4}
    assert after.is_error and text(after).startswith("AWL_NOT_ACTIVE: ")
    assert env.view().state == "submitted"
    assert env.outbox_lines() == []


@pytest.mark.spec("GW-7")
async def test_calls_carry_the_attempt_across_a_rework(tmp_path: Path) -> None:
    """After a rework, calls are numbered on and recorded under the next attempt."""
    env = make_env(tmp_path, staged=[])
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            await client.call_tool("notes__search_notes", {"query": "invoice"})
            first = await client.call_tool("awl_submit_report", {"report": _report(
                tools_used=["notes/search_notes"], effects=None,
                cost={"tool_calls": 1, "usd": 0})})
            assert not first.is_error, text(first)
            env.desk.review(env.order_id, "human:ana", "rework", "cite the refund note too")
            await client.call_tool("notes__get_note", {"id": "n3"})
            order = await client.call_tool("awl_get_order", {})
    records = env.calls()
    assert [(r.ref, r.attempt) for r in records] == [
        ("notes/search_notes#1", 1), ("notes/get_note#2", 2)]
    assert order.structured_content is not None
    assert order.structured_content["attempt"] == 2
    assert order.structured_content["latest_review"]["reason"] == "cite the refund note too"


@pytest.mark.spec("GW-10")
async def test_a_placeholder_to_a_held_call_of_an_earlier_attempt_is_refused(
        tmp_path: Path) -> None:
    """After a rework, a $ref to a call held in the previous attempt is refused, not held."""
    env = make_env(tmp_path, staged=["receiver/*"])
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            first = await client.call_tool("receiver__create_issue", {"title": "Outage"})
            report = await client.call_tool("awl_submit_report", {"report": _report(
                evidence=[{"criterion": "c1", "type": "tool_call",
                           "ref": "receiver/create_issue#1"}],
                tools_used=["receiver/create_issue"], effects=None,
                cost={"tool_calls": 1, "usd": 0})})
            assert not report.is_error, text(report)
            env.desk.review(env.order_id, "human:ana", "rework", "file it under billing")
            stale = await client.call_tool("receiver__deliver", {"to": "ops", "body": {
                "$ref": "receiver/create_issue#1", "pointer": "/structuredContent/number"}})
            again = await client.call_tool("receiver__create_issue", {"title": "Billing"})
            fresh = await client.call_tool("receiver__deliver", {"to": "ops", "body": {
                "$ref": "receiver/create_issue#3", "pointer": "/structuredContent/number"}})
    assert text(first) == "pending:receiver/create_issue#1"
    assert stale.is_error and text(stale).startswith("AWL_INVALID_ARGUMENTS: ")
    assert "receiver/create_issue#1" in text(stale)
    assert text(again) == "pending:receiver/create_issue#3"
    assert text(fresh) == "pending:receiver/deliver#4"
    assert [(r.outcome, r.attempt) for r in env.calls()] == [
        ("held", 1), ("error", 2), ("held", 2), ("held", 2)]
    assert env.deliveries() == []


@pytest.mark.spec("GW-11")
async def test_the_worker_cites_refs_it_listed_across_a_rework(tmp_path: Path) -> None:
    """Refs read from awl_list_calls, per attempt, are accepted as the report's evidence."""
    env = make_env(tmp_path, staged=[])
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            await client.call_tool("notes__search_notes", {"query": "invoice"})
            mine = await client.call_tool("awl_list_calls", {"attempt": 1})
            [call] = (mine.structured_content or {})["calls"]
            first = await client.call_tool("awl_submit_report", {"report": _report(
                evidence=[{"criterion": "c1", "type": "tool_call", "ref": call["ref"]}],
                tools_used=[call["tool"]], effects=None, cost={"tool_calls": 1, "usd": 0})})
            assert not first.is_error, text(first)
            env.desk.review(env.order_id, "human:ana", "rework", "cite the refund note too")
            await client.call_tool("notes__get_note", {"id": "n3"})
            second = await client.call_tool("awl_list_calls", {"attempt": 2})
            every = await client.call_tool("awl_list_calls", {})
            [note] = (second.structured_content or {})["calls"]
            final = await client.call_tool("awl_submit_report", {"report": _report(
                evidence=[{"criterion": "c1", "type": "tool_call", "ref": call["ref"]},
                          {"criterion": "c1", "type": "tool_call", "ref": note["ref"]}],
                tools_used=[note["tool"]], effects=None, cost={"tool_calls": 2, "usd": 0})})
    assert (call["ref"], call["attempt"]) == ("notes/search_notes#1", 1)
    assert (note["ref"], note["attempt"], note["outcome"]) == ("notes/get_note#2", 2, "ok")
    assert (second.structured_content or {})["attempt"] == 2
    assert [c["ref"] for c in (every.structured_content or {})["calls"]] == [
        "notes/search_notes#1", "notes/get_note#2"]
    assert not final.is_error, text(final)
    assert env.view().state == "submitted"
