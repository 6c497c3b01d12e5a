"""Committing approved effects in-process against a real receiver subprocess."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from awl._errors import Conflict, Forbidden, InvalidTransition
from awl._store import LockInfo
from awl.cli import main
from gateway._commit import (
    commit,
    commit_sync,
    drop_attempt,
    fill_refs,
    json_equal,
    list_effects,
    lock_name,
    resolve_pointer,
    retry_sync,
    settle,
)
from gateway._config import load_config
from gateway._lock import OrderLock, holder_alive, is_stale, process_start
from tests.gateway.commit_support import MANAGER, WORKER, Setup, make_setup

DELIVER = "receiver/deliver"
ISSUE = "receiver/create_issue"
REJECT = "receiver/reject"


def run(setup: Setup, **kwargs: object) -> object:
    return commit_sync(setup.order_id, store=setup.store,
                       pool_or_config=load_config(setup.config), **kwargs)


def three(tmp_path: Path, **kwargs: object) -> Setup:
    return make_setup(tmp_path, [(DELIVER, {"to": "cfo", "body": "q3"}),
                                 (DELIVER, {"to": "ceo", "body": "q3"}),
                                 (DELIVER, {"to": "board", "body": "q3"})], **kwargs)


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


def test_pointers_address_the_wire_form() -> None:
    """A JSON pointer reads a result as the wire carries it, with RFC 6901 escapes."""
    result = {"structuredContent": {"number": 7, "a/b": {"~x": [10, 20]}}, "isError": False}
    assert resolve_pointer(result, "/structuredContent/number") == 7
    assert resolve_pointer(result, "/structuredContent/a~1b/~0x/1") == 20
    assert resolve_pointer(result, "") == result
    for bad in ("/structured_content/number", "/structuredContent/a~1b/~0x/2",
                "/structuredContent/a~1b/~0x/01", "structuredContent"):
        with pytest.raises(KeyError):
            resolve_pointer(result, bad)


# --------------------------------------------------------------------------- commit

def test_commit_runs_each_approved_effect_once_in_report_order(tmp_path: Path) -> None:
    """Every approved effect reaches the receiver once, in order, with its awl meta."""
    setup = three(tmp_path)
    summary = run(setup)
    assert summary.ok  # type: ignore[attr-defined]
    lines = setup.deliveries()
    assert [line["ref"] for line in lines] == setup.refs
    assert {line["order"] for line in lines} == {setup.order_id}
    assert {line["attempt"] for line in lines} == {1}
    assert [line["arguments"]["to"] for line in lines] == ["cfo", "ceo", "board"]
    states = setup.states()
    assert all(states[r].state == "committed" and states[r].dispatches == 1 for r in setup.refs)
    assert states[setup.refs[0]].result is not None
    assert states[setup.refs[0]].result["structuredContent"]["delivered"] is True


def test_commit_again_and_again_sends_nothing(tmp_path: Path) -> None:
    """Once results are recorded, further commits only report them."""
    setup = three(tmp_path)
    run(setup)
    for _ in range(3):
        summary = run(setup)
        assert summary.ok  # type: ignore[attr-defined]
        assert not any(e.sent for e in summary.effects)  # type: ignore[attr-defined]
    assert setup.counts() == {r: 1 for r in setup.refs}


def test_tampered_arguments_run_nothing_and_name_the_mismatch(tmp_path: Path) -> None:
    """A report whose arguments differ from the held call runs no effect at all."""
    setup = three(tmp_path, tamper={1: {"to": "ceo", "body": "something else"}})
    summary = run(setup)
    assert not summary.ok  # type: ignore[attr-defined]
    found = [(m.problem, m.path) for m in summary.mismatches]  # type: ignore[attr-defined]
    assert found == [("arguments", "/effects/1/arguments")]
    assert setup.counts() == {}
    assert {s.state for s in setup.states().values()} == {"held"}


def test_unapproved_and_unlisted_held_calls_are_dropped(tmp_path: Path) -> None:
    """Held calls the manager did not approve or the report does not list never run."""
    setup = three(tmp_path, approve=[0, 2], unlisted=[(DELIVER, {"to": "press"})])
    summary = run(setup)
    assert summary.ok  # type: ignore[attr-defined]
    assert setup.counts() == {setup.refs[0]: 1, setup.refs[2]: 1}
    states = setup.states()
    assert states[setup.refs[1]].state == "dropped"
    assert states[setup.extra[0]].state == "dropped"
    drops = [e for e in setup.store.events(setup.order_id) if e.action == "drop"]
    assert len(drops) == 1 and drops[0].from_ == drops[0].to == "approved"
    assert drops[0].data is not None
    assert sorted(drops[0].data["refs"]) == sorted([setup.refs[1], setup.extra[0]])
    run(setup)  # dropping again logs nothing new
    assert len([e for e in setup.store.events(setup.order_id) if e.action == "drop"]) == 1


def test_rework_drops_the_earlier_attempts_held_calls(tmp_path: Path) -> None:
    """Held calls of an attempt sent back for rework are dropped, never sent."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo", "body": "v2"})],
                       rework_first=[(DELIVER, {"to": "cfo", "body": "v1"})])
    old = "receiver/deliver#1"
    summary = run(setup)
    assert summary.ok and summary.dropped == (old,)  # type: ignore[attr-defined]
    assert setup.counts() == {setup.refs[0]: 1}
    assert setup.states()[old].state == "dropped"


