"""Committing approved effects in-process against a real receiver subprocess."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import pytest

from awl.cli import main
from awl.documents.checks import json_equal
from awl.documents.errors import BadRequest, Conflict, Forbidden, InvalidTransition
from awl.documents.models import format_time, parse_time
from awl.store.protocol import EffectState, LockInfo, PassRecord, Revocation
from gateway._commit import (
    CommitSummary,
    commit,
    commit_sync,
    drop_attempt,
    fill_refs,
    list_effects,
    lock_name,
    retry_sync,
    settle,
)
from gateway._config import load_config
from gateway._lock import OrderLock, holder_alive, is_stale, process_start
from tests.awl.desk_support import reserved
from tests.gateway.commit_support import (
    MANAGER,
    WORKER,
    Setup,
    finish,
    hold,
    make_setup,
    start_committer,
)

DELIVER = "receiver/deliver"
ISSUE = "receiver/create_issue"
REJECT = "receiver/reject"


def run(setup: Setup) -> CommitSummary:
    return commit_sync(setup.order_id, store=setup.store,
                       pool_or_config=load_config(setup.config))


def three(tmp_path: Path, **kwargs: Any) -> Setup:
    return make_setup(tmp_path, [(DELIVER, {"to": "cfo", "body": "q3"}),
                                 (DELIVER, {"to": "ceo", "body": "q3"}),
                                 (DELIVER, {"to": "board", "body": "q3"})], **kwargs)


def one(tmp_path: Path, **kwargs: Any) -> Setup:
    return make_setup(tmp_path, [(DELIVER, {"to": "cfo", "body": "q3"})], **kwargs)


def make_unknown(setup: Setup, ref: str) -> None:
    """Leave ``ref`` as a dead committer would: marked dispatching, never answered."""
    setup.store.set_effect(setup.order_id, ref, expect=["held"], state="dispatching",
                           count_dispatch=True, at="2030-01-01T00:00:00Z")


# --------------------------------------------------------------------------- helpers

def test_json_equal_tells_booleans_from_numbers() -> None:
    """JSON equality ignores key order but never takes true for 1."""
    assert json_equal({"a": [1, {"b": None}], "c": "x"}, {"c": "x", "a": [1.0, {"b": None}]})
    assert not json_equal({"a": True}, {"a": 1})
    assert not json_equal({"a": 0}, {"a": False})
    assert not json_equal({"a": [1, 2]}, {"a": [2, 1]})
    assert not json_equal({"a": 1}, {"a": 1, "b": 1})
    assert not json_equal("1", 1)


# --------------------------------------------------------------------------- commit

@pytest.mark.slow
@pytest.mark.spec("CM-1", "CM-7", "CM-9")
def test_commit_runs_each_approved_effect_once_in_order_and_never_again(tmp_path: Path) -> None:
    """Every approved effect reaches the receiver once, in order, with its awl meta; later
    commits only report the recorded results."""
    setup = three(tmp_path)
    assert run(setup).ok
    lines = setup.deliveries()
    assert [line["ref"] for line in lines] == setup.refs
    assert {line["order"] for line in lines} == {setup.order_id}
    assert {line["attempt"] for line in lines} == {1}
    assert [line["arguments"]["to"] for line in lines] == ["cfo", "ceo", "board"]
    states = setup.states()
    assert all(states[r].state == "committed" and states[r].dispatches == 1 for r in setup.refs)
    result = states[setup.refs[0]].result
    assert result is not None and result["structuredContent"]["delivered"] is True
    for _ in range(2):
        again = run(setup)
        assert again.ok and not any(e.sent for e in again.effects)
        assert {e.reason for e in again.effects} == {"already committed before this run"}
    assert setup.counts() == {r: 1 for r in setup.refs}


@pytest.mark.slow
@pytest.mark.spec("CM-1")
def test_approved_effects_run_one_at_a_time_in_the_report_s_order(tmp_path: Path) -> None:
    """The approved effects run in the order the report lists them, whatever their numbers
    or the approval's order, each answered before the next is sent."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"}), (DELIVER, {"to": "ceo"}),
                                  (DELIVER, {"to": "board"}), (DELIVER, {"to": "press"})],
                       rewrite=lambda _store, _oid, effects: [effects[i] for i in (2, 0, 3, 1)],
                       approve=[1, 2, 0])
    setup.control_receiver(delay=0.2)
    summary = run(setup)
    assert summary.ok
    in_report_order = [setup.refs[i] for i in (2, 0, 1)]
    assert [e.ref for e in summary.effects] == in_report_order
    lines = setup.deliveries()
    assert [line["ref"] for line in lines] == in_report_order
    # The receiver logs each delivery on arrival and answers 0.2 s later: none overlapped.
    assert all(b["at"] - a["at"] >= 0.2 for a, b in pairwise(lines))
    assert setup.states()[setup.refs[3]].state == "dropped"


