"""Committers killed with SIGKILL at chosen moments; receiver counts stay at most one."""

from __future__ import annotations

from pathlib import Path

import pytest

from awl.documents.errors import InvalidTransition
from gateway._commit import commit_sync, lock_name, retry_sync, settle
from gateway._config import load_config
from gateway._lock import HOST
from tests.gateway.commit_support import (
    MANAGER,
    Setup,
    finish,
    kill9,
    make_setup,
    start_committer,
    wait_for,
)

pytestmark = pytest.mark.slow

DELIVER = "receiver/deliver"


def two(tmp_path: Path, store_url: str | None) -> Setup:
    return make_setup(tmp_path, [(DELIVER, {"to": "cfo", "body": "q3"}),
                                 (DELIVER, {"to": "ceo", "body": "q3"})], store_url=store_url)


def pause_at(tmp_path: Path, ref: str) -> tuple[Path, str]:
    return tmp_path / "dispatching.marker", ref


def recommit(setup: Setup) -> object:
    return commit_sync(setup.order_id, store=setup.store,
                       pool_or_config=load_config(setup.config))


@pytest.mark.spec("CM-6", "CM-8", "CM-10")
def test_killed_after_the_dispatching_mark_is_unknown_and_never_sent(
        tmp_path: Path, store_url: str | None) -> None:
    """kill -9 right after the durable mark, before the send: unknown, count 0, forever."""
    setup = two(tmp_path, store_url)
    pause = pause_at(tmp_path, setup.refs[1])
    marker = pause[0]
    proc = start_committer(setup, pause=pause)
    wait_for(marker.exists, what="the dispatching marker")
    assert marker.read_text() == setup.refs[1]
    assert setup.states()[setup.refs[1]].state == "dispatching"
    held = setup.store.get_lock(lock_name(setup.order_id))
    assert held is not None and held.pid == proc.pid
    kill9(proc)

    summary = recommit(setup)  # no manual step: the dead holder's lock is taken over
    # SQLite: the dead holder's record is taken over. PostgreSQL: the server freed its
    # advisory lock with its connection, and the record it left names it all the same.
    took_over = summary.took_over  # type: ignore[attr-defined]
    assert took_over == f"pid {proc.pid} on {HOST}", took_over
    assert summary.recovered == (setup.refs[1],)  # type: ignore[attr-defined]
    states = setup.states()
    assert states[setup.refs[0]].state == "committed"
    assert states[setup.refs[1]].state == "unknown"
    assert setup.counts() == {setup.refs[0]: 1}
    for _ in range(2):
        recommit(setup)
    assert setup.counts() == {setup.refs[0]: 1}
    assert setup.states()[setup.refs[1]].dispatches == 1


@pytest.mark.spec("CM-7", "CM-8")
def test_committer_killed_after_the_receiver_got_it_is_unknown_counted_once(
        tmp_path: Path, store_url: str | None) -> None:
    """The receiver has the delivery, the committer dies before the answer: unknown, 1."""
    setup = two(tmp_path, store_url)
    setup.control_receiver(hang_after=[setup.refs[0]])
    proc = start_committer(setup)
    wait_for(lambda: setup.counts().get(setup.refs[0]) == 1, what="the first delivery")
    kill9(proc)
    setup.control_receiver()
    summary = recommit(setup)
    assert summary.recovered == (setup.refs[0],)  # type: ignore[attr-defined]
    states = setup.states()
    assert (states[setup.refs[0]].state, states[setup.refs[1]].state) == ("unknown", "committed")
    recommit(setup)
    assert setup.counts() == {setup.refs[0]: 1, setup.refs[1]: 1}