def test_drop_attempt_drops_only_that_attempts_held_calls(tmp_path: Path) -> None:
    """drop_attempt drops the still-held calls of one attempt and logs one drop event."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo", "body": "v2"})],
                       rework_first=[(DELIVER, {"to": "cfo", "body": "v1"}),
                                     (DELIVER, {"to": "ceo", "body": "v1"})])
    assert drop_attempt(setup.order_id, 1, store=setup.store) == [
        "receiver/deliver#1", "receiver/deliver#2"]
    assert drop_attempt(setup.order_id, 1, store=setup.store) == []
    states = setup.states()
    assert states[setup.refs[0]].state == "held"
    drops = [e for e in setup.store.events(setup.order_id) if e.action == "drop"]
    assert len(drops) == 1 and drops[0].actor == "awl:gateway"


def test_ref_values_are_filled_from_the_referenced_result(tmp_path: Path) -> None:
    """A $ref takes the referenced effect's recorded result at the pointer."""
    setup = make_setup(tmp_path, [
        (ISSUE, {"title": "Q3 risks"}),
        (DELIVER, {"to": "cfo", "body": {"issue": {"$ref": "receiver/create_issue#1",
                                                    "pointer": "/structuredContent/number"}}}),
    ])
    assert run(setup).ok  # type: ignore[attr-defined]
    issue, mail = setup.deliveries()
    assert mail["arguments"]["body"] == {"issue": 1}
    assert issue["ref"] == setup.refs[0]


def test_a_dependent_of_an_uncommitted_effect_is_skipped(tmp_path: Path) -> None:
    """A $ref to an effect that failed or did not run skips the dependent effect."""
    setup = make_setup(tmp_path, [
        (REJECT, {"reason": "quota"}),
        (DELIVER, {"to": "cfo", "body": {"$ref": "receiver/reject#1",
                                         "pointer": "/structuredContent/number"}}),
        (ISSUE, {"title": "x"}),
        (DELIVER, {"to": "ceo", "body": {"$ref": "receiver/create_issue#3",
                                         "pointer": "/structuredContent/nothing"}}),
    ])
    summary = run(setup)
    got = {e.ref: (e.state, e.reason) for e in summary.effects}  # type: ignore[attr-defined]
    assert got[setup.refs[0]][0] == "failed"
    assert got[setup.refs[1]] == ("skipped", "needs receiver/reject#1, which is failed, "
                                             "not committed")
    assert got[setup.refs[3]][0] == "skipped"
    assert "/structuredContent/nothing" in got[setup.refs[3]][1]
    assert setup.counts() == {setup.refs[0]: 1, setup.refs[2]: 1}
    states, _ = fill_refs({"x": {"$ref": "a/b#9", "pointer": ""}}, {})
    assert states == {"x": {"$ref": "a/b#9", "pointer": ""}}


def test_a_revoked_pass_runs_nothing(tmp_path: Path) -> None:
    """Effects held under a pass that is now revoked are refused before anything runs."""
    setup = three(tmp_path, pass_jti="pass-1")
    setup.store.revoke("pass-1", reason="leaked", at="2030-01-01T00:00:00Z")
    summary = run(setup)
    assert [(m.problem, m.path) for m in summary.mismatches] == [  # type: ignore[attr-defined]
        ("pass_revoked", f"/effects/{i}") for i in range(3)]
    assert setup.counts() == {}


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


def test_an_answer_lost_to_a_receiver_crash_is_unknown_and_never_resent(tmp_path: Path) -> None:
    """The receiver logs the delivery then dies: the effect is unknown, counted once."""
    setup = three(tmp_path)
    setup.control_receiver(crash_after=[setup.refs[1]])
    summary = run(setup)
    states = setup.states()
    assert [states[r].state for r in setup.refs] == ["committed", "unknown", "committed"]
    assert not summary.ok  # type: ignore[attr-defined]
    setup.control_receiver()
    for _ in range(2):
        again = run(setup)
        assert not any(e.sent for e in again.effects)  # type: ignore[attr-defined]
    assert setup.counts() == {r: 1 for r in setup.refs}


