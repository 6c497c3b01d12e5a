"""Settlement is final (CM-11): an effect settled ``happened`` is never sent again, by the
CLI, by the desk's MCP ``settle_effect``, or by a log that already holds a later settlement.
The receiver counts what really reached it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from awl.cli import main
from awl.desk.effects import list_effects, record_event
from awl.desk.settlement import settle
from awl.documents.errors import InvalidTransition
from awl.mcp.errors import ERROR_META
from awl.server import DeskServer
from gateway._commit import commit_sync, lock_name, retry_sync
from gateway._config import load_config
from gateway._lock import EXIT_LOCKED, OrderLock
from tests.gateway.commit_support import MANAGER, Setup, make_setup
from tests.gateway.gateway_support import server_entry

pytestmark = pytest.mark.slow


def _delivered_but_unknown(tmp_path: Path) -> tuple[Setup, str]:
    """One approved effect that reached the receiver (count 1) and whose answer never came."""
    setup = make_setup(tmp_path, [("receiver/deliver", {"to": "cfo"})], timeout=2)
    ref = setup.refs[0]
    setup.control_receiver(hang_after="*")
    summary = commit_sync(setup.order_id, store=setup.store,
                          pool_or_config=load_config(setup.config))
    assert [e.state for e in summary.effects] == ["unknown"]
    setup.control_receiver()
    assert setup.counts() == {ref: 1}
    return setup, ref


def _cli(setup: Setup, *argv: str) -> int:
    return main(["effects", *argv, "--home", str(setup.home)])


@pytest.mark.spec("CM-11")
def test_the_cli_refuses_a_second_settlement_and_never_sends_again(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """`awl effects settle --happened`, then `--did-not-happen` is refused naming the first;
    `awl effects retry` is refused; the receiver still counts one delivery."""
    setup, ref = _delivered_but_unknown(tmp_path)
    oid = setup.order_id
    assert _cli(setup, "settle", oid, ref, "--happened", "--evidence", "in the log",
                "--as", MANAGER) == 0
    assert "it will never be sent again" in capfd.readouterr().out
    assert _cli(setup, "settle", oid, ref, "--did-not-happen", "--evidence", "not there",
                "--as", MANAGER) == 1
    err = capfd.readouterr().err.strip()
    assert err.startswith("awl: INVALID_TRANSITION: ")
    assert f"already settled as happened by {MANAGER}" in err and "\n" not in err
    assert _cli(setup, "retry", oid, ref, "--config", str(setup.config), "--as", MANAGER) == 1
    assert "settled as happened" in capfd.readouterr().err
    assert setup.counts() == {ref: 1}
    [view] = list_effects(oid, store=setup.store)
    assert view.settlement is not None and view.settlement.verdict == "happened"


@pytest.mark.spec("CM-11", "BIND-2")
def test_settle_effect_over_mcp_is_final(tmp_path: Path) -> None:
    """The desk's settle_effect: a second settlement (either verdict) is refused."""
    setup, ref = _delivered_but_unknown(tmp_path)
    oid = setup.order_id

    async def settle_twice() -> None:
        async with Client(DeskServer(setup.store, principal=MANAGER).server) as client:
            first = await client.call_tool("settle_effect", {
                "order_id": oid, "ref": ref, "verdict": "happened", "evidence": "in the log"})
            assert not first.is_error
            for verdict in ("did_not_happen", "happened"):
                again = await client.call_tool("settle_effect", {
                    "order_id": oid, "ref": ref, "verdict": verdict, "evidence": "again"})
                assert again.is_error
                assert (again.meta or {})[ERROR_META]["code"] == "INVALID_TRANSITION"

    anyio.run(settle_twice)
    with pytest.raises(InvalidTransition, match="settled as happened"):
        retry_sync(oid, ref, MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config))
    assert setup.counts() == {ref: 1}