@pytest.mark.spec("CM-7", "CM-12")
def test_receiver_killed_after_receipt_in_a_subprocess_commit_is_unknown(
        tmp_path: Path, store_url: str | None) -> None:
    """The receiver dies after logging: the committer records unknown and exits 1."""
    setup = two(tmp_path, store_url)
    setup.control_receiver(crash_after=[setup.refs[0]])
    code, out, _err = finish(start_committer(setup))
    assert code == 1
    assert f"{setup.refs[0]}" in out and "unknown" in out
    setup.control_receiver()
    code, out, _err = finish(start_committer(setup))
    assert code == 1 and "already unknown" in out
    assert setup.counts() == {setup.refs[0]: 1, setup.refs[1]: 1}


@pytest.mark.spec("CM-6", "CM-10")
def test_repeated_and_concurrent_commits_deliver_each_effect_once(
        tmp_path: Path, store_url: str | None) -> None:
    """Two processes commit at once, then again and again: every count stays 1."""
    setup = two(tmp_path, store_url)
    setup.control_receiver(delay=0.2)  # keep the first committer busy while the other waits
    racers = [start_committer(setup, lock_wait=60) for _ in range(2)]
    results = [finish(p) for p in racers]
    assert [code for code, _, _ in results] == [0, 0], results
    assert sorted(out.count("already committed") for _, out, _ in results) == [0, 2]
    assert setup.counts() == {r: 1 for r in setup.refs}
    code, out, _ = finish(start_committer(setup))
    assert code == 0 and out.count("already committed") == 2
    for _ in range(2):
        assert recommit(setup).ok  # type: ignore[attr-defined]
    assert setup.counts() == {r: 1 for r in setup.refs}


@pytest.mark.spec("CM-8", "CM-9", "CM-11")
def test_settle_and_retry_a_killed_dispatch_with_the_same_ref(
        tmp_path: Path, store_url: str | None) -> None:
    """After a kill before sending, the manager settles did_not_happen and retries once."""
    setup = two(tmp_path, store_url)
    pause = pause_at(tmp_path, setup.refs[0])
    marker = pause[0]
    proc = start_committer(setup, pause=pause)
    wait_for(marker.exists, what="the dispatching marker")
    kill9(proc)
    recommit(setup)
    assert setup.counts() == {setup.refs[1]: 1}
    try:
        retry_sync(setup.order_id, setup.refs[0], MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config))
        raise AssertionError("an unsettled unknown effect was retried")
    except InvalidTransition:
        pass
    settle(setup.order_id, setup.refs[0], "did_not_happen",
           "the receiver's log has no delivery for this ref", MANAGER, store=setup.store)
    outcome = retry_sync(setup.order_id, setup.refs[0], MANAGER, store=setup.store,
                         pool_or_config=load_config(setup.config))
    assert outcome.state == "committed"
    first = [line for line in setup.deliveries() if line["ref"] == setup.refs[0]]
    assert [(x["ref"], x["order"], x["attempt"]) for x in first] == [
        (setup.refs[0], setup.order_id, 1)]
    assert setup.counts() == {r: 1 for r in setup.refs}


@pytest.mark.spec("CM-6", "SEC-4")
def test_ctrl_c_while_sending_says_where_the_effects_stand(tmp_path: Path) -> None:
    """A Ctrl-C while the receiver holds a delivery: exit 130 as for any Ctrl-C, and one line
    saying the effect being sent stays unknown (it exited with no word), never sent again."""
    import signal

    setup = two(tmp_path, None)
    setup.control_receiver(hang_after=[setup.refs[0]])
    proc = start_committer(setup)
    wait_for(lambda: setup.counts().get(setup.refs[0]) == 1, what="the first delivery")
    proc.send_signal(signal.SIGINT)
    code, _out, err = finish(proc)
    assert code == 130
    assert err == (f"awl: interrupted: the commit of order {setup.order_id} stopped; an "
                   "effect it was sending stays unknown until you settle it (`awl effects "
                   f"list {setup.order_id}`), and the rest were not sent\n")
    states = setup.states()
    assert (states[setup.refs[0]].state, states[setup.refs[1]].state) == ("unknown", "held")
    setup.control_receiver()
    recommit(setup)
    assert setup.counts() == {setup.refs[0]: 1, setup.refs[1]: 1}
