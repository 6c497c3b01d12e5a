"""Attacks on the commit path that the other commit tests do not cover.

Every test counts what reached the upstream in the upstream's own log (the receiver's
deliveries, or every message the spy upstream got), never in what the committer recorded.

- ``$ref`` placeholders standing for the whole arguments, filled with something that is not
  an object: never sent, ``skipped`` (it was ``unknown`` after a crash inside the send,
  though it surely never left).
- An upstream that answers twice, answers garbage, dies mid-call or hangs past the timeout,
  in one commit: each effect reached it once and its state says what is known.
- The order above a sub-order cancelled while the sub-order's commit runs: nothing more
  is sent (LC-22); what was still held is dropped.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from awl.desk import Desk
from awl.documents.models import format_time
from awl.store.sqlite import SQLiteStore
from gateway._commit import CommitSummary, commit_sync
from gateway._config import load_config
from tests.gateway.commit_support import (
    MANAGER,
    WORKER,
    Setup,
    finish,
    hold,
    kill9,
    make_setup,
    report_doc,
    start_committer,
    wait_for,
    write_config,
)
from tests.servers.receiver import read_log

DELIVER = "receiver/deliver"
ISSUE = "receiver/create_issue"
SPY = Path(__file__).resolve().parent / "spy_server.py"


def run(setup: Setup, **kwargs: Any) -> CommitSummary:
    return commit_sync(setup.order_id, store=setup.store,
                       pool_or_config=load_config(setup.config), **kwargs)


# --------------------------------------------------------------------------- $ref at the root

@pytest.mark.spec("CM-5", "CM-7")
@pytest.mark.parametrize("pointer", ["/structuredContent/title", "/content",
                                     "/structuredContent/number"])
def test_a_root_ref_filled_with_something_not_an_object_is_skipped_never_sent(
        tmp_path: Path, pointer: str) -> None:
    """Arguments that are all one placeholder, pointing at a string, a list or a number:
    the filled arguments are not an object, so no tool call can carry them. The effect is
    ``skipped`` with the reason, nothing reaches the receiver, and the commit says so in
    its lines (it became ``unknown`` after a TypeError raised past the mark, though the
    request never left)."""
    setup = make_setup(tmp_path, [
        (ISSUE, {"title": "q3 numbers"}),
        (DELIVER, {"$ref": "receiver/create_issue#1", "pointer": pointer})])
    first, ref = setup.refs
    summary = run(setup)
    states = setup.states()
    assert states[first].state == "committed"
    assert states[ref].state == "skipped", states[ref]
    assert states[ref].dispatches == 0
    assert "object" in (states[ref].error or "")
    assert setup.counts() == {first: 1}
    assert any(ref in line and "skipped" in line for line in summary.lines())


@pytest.mark.spec("CM-5")
def test_a_root_ref_filled_with_an_object_sends_that_object(tmp_path: Path) -> None:
    """The one root placeholder that can run: the pointed value is an object, and it is
    sent as the arguments, once."""
    setup = make_setup(tmp_path, [
        (ISSUE, {"title": "q3"}),
        (DELIVER, {"$ref": "receiver/create_issue#1", "pointer": "/structuredContent"})])
    ref = setup.refs[1]
    run(setup)
    assert setup.states()[ref].state == "committed"
    sent = [d for d in setup.deliveries() if d["ref"] == ref]
    assert [d["arguments"] for d in sent] == [{"number": 1, "title": "q3"}]


# --------------------------------------------------------------------------- hostile upstreams

def _spy_setup(tmp_path: Path, tools: list[str], *, timeout: float = 3.0) -> tuple[Setup, Path]:
    setup = make_setup(tmp_path, [(f"spy/{t}", {} if t != "write" else {"to": f"n{i}"})
                                  for i, t in enumerate(tools)],
                       staged=["spy/*"], tools=["spy/*"])
    log = tmp_path / "spy.jsonl"
    setup.config.write_text(json.dumps({"mcpServers": {"spy": {
        "command": sys.executable, "args": [str(SPY)], "env": {"SPY_LOG": str(log)},
        "timeout": timeout}}}), encoding="utf-8")
    return setup, log


def _spy_calls(log: Path) -> dict[str, int]:
    """tools/call requests the spy received, per awl/ref."""
    out: dict[str, int] = {}
    for message in read_log(str(log)):
        if message.get("method") == "tools/call":
            ref = str(((message.get("params") or {}).get("_meta") or {}).get("awl/ref"))
            out[ref] = out.get(ref, 0) + 1
    return out


@pytest.mark.spec("CM-6", "CM-7", "CM-8")
def test_an_upstream_answering_twice_garbage_dying_and_hanging_gets_each_effect_once(
        tmp_path: Path) -> None:
    """One commit through the spy upstream: writes around a tool that answers twice, one
    that answers a line that is not JSON, one that exits mid-call and one that never
    answers. Each effect reached the spy exactly once; the one answered is committed with
    the first answer; the others are unknown (it got them, and no answer can be read);
    the writes after each fault still commit; a second commit sends nothing."""
    tools = ["write", "twice", "write", "garbage", "write", "die", "write", "hang", "write"]
    setup, log = _spy_setup(tmp_path, tools, timeout=3.0)
    summary = run(setup)
    states = setup.states()
    got = [states[r].state for r in setup.refs]
    assert got == ["committed", "committed", "committed", "unknown", "committed", "unknown",
                   "committed", "unknown", "committed"], (got, summary.lines())
    twice = states[setup.refs[1]].result
    assert twice is not None and twice["content"][0]["text"] == "first"
    assert _spy_calls(log) == {r: 1 for r in setup.refs}
    again = run(setup)
    assert not again.ok and _spy_calls(log) == {r: 1 for r in setup.refs}
    assert all(o.sent is False for o in again.effects)


# --------------------------------------------------------------------------- LC-22 mid-commit

@pytest.mark.slow
@pytest.mark.spec("LC-22", "CM-4", "CM-12")
def test_cancelling_the_order_above_mid_commit_stops_the_rest(tmp_path: Path) -> None:
    """A sub-order's commit runs three approved deliveries; while the receiver holds the
    first, the manager cancels the order above. The first was sent (committed), nothing
    after it reaches the receiver: the rest are dropped naming the order above, one line
    says why, and the exit is 1."""
    setup = _sub_order_setup(tmp_path)
    parent, child, desk = setup.extra[0], setup.order_id, setup.desk
    refs = [hold(setup.store, child, DELIVER, {"to": n}) for n in ("a", "b", "c")]
    desk.report(child, SUB, report_doc(
        [{"ref": r, "tool": DELIVER, "arguments": {"to": n}}
         for r, n in zip(refs, "abc", strict=True)], [DELIVER], refs[0]))
    desk.review(child, WORKER, "approve")
    setup.refs = refs
    setup.control_receiver(delay=2.0)
    proc = start_committer(setup)
    wait_for(lambda: setup.counts().get(refs[0]) == 1, what="the first delivery")
    desk.cancel(parent, MANAGER, "the customer withdrew")
    code, out, err = finish(proc)
    time.sleep(0.1)
    assert setup.counts() == {refs[0]: 1}, out
    assert code == 1 and err == "", (out, err)
    states = setup.states()
    assert [states[r].state for r in refs] == ["committed", "dropped", "dropped"], out
    assert all(parent in (states[r].error or "") for r in refs[1:])
    assert sum("nothing more ran" in line or "nothing ran" in line
               for line in out.splitlines()) == 1, out
    drops = [e for e in setup.store.events(child) if e.action == "drop"]
    assert [d.data["refs"] for d in drops if d.data] == [refs[1:]]


@pytest.mark.spec("LC-22", "CM-4")
def test_an_order_above_past_its_deadline_has_ended_for_the_commit(tmp_path: Path) -> None:
    """The order above passed its deadline after the sub-order was approved, and nobody has
    looked at it since (the desk expires an order when it is read): it has ended all the
    same, so the sub-order's commit sends nothing and drops its held calls, naming it
    expired."""
    setup = _sub_order_setup(tmp_path, seconds=3.0)
    parent, child, desk = setup.extra[0], setup.order_id, setup.desk
    ref = hold(setup.store, child, DELIVER, {"to": "a"})
    desk.report(child, SUB, report_doc([{"ref": ref, "tool": DELIVER, "arguments": {"to": "a"}}],
                                       [DELIVER], ref))
    desk.review(child, WORKER, "approve")
    setup.refs = [ref]
    deadline = setup.store.load(parent).order.deadline
    wait_for(lambda: format_time(datetime.now(UTC)) > deadline, what="the deadline")
    time.sleep(0.05)
    assert setup.store.load(parent).state == "working"  # as stored: nobody expired it yet
    summary = run(setup)
    assert setup.counts() == {}
    assert summary.refused is not None and "expired" in summary.refused
    assert setup.states()[ref].state == "dropped"


SUB = "agent:sub"


def _sub_order_setup(tmp_path: Path, *, seconds: float = 86400.0) -> Setup:
    """A working order staging nothing and a working sub-order of it that stages
    deliveries (its manager is the order's worker); ``extra`` holds the parent's id."""
    home = tmp_path / "home"
    home.mkdir()
    store = SQLiteStore(home / "desk.sqlite3")
    desk = Desk(store)
    log, control = tmp_path / "receiver.jsonl", tmp_path / "receiver-control.json"
    control.write_text("{}", encoding="utf-8")
    config = write_config(tmp_path, log, control)
    deadline = format_time(datetime.now(UTC) + timedelta(seconds=seconds))
    parent = desk.create({
        "to": WORKER, "goal": "Get the notices out",
        "criteria": [{"id": "c1", "text": "sent"}], "budget": {"usd": 5, "tool_calls": 50},
        "deadline": deadline, "tools": ["receiver/*"], "staged": []}, MANAGER).id
    desk.accept(parent, WORKER)
    desk.start(parent, WORKER)
    child = desk.create({
        "to": SUB, "parent_id": parent, "goal": "deliver",
        "criteria": [{"id": "c1", "text": "delivered"}], "budget": {"tool_calls": 5, "usd": 1},
        "deadline": deadline, "tools": [DELIVER], "staged": [DELIVER]}, WORKER).id
    desk.accept(child, SUB)
    desk.start(child, SUB)
    return Setup(home, store, desk, child, [], config, log, control, [parent])


# --------------------------------------------------------------------------- a busy store

def _hold_the_desk(path: Path, seconds: float, when: Any) -> threading.Thread:
    """A thread that, once ``when()`` is true, takes the SQLite desk's write lock (as a
    long backup or another writer stuck mid-transaction would) for ``seconds``."""
    def hold_it() -> None:
        wait_for(when, what="the moment to lock the desk")
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            time.sleep(seconds)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    thread = threading.Thread(target=hold_it, daemon=True)
    thread.start()
    return thread


@pytest.mark.spec("CM-7", "CM-8")
def test_an_answer_recorded_while_the_desk_is_busy_is_kept_not_left_dispatching(
        tmp_path: Path) -> None:
    """The receiver answers while another writer holds the desk for longer than the
    committer's busy timeout: the answer is recorded once the desk is free (the effect ran;
    it is committed with its result, never left dispatching), and the next effect is sent
    only after that, once."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"}), (DELIVER, {"to": "ceo"})])
    first, second = setup.refs
    setup.control_receiver(delay=1.0)
    path = setup.home / "desk.sqlite3"
    locker = _hold_the_desk(path, 3.0, lambda: setup.counts().get(first) == 1)
    impatient = SQLiteStore(path, timeout=0.5)
    try:
        summary = commit_sync(setup.order_id, store=impatient,
                              pool_or_config=load_config(setup.config))
    finally:
        impatient.close()
    locker.join()
    states = setup.states()
    assert [states[r].state for r in setup.refs] == ["committed", "committed"], (
        summary.lines())
    assert states[first].result is not None
    assert summary.ok
    assert setup.counts() == {first: 1, second: 1}


