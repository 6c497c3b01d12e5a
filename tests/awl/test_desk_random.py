"""Seeded random operation sequences keep the desk's invariants after every step.

Each run drives many orders with thousands of operations by every actor (the right one most
of the time, someone else often), with valid and invalid documents and a clock that jumps
past deadlines. After every step the touched order is checked: its log counts up by one
from 1, every event is a row of the lifecycle table, the log only grows (nothing is ever
rewritten), a terminal state never changes, reports and reviews are never lost and match
their events, the folded state equals the stored state, and a refused operation wrote
nothing but possibly the desk's own expiry. Every order is checked again at the end.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from awl import AWLError, Event, WorkReport
from awl.desk import Desk, OrderView
from awl.documents.lifecycle import DESK_ACTOR, TABLE, TERMINAL, fold
from awl.documents.models import format_time
from awl.store.protocol import Store
from tests.awl.desk_support import Clock, effect, open_store, order_fields, report_fields

pytestmark = pytest.mark.slow

MANAGERS = ["human:m1", "human:m2"]
WORKERS = ["agent:w1", "agent:w2"]
OTHERS = ["human:esc", "agent:mallory"]
EVERYONE = MANAGERS + WORKERS + OTHERS
OPERATIONS = ["accept", "decline", "start", "progress", "report", "answer", "review",
              "cancel", "get", "list", "questions", "settle", "drop", "events"]
FITTING = {
    "offered": ["accept", "accept", "accept", "decline"],
    "accepted": ["start"],
    "working": ["progress", "report", "report"],
    "blocked": ["answer"],
    "submitted": ["review"],
    "approved": ["settle", "drop", "get"],
    "declined": ["get"], "expired": ["get", "drop"], "cancelled": ["get", "drop"],
}


@dataclass
class Seen:
    """What the test last saw of an order."""

    events: list[Event] = field(default_factory=list)
    reports: tuple[WorkReport, ...] = ()
    reviews: int = 0


class Run:
    def __init__(self, store: Store, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = Clock()
        self.desk = Desk(store, clock=self.clock)
        self.store = store
        self.ids: list[str] = []
        self.seen: dict[str, Seen] = {}
        self.counts: dict[str, int] = {}
        self.touched: list[str] = []  # the orders the current step reads or writes

    # ------------------------------------------------------------------ operations

    def actor(self, right: str) -> str:
        return right if self.rng.random() < 0.7 else self.rng.choice(EVERYONE)

    def create(self) -> str | None:
        rng = self.rng
        manager = rng.choice(MANAGERS)
        hours = rng.choice([1, 3, 12, 48])
        deadline = format_time(self.clock.now.replace(microsecond=0) + timedelta(hours=hours))
        fields = order_fields(to=rng.choice(WORKERS), deadline=deadline,
                              escalate_to=rng.choice([None, "human:esc"]))
        roll = rng.random()
        if roll < 0.1:
            fields["criteria"] = []  # invalid: O1
        elif roll < 0.15:
            fields["from"] = rng.choice(MANAGERS)  # maybe someone else's name
        elif roll < 0.3 and self.ids:
            parent = self.store.load(rng.choice(self.ids)).order
            fields.update(parent_id=parent.id, budget={"usd": rng.choice([1, 50]),
                                                       "tool_calls": 5},
                          deadline=parent.deadline)
            if rng.random() < 0.7:  # else it carries the parent's staged tool: C5
                fields.update(tools=["filings/*"], staged=[])
            manager = rng.choice([parent.to, parent.manager, manager])
            self.touched.append(parent.id)
        elif roll < 0.35 and self.ids:
            fields["continues"] = rng.choice(self.ids)
            self.touched.append(fields["continues"])
        view = self.desk.create(fields, manager, copy_handoff=rng.random() < 0.5)
        self.ids.append(view.id)
        self.seen[view.id] = Seen()
        return view.id

    def report_doc(self, record: OrderView) -> dict[str, Any]:
        rng = self.rng
        status = rng.choice(["done", "done", "blocked", "failed"])
        doc = report_fields(status)
        roll = rng.random()
        if roll < 0.1:
            doc["cost"] = {"usd": 500, "tool_calls": 1}  # over budget: a limit finding
        elif roll < 0.2:
            doc["evidence"] = [{"criterion": "nope", "type": "note"}]  # invalid: R3
        elif roll < 0.25:
            doc["attempt"] = rng.choice([1, 2, 3])
        elif roll < 0.4 and status == "done":
            doc["effects"] = [effect(1), effect(2)]
        if rng.random() < 0.3:
            doc["handoff"] = {"summary": "so far", "next_step": "carry on"}
        return doc

    def step(self) -> str | None:
        """Run one random operation; return the id of an order it created."""
        rng = self.rng
        if not self.ids or rng.random() < 0.08:
            return self.create()
        active = [i for i in self.ids if self.seen[i].events[-1].to not in TERMINAL]
        # Mostly orders that can still move, so many get far before their deadline.
        order_id = rng.choice(active if active and rng.random() < 0.85 else self.ids)
        self.touched.append(order_id)
        record = self.desk.store.load(order_id)
        order = record.order
        # Mostly what the state calls for, so orders get somewhere.
        op = rng.choice(FITTING[record.state] if rng.random() < 0.6 else OPERATIONS)
        worker, manager = self.actor(order.to), self.actor(order.manager)
        desk = self.desk
        if op == "accept":
            desk.accept(order_id, worker)
        elif op == "decline":
            desk.decline(order_id, worker, rng.choice([None, "busy"]))
        elif op == "start":
            desk.start(order_id, worker)
        elif op == "progress":
            desk.progress(order_id, worker, "step", rng.choice([None, 10, 150]))
        elif op == "report":
            desk.report(order_id, worker, self.report_doc(OrderView.of(record)))
        elif op == "answer":
            desk.answer(order_id, self.actor(rng.choice(list(order.answerers))), "an answer")
        elif op == "review":
            if rng.random() < 0.5:
                desk.review(order_id, manager, "rework", rng.choice(["redo", "", None]))
            else:
                chosen = rng.choice([None, ["mail/send#2"], ["mail/send#7"]])
                desk.review(order_id, manager, "approve", effects=chosen)
        elif op == "cancel":
            desk.cancel(order_id, manager, "stop")
        elif op == "get":
            desk.get(order_id)
        elif op == "list":
            desk.list(worker=rng.choice(WORKERS), state=rng.choice([None, "working"]),
                      limit=5)
        elif op == "questions":
            desk.questions(rng.choice([None, *MANAGERS]))
        elif op == "settle":
            desk.record(order_id, manager, "settle", note="it happened")
        elif op == "drop":
            desk.record(order_id, rng.choice([DESK_ACTOR, worker]), "drop")
        else:
            desk.events(order_id, after=rng.randrange(0, 5))
        return None

    # ------------------------------------------------------------------ invariants

    def check(self, order_id: str, *, refused: bool) -> None:
        record = self.store.load(order_id)
        events = self.store.events(order_id)
        seen = self.seen[order_id]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert record.seq == len(events)
        for event in events:
            assert (event.from_, event.action, event.to) in TABLE
        assert fold(events) == record.state
        assert events[: len(seen.events)] == seen.events, "the log was rewritten"
        new = events[len(seen.events):]
        if seen.events and seen.events[-1].to in TERMINAL:
            assert all(e.from_ == e.to for e in new), "a terminal state changed"
        if refused:
            assert all(e.actor == DESK_ACTOR and e.action == "expire" for e in new), \
                f"a refused operation wrote {[e.action for e in new]}"
        assert record.reports[: len(seen.reports)] == seen.reports, "a report was lost"
        with_report = sum(1 for e in events if e.action == "report"
                          or (e.action == "expire" and e.data and "status" in e.data))
        assert len(record.reports) == with_report
        assert len(record.reviews) == sum(1 for e in events if e.action in ("approve",
                                                                            "rework"))
        self.seen[order_id] = Seen(events=events, reports=record.reports,
                                   reviews=len(record.reviews))

    def go(self, steps: int) -> None:
        for _ in range(steps):
            if self.rng.random() < 0.005:
                self.clock.advance(hours=self.rng.choice([1, 6, 30]))
            else:
                self.clock.advance(seconds=self.rng.randrange(1, 30))
            self.touched = []
            try:
                created = self.step()
                refused = False
                outcome = "ok"
            except AWLError as exc:
                created = None
                refused = True
                outcome = type(exc).__name__
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
            for order_id in {*self.touched, *([created] if created else [])}:
                self.check(order_id, refused=refused)
        for order_id in self.ids:
            self.check(order_id, refused=False)


@pytest.mark.spec("LC-2", "LC-3")
@pytest.mark.parametrize(("kind", "seed", "steps"),
                         [("memory", 1, 3000), ("memory", 2, 3000), ("sqlite", 3, 1500)])
def test_random_operations_keep_the_invariants(tmp_path: Path, kind: str, seed: int,
                                               steps: int) -> None:
    """Thousands of random operations by every actor never break the log's invariants."""
    store = open_store(kind, tmp_path)
    try:
        run = Run(store, seed)
        run.go(steps)
        states = {store.load(order_id).state for order_id in run.ids}
    finally:
        store.close()
    # The run exercised both sides: plenty of writes and plenty of each kind of refusal.
    assert run.counts["ok"] > steps // 4
    for kind_of_refusal in ("Forbidden", "InvalidTransition", "ValidationFailed",
                            "BadRequest"):
        assert run.counts.get(kind_of_refusal, 0) > 10, run.counts
    assert {"approved", "expired", "cancelled", "declined"} <= states
