"""Handoff briefings: what whoever continues an order needs, in a short Markdown page."""

from __future__ import annotations

import pytest

from awl.desk import Desk
from awl.desk.briefing import briefing
from awl.store.memory import MemoryStore
from tests.awl.desk_support import (
    HELPER,
    MANAGER,
    WORKER,
    Clock,
    order_fields,
    report_fields,
    working,
)

HANDOFF = {
    "summary": "Root cause found: the job enqueues twice on retry.",
    "decisions": [{"text": "Lock on the invoice id", "why": "job ids change on retry"}],
    "tried": [{"text": "Deduplicating in the queue", "result": "the queue has no keys"}],
    "open_questions": ["Should the old jobs be replayed?"],
    "next_steps": [{"text": "Remove the debug logging", "priority": "low"},
                   {"text": "Add a spec for the retry path", "priority": "high"},
                   {"text": "Check the two other jobs", "priority": "medium"}],
    "files": [{"path": "app/jobs/invoice_job.rb", "note": "where the enqueue happens",
               "ranges": [{"start": 14, "end": 31, "note": "the retry path"},
                          {"start": 40, "end": 40}]}],
}


@pytest.fixture
def desk() -> Desk:
    return Desk(MemoryStore(), clock=Clock())


def _sections(text: str) -> list[str]:
    return [line[3:] for line in text.splitlines() if line.startswith("## ")]


def test_a_blocked_order_briefs_goal_questions_steps_decisions_and_files(desk: Desk) -> None:
    """Every part of the handoff shows, in the order a reader needs it."""
    view = working(desk, escalate_to=HELPER)
    desk.progress(view.id, WORKER, "found the cause", 60)
    desk.report(view.id, WORKER, report_fields("blocked", questions=["Which queue?"],
                                                handoff=HANDOFF))
    text = desk.handoff(view.id)
    assert text.startswith("# Handoff: Summarize the quarterly filings\n")
    assert _sections(text) == ["Goal", "Status", "Open questions", "Next steps", "Decisions",
                               "What was tried", "Files", "Criteria", "Recent events"]
    assert f"waiting for an answer from {MANAGER} or {HELPER}" in text
    assert "- Which queue?\n- Should the old jobs be replayed?" in text
    steps = text.split("## Next steps\n\n")[1].split("\n\n")[0].splitlines()
    assert steps == [
        f"1. [HIGH] Answer the open questions: awl answer {view.id} TEXT",
        "2. [HIGH] Add a spec for the retry path",
        "3. [MEDIUM] Check the two other jobs",
        "4. [LOW] Remove the debug logging",
    ]
    assert "- **Lock on the invoice id** — because job ids change on retry" in text
    assert "- Deduplicating in the queue → the queue has no keys" in text
    assert ("### app/jobs/invoice_job.rb\nwhere the enqueue happens\n"
            "- Lines 14-31: the retry path\n- Line 40\n") in text
    assert "Worker's summary: Root cause found" in text
    assert "not verified fact" in text
    assert "spent usd 2.5 (25%), tool_calls 7 (18%)" in text


def test_manager_decisions_and_attempts_come_from_the_log(desk: Desk) -> None:
    """Answers, reworks and approvals with their reasons, and each attempt's outcome."""
    view = working(desk)
    desk.report(view.id, WORKER, report_fields("blocked"))
    desk.answer(view.id, MANAGER, "Use Q3")
    desk.report(view.id, WORKER, report_fields(result={"summary": "first draft"}))
    desk.review(view.id, MANAGER, "rework", "cite page numbers")
    desk.report(view.id, WORKER, report_fields(result={"summary": "second draft"}))
    desk.review(view.id, MANAGER, "approve", "thanks")
    text = desk.handoff(view.id)
    assert "state **approved** · attempt 2" in text
    assert f"- {MANAGER} answered" in text and "Use Q3" in text
    assert "chose rework" in text and "cite page numbers" in text
    assert "- Attempt 1 (done, sent back: cite page numbers): first draft" in text
    assert "- Attempt 2 (done): second draft" in text
    assert f"Approved at 2030-01-01T09:00:00.000Z by {MANAGER}: thanks" in text
    assert "- [x] `c1` a one-page summary — note (written)" in text


def test_a_fresh_order_shows_the_handoff_it_was_given(desk: Desk) -> None:
    """Without reports, the order's own handoff (from earlier work) is what is shown."""
    view = desk.create(order_fields(handoff=HANDOFF), MANAGER)
    text = briefing(desk.get(view.id))
    assert f"Offered to {WORKER}; not accepted yet." in text
    assert "Add a spec for the retry path" in text
    assert "Recent events" not in text
    assert "- [ ] `c1` a one-page summary" in text


def test_the_newest_handoff_wins_field_by_field(desk: Desk) -> None:
    """A report's handoff replaces the order's fields it sets and keeps the others."""
    view = working(desk, handoff=HANDOFF)
    desk.report(view.id, WORKER, report_fields("failed", handoff={"next_step": "Try Q2"}))
    text = desk.handoff(view.id)
    assert "2. [HIGH] Try Q2\n3. [HIGH] Add a spec for the retry path" in text
    assert "Error: the filings site is down" in text
    assert "### app/jobs/invoice_job.rb" in text


def test_ended_orders_say_how_and_why(desk: Desk) -> None:
    """Cancelled and declined orders name who ended them and their reason."""
    view = working(desk)
    desk.cancel(view.id, MANAGER, "budget cut")
    assert f"Cancelled at 2030-01-01T09:00:00.000Z by {MANAGER}: budget cut" in (
        desk.handoff(view.id))
    other = desk.create(order_fields(), MANAGER)
    desk.decline(other.id, WORKER)
    assert f"Declined at 2030-01-01T09:00:00.000Z by {WORKER}." in desk.handoff(other.id)


def test_a_sub_order_names_its_parent(desk: Desk) -> None:
    """Links to the parent and to the continued order are shown."""
    parent = working(desk)
    child = desk.create(order_fields(to="agent:h", parent_id=parent.id, tools=["filings/*"],
                                     staged=None, budget={"usd": 1, "tool_calls": 1},
                                     **{"from": WORKER}), WORKER)
    assert f"Sub-order of `{parent.id}`" in desk.handoff(child.id)
