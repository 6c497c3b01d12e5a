"""What the worker is told about a held call agrees with what a report may list (GW-9, R14):
a call held only by the operator's hold list or by safe mode never runs, and the gateway
says so instead of asking for it in the report's effects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gateway.gateway_support import connect, make_env, server_entry

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

_NEVER = "never run"
_LIST_IT = "List it in your report's effects"


def _texts(result: Any) -> str:
    return "\n".join(b.text for b in result.content if b.type == "text")


@pytest.mark.spec("GW-9", "GW-11", "R14")
async def test_a_call_held_only_by_the_operator_or_safe_mode_is_never_asked_for(
        tmp_path: Path) -> None:
    """The operator's hold list (receiver/deliver) and safe mode (receiver/reject) hold calls
    the order does not stage: their answers and descriptions say they never run, the
    held-call list leaves them out, and a report that follows that advice is accepted."""
    env = make_env(tmp_path, servers={
        "notes": server_entry("notes", env={"OUTBOX_PATH": str(tmp_path / "outbox.jsonl")}),
        "receiver": server_entry("receiver", env={"RECEIVER_LOG": str(tmp_path / "r.jsonl")},
                                 hold=["deliver"]),
    }, staged=["notes/send_email"], budget={"tool_calls": 20, "usd": 1})
    email = {"to": "a@example.test", "subject": "s", "body": "b"}
    with anyio.fail_after(60):
        async with connect(env, safe=True) as (_gw, client):
            listed = {t.name: t.description or "" for t in (await client.list_tools()).tools}
            staged = await client.call_tool("notes__send_email", email)
            by_operator = await client.call_tool("receiver__deliver", {"to": "ops"})
            by_safe_mode = await client.call_tool("receiver__reject", {"reason": "x"})
            held = await client.call_tool("awl_list_held_calls", {})
            report = await client.call_tool("awl_submit_report", {"report": {
                "status": "done", "result": {"summary": "queued the email"},
                "evidence": [{"criterion": "c1", "type": "tool_call",
                              "ref": "notes/send_email#1"}],
                "cost": {"tool_calls": 3, "usd": 0},
                "tools_used": ["notes/send_email", "receiver/deliver", "receiver/reject"],
                "effects": [{"ref": "notes/send_email#1", "tool": "notes/send_email",
                             "arguments": email}]}})
    assert _LIST_IT in _texts(staged) and _NEVER not in listed["notes__send_email"]
    for result, name in ((by_operator, "receiver__deliver"), (by_safe_mode, "receiver__reject")):
        assert _texts(result).startswith("pending:")
        assert _NEVER in _texts(result) and _LIST_IT not in _texts(result)
        assert _NEVER in listed[name]
    assert held.structured_content is not None
    assert [e["ref"] for e in held.structured_content["effects"]] == ["notes/send_email#1"]
    assert "2 more held call(s)" in _texts(held)
    assert not report.is_error, _texts(report)
