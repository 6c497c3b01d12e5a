"""The gateway in-process, in front of real subprocess upstreams, driven by the SDK client."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from awl.documents.errors import Conflict, NotFound
from awl.documents.models import CallRecord, parse_time
from awl.store.sqlite import SQLiteStore
from gateway._config import ConfigError, load_config
from gateway._gateway import UNRESOLVED_TOOL
from gateway._names import SEPARATOR, NameTable, split_canonical
from gateway._serve import open_gateway
from gateway._worker_tools import MAX_CALL_LIMIT, WORKER_TOOL_NAMES
from tests.gateway.gateway_support import WORKER, connect, make_env, text, time_entry

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.mark.spec("GW-3")
async def test_tools_list_shows_only_allowed_tools(tmp_path: Path) -> None:
    """tools/list shows the allowed upstream tools under model-safe names, and the desk tools."""
    env = make_env(tmp_path, tools=["notes/search_notes", "notes/send_email", "receiver/*"])
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            listed = {t.name: t for t in (await client.list_tools()).tools}
    assert set(listed) == {
        "notes__search_notes", "notes__send_email", "receiver__deliver",
        "receiver__create_issue", "receiver__reject", "receiver__echo",
        "awl_get_order", "awl_post_progress", "awl_list_calls", "awl_list_held_calls",
        "awl_submit_report"}
    search = listed["notes__search_notes"]
    assert search.description is not None
    assert search.description.startswith("[notes/search_notes] ")
    assert search.input_schema["required"] == ["query"]
    held = listed["notes__send_email"]
    assert held.description is not None and "Held for the manager's approval" in held.description


@pytest.mark.spec("GW-7")
async def test_an_allowed_call_is_forwarded_and_recorded(tmp_path: Path) -> None:
    """A forwarded call reaches the upstream with awl/ref and is recorded before the answer."""
    env = make_env(tmp_path, staged=[])
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            result = await client.call_tool("receiver__deliver", {"to": "ops"})
            records = env.calls()
    assert not result.is_error
    assert result.structured_content == {"number": 1, "delivered": True}
    [record] = records
    assert (record.ref, record.outcome, record.attempt, record.pass_jti) == (
        "receiver/deliver#1", "ok", 1, None)
    assert (record.order_id, record.tool, record.arguments) == (
        env.order_id, "receiver/deliver", {"to": "ops"})
    assert parse_time(record.started_at) <= parse_time(record.ended_at)
    assert record.result is not None and record.result["structuredContent"]["number"] == 1
    [delivery] = env.deliveries()
    assert (delivery["ref"], delivery["order"], delivery["attempt"]) == (
        "receiver/deliver#1", env.order_id, 1)


@pytest.mark.spec("GW-2", "GW-6")
async def test_name_tricks_never_reach_an_upstream(tmp_path: Path) -> None:
    """Case, whitespace, look-alike letters, '..', canonical and unlisted names are refused."""
    env = make_env(tmp_path, staged=[])
    tricks = [
        "NOTES__send_email", "notes__Send_email", "notes__send_email ", " notes__send_email",
        "notes__send_email\n", "notes__\u0455end_email", "notes__send_emai\u031f",
        "notes\u2017send_email", "notes__..__send_email", "../notes__send_email",
        "notes/send_email", "notes.send_email", "mail__send_email", "notes__send_email__",
        "notes____send_email", "", "awl_get_order ", "*",
    ]
    args = {"to": "x@example.com", "subject": "s", "body": "b"}
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            answers = [await client.call_tool(name, args) for name in tricks]
            assert env.outbox_lines() == []
            real = await client.call_tool("notes__send_email", args)
    for name, answer in zip(tricks, answers, strict=True):
        assert answer.is_error, name
        assert text(answer).startswith("AWL_FORBIDDEN: "), (name, text(answer))
    assert not real.is_error
    sent = [line["awl_ref"] for line in env.outbox_lines()]
    assert sent == [f"notes/send_email#{len(tricks) + 1}"]
    records = env.calls()
    assert [r.outcome for r in records] == ["refused"] * len(tricks) + ["ok"]
    assert {r.tool for r in records[:-1]} <= {UNRESOLVED_TOOL}
    assert env.store.usage(env.order_id).tool_calls == 1


@pytest.mark.spec("GW-9", "GW-11")
async def test_a_staged_call_is_held_not_forwarded(tmp_path: Path) -> None:
    """A staged call is validated, recorded as held with its arguments, and answered pending."""
    env = make_env(tmp_path)
    args = {"to": "cfo@example.com", "subject": "Q3", "body": "Three risks."}
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            held = await client.call_tool("notes__send_email", args)
            bad = await client.call_tool("notes__send_email", {"to": "cfo@example.com"})
            listed = await client.call_tool("awl_list_held_calls", {})
    assert not held.is_error
    assert text(held) == "pending:notes/send_email#1"
    assert held.structured_content == {"pending": "notes/send_email#1", "status": "held"}
    assert bad.is_error and text(bad).startswith("AWL_INVALID_ARGUMENTS: ")
    assert env.outbox_lines() == []
    first, second = env.calls()
    assert (first.outcome, first.arguments, first.tool) == ("held", args, "notes/send_email")
    assert second.outcome == "error"
    [effect] = env.store.effects(env.order_id)
    assert (effect.ref, effect.state, effect.attempt) == ("notes/send_email#1", "held", 1)
    assert listed.structured_content == {"attempt": 1, "effects": [
        {"ref": "notes/send_email#1", "tool": "notes/send_email", "arguments": args}]}
    assert env.store.usage(env.order_id).tool_calls == 2


@pytest.mark.spec("GW-10")
async def test_a_held_call_may_reference_an_earlier_held_call(tmp_path: Path) -> None:
    """A $ref value to an earlier held call is accepted; one to anything else is refused."""
    env = make_env(tmp_path, staged=["receiver/*"])
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            issue = await client.call_tool("receiver__create_issue", {"title": "Outage"})
            ref = {"$ref": "receiver/create_issue#1", "pointer": "/structuredContent/number"}
            note = await client.call_tool("receiver__deliver", {"to": "ops", "body": ref})
            typed = await client.call_tool("receiver__create_issue", {"title": ref})
            dangling = await client.call_tool(
                "receiver__deliver", {"to": {"$ref": "receiver/create_issue#9"}})
            not_held = await client.call_tool(
                "receiver__deliver", {"to": {"$ref": "receiver/deliver#4"}})
    assert text(issue) == "pending:receiver/create_issue#1"
    assert text(note) == "pending:receiver/deliver#2"
    assert text(typed) == "pending:receiver/create_issue#3"
    assert dangling.is_error and "receiver/create_issue#9" in text(dangling)
    assert not_held.is_error and text(not_held).startswith("AWL_INVALID_ARGUMENTS")
    assert env.deliveries() == []
    assert [r.outcome for r in env.calls()] == ["held", "held", "held", "error", "error"]


@pytest.mark.spec("GW-9")
async def test_safe_mode_holds_tools_not_marked_read_only(tmp_path: Path) -> None:
    """In safe mode a tool without readOnlyHint is held; a read-only tool still runs."""
    env = make_env(tmp_path, staged=[])
    with anyio.fail_after(60):
        async with connect(env, safe=True) as (_gw, client):
            write = await client.call_tool("receiver__deliver", {"to": "ops"})
            read = await client.call_tool("receiver__echo", {"text": "hi"})
    assert text(write) == "pending:receiver/deliver#1"
    assert not read.is_error and read.structured_content == {"text": "hi"}
    assert env.deliveries() == []


@pytest.mark.spec("GW-9")
async def test_the_operator_hold_list_holds(tmp_path: Path) -> None:
    """A tool in the config's hold list is held even when the order does not stage it."""
    from tests.gateway.gateway_support import server_entry

    log = tmp_path / "receiver.jsonl"
    servers = {"receiver": server_entry("receiver", env={"RECEIVER_LOG": str(log)},
                                        hold=["deliver"], costs={"deliver": 0.25})}
    env = make_env(tmp_path, servers=servers, staged=[])
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            held = await client.call_tool("receiver__deliver", {"to": "ops"})
    assert text(held) == "pending:receiver/deliver#1"
    assert env.deliveries() == []
    assert env.store.usage(env.order_id).usd == pytest.approx(0.25)


