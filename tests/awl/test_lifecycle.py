from __future__ import annotations

import pytest

from awl import InvalidTransition
from awl.documents.lifecycle import (
    ACTIVE,
    NOTE_ACTIONS,
    STATES,
    TABLE,
    TERMINAL,
    fold,
    is_row,
    role_of,
    targets,
)
from awl.documents.models import Event

T0 = "2026-03-01T10:00:00Z"


def _log(*steps: tuple[str | None, str, str]) -> list[Event]:
    return [
        Event.model_validate({"seq": i, "at": T0, "actor": "agent:x", "action": action,
                              "from": from_, "to": to})
        for i, (from_, action, to) in enumerate(steps, start=1)
    ]


TRANSITIONS = [
    (None, "create", "offered", "manager"),
    ("offered", "accept", "accepted", "worker"),
    ("offered", "decline", "declined", "worker"),
    ("accepted", "start", "working", "worker"),
    ("working", "report", "submitted", "worker"),
    ("working", "report", "blocked", "worker"),
    ("blocked", "answer", "working", "answerer"),
    ("submitted", "approve", "approved", "manager"),
    ("submitted", "rework", "working", "manager"),
    ("working", "block", "blocked", "desk"),
    *[(s, "cancel", "cancelled", "manager") for s in sorted(ACTIVE)],
    *[(s, "expire", "expired", "desk") for s in sorted(ACTIVE)],
]


@pytest.mark.spec("LC-3")
@pytest.mark.parametrize(("from_", "action", "to", "role"), TRANSITIONS)
def test_every_published_transition_is_a_row(
    from_: str | None, action: str, to: str, role: str
) -> None:
    """Each published transition is in the table with its role."""
    assert TABLE[(from_, action, to)] == role
    assert to in targets(from_, action)


@pytest.mark.spec("LC-3", "LC-8")
def test_the_table_has_no_other_transitions() -> None:
    """Every row that changes the state is one of the published transitions."""
    moving = {(f, a, t) for (f, a, t) in TABLE if f != t}
    assert moving == {(f, a, t) for (f, a, t, _) in TRANSITIONS}


def test_terminal_states_are_left_by_no_transition() -> None:
    """No row leaves a terminal state for another state."""
    for (from_, _action, to) in TABLE:
        if from_ in TERMINAL:
            assert to == from_


@pytest.mark.parametrize(
    ("state", "action", "allowed"),
    [
        ("accepted", "progress", True),
        ("working", "progress", True),
        ("blocked", "progress", True),
        ("offered", "progress", False),
        ("submitted", "progress", False),
        ("approved", "settle", True),
        ("approved", "retry", True),
        ("working", "settle", False),
        ("working", "drop", True),
        ("cancelled", "drop", True),
        ("offered", "drop", False),
    ],
)
def test_note_actions_keep_the_state_where_allowed(state: str, action: str,
                                                   allowed: bool) -> None:
    """Non-transition actions are rows with from equal to to, only where they make sense."""
    assert action in NOTE_ACTIONS
    assert is_row(state, action, state) is allowed


@pytest.mark.spec("LC-20", "LC-21")
@pytest.mark.parametrize("state", sorted(STATES))
def test_check_runs_are_desk_rows_once_work_started(state: str) -> None:
    """The desk records check runs from working on (not before, nor on an order that ended
    unapproved), and only the desk blocks an order itself, from working."""
    allowed = state in ("working", "blocked", "submitted", "approved")
    assert is_row(state, "check", state) is allowed
    assert (TABLE.get((state, "check", state)) == "desk") is allowed
    assert is_row(state, "block", "blocked") is (state == "working")


@pytest.mark.parametrize(
    ("steps", "state"),
    [
        ([(None, "create", "offered")], "offered"),
        ([(None, "create", "offered"), ("offered", "decline", "declined")], "declined"),
        ([(None, "create", "offered"), ("offered", "accept", "accepted"),
          ("accepted", "start", "working"), ("working", "progress", "working"),
          ("working", "report", "blocked"), ("blocked", "answer", "working"),
          ("working", "report", "submitted"), ("submitted", "rework", "working"),
          ("working", "report", "submitted"), ("submitted", "approve", "approved"),
          ("approved", "drop", "approved"), ("approved", "settle", "approved")], "approved"),
        ([(None, "create", "offered"), ("offered", "accept", "accepted"),
          ("accepted", "expire", "expired")], "expired"),
        ([(None, "create", "offered"), ("offered", "cancel", "cancelled")], "cancelled"),
    ],
)
def test_golden_logs_fold_to_their_state(steps: list[tuple[str | None, str, str]],
                                         state: str) -> None:
    """A valid log replays to the state it ends in."""
    assert fold(_log(*steps)) == state


@pytest.mark.parametrize(
    "steps",
    [
        [("offered", "accept", "accepted")],
        [(None, "create", "offered"), ("offered", "start", "working")],
        [(None, "create", "offered"), ("accepted", "start", "working")],
        [(None, "create", "offered"), ("offered", "decline", "declined"),
         ("declined", "accept", "accepted")],
        [(None, "create", "offered"), ("offered", "cancel", "cancelled"),
         ("cancelled", "expire", "expired")],
        [(None, "create", "offered"), ("offered", "accept", "working")],
    ],
)
def test_logs_with_a_row_outside_the_table_are_refused(
    steps: list[tuple[str | None, str, str]]
) -> None:
    """Replaying a log with a transition outside the table raises."""
    with pytest.raises(InvalidTransition):
        fold(_log(*steps))


def test_a_gap_in_seq_is_refused() -> None:
    """A log whose seq skips a number does not replay."""
    events = _log((None, "create", "offered"), ("offered", "accept", "accepted"))
    gapped = [events[0], events[1].model_copy(update={"seq": 3})]
    with pytest.raises(InvalidTransition):
        fold(gapped)


def test_an_empty_log_is_refused() -> None:
    """An order always has at least its create event."""
    with pytest.raises(InvalidTransition):
        fold([])


def test_role_of_names_who_acts() -> None:
    """The role of an action depends only on the state and the action."""
    assert role_of("blocked", "answer") == "answerer"
    assert role_of("working", "report") == "worker"
    assert role_of("approved", "cancel") is None
    assert targets("working", "report") == ("blocked", "submitted")
