"""The desk MCP server over stdio: real ``awl serve`` subprocesses, one per identity, on one
SQLite desk, driven with the official SDK client in both protocol eras."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from awl.documents.models import CallRecord, format_time
from awl.server import TOOL_NAMES, DeskServer
from awl.store.memory import MemoryStore
from awl.store.sqlite import SQLiteStore
from tests.awl.server_support import (
    MANAGER,
    WORKER,
    Desk,
    forward_call,
    hold_call,
    order_fields,
    serve_as,
)

pytestmark = pytest.mark.slow

# Every manager action, as a worker-bound connection would try it (SEC-1).
MANAGER_CALLS: dict[str, dict[str, Any]] = {
    "review_work_report": {"decision": "approve"},
    "answer_question": {"answer": "do it my way"},
    "cancel_work_order": {"reason": "I would rather not"},
    "settle_effect": {"ref": "mail/send#1", "verdict": "happened", "evidence": "trust me"},
}


def _worker_calls() -> dict[str, dict[str, Any]]:
    """Every worker action, as a manager-bound connection would try it (SEC-1)."""
    return {
        "accept_work_order": {}, "decline_work_order": {"reason": "busy"},
        "start_work_order": {}, "post_progress": {"note": "done, I promise"},
        "submit_work_report": {"report": _report("done", [], [])},
    }


def _report(status: str, evidence: list[dict[str, Any]], effects: list[CallRecord],
            tools: tuple[str, ...] = ()) -> dict[str, Any]:
    report: dict[str, Any] = {
        "status": status,
        "result": {"summary": f"a {status} report"},
        "evidence": evidence,
        "cost": {"usd": 1.5, "tool_calls": len(effects) + 1},
        "tools_used": sorted(tools),
    }
    if status == "blocked":
        report["questions"] = ["Which quarter: Q3 or Q4?"]
    if effects:
        report["effects"] = [{"ref": c.ref, "tool": c.tool, "arguments": c.arguments}
                             for c in effects]
    return report


def _done(read: CallRecord, effects: list[CallRecord]) -> dict[str, Any]:
    evidence = [{"criterion": "c1", "type": "tool_call", "ref": read.ref},
                {"criterion": "c2", "type": "note", "note": "sent once approved"}]
    return _report("done", evidence, effects, tools=("files/read", "mail/send"))


async def _all_refused(desk: Desk, order_id: str, calls: dict[str, dict[str, Any]]) -> None:
    for name, arguments in calls.items():
        error = await desk.refused(name, order_id=order_id, **arguments)
        assert error["code"] == "FORBIDDEN", (name, error)


def _now() -> str:
    return format_time(datetime.now(UTC))


@pytest.mark.anyio
@pytest.mark.parametrize(("manager_mode", "worker_mode", "version"), [
    ("legacy", "legacy", "2025-11-25"),
    ("auto", "2026-07-28", "2026-07-28"),
])
@pytest.mark.spec("BIND-2", "BIND-3", "SEC-1", "BIND-20")
async def test_an_order_runs_its_whole_course_between_two_bound_connections(
        tmp_path: Path, manager_mode: str, worker_mode: str, version: str) -> None:
    """A manager and a worker, each through its own `awl serve` on one desk, take an order
    through progress, a question, a rework and a partial approval, and every result fits
    its tool's output schema."""
    home = tmp_path / "home"
    home.mkdir()
    store = SQLiteStore(home / "desk.sqlite3")
    try:
        with anyio.fail_after(100):
            async with serve_as(home, MANAGER, manager_mode) as m, \
                    serve_as(home, WORKER, worker_mode) as w:
                assert m.client.protocol_version == w.client.protocol_version == version
                assert "submit_work_report" in (m.client.instructions or "")
                await _course(m, w, store)
    finally:
        store.close()