@pytest.mark.spec("GW-3")
async def test_the_published_time_server_works_through_the_gateway(tmp_path: Path) -> None:
    """The published mcp-server-time is listed, called and recorded through the gateway."""
    env = make_env(tmp_path, servers={"time": time_entry()}, tools=["time/get_current_time"],
                   staged=[])
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            names = [t.name for t in (await client.list_tools()).tools]
            now = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
            convert = await client.call_tool(
                "time__convert_time",
                {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})
    assert "time__get_current_time" in names and "time__convert_time" not in names
    assert not now.is_error and "UTC" in str(now.structured_content)
    assert convert.is_error and text(convert).startswith("AWL_FORBIDDEN")
    assert [(r.tool, r.outcome) for r in env.calls()] == [
        ("time/get_current_time", "ok"), ("time/convert_time", "refused")]


@pytest.mark.spec("GW-11")
async def test_desk_tools_act_as_the_worker_and_cost_nothing(tmp_path: Path) -> None:
    """The worker reads its order and posts progress (a whole percent) through the gateway,
    uncounted."""
    env = make_env(tmp_path)
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            order = await client.call_tool("awl_get_order", {})
            progress = await client.call_tool("awl_post_progress",
                                              {"note": "drafted", "percent": 40})
            bad = await client.call_tool("awl_post_progress", {"note": " "})
            fractions = [await client.call_tool("awl_post_progress",
                                                {"note": "half", "percent": bad_percent})
                         for bad_percent in (40.5, True, 101)]
    data: Any = order.structured_content
    assert data["order"]["id"] == env.order_id and data["state"] == "working"
    assert data["acting_as"] == WORKER and data["attempt"] == 1 and data["tools_used"] == []
    assert not progress.is_error
    assert bad.is_error and text(bad).startswith("BAD_REQUEST: ")
    assert all(r.is_error and text(r).startswith("BAD_REQUEST: ") for r in fractions)  # LC-11
    assert env.calls() == []
    assert env.desk.events(env.order_id)[-1].action == "progress"
    assert env.desk.events(env.order_id)[-1].data == {"percent": 40}