@pytest.mark.spec("CM-2", "SEC-5")
def test_tampered_arguments_run_nothing_and_name_the_mismatch(tmp_path: Path) -> None:
    """A report whose arguments differ from the held call runs no effect at all."""
    setup = three(tmp_path, tamper={1: {"to": "ceo", "body": "something else"}})
    summary = run(setup)
    assert not summary.ok
    found = [(m.problem, m.path) for m in summary.mismatches]
    assert found == [("arguments", "/effects/1/arguments")]
    assert setup.counts() == {}
    assert {s.state for s in setup.states().values()} == {"held"}


@pytest.mark.spec("CM-2")
def test_every_effect_that_fails_the_call_log_check_is_named_and_nothing_runs(
        tmp_path: Path) -> None:
    """Effects naming a call of an earlier attempt, no recorded call, or a call that was
    forwarded instead of held are each named, and not even the sound effect runs."""
    def rewrite(store: Any, order_id: str, effects: list[dict[str, Any]]
                ) -> list[dict[str, Any]]:
        at = format_time(datetime.now(UTC))
        forwarded = reserved(store.reserve_call(order_id, attempt=2, tool=DELIVER,
                                       arguments={"to": "ops"}, pass_jti=None, usd=0.0,
                                       started_at=at, scopes=[]))
        store.finish_call(order_id, forwarded.ref, outcome="ok", result=None, error=None,
                          ended_at=at)
        return [effects[0],
                {"ref": "receiver/deliver#1", "tool": DELIVER, "arguments": {"to": "old"}},
                {"ref": "receiver/deliver#99", "tool": DELIVER, "arguments": {"to": "cfo"}},
                {"ref": forwarded.ref, "tool": DELIVER, "arguments": {"to": "ops"}}]

    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"})],
                       rework_first=[(DELIVER, {"to": "old"})], rewrite=rewrite)
    summary = run(setup)
    assert [(m.problem, m.path) for m in summary.mismatches] == [
        ("attempt", "/effects/1"), ("not_recorded", "/effects/2/ref"),
        ("not_held", "/effects/3")]
    assert not any(e.sent for e in summary.effects)
    assert setup.counts() == {}
    assert setup.states()[setup.refs[0]].state == "held"


@pytest.mark.spec("CM-2")
def test_a_listed_effect_left_out_of_the_approval_is_checked_too(tmp_path: Path) -> None:
    """An effect the report lists but the manager did not approve is still checked against
    the call log: its tampered arguments stop the commit, and nothing is sent or dropped."""
    setup = three(tmp_path, approve=[0], tamper={2: {"to": "press", "body": "q3"}})
    summary = run(setup)
    assert [(m.problem, m.path) for m in summary.mismatches] == [
        ("arguments", "/effects/2/arguments")]
    assert summary.dropped == () and setup.counts() == {}
    assert {s.state for s in setup.states().values()} == {"held"}


