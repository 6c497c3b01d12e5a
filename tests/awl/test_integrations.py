"""The framework-neutral part of the integrations: the report draft, the review wait, the loop.

The calls go through a real in-process gateway to the example outbox server (a subprocess);
what it sent is read from its own outbox file. The manager's review comes from another
process (the real ``awl review`` CLI) where the wait must find it without being woken.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from awl import BadRequest, list_effects
from awl.integrations import (
    Attempt,
    ReviewTimeout,
    draft_report,
    wait_for_review,
    work_order,
)
from tests.gateway.gateway_support import MANAGER, ROOT, WORKER, Env, connect, make_env

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

EMAIL = {"to": "a@example.com", "subject": "Hi", "body": "Hello"}
OTHER = {"to": "b@example.com", "subject": "Hi", "body": "Hello too"}


async def _work(env: Env) -> None:
    """A read, two held emails, a write that passes and a refused call, through the gateway."""
    async with connect(env) as (_, client):
        assert not (await client.call_tool("notes__search_notes", {"query": "offsite"})).is_error
        for email in (EMAIL, OTHER):
            assert not (await client.call_tool("notes__send_email", email)).is_error
        assert not (await client.call_tool("notes__create_issue", {"title": "x"})).is_error
        assert (await client.call_tool("receiver__create_issue", {"title": "x"})).is_error


def _submit(env: Env) -> dict[str, Any]:
    draft = draft_report(env.desk, env.order_id)
    report = draft.report(summary="Answered", evidence=draft.evidence("c1", "notes/search_notes"))
    env.desk.report(env.order_id, WORKER, report)
    return report


def _cli_review(env: Env, *decision: str) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWL_")}
    environ["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "awl", "review", env.order_id, *decision,
                           "--as", MANAGER, "--home", str(env.home)], env=environ,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


async def test_the_draft_takes_effects_tools_and_evidence_from_the_call_log(
        tmp_path: Path) -> None:
    """effects = the held calls of staged tools in order; tools_used and refs from the log."""
    env = make_env(tmp_path, tools=["notes/*"], staged=["notes/send_email"],
                   budget={"tool_calls": 10, "usd": 1})
    await _work(env)
    draft = draft_report(env.desk, env.order_id, started_at="2026-01-01T00:00:00Z")
    assert [(e["tool"], e["arguments"]) for e in draft.effects] == [
        ("notes/send_email", EMAIL), ("notes/send_email", OTHER)]
    assert [e["ref"] for e in draft.effects] == draft.refs("notes/send_email", outcome="held")
    assert draft.tools_used == ["notes/create_issue", "notes/search_notes", "notes/send_email"]
    assert draft.cost["tool_calls"] == 4  # the refused call is recorded, never counted
    assert draft.report(summary="s", evidence=[])["started_at"] == "2026-01-01T00:00:00Z"
    [item] = draft.evidence("c1", "notes/search_notes", note="the search")
    assert item == {"criterion": "c1", "type": "tool_call", "ref": "notes/search_notes#1",
                    "note": "the search"}
    with pytest.raises(BadRequest, match="no call of notes/get_note"):
        draft.evidence("c1", "notes/get_note")
    _submit(env)
    assert env.view().state == "submitted"  # the desk checked every ref against the log
    assert env.outbox_lines() == []


async def test_a_review_from_another_process_ends_the_wait_without_busy_polling(
        tmp_path: Path) -> None:
    """The wait long-polls the desk: few reads while it waits, woken by another process."""
    env = make_env(tmp_path, tools=["notes/*"], staged=["notes/send_email"])
    await _work(env)
    _submit(env)
    reads = 0
    get = env.desk.get

    def counting(order_id: str, *, viewer: str | None = None) -> Any:
        nonlocal reads
        reads += 1
        return get(order_id, viewer=viewer)

    env.desk.get = counting  # type: ignore[method-assign]
    began = time.monotonic()
    with pytest.raises(ReviewTimeout, match="still waits on the desk"):
        await wait_for_review(env.desk, env.order_id, timeout=1.5)
    assert 1.4 < time.monotonic() - began < 10
    assert reads < 30, f"{reads} reads in 1.5 s: a busy wait"
    assert env.view().state == "submitted"

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, _cli_review, env, "--approve")
        verdict = await wait_for_review(env.desk, env.order_id, timeout=60)
    assert (verdict.decision, verdict.attempt, verdict.state) == ("approved", 1, "approved")


async def test_the_verdict_is_the_desks_state_so_a_new_process_gets_it(tmp_path: Path) -> None:
    """A rework given while no one waited is found at once, and again by the next waiter."""
    env = make_env(tmp_path, tools=["notes/*"], staged=["notes/send_email"])
    await _work(env)
    _submit(env)
    _cli_review(env, "--rework", "write to c@example.com instead")
    for _ in range(2):
        verdict = await wait_for_review(env.desk, env.order_id, timeout=0)
        assert (verdict.decision, verdict.attempt) == ("rework", 1)
        assert verdict.reason == "write to c@example.com instead"
    states = {e.ref: e.state for e in list_effects(env.order_id, store=env.store)}
    assert set(states.values()) == {"dropped"}  # attempt 1's held calls never run
    with pytest.raises(BadRequest, match="no submitted report for attempt 2"):
        await wait_for_review(env.desk, env.order_id, attempt=2, timeout=0)


async def test_the_loop_resumes_where_the_order_is(tmp_path: Path) -> None:
    """An approved order is committed, not worked again; a second run sends nothing more."""
    env = make_env(tmp_path, tools=["notes/*"], staged=["notes/send_email"])
    await _work(env)
    _submit(env)
    env.desk.review(env.order_id, MANAGER, "approve")

    async def never(attempt: Attempt) -> dict[str, Any]:
        raise AssertionError("the agent ran again")

    for _ in range(2):
        outcome = await work_order(env.desk, env.order_id, WORKER, never, config=env.config,
                                   review_timeout=5)
        assert outcome.commit is not None and outcome.commit.ok and outcome.runs == []
        assert [m["to"] for m in env.outbox_lines()] == [EMAIL["to"], OTHER["to"]]


def test_import_awl_needs_no_framework() -> None:
    """``import awl`` and ``awl.integrations`` load no framework; a missing one is one line."""
    code = ("import sys, awl, gateway, awl.integrations\n"
            "print(sorted(m for m in ('pydantic_ai', 'agents', 'fastmcp') if m in sys.modules))\n"
            "sys.modules['pydantic_ai'] = None\n"
            "try:\n    import awl.integrations.pydantic_ai\n"
            "except ImportError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    loaded, missing = done.stdout.splitlines()
    assert loaded == "[]"
    assert missing.endswith("pip install -e '.[pydantic-ai]' in the awl-gateway checkout")
