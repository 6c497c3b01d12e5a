"""A desk process killed with SIGKILL mid-write leaves a desk that opens and replays."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from awl.documents.models import Event
from awl.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow

# Walks orders through the lifecycle for ever (create, accept, start, report, then rework
# and a second report every other order, approve), printing one line per committed write.
CHILD = r"""
import sys
from awl.documents.models import Event, Review, WorkOrder, WorkReport
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import reserved

path, prefix = sys.argv[1], sys.argv[2]
T = "2030-01-01T00:00:00Z"
store = SQLiteStore(path)
writes = 0

def done(what):
    global writes
    writes += 1
    print(writes, what, flush=True)

def step(oid, seq, action, frm, to, **kw):
    e = Event.model_validate({"seq": seq, "at": T, "actor": "agent:w", "action": action,
                              "from": frm, "to": to})
    store.append(oid, e, state=to, **kw)
    done(action)

def report(oid, attempt):
    return WorkReport.model_validate({"spec": "awl/work-report@0.3", "order_id": oid,
        "from": "agent:w", "status": "done", "result": {"summary": "s"}, "evidence": [],
        "cost": {"tool_calls": 1}, "finished_at": T, "tools_used": [], "attempt": attempt})

def review(oid, attempt, decision):
    return Review.model_validate({"order_id": oid, "attempt": attempt, "actor": "human:m",
        "decision": decision, "reason": "again", "at": T})

k = 0
while True:
    oid = f"{prefix}-{k}"
    order = WorkOrder.model_validate({"spec": "awl/work-order@0.3", "id": oid,
        "created_at": T, "from": "human:m", "to": "agent:w", "goal": "g",
        "criteria": [{"id": "c", "text": "t"}], "budget": {"tool_calls": 9},
        "deadline": "2030-01-02T00:00:00Z", "tools": ["srv/*"], "staged": ["srv/send"]})
    store.create_order(order, Event.model_validate({"seq": 1, "at": T, "actor": "human:m",
        "action": "create", "from": None, "to": "offered"}))
    done("create")
    step(oid, 2, "accept", "offered", "accepted")
    step(oid, 3, "start", "accepted", "working")
    call = reserved(store.reserve_call(oid, attempt=1, tool="srv/send", arguments={"k": k},
        pass_jti=None, usd=0.0, started_at=T, scopes=[]))
    store.hold_call(oid, call.ref, result=None, ended_at=T)
    done("call")
    step(oid, 4, "report", "working", "submitted", report=report(oid, 1))
    seq = 5
    if k % 2:
        step(oid, 5, "rework", "submitted", "working", review=review(oid, 1, "rework"))
        step(oid, 6, "report", "working", "submitted", report=report(oid, 2))
        seq = 7
    step(oid, seq, "approve", "submitted", "approved", review=review(oid, 1, "approve"))
    store.set_effect(oid, call.ref, expect=["held"], state="dispatching",
                     count_dispatch=True, at=T)
    done("dispatching")
    store.set_effect(oid, call.ref, expect=["dispatching"], state="committed",
                     result={"k": k}, at=T)
    done("committed")
    k += 1
"""


def _fold(events: list[Event]) -> str | None:
    """The state a log folds to; each event must start where the previous one ended."""
    state: str | None = None
    for event in events:
        assert event.from_ == state, (event, state)
        state = event.to
    return state


def _check(path: Path) -> int:
    """Check the desk replays cleanly; return how many orders it holds."""
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    with SQLiteStore(path) as store:
        records = store.list_orders(limit=None)
        for record in records:
            oid = record.order.id
            events = store.events(oid)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert record.seq == len(events)
            assert record.state == _fold(events)
            actions = [e.action for e in events]
            assert len(record.reports) == actions.count("report")
            assert len(record.reviews) == actions.count("approve") + actions.count("rework")
            effects = store.effects(oid)
            calls = store.calls(oid)
            assert len(effects) <= len(calls) <= 1
            # The hold writes the outcome and the effect together (CM-14): never one alone.
            assert bool(effects) == (bool(calls) and calls[0].outcome == "held")
            if effects:
                effect = effects[0]
                assert calls[0].outcome == "held"
                assert effect.dispatches == (0 if effect.state == "held" else 1)
                assert (effect.result is not None) == (effect.state == "committed")
                if effect.state != "held":
                    assert record.state == "approved"
        return len(records)


@pytest.mark.spec("CM-14")
def test_kill_9_mid_run_leaves_a_desk_that_replays(tmp_path: Path) -> None:
    """After SIGKILL at random moments the desk is intact and every log folds to its state."""
    path = tmp_path / "desk.sqlite3"
    rng = random.Random(7)
    orders = 0
    for round_ in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), f"r{round_}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert child.stdout is not None
        target = rng.randrange(30, 400)
        for line in child.stdout:
            if int(line.split()[0]) >= target:
                break
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
        if child.stderr is not None:
            child.stderr.close()
        assert child.returncode == -signal.SIGKILL
        held = _check(path)
        assert held > orders  # each round added orders, and earlier ones survived
        orders = held