@pytest.mark.slow
@pytest.mark.spec("CM-2", "CM-8")
def test_a_commit_run_again_passes_the_check_and_sends_only_what_is_still_held(
        tmp_path: Path) -> None:
    """After a commit that stopped part way (one effect committed, one failed, one marked
    dispatching and never answered), a new commit passes the call-log check, reports each
    effect past held with its state, and sends only the one still held."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": to}) for to in ("cfo", "ceo", "board",
                                                                   "press")])
    done, refused, lost, waiting = setup.refs
    at = "2030-01-01T00:00:00Z"
    for ref in (done, refused):
        setup.store.set_effect(setup.order_id, ref, expect=["held"], state="dispatching",
                               count_dispatch=True, at=at)
    setup.store.set_effect(setup.order_id, done, expect=["dispatching"], state="committed",
                           result={"content": []}, at=at)
    setup.store.set_effect(setup.order_id, refused, expect=["dispatching"], state="failed",
                           error="rejected", at=at)
    make_unknown(setup, lost)
    summary = run(setup)
    assert summary.mismatches == ()
    assert [(e.ref, e.state, e.sent) for e in summary.effects] == [
        (done, "committed", False), (refused, "failed", False), (lost, "unknown", False),
        (waiting, "committed", True)]
    assert setup.counts() == {waiting: 1}


@pytest.mark.slow
@pytest.mark.spec("SEC-5")
def test_the_commit_sends_the_held_arguments_never_the_reported_ones(tmp_path: Path) -> None:
    """A report whose arguments equal the held ones as JSON but are written differently
    passes the check, and the receiver gets the arguments exactly as held."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo", "body": {"copies": 2}})],
                       tamper={0: {"to": "cfo", "body": {"copies": 2.0}}})
    listed = setup.store.load(setup.order_id).reports[-1].effects
    assert listed is not None and listed[0].arguments == {"to": "cfo", "body": {"copies": 2.0}}
    assert run(setup).ok
    (line,) = setup.deliveries()
    assert line["arguments"] == {"to": "cfo", "body": {"copies": 2}}
    assert type(line["arguments"]["body"]["copies"]) is int


@pytest.mark.slow
@pytest.mark.spec("CM-4", "CM-1")
def test_unapproved_unlisted_and_reworked_held_calls_are_dropped(tmp_path: Path) -> None:
    """Held calls not approved, not listed, or of a reworked attempt never run: the desk
    drops the reworked ones at the rework, the commit drops the rest."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"}), (DELIVER, {"to": "ceo"}),
                                  (DELIVER, {"to": "board"})],
                       approve=[0, 2], unlisted=[(DELIVER, {"to": "press"})],
                       rework_first=[(DELIVER, {"to": "cfo", "body": "v1"})])
    old = "receiver/deliver#1"
    assert setup.states()[old].state == "dropped"  # already, by the rework
    summary = run(setup)
    assert summary.ok
    assert setup.counts() == {setup.refs[0]: 1, setup.refs[2]: 1}
    dropped = [setup.refs[1], setup.extra[0]]
    assert sorted(summary.dropped) == sorted(dropped)
    states = setup.states()
    assert all(states[r].state == "dropped" for r in [old, *dropped])
    assert states[old].error == "attempt 1 was sent back for rework"
    assert states[setup.refs[1]].error == "the manager did not approve it"
    assert states[setup.extra[0]].error == "the approved report does not list it"
    drops = [e for e in setup.store.events(setup.order_id) if e.action == "drop"]
    assert [(e.actor, e.from_, e.to) for e in drops] == [
        ("awl:desk", "working", "working"), ("awl:gateway", "approved", "approved")]
    assert [sorted((e.data or {})["refs"]) for e in drops] == [[old], sorted(dropped)]
    run(setup)  # dropping again logs nothing new
    assert len([e for e in setup.store.events(setup.order_id) if e.action == "drop"]) == 2


def test_drop_attempt_drops_only_that_attempts_held_calls(tmp_path: Path) -> None:
    """drop_attempt drops the still-held calls of one attempt and logs one drop event."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"})],
                       unlisted=[(DELIVER, {"to": "ceo"})])
    later = hold(setup.store, setup.order_id, DELIVER, {"to": "board"}, attempt=2)
    assert drop_attempt(setup.order_id, 1, store=setup.store) == [
        setup.refs[0], setup.extra[0]]
    assert drop_attempt(setup.order_id, 1, store=setup.store) == []
    assert setup.states()[later].state == "held"
    drops = [e for e in setup.store.events(setup.order_id) if e.action == "drop"]
    assert len(drops) == 1 and drops[0].actor == "awl:gateway"
    assert drops[0].data is not None and drops[0].data["attempt"] == 1