@pytest.mark.spec("CM-11")
def test_only_the_first_settlement_in_a_log_counts(tmp_path: Path) -> None:
    """A log written before settlements were final may hold happened, then did_not_happen,
    for the same dispatch: the first counts, so the effect is not retried."""
    setup, ref = _delivered_but_unknown(tmp_path)
    oid = setup.order_id
    settle(oid, ref, "happened", "in the log", MANAGER, store=setup.store)
    [state] = setup.store.effects(oid)
    record_event(setup.desk, oid, MANAGER, "settle", note="later", data={
        "ref": ref, "verdict": "did_not_happen", "evidence": "later",
        "dispatches": state.dispatches})
    [view] = list_effects(oid, store=setup.store)
    assert view.settlement is not None and view.settlement.verdict == "happened"
    assert not view.retryable
    with pytest.raises(InvalidTransition, match="settled as happened"):
        retry_sync(oid, ref, MANAGER, store=setup.store,
                   pool_or_config=load_config(setup.config))
    assert setup.counts() == {ref: 1}


@pytest.mark.spec("CM-10", "CM-12")
def test_a_commit_that_cannot_take_the_lock_says_so_with_its_own_exit_code(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """While a live committer holds the order's lock, `awl gateway --commit` (text and
    --json) and `awl effects retry` exit 3 saying the lock is held, and send nothing."""
    setup = make_setup(tmp_path, [("receiver/deliver", {"to": "cfo"})])
    oid = setup.order_id
    commit = ["gateway", "--order", oid, "--config", str(setup.config), "--home",
              str(setup.home), "--commit"]
    lock = OrderLock(setup.store, lock_name(oid))
    assert lock.try_acquire()
    try:
        assert main(commit) == EXIT_LOCKED
        err = capfd.readouterr().err.strip()
        assert err.startswith("awl: LOCKED: lock ") and "nothing was sent" in err
        assert main([*commit, "--json"]) == EXIT_LOCKED
        answer = json.loads(capfd.readouterr().out)
        assert (answer["order_id"], answer["ok"], answer["error"]) == (oid, False, "LOCKED")
        assert _cli(setup, "retry", oid, setup.refs[0], "--config", str(setup.config),
                    "--as", MANAGER) == EXIT_LOCKED
    finally:
        lock.release()
    assert setup.deliveries() == []
    assert main(commit) == 0
    assert setup.counts() == {setup.refs[0]: 1}


@pytest.mark.spec("CM-7", "CM-12")
def test_an_effect_whose_tool_the_upstream_lacks_stays_held_until_the_config_is_fixed(
        tmp_path: Path) -> None:
    """A config naming the wrong server for `receiver` (one without `deliver`) sends
    nothing and leaves the effect held, not failed; with the config fixed it commits once."""
    setup = make_setup(tmp_path, [("receiver/deliver", {"to": "cfo"})])
    ref = setup.refs[0]
    good = json.loads(setup.config.read_text())
    wrong = {"mcpServers": {"receiver": server_entry("shapes")}}
    setup.config.write_text(json.dumps(wrong), encoding="utf-8")
    summary = commit_sync(setup.order_id, store=setup.store,
                          pool_or_config=load_config(setup.config))
    [outcome] = summary.effects
    assert (outcome.state, outcome.sent) == ("held", False)
    assert "does not offer a tool 'deliver'" in outcome.reason
    assert setup.states()[ref].state == "held" and setup.states()[ref].dispatches == 0
    setup.config.write_text(json.dumps(good), encoding="utf-8")
    summary = commit_sync(setup.order_id, store=setup.store,
                          pool_or_config=load_config(setup.config))
    assert [e.state for e in summary.effects] == ["committed"]
    assert setup.counts() == {ref: 1}


@pytest.mark.spec("CM-7", "CM-11")
def test_a_retry_through_a_config_without_the_tool_stays_retryable(tmp_path: Path) -> None:
    """An unknown effect settled did_not_happen, retried through a config whose server
    lacks the tool, is not sent and stays unknown and retryable."""
    setup, ref = _delivered_but_unknown(tmp_path)
    oid = setup.order_id
    settle(oid, ref, "did_not_happen", "not in the receiver's log", MANAGER, store=setup.store)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"mcpServers": {"receiver": server_entry("shapes")}}),
                     encoding="utf-8")
    outcome = retry_sync(oid, ref, MANAGER, store=setup.store,
                         pool_or_config=load_config(wrong))
    assert (outcome.state, outcome.sent) == ("unknown", False)
    [view] = list_effects(oid, store=setup.store)
    assert view.retryable and view.dispatches == 1
    assert setup.counts() == {ref: 1}
