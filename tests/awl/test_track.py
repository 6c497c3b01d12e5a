"""Track records: every order in one outcome, spend against budget, time to approval."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from awl.desk import Desk
from awl.desk.track import OUTCOMES, outcome_of, track_record
from awl.store.protocol import Store
from tests.awl.desk_support import (
    MANAGER,
    WORKER,
    Clock,
    open_store,
    order_fields,
    report_fields,
    working,
)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["memory", "sqlite"])
def desk(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Desk]:
    store = open_store(request.param, tmp_path)
    yield Desk(store, clock=clock)
    store.close()


def _approved(desk: Desk, clock: Clock, *, reworks: int, minutes: int, usd: float) -> str:
    view = working(desk)
    for _ in range(reworks):
        desk.report(view.id, WORKER, report_fields(cost={"usd": usd / 2, "tool_calls": 1}))
        desk.review(view.id, MANAGER, "rework", "more")
    clock.advance(minutes=minutes)
    desk.report(view.id, WORKER, report_fields(cost={"usd": usd, "tool_calls": 4}))
    desk.review(view.id, MANAGER, "approve")
    return view.id


def test_each_order_counts_under_exactly_one_outcome(desk: Desk, clock: Clock) -> None:
    """Approved, reworked, failed, expired, cancelled, declined and active are told apart."""
    _approved(desk, clock, reworks=0, minutes=10, usd=1)
    _approved(desk, clock, reworks=2, minutes=30, usd=4)
    _approved(desk, clock, reworks=1, minutes=50, usd=5)
    failed = working(desk)
    desk.report(failed.id, WORKER, report_fields("failed"))
    desk.cancel(failed.id, MANAGER, "cannot be done")
    cancelled = working(desk)
    desk.cancel(cancelled.id, MANAGER, "changed my mind")
    declined = desk.create(order_fields(), MANAGER)
    desk.decline(declined.id, WORKER)
    over = working(desk)
    desk.report(over.id, WORKER, report_fields(cost={"usd": 20, "tool_calls": 1}))
    working(desk)
    desk.create(order_fields(to="agent:someone-else"), MANAGER)

    record = desk.track(WORKER)
    assert record.orders == 8
    assert (record.approved_first_time, record.approved_after_rework) == (1, 2)
    assert record.rework_rounds == {1: 1, 2: 1}
    assert (record.failed, record.cancelled, record.declined, record.expired,
            record.active) == (1, 1, 1, 1, 1)
    assert record.approved == 3
    assert sum(record.to_json()[o] for o in OUTCOMES) == record.orders


def test_spend_is_measured_against_budget_per_unit(desk: Desk, clock: Clock) -> None:
    """Spend sums the latest report's cost; the median ratio is per order."""
    for usd in (1, 4, 5):
        _approved(desk, clock, reworks=0, minutes=1, usd=usd)
    spend = desk.track(WORKER).spend
    assert spend["usd"].orders == 3
    assert spend["usd"].spent == pytest.approx(10)
    assert spend["usd"].budget == pytest.approx(30)
    assert spend["usd"].median_ratio == pytest.approx(0.4)
    assert spend["tool_calls"].median_ratio == pytest.approx(0.1)


def test_time_to_approval_runs_from_accept(desk: Desk, clock: Clock) -> None:
    """The median time from accept to approval is over approved orders only."""
    for minutes in (10, 30, 50):
        _approved(desk, clock, reworks=0, minutes=minutes, usd=1)
    working(desk)
    assert desk.track(WORKER).median_seconds_to_approval == pytest.approx(30 * 60)


def test_a_worker_without_orders_has_an_empty_record(desk: Desk) -> None:
    """No orders means zeros and no medians."""
    record = desk.track("agent:new")
    assert record.orders == 0
    assert record.median_seconds_to_approval is None
    assert record.to_json()["spend"] == {}


def test_the_record_reads_only_the_worker_s_orders(tmp_path: Path) -> None:
    """Other workers' orders never enter the record, and outcome_of agrees with it."""
    store: Store = open_store("sqlite", tmp_path)
    try:
        desk = Desk(store, clock=Clock())
        mine = working(desk)
        desk.create(order_fields(to="agent:other"), MANAGER)
        record = track_record(store, WORKER)
        assert record.orders == 1
        assert outcome_of(store.load(mine.id)) == "active"
    finally:
        store.close()
