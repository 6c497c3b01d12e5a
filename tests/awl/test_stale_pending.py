"""Calls a gateway left ``pending`` (it died) are read as may-have-run (SPEC GW-7)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from awl.desk import AWL_OUTCOME_UNKNOWN, Desk, settle_stale_calls
from awl.documents import format_time
from awl.store import Scope
from awl.store.memory import MemoryStore


@pytest.mark.spec("GW-7")
def test_a_call_pending_past_the_bound_is_recorded_as_may_have_run() -> None:
    store = MemoryStore()
    desk = Desk(store)
    order = desk.create({
        "to": "agent:w", "goal": "g", "criteria": [{"id": "c1", "text": "t"}],
        "budget": {"tool_calls": 5}, "deadline": "2099-01-01T00:00:00Z",
        "tools": ["s/*"]}, "human:m")
    started = datetime(2030, 1, 1, tzinfo=UTC)
    for _ in range(2):
        store.reserve_call(order.id, attempt=1, tool="s/t", arguments={}, pass_jti=None,
                           usd=0.0, started_at=format_time(started),
                           scopes=[Scope(None, max_calls=5, max_usd=None, name="order")])
    store.finish_call(order.id, "s/t#2", outcome="ok", result={"content": []}, error=None,
                      ended_at=format_time(started))
    soon = settle_stale_calls(store, store.calls(order.id), now=started + timedelta(minutes=5))
    assert [c.outcome for c in soon] == ["pending", "ok"]
    late = settle_stale_calls(store, store.calls(order.id), now=started + timedelta(hours=2))
    assert [c.outcome for c in late] == ["error", "ok"]
    assert (late[0].error or "").startswith(f"{AWL_OUTCOME_UNKNOWN}: ")
    assert "may have run" in (late[0].error or "")
    assert [c.outcome for c in store.calls(order.id)] == ["error", "ok"]