@pytest.mark.spec("CM-7", "CM-8", "CM-12")
def test_an_answer_the_desk_cannot_record_stops_the_commit_and_says_what_it_was(
        tmp_path: Path) -> None:
    """The desk stays busy for longer than the committer's lease after the receiver
    answered: the commit returns (no exception: it said "nothing was written, retry" while
    a delivery had been made), the effect stays dispatching with a reason saying it was
    answered, nothing more is sent, and the next commit makes it unknown and sends the rest
    once."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"}), (DELIVER, {"to": "ceo"})])
    first, second = setup.refs
    setup.control_receiver(delay=1.0)
    path = setup.home / "desk.sqlite3"
    locker = _hold_the_desk(path, 5.0, lambda: setup.counts().get(first) == 1)
    impatient = SQLiteStore(path, timeout=0.5)
    try:
        summary = commit_sync(setup.order_id, store=impatient,
                              pool_or_config=load_config(setup.config), lease=2.0)
    finally:
        impatient.close()
    locker.join()
    assert not summary.ok
    outcomes = {e.ref: e for e in summary.effects}
    assert outcomes[first].state == "dispatching" and outcomes[first].sent
    assert "answered with a result" in outcomes[first].reason, outcomes[first].reason
    assert outcomes[second].state == "held" and not outcomes[second].sent
    assert "could not record" in outcomes[second].reason
    assert setup.counts() == {first: 1}
    assert setup.states()[first].state == "dispatching"

    setup.control_receiver()
    again = run(setup)
    assert again.recovered == (first,)
    states = setup.states()
    assert (states[first].state, states[second].state) == ("unknown", "committed")
    assert setup.counts() == {first: 1, second: 1}


# --------------------------------------------------------------------------- kill -9, more moments

@pytest.mark.slow
@pytest.mark.spec("CM-6", "CM-10")
def test_killed_while_starting_the_upstream_before_any_mark_sends_it_later_once(
        tmp_path: Path) -> None:
    """kill -9 while the committer waits for its upstream to start (it holds the order's
    lock, nothing is marked): the effects stay held, the next commit takes the dead
    holder's lock over and sends each once."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"}), (DELIVER, {"to": "ceo"})])
    config = json.loads(setup.config.read_text(encoding="utf-8"))
    entry = config["mcpServers"]["receiver"]
    slow = tmp_path / "slow-start"
    entry["args"] = ["-c", "import os, sys, time; open(sys.argv[1], 'w').close(); "
                     "time.sleep(3); os.execv(sys.executable, [sys.executable, *sys.argv[2:]])",
                     str(slow), *entry["args"]]
    setup.config.write_text(json.dumps(config), encoding="utf-8")
    proc = start_committer(setup)
    wait_for(slow.exists, what="the upstream's start")
    assert {s.state for s in setup.states().values()} == {"held"}
    kill9(proc)
    summary = run(setup)
    assert summary.ok and summary.recovered == ()
    assert summary.took_over is not None and str(proc.pid) in summary.took_over
    assert setup.counts() == {r: 1 for r in setup.refs}


