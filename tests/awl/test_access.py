"""Who may do what with an order, decided in one module (awl.desk.access) that the library
desk, the MCP desk server and the gateway's worker tools all ask.

The doors themselves are attacked in test_server_tools.py, test_suborders.py,
tests/gateway/test_suborder_attacks.py and tests/gateway/test_gateway_credentials.py; here
the library door the MCP server's read check now goes through, and the edges of the rules.
"""

from __future__ import annotations

import pytest

from awl import Desk, Forbidden, MemoryStore, WorkOrder
from awl.desk.access import (
    acting_as,
    check_action,
    check_party,
    check_pass_deriver,
    check_reader,
    roles,
)
from tests.awl.desk_support import MANAGER, WORKER, Clock, order_fields, working

SUB_WORKER = "agent:helper"
OUTSIDER = "agent:outsider"


@pytest.fixture
def desk() -> Desk:
    """A desk on a memory store (what is decided here does not depend on the store)."""
    return Desk(MemoryStore(), clock=Clock())


@pytest.mark.spec("SEC-1")
def test_a_reader_must_be_part_of_the_order_or_of_one_above_it(desk: Desk) -> None:
    """The library answers ``get(viewer=...)`` as the MCP desk does: the sub-order's own
    worker and the parent's manager read it; an outsider is refused, naming who may."""
    parent = working(desk)
    sub = desk.create(order_fields(to=SUB_WORKER, parent_id=parent.id, tools=["filings/*"],
                                   staged=None, budget={"usd": 1, "tool_calls": 3}), WORKER)
    for reader in (SUB_WORKER, WORKER, MANAGER, None):
        assert desk.get(sub.id, viewer=reader).id == sub.id
    with pytest.raises(Forbidden, match=f"{OUTSIDER} is not part of order '{sub.id}'"):
        desk.get(sub.id, viewer=OUTSIDER)
    # The approval page is stricter (BIND-13): parties of the order itself only.
    check_party(sub.order, SUB_WORKER)
    with pytest.raises(Forbidden, match=f"{MANAGER} is not a party to order '{sub.id}'"):
        check_party(sub.order, MANAGER)
    assert roles(sub.order, WORKER) == ["manager", "answerer"]
    assert (roles(sub.order, SUB_WORKER), roles(sub.order, MANAGER)) == (["worker"], [])


def test_the_orders_above_are_read_only_when_the_order_itself_grants_nothing(
        desk: Desk) -> None:
    """A party of the order is let in without reading the chain above it; anyone else needs
    a role in an order of that chain."""
    order = working(desk).order
    asked: list[str] = []

    def above() -> list[WorkOrder]:
        asked.append(order.id)
        return [order.model_copy(update={"from_": "human:boss"})]

    check_reader(order, WORKER, above)
    assert asked == []
    check_reader(order, "human:boss", above)
    with pytest.raises(Forbidden):
        check_reader(order, OUTSIDER, above)
    assert asked == [order.id, order.id]


def test_desk_actions_are_taken_by_desk_principals_only(desk: Desk) -> None:
    """A lifecycle action of the desk's own (expiry) is refused to any principal not under
    ``awl:``, and the worker's actions to anyone but the worker."""
    order = working(desk).order
    check_action(order, "expire", "awl:desk")
    with pytest.raises(Forbidden, match="only its desk"):
        check_action(order, "expire", MANAGER)
    with pytest.raises(Forbidden, match=f"only its worker \\({WORKER}\\)"):
        check_action(order, "report", MANAGER)


def test_a_pass_is_derived_only_by_its_holder_and_the_gateway_acts_as_it(desk: Desk) -> None:
    """A parent pass without a subject is held by nobody, so nobody derives from it; the
    gateway's worker tools act as the pass holder, else as the order's worker."""
    check_pass_deriver(WORKER, WORKER)
    for holder in (None, MANAGER):
        with pytest.raises(Forbidden, match="may derive passes only from a pass it holds"):
            check_pass_deriver(WORKER, holder)
    order = desk.create(order_fields(), MANAGER).order
    assert acting_as(order, None) == WORKER
    assert acting_as(order, SUB_WORKER) == SUB_WORKER