async def _course(m: Desk, w: Desk, store: SQLiteStore) -> None:
    worker_calls = _worker_calls()
    created = await m.call("create_work_order", order=order_fields())
    oid = created["order"]["id"]
    assert created["order"]["from"] == MANAGER
    assert (created["state"], created["seq"]) == ("offered", 1)
    assert created["your_roles"] == ["manager", "answerer"]
    assert created["next_tools"] == ["cancel_work_order"]
    forged = await w.refused("create_work_order", order={**order_fields(), "from": MANAGER})
    assert forged["code"] == "FORBIDDEN"

    mine = await w.call("list_work_orders", role="worker", state="offered")
    assert [o["id"] for o in mine["orders"]] == [oid]
    assert mine["orders"][0]["next_tools"] == ["accept_work_order", "decline_work_order"]
    await _all_refused(w, oid, MANAGER_CALLS)
    await _all_refused(m, oid, worker_calls)

    assert (await w.call("accept_work_order", order_id=oid))["state"] == "accepted"
    await _all_refused(m, oid, worker_calls)
    working = await w.call("start_work_order", order_id=oid)
    assert working["state"] == "working"

    # The manager long-polls while the worker posts progress.
    news: dict[str, Any] = {}

    async def wait() -> None:
        news.update(await m.call("wait_for_update", order_id=oid, after_seq=working["seq"],
                                 timeout_seconds=30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await w.call("post_progress", order_id=oid, note="drafting the summary", percent=30)
    assert [e["action"] for e in news["events"]] == ["progress"]
    assert news["events"][0]["data"] == {"percent": 30} and not news["timed_out"]

    issued = await w.call("issue_delegation_pass", order_id=oid)
    assert issued["subject"] == WORKER and issued["tools"] == ["files/read", "mail/*"]

    blocked = await w.call("submit_work_report", order_id=oid, report=_report("blocked", [], []))
    assert blocked["state"] == "blocked"
    assert blocked["open_questions"] == ["Which quarter: Q3 or Q4?"]
    await _all_refused(w, oid, MANAGER_CALLS)
    queue = await m.call("list_work_orders", role="answerer")
    assert [(o["id"], o["blocking"]) for o in queue["orders"]] == [(oid, 1)]
    assert "next" not in queue  # the last page (BIND-20)
    garbled = await m.refused("list_work_orders", role="answerer", after="garbled")
    assert garbled["code"] == "BAD_REQUEST" and "cursor" in garbled["message"]
    answered = await m.call("answer_question", order_id=oid, answer="Q3")
    assert answered["state"] == "working"

    read = forward_call(store, oid, 1, "files/read", {"path": "q3.md"})
    first = hold_call(store, oid, 1, "mail/send", {"to": "board@example.com", "body": "v1"})
    await w.call("submit_work_report", order_id=oid, report=_done(read, [first]))
    news = await m.call("wait_for_update", order_id=oid, after_seq=answered["seq"],
                        timeout_seconds=30)
    assert [e["action"] for e in news["events"]] == ["report"]
    assert news["state"] == "submitted"
    await _all_refused(w, oid, MANAGER_CALLS)
    await _all_refused(m, oid, worker_calls)

    rework = await m.call("review_work_report", order_id=oid, decision="rework",
                          reason="copy the CFO")
    assert (rework["state"], rework["attempt"]) == ("working", 2)
    effects = await m.call("list_effects", order_id=oid)
    assert [(e["ref"], e["state"]) for e in effects["effects"]] == [(first.ref, "dropped")]

    read2 = forward_call(store, oid, 2, "files/read", {"path": "q3.md"})
    board = hold_call(store, oid, 2, "mail/send", {"to": "board@example.com", "body": "v2"})
    cfo = hold_call(store, oid, 2, "mail/send", {"to": "cfo@example.com", "body": "v2"})
    submitted = await w.call("submit_work_report", order_id=oid,
                             report=_done(read2, [board, cfo]))
    assert submitted["state"] == "submitted"
    assert [r["attempt"] for r in submitted["reports"]] == [1, 1, 2]
    assert set(submitted["next_tools"]) == set()  # the worker waits for the review
    mine_now = await m.call("get_work_order", order_id=oid)
    assert set(mine_now["next_tools"]) == {"review_work_report", "cancel_work_order"}

    approved = await m.call("review_work_report", order_id=oid, decision="approve",
                            effects=[board.ref])
    assert approved["state"] == "approved"
    assert approved["reviews"][-1]["effects"] == [board.ref]
    assert issued["jti"] in store.revoked()  # the order ended, so its passes did too
    await _all_refused(w, oid, MANAGER_CALLS)

    # The commit sent the board's mail and never heard back: the effect is unknown.
    store.set_effect(oid, board.ref, expect=["held"], state="dispatching",
                     count_dispatch=True, at=_now())
    store.set_effect(oid, board.ref, expect=["dispatching"], state="unknown", at=_now())
    settled = await m.call("settle_effect", order_id=oid, ref=board.ref,
                           verdict="did_not_happen", evidence="no such mail in the inbox")
    assert settled["effect"]["retryable"] is True

    full = await w.call("get_work_order", order_id=oid, include_events=True)
    drop = next(e for e in full["events"] if e["action"] == "drop")
    assert (drop["actor"], drop["data"]["refs"]) == ("awl:desk", [first.ref])
    assert [e["action"] for e in full["events"]] == [
        "create", "accept", "start", "progress", "report", "answer", "report", "rework",
        "drop", "report", "approve", "settle"]
    handoff = await w.call("get_handoff", order_id=oid)
    assert handoff["markdown"].startswith("#")
    track = await m.call("get_track_record", worker=WORKER)
    assert (track["orders"], track["approved_after_rework"]) == (1, 1)

    declined = await m.call("create_work_order", order=order_fields(goal="Another job"))
    gone = await w.call("decline_work_order", order_id=declined["order"]["id"], reason="busy")
    assert gone["state"] == "declined"
    dropped = await m.call("create_work_order", order=order_fields(goal="A third job"))
    cancelled = await m.call("cancel_work_order", order_id=dropped["order"]["id"],
                             reason="no longer needed")
    assert cancelled["state"] == "cancelled"

    assert m.used | w.used == set(TOOL_NAMES)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.spec("BIND-2")
async def test_the_tool_list_declares_schemas_and_honest_annotations(mode: str) -> None:
    """Every published tool is listed with valid input and output schemas and no actor
    argument, read-only tools say so, and the server tells a connecting agent how the flow
    works, in either era."""
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

    server = DeskServer(MemoryStore(), principal=MANAGER)
    with anyio.fail_after(30):
        async with Client(server.server, mode=mode) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            instructions = client.instructions
    assert tuple(tools) == TOOL_NAMES
    for tool in tools.values():
        Draft202012Validator.check_schema(tool.input_schema)
        assert tool.output_schema is not None
        Draft202012Validator.check_schema(tool.output_schema)
        assert "actor" not in tool.input_schema.get("properties", {})
        assert tool.annotations is not None and tool.annotations.open_world_hint is False
    read_only = {n for n, t in tools.items() if t.annotations and t.annotations.read_only_hint}
    assert read_only == {"list_work_orders", "get_work_order", "wait_for_update",
                         "get_track_record", "get_handoff", "list_effects"}
    destructive = {n for n, t in tools.items()
                   if t.annotations and t.annotations.destructive_hint}
    assert destructive == {"decline_work_order", "review_work_report", "cancel_work_order"}
    assert instructions is not None
    for name in ("create_work_order", "submit_work_report", "review_work_report"):
        assert name in instructions