@pytest.mark.slow
@pytest.mark.spec("CM-7", "CM-8")
def test_killed_after_the_answer_before_the_committed_mark_is_unknown_and_sent_once(
        tmp_path: Path) -> None:
    """The receiver answered, and the committer (a separate process) is stuck writing
    ``committed`` to a desk another writer holds: kill -9 there. The next commit makes it
    unknown (it ran, but nothing recorded its answer), sends the other once, and nothing
    is ever sent twice."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"}), (DELIVER, {"to": "ceo"})])
    first, second = setup.refs
    setup.control_receiver(delay=1.0)
    path = setup.home / "desk.sqlite3"
    taken = threading.Event()
    release = threading.Event()

    def hold_it() -> None:
        wait_for(lambda: setup.counts().get(first) == 1, what="the first delivery")
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            taken.set()
            release.wait(60)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    locker = threading.Thread(target=hold_it, daemon=True)
    locker.start()
    proc = start_committer(setup)
    assert taken.wait(60)
    time.sleep(2.0)  # the answer came after 1 s; the committer now waits on the desk
    assert setup.states()[first].state == "dispatching"
    kill9(proc)
    release.set()
    locker.join()
    setup.control_receiver()
    summary = run(setup)
    assert summary.recovered == (first,)
    states = setup.states()
    assert (states[first].state, states[second].state) == ("unknown", "committed")
    for _ in range(2):
        run(setup)
    assert setup.counts() == {first: 1, second: 1}