@pytest.mark.slow
@pytest.mark.spec("CM-5", "SEC-5")
def test_ref_values_are_filled_and_dependents_of_uncommitted_effects_skipped(
        tmp_path: Path) -> None:
    """A $ref takes the referenced result at the pointer; one that cannot is skipped."""
    setup = make_setup(tmp_path, [
        (ISSUE, {"title": "Q3 risks"}),
        (DELIVER, {"to": "cfo", "body": {"issue": {"$ref": "receiver/create_issue#1",
                                                    "pointer": "/structuredContent/number"}}}),
        (REJECT, {"reason": "quota"}),
        (DELIVER, {"to": "ceo", "body": {"$ref": "receiver/reject#3",
                                         "pointer": "/structuredContent/number"}}),
        (DELIVER, {"to": "board", "body": {"$ref": "receiver/create_issue#1",
                                           "pointer": "/structuredContent/nothing"}}),
    ])
    summary = run(setup)
    got = {e.ref: (e.state, e.reason) for e in summary.effects}
    assert [got[r][0] for r in setup.refs] == [
        "committed", "committed", "failed", "skipped", "skipped"]
    assert got[setup.refs[3]][1] == "needs receiver/reject#3, which is failed, not committed"
    assert "/structuredContent/nothing" in got[setup.refs[4]][1]
    assert setup.counts() == {r: 1 for r in setup.refs[:3]}
    issue, mail, _ = setup.deliveries()
    assert issue["ref"] == setup.refs[0]  # the receiver numbered it 1
    assert mail["arguments"]["body"] == {"issue": 1}
    waiting = EffectState(order_id="o", ref="a/b#9", attempt=1, state="held")
    assert fill_refs({"x": {"$ref": "a/b#9", "pointer": ""}}, {"a/b#9": waiting})[1] == (
        "needs a/b#9, which is held, not committed")


def _after_the_holds(setup: Setup) -> str:
    """A moment just after the latest held call of the order started."""
    latest = max(parse_time(c.started_at) for c in setup.store.calls(setup.order_id))
    return format_time(latest + timedelta(milliseconds=1))


@pytest.mark.slow
@pytest.mark.spec("CM-3")
def test_a_pass_revoked_before_the_hold_runs_nothing(tmp_path: Path) -> None:
    """Effects held under a pass, or under one derived from a pass, that was already revoked
    when they were held are refused before anything runs."""
    setup = three(tmp_path / "own", pass_jti="pass-1")
    setup.store.revoke("pass-1", reason="leaked", at="2000-01-01T00:00:00Z")
    summary = run(setup)
    assert [(m.problem, m.path) for m in summary.mismatches] == [
        ("pass_revoked", f"/effects/{i}") for i in range(3)]
    assert setup.counts() == {}
    derived = one(tmp_path / "parent", pass_jti="pass-2")
    derived.store.save_pass(PassRecord(jti="pass-2", order_id=derived.order_id,
                                       parent_jti="pass-1", subject=WORKER, exp=2**31,
                                       issued_at="2000-01-01T00:00:00Z"))
    derived.store.revoke("pass-1", reason="leaked", at="2000-01-01T00:00:00Z")
    summary = run(derived)
    assert [(m.problem, m.path) for m in summary.mismatches] == [("pass_revoked", "/effects/0")]
    assert derived.counts() == {}


@pytest.mark.slow
@pytest.mark.spec("CM-3", "DP-8")
def test_a_pass_revoked_after_the_hold_still_commits(tmp_path: Path) -> None:
    """The desk revokes the order's pass when it approves; the effects held under it still
    run, since the pass was valid when they were held."""
    setup = three(tmp_path, pass_jti="pass-1", issued=True)
    approval = next(e for e in setup.store.events(setup.order_id) if e.action == "approve")
    assert setup.store.revocations() == {
        "pass-1": Revocation(reason="order approved", at=approval.at)}
    summary = run(setup)
    assert summary.ok and not summary.mismatches
    assert setup.counts() == {r: 1 for r in setup.refs}


@pytest.mark.slow
@pytest.mark.spec("CM-3")
def test_a_retry_rechecks_the_pass_as_of_the_hold(tmp_path: Path) -> None:
    """A retry refuses a pass revoked before the hold and sends under one revoked after."""
    for name, revoked_at, sends in (("before", "2000-01-01T00:00:00Z", False),
                                    ("after", None, True)):
        setup = one(tmp_path / name, pass_jti="pass-1")
        ref = setup.refs[0]
        make_unknown(setup, ref)
        setup.store.revoke("pass-1", reason="leaked",
                           at=revoked_at or _after_the_holds(setup))
        run(setup)
        settle(setup.order_id, ref, "did_not_happen", "no trace", MANAGER, store=setup.store)
        if sends:
            assert retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                              pool_or_config=load_config(setup.config)).state == "committed"
            assert setup.counts() == {ref: 1}
        else:
            with pytest.raises(InvalidTransition, match="revoked"):
                retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                           pool_or_config=load_config(setup.config))
            assert setup.counts() == {}