@pytest.mark.spec("GW-1")
def test_desk_tool_names_cannot_collide_with_upstream_names() -> None:
    """Every exposed upstream name has '__', no desk tool name has, and the table reserves them."""
    assert not any(SEPARATOR in name for name in WORKER_TOOL_NAMES)
    table = NameTable(["awl/get_order", "awl_get/order", "a.b/c"], reserved=WORKER_TOOL_NAMES)
    assert all(SEPARATOR in exposed for exposed in table)
    assert not set(table) & WORKER_TOOL_NAMES


@pytest.mark.spec("GW-7")
async def test_every_recorded_call_answers_with_its_ref(tmp_path: Path) -> None:
    """A forwarded, failed or held call's answer names its call ref in _meta awl/ref."""
    env = make_env(tmp_path)
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            found = await client.call_tool("notes__search_notes", {"query": "offsite"})
            missing = await client.call_tool("notes__get_note", {"id": "n404"})
            held = await client.call_tool(
                "notes__send_email", {"to": "a@example.com", "subject": "s", "body": "b"})
    assert not found.is_error and missing.is_error and not held.is_error
    assert [(r.meta or {}).get("awl/ref") for r in (found, missing, held)] == [
        "notes/search_notes#1", "notes/get_note#2", "notes/send_email#3"]
    assert [c.ref for c in env.calls()] == [
        "notes/search_notes#1", "notes/get_note#2", "notes/send_email#3"]


async def test_an_unknown_order_is_refused_before_any_upstream_starts(tmp_path: Path) -> None:
    """A gateway for an order the desk does not know fails at once, naming the order."""
    env = make_env(tmp_path, servers={"broken": {"command": str(tmp_path / "no-such-program")}},
                   tools=["broken/*"], staged=[])
    with anyio.fail_after(30), pytest.raises(NotFound, match="wo_missing"):
        async with open_gateway("wo_missing", env.config, store=env.store, home=env.home):
            pass


class _FailingWrites(SQLiteStore):
    """A store whose next write of each kind of call record fails, as a full disk would."""

    fail_finish = True
    fail_refusal = True

    def finish_call(self, order_id: str, ref: str, **fields: Any) -> None:
        if self.fail_finish:
            self.fail_finish = False
            raise Conflict("the disk is full")
        super().finish_call(order_id, ref, **fields)

    def record_call(self, record_fields: dict[str, Any]) -> CallRecord:
        if self.fail_refusal:
            self.fail_refusal = False
            raise Conflict("the disk is full")
        return super().record_call(record_fields)