def test_a_receiver_that_never_answers_makes_the_effect_unknown(tmp_path: Path) -> None:
    """No answer within the timeout leaves the effect unknown; a later commit skips it."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"})], timeout=0.5)
    setup.control_receiver(hang_after="*")
    summary = run(setup)
    assert [e.state for e in summary.effects] == ["unknown"]  # type: ignore[attr-defined]
    assert "0.5 s" in summary.effects[0].reason  # type: ignore[attr-defined]
    setup.control_receiver()
    run(setup)
    assert setup.counts() == {setup.refs[0]: 1}


def test_an_upstream_that_cannot_start_leaves_effects_held(tmp_path: Path) -> None:
    """When the receiver cannot even start, nothing is marked and a later commit runs it."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"})])
    broken = json.loads(setup.config.read_text())
    broken["mcpServers"]["receiver"]["args"] = ["-c", "raise SystemExit(3)"]
    broken["mcpServers"]["receiver"]["connect_timeout"] = 5
    summary = commit_sync(setup.order_id, store=setup.store, pool_or_config=broken)
    assert [e.state for e in summary.effects] == ["held"]
    assert setup.states()[setup.refs[0]].dispatches == 0
    assert run(setup).ok  # type: ignore[attr-defined]
    assert setup.counts() == {setup.refs[0]: 1}


# --------------------------------------------------------------------------- settle and retry

def test_only_the_manager_settles_and_only_unknown_effects(tmp_path: Path) -> None:
    """Settling is the manager's, for unknown effects, with evidence."""
    setup = three(tmp_path)
    make_unknown(setup, setup.refs[0])
    run(setup)
    ref = setup.refs[0]
    with pytest.raises(Forbidden):
        settle(setup.order_id, ref, "happened", "saw it", WORKER, store=setup.store)
    with pytest.raises(InvalidTransition):
        settle(setup.order_id, setup.refs[1], "happened", "saw it", MANAGER, store=setup.store)
    view = settle(setup.order_id, ref, "happened", "in the CFO's inbox", MANAGER,
                  store=setup.store)
    assert view.state == "unknown" and not view.retryable
    assert view.settlement is not None and view.settlement.by == MANAGER
    event = setup.store.events(setup.order_id)[-1]
    assert (event.action, event.actor, event.from_, event.to) == (
        "settle", MANAGER, "approved", "approved")
    assert event.data is not None and event.data["verdict"] == "happened"
    with pytest.raises(InvalidTransition):  # happened is final
        retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config))


def test_an_unsettled_unknown_effect_is_never_retried(tmp_path: Path) -> None:
    """Retry refuses an unknown effect until the manager settles it did_not_happen."""
    setup = three(tmp_path)
    make_unknown(setup, setup.refs[0])
    run(setup)
    with pytest.raises(InvalidTransition, match="not settled"):
        retry_sync(setup.order_id, setup.refs[0], MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config))
    with pytest.raises(Forbidden):
        retry_sync(setup.order_id, setup.refs[0], WORKER, store=setup.store,
                   pool_or_config=load_config(setup.config))
    assert setup.counts().get(setup.refs[0]) is None


def test_retry_sends_with_the_same_ref_and_needs_a_new_settlement_after(tmp_path: Path) -> None:
    """A did_not_happen effect is retried once with its awl/ref; the settlement is used up."""
    setup = three(tmp_path)
    ref = setup.refs[1]
    make_unknown(setup, ref)
    run(setup)
    settle(setup.order_id, ref, "did_not_happen", "not in the outbox", MANAGER,
           store=setup.store)
    outcome = retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                         pool_or_config=load_config(setup.config))
    assert outcome.state == "committed" and outcome.sent
    line = [x for x in setup.deliveries() if x["arguments"]["to"] == "ceo"]
    assert [(x["ref"], x["order"], x["attempt"]) for x in line] == [(ref, setup.order_id, 1)]
    actions = [e.action for e in setup.store.events(setup.order_id)]
    assert actions[-2:] == ["settle", "retry"]
    with pytest.raises(InvalidTransition):
        retry_sync(setup.order_id, ref, MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config))
    assert setup.counts()[ref] == 1


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


def test_retry_rechecks_the_deadline(tmp_path: Path) -> None:
    """A retry after the order's deadline is refused and sends nothing."""
    setup = three(tmp_path)
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


@pytest.mark.anyio
async def test_a_lease_that_ran_out_is_taken_over_and_its_holder_stops(tmp_path: Path) -> None:
    """A holder whose lease expired loses the lock to the next taker and learns it."""
    setup = three(tmp_path)
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

def test_the_effects_commands_list_settle_and_retry(tmp_path: Path,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """awl effects list, settle and retry work from the command line, text and JSON."""
    setup = three(tmp_path)
    ref = setup.refs[2]
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
    assert [e["state"] for e in listed] == ["committed"] * 3
    assert setup.counts() == {r: 1 for r in setup.refs}