@pytest.mark.spec("CM-1")
def test_an_order_that_is_not_approved_is_not_committed(tmp_path: Path) -> None:
    """Committing an order that was never approved raises and sends nothing."""
    setup = three(tmp_path)
    other = setup.desk.create({
        "to": WORKER, "goal": "x", "criteria": [{"id": "c1", "text": "y"}],
        "budget": {"tool_calls": 3},
        "deadline": (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tools": ["receiver/*"], "staged": ["receiver/deliver"]}, MANAGER)
    with pytest.raises(InvalidTransition):
        commit_sync(other.id, store=setup.store, pool_or_config=load_config(setup.config))
    assert setup.store.get_lock(lock_name(other.id)) is None


@pytest.mark.slow
@pytest.mark.spec("CM-7", "CM-8")
def test_a_receiver_that_never_answers_makes_the_effect_unknown(tmp_path: Path) -> None:
    """No answer within the timeout leaves the effect unknown; a later commit skips it."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"})], timeout=0.5)
    setup.control_receiver(hang_after="*")
    summary = run(setup)
    assert [e.state for e in summary.effects] == ["unknown"]
    assert "0.5 s" in summary.effects[0].reason
    setup.control_receiver()
    run(setup)
    assert setup.counts() == {setup.refs[0]: 1}


@pytest.mark.slow
@pytest.mark.spec("CM-7")
def test_an_effect_answered_with_an_error_is_failed_with_that_error(tmp_path: Path) -> None:
    """An upstream's error answer makes the effect failed with the error kept, and a later
    commit does not send it again."""
    setup = make_setup(tmp_path, [(REJECT, {"reason": "quota"})])
    summary = run(setup)
    assert [(e.state, e.sent) for e in summary.effects] == [("failed", True)]
    state = setup.states()[setup.refs[0]]
    assert state.state == "failed" and "rejected: quota" in (state.error or "")
    assert state.result is not None and state.result["isError"] is True
    again = run(setup)
    assert not again.ok and not any(e.sent for e in again.effects)
    assert setup.counts() == {setup.refs[0]: 1}


@pytest.mark.slow
@pytest.mark.spec("CM-7")
def test_an_upstream_that_cannot_start_leaves_effects_held(tmp_path: Path) -> None:
    """When the receiver cannot even start, nothing is marked and a later commit runs it."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"})])
    broken = json.loads(setup.config.read_text())
    broken["mcpServers"]["receiver"]["args"] = ["-c", "raise SystemExit(3)"]
    broken["mcpServers"]["receiver"]["connect_timeout"] = 5
    summary = commit_sync(setup.order_id, store=setup.store, pool_or_config=broken)
    assert [e.state for e in summary.effects] == ["held"]
    assert setup.states()[setup.refs[0]].dispatches == 0
    assert run(setup).ok
    assert setup.counts() == {setup.refs[0]: 1}


# --------------------------------------------------------------------------- settle and retry

@pytest.mark.spec("CM-8", "CM-11")
def test_only_the_manager_settles_and_only_unknown_effects(tmp_path: Path) -> None:
    """Settling is the manager's, for unknown effects, with evidence."""
    setup = one(tmp_path)
    ref = setup.refs[0]
    with pytest.raises(InvalidTransition):  # held
        settle(setup.order_id, ref, "happened", "saw it", MANAGER, store=setup.store)
    make_unknown(setup, ref)
    with pytest.raises(InvalidTransition):  # dispatching: only a commit may decide it
        settle(setup.order_id, ref, "happened", "saw it", MANAGER, store=setup.store)
    assert run(setup).recovered == (ref,)
    with pytest.raises(Forbidden):
        settle(setup.order_id, ref, "happened", "saw it", WORKER, store=setup.store)
    with pytest.raises(BadRequest):
        settle(setup.order_id, ref, "happened", " ", MANAGER, store=setup.store)
    view = settle(setup.order_id, ref, "happened", "in the CFO's inbox", MANAGER,
                  store=setup.store)
    assert view.state == "unknown" and not view.retryable
    assert view.settlement is not None and view.settlement.by == MANAGER
    event = setup.store.events(setup.order_id)[-1]
    assert (event.action, event.actor, event.from_, event.to) == (
        "settle", MANAGER, "approved", "approved")
    assert event.data is not None
    assert (event.data["ref"], event.data["verdict"], event.data["evidence"]) == (
        ref, "happened", "in the CFO's inbox")
    with pytest.raises(InvalidTransition):  # happened is final
        retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config))


@pytest.mark.spec("CM-8", "CM-11")
def test_an_unsettled_unknown_effect_is_never_retried(tmp_path: Path) -> None:
    """Retry refuses an unknown effect until the manager settles it did_not_happen."""
    setup = one(tmp_path)
    make_unknown(setup, setup.refs[0])
    run(setup)
    with pytest.raises(InvalidTransition, match="not settled"):
        retry_sync(setup.order_id, setup.refs[0], MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config))
    with pytest.raises(Forbidden):
        retry_sync(setup.order_id, setup.refs[0], WORKER, store=setup.store,
                   pool_or_config=load_config(setup.config))
    assert setup.counts().get(setup.refs[0]) is None


@pytest.mark.slow
@pytest.mark.spec("CM-9", "CM-11")
def test_retry_sends_with_the_same_ref_and_needs_a_new_settlement_after(tmp_path: Path) -> None:
    """A did_not_happen effect is retried once with its awl/ref; the settlement is used up."""
    setup = one(tmp_path)
    ref = setup.refs[0]
    make_unknown(setup, ref)
    run(setup)
    settle(setup.order_id, ref, "did_not_happen", "not in the outbox", MANAGER,
           store=setup.store)
    outcome = retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                         pool_or_config=load_config(setup.config))
    assert outcome.state == "committed" and outcome.sent
    assert [(x["ref"], x["order"], x["attempt"]) for x in setup.deliveries()] == [
        (ref, setup.order_id, 1)]
    actions = [e.action for e in setup.store.events(setup.order_id)]
    assert actions[-2:] == ["settle", "retry"]
    with pytest.raises(InvalidTransition):
        retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config))
    assert setup.counts()[ref] == 1


@pytest.mark.slow
@pytest.mark.spec("CM-9")
def test_a_retry_carries_the_same_awl_meta_as_the_first_send(tmp_path: Path) -> None:
    """The first send, whose answer was lost, and the retry carry identical awl/ref,
    awl/order and awl/attempt (here attempt 2, after a rework)."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"})],
                       rework_first=[(DELIVER, {"to": "old"})], timeout=0.5)
    ref = setup.refs[0]
    setup.control_receiver(hang_after="*")
    assert [e.state for e in run(setup).effects] == ["unknown"]
    setup.control_receiver()
    settle(setup.order_id, ref, "did_not_happen", "the answer never came", MANAGER,
           store=setup.store)
    assert retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                      pool_or_config=load_config(setup.config)).state == "committed"
    sends = [(x["ref"], x["order"], x["attempt"]) for x in setup.deliveries()]
    assert sends == [(ref, setup.order_id, 2)] * 2


@pytest.mark.spec("CM-11")
def test_a_retry_rechecks_that_the_order_allows_and_stages_the_tool(tmp_path: Path) -> None:
    """A settled unknown effect of a tool the order does not stage, or does not allow, is
    refused on retry and nothing is sent (such records can only be forged: orders never
    change)."""
    setup = one(tmp_path)
    for tool, why in (("receiver/echo", "does not stage"), ("elsewhere/deliver", "not allow")):
        ref = hold(setup.store, setup.order_id, tool, {"text": "x"})
        make_unknown(setup, ref)
        setup.store.set_effect(setup.order_id, ref, expect=["dispatching"], state="unknown",
                               error="lost", at="2030-01-01T00:00:01Z")
        settle(setup.order_id, ref, "did_not_happen", "never arrived", MANAGER,
               store=setup.store)
        with pytest.raises(InvalidTransition, match=why):
            retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                       pool_or_config=load_config(setup.config))
        assert setup.states()[ref].dispatches == 1
    assert setup.deliveries() == []


@pytest.mark.slow
@pytest.mark.spec("CM-8", "CM-11")
def test_a_retry_that_ends_unknown_needs_settling_again(tmp_path: Path) -> None:
    """A settlement describes one dispatch: after a retry it no longer permits another."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"})], timeout=0.5)
    ref = setup.refs[0]
    make_unknown(setup, ref)
    run(setup)
    settle(setup.order_id, ref, "did_not_happen", "no trace", MANAGER, store=setup.store)
    setup.control_receiver(hang_after="*")
    assert retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                      pool_or_config=load_config(setup.config)).state == "unknown"
    setup.control_receiver()
    view = next(v for v in list_effects(setup.order_id, store=setup.store) if v.ref == ref)
    assert view.state == "unknown" and view.settlement is None and view.dispatches == 2
    with pytest.raises(InvalidTransition, match="not settled"):
        retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config))
    assert setup.counts() == {ref: 1}


@pytest.mark.spec("CM-11")
def test_retry_rechecks_the_deadline(tmp_path: Path) -> None:
    """A retry after the order's deadline is refused and sends nothing."""
    setup = one(tmp_path)
    ref = setup.refs[0]
    make_unknown(setup, ref)
    run(setup)
    settle(setup.order_id, ref, "did_not_happen", "no trace", MANAGER, store=setup.store)
    late = datetime.now(UTC) + timedelta(days=2)
    with pytest.raises(InvalidTransition, match="deadline"):
        retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config), now=lambda: late)
    assert setup.counts().get(ref) is None


# --------------------------------------------------------------------------- the lock

def _lock(store: object, pid: int, lease_until: float, host: str | None = None,
          started: str | None = None) -> LockInfo:
    data: dict[str, object] = {} if started is None else {"started": started}
    return LockInfo(name="commit:x", holder="old", pid=pid,
                    host=host or socket.gethostname(), lease_until=lease_until, data=data)


@pytest.mark.spec("CM-10")
def test_a_lock_is_stale_when_its_process_is_gone_or_its_lease_ran_out() -> None:
    """A dead pid, a reused pid or an old lease make a lock stale; a live holder does not."""
    me, far = os.getpid(), time.time() + 60
    assert holder_alive(_lock(None, me, far, started=process_start(me))) is True
    assert not is_stale(_lock(None, me, far))
    assert is_stale(_lock(None, me, time.time() - 1))
    assert is_stale(_lock(None, me, far, started="1"))  # same pid, another process
    assert holder_alive(_lock(None, me, far, host="elsewhere.invalid")) is None
    assert not is_stale(_lock(None, me, far, host="elsewhere.invalid"))
    dead = 2 ** 22 + 12345
    assert is_stale(_lock(None, dead, far))


@pytest.mark.slow
@pytest.mark.spec("CM-10")
@pytest.mark.anyio
async def test_a_live_committer_holds_off_another_and_a_dead_one_is_taken_over(
        tmp_path: Path) -> None:
    """A second committer gets Conflict while the first lives, and takes over once it died."""
    setup = three(tmp_path)
    async with OrderLock(setup.store, lock_name(setup.order_id)):
        with pytest.raises(Conflict):
            await commit(setup.order_id, store=setup.store,
                         pool_or_config=load_config(setup.config))
    ghost = LockInfo(name=lock_name(setup.order_id), holder="ghost", pid=2 ** 22 + 999,
                     host=socket.gethostname(), lease_until=time.time() + 600)
    assert setup.store.acquire_lock(ghost)
    with anyio.fail_after(60):
        summary = await commit(setup.order_id, store=setup.store,
                               pool_or_config=load_config(setup.config))
    assert summary.ok and summary.took_over is not None
    assert setup.store.get_lock(lock_name(setup.order_id)) is None


@pytest.mark.spec("CM-10")
@pytest.mark.anyio
async def test_a_lease_that_ran_out_is_taken_over_and_its_holder_stops(tmp_path: Path) -> None:
    """A holder whose lease expired loses the lock to the next taker and learns it."""
    setup = one(tmp_path)
    first = OrderLock(setup.store, "commit:y", lease=30)
    assert first.try_acquire()
    assert first.info is not None
    # As if the holder ran on another host and stopped renewing: only the lease can tell.
    expired = replace(first.info, host="elsewhere.invalid", lease_until=time.time() - 1)
    assert setup.store.acquire_lock(expired, replace=first.info)
    first.info = expired
    second = OrderLock(setup.store, "commit:y")
    assert second.try_acquire() and second.took_over == expired
    assert not first.renew() and first.lost


# --------------------------------------------------------------------------- CLI

@pytest.mark.slow
@pytest.mark.spec("CM-11")
def test_the_effects_commands_list_settle_and_retry(tmp_path: Path,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """awl effects list, settle and retry work from the command line, text and JSON."""
    setup = one(tmp_path)
    ref = setup.refs[0]
    make_unknown(setup, ref)
    run(setup)
    home = str(setup.home)
    capfd.readouterr()
    assert main(["effects", "list", setup.order_id, "--home", home]) == 0
    text = capfd.readouterr().out
    assert f"{ref}  unknown" in text and "unsettled" in text
    assert main(["effects", "settle", setup.order_id, ref, "--did-not-happen",
                 "--evidence", "no trace", "--as", WORKER, "--home", home]) == 1
    assert "FORBIDDEN" in capfd.readouterr().err
    assert main(["effects", "retry", setup.order_id, ref, "--config", str(setup.config),
                 "--as", MANAGER, "--home", home]) == 1
    assert "INVALID_TRANSITION" in capfd.readouterr().err
    assert main(["effects", "settle", setup.order_id, ref, "--did-not-happen",
                 "--evidence", "no trace", "--as", MANAGER, "--home", home, "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["retryable"] is True
    assert main(["effects", "retry", setup.order_id, ref, "--config", str(setup.config),
                 "--as", MANAGER, "--home", home]) == 0
    assert "committed" in capfd.readouterr().out
    assert main(["effects", "list", setup.order_id, "--home", home, "--json"]) == 0
    listed = json.loads(capfd.readouterr().out)["effects"]
    assert [e["state"] for e in listed] == ["committed"]
    assert setup.counts() == {ref: 1}


@pytest.mark.slow
@pytest.mark.spec("CM-12")
def test_the_commit_command_prints_each_effect_s_state_and_fails_unless_all_committed(
        tmp_path: Path) -> None:
    """awl gateway --commit prints one line per approved effect with its state, and exits 0
    only when every one is committed."""
    cases = (("good", [(DELIVER, {"to": "cfo"}), (DELIVER, {"to": "ceo"})], 0,
              ["committed", "committed"]),
             ("bad", [(DELIVER, {"to": "cfo"}), (REJECT, {"reason": "quota"})], 1,
              ["committed", "failed"]))
    for name, calls, code, states in cases:
        setup = make_setup(tmp_path / name, calls)
        exit_code, out, err = finish(start_committer(setup))
        assert exit_code == code, err
        for ref, state in zip(setup.refs, states, strict=True):
            (line,) = [x for x in out.splitlines() if x.startswith(f"{ref} ")]
            assert line.split()[2] == state


# --------------------------------------------------------------------------- end to end

@pytest.mark.slow
@pytest.mark.spec("CM-5", "SEC-5")
@pytest.mark.anyio
async def test_calls_held_by_the_gateway_commit_through_awl_gateway_commit(
        tmp_path: Path) -> None:
    """Held through the real gateway, reported, approved, then committed by the CLI."""
    import subprocess
    import sys

    from tests.gateway.gateway_support import MANAGER as GW_MANAGER
    from tests.gateway.gateway_support import ROOT, connect, make_env

    env = make_env(tmp_path, staged=["receiver/create_issue", "receiver/deliver"])
    ref = {"$ref": "receiver/create_issue#1", "pointer": "/structuredContent/number"}
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            await client.call_tool("receiver__create_issue", {"title": "Outage"})
            await client.call_tool("receiver__deliver", {"to": "ops", "body": ref})
            await client.call_tool("receiver__deliver", {"to": "press", "body": "no"})
            held = await client.call_tool("awl_list_held_calls", {})
            assert held.structured_content is not None
            effects = held.structured_content["effects"]
            report = await client.call_tool("awl_submit_report", {"report": {
                "status": "done", "result": {"summary": "filed and told ops"},
                "evidence": [{"criterion": "c1", "type": "tool_call",
                              "ref": "receiver/create_issue#1"}],
                "cost": {"tool_calls": 3, "usd": 0},
                "tools_used": ["receiver/create_issue", "receiver/deliver"],
                "effects": effects}})
            assert not report.is_error, report.content
    env.desk.review(env.order_id, GW_MANAGER, "approve",
                    effects=["receiver/create_issue#1", "receiver/deliver#2"])
    assert env.deliveries() == []
    command = [sys.executable, "-m", "awl", "gateway", "--order", env.order_id, "--config",
               str(env.config), "--commit", "--home", str(env.home), "--json"]
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        command, capture_output=True, text=True, cwd=str(ROOT), timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)}))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert [e["state"] for e in summary["effects"]] == ["committed", "committed"]
    assert summary["dropped"] == ["receiver/deliver#3"]
    got = [(d["ref"], d["arguments"]) for d in env.deliveries()]
    assert got == [("receiver/create_issue#1", {"title": "Outage"}),
                   ("receiver/deliver#2", {"to": "ops", "body": 1})]