@pytest.mark.spec("GW-7")
async def test_no_answer_reaches_the_worker_before_its_record_is_written(tmp_path: Path) -> None:
    """When a call's outcome cannot be written, the worker gets no result: it is told the
    call may have run, with its ref (GW-7), never that nothing was written."""
    env = make_env(tmp_path, staged=[])
    store = _FailingWrites(env.home / "desk.sqlite3")
    with anyio.fail_after(60), open(os.devnull, "w") as quiet:
        async with (open_gateway(env.order_id, env.config, store=store, home=env.home,
                                 errlog=quiet) as gw, Client(gw.server) as client):
            first = await client.call_tool("receiver__deliver", {"to": "ops"})
            told = " ".join(getattr(c, "text", "") for c in first.content)
            assert first.is_error and "AWL_NOT_RECORDED" in told, told
            assert "receiver/deliver#1" in told and "may have run" in told
            with pytest.raises(MCPError):
                await client.call_tool("mail__send", {"to": "ops"})
            after = await client.call_tool("receiver__deliver", {"to": "ops"})
    store.close()
    # The first call did reach the upstream; the gateway kept its outcome and wrote it once
    # the store took writes again (GW-20).
    assert [d["ref"] for d in env.deliveries()] == ["receiver/deliver#1", "receiver/deliver#2"]
    assert not after.is_error
    assert [(r.ref, r.outcome) for r in env.calls()] == [
        ("receiver/deliver#1", "ok"), ("receiver/deliver#2", "ok")]


@pytest.mark.spec("GW-6")
def test_unresolved_names_are_recorded_under_a_tool_no_server_can_have() -> None:
    """The tool a refused unknown name is recorded under belongs to no configurable server."""
    server, _tool = split_canonical(UNRESOLVED_TOOL)
    with pytest.raises(ConfigError):
        load_config({"mcpServers": {server: {"command": "x"}}})


@pytest.mark.spec("GW-11")
async def test_the_worker_lists_its_calls_with_their_refs(tmp_path: Path) -> None:
    """awl_list_calls shows each call's ref, tool, outcome, attempt, start and arguments, free."""
    env = make_env(tmp_path)
    email = {"to": "cfo@example.com", "subject": "Q3", "body": "Three risks."}
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            listed = {t.name: t for t in (await client.list_tools()).tools}
            empty = await client.call_tool("awl_list_calls", {})
            await client.call_tool("notes__search_notes", {"query": "refund"})
            await client.call_tool("notes__get_note", {"id": "n404"})
            await client.call_tool("mail__send", {"to": "x"})
            await client.call_tool("notes__send_email", email)
            # The SDK client checks every answer below against the tool's output schema.
            every = await client.call_tool("awl_list_calls", {})
            notes = await client.call_tool("awl_list_calls", {"tool": "notes/search_notes"})
            held = await client.call_tool("awl_list_calls", {"outcome": "held", "attempt": 1})
            later = await client.call_tool("awl_list_calls", {"attempt": 2})
            latest = await client.call_tool("awl_list_calls", {"limit": 1})
            bad = [await client.call_tool("awl_list_calls", args) for args in (
                {"attempt": 0}, {"limit": MAX_CALL_LIMIT + 1}, {"outcome": "done"},
                {"tool": 3}, {"attempt": True})]
    tool = listed["awl_list_calls"]
    assert tool.annotations is not None and tool.annotations.read_only_hint is True
    assert tool.output_schema is not None and tool.input_schema["additionalProperties"] is False
    assert empty.structured_content == {"attempt": 1, "calls": [], "omitted": 0}
    data: Any = every.structured_content
    records = env.calls()
    assert data["attempt"] == 1 and data["omitted"] == 0
    assert data["calls"] == [
        {"ref": r.ref, "tool": r.tool, "outcome": r.outcome, "attempt": r.attempt,
         "started_at": r.started_at, "arguments": r.arguments} for r in records]
    assert [(c["ref"], c["outcome"]) for c in data["calls"]] == [
        ("notes/search_notes#1", "ok"), ("notes/get_note#2", "error"),
        (f"{UNRESOLVED_TOOL}#3", "refused"), ("notes/send_email#4", "held")]
    assert data["calls"][3]["arguments"] == email
    # Clients that show the model only text still show every ref.
    assert text(every).splitlines()[0].startswith("notes/search_notes#1 ok (attempt 1) ")
    assert json.dumps({"query": "refund"}) in text(every)
    assert [c["ref"] for c in (notes.structured_content or {})["calls"]] == [
        "notes/search_notes#1"]
    assert [c["ref"] for c in (held.structured_content or {})["calls"]] == [
        "notes/send_email#4"]
    assert later.structured_content == {"attempt": 1, "calls": [], "omitted": 0}
    latest_data: Any = latest.structured_content
    assert [c["ref"] for c in latest_data["calls"]] == ["notes/send_email#4"]
    assert latest_data["omitted"] == 3
    for answer in bad:
        assert answer.is_error and text(answer).startswith("BAD_REQUEST: "), text(answer)
    assert len(records) == 4 and env.store.usage(env.order_id).tool_calls == 3
