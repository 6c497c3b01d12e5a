"""Settlement is final (CM-11): an effect settled ``happened`` is never sent again, by the
CLI, by the desk's MCP ``settle_effect``, or by a log that already holds a later settlement.
The receiver counts what really reached it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client

from awl._effects import list_effects, record_event, settle
from awl._errors import InvalidTransition
from awl.cli import main
from awl.server import DeskServer
from awl.server._server import ERROR_META
from gateway._commit import commit_sync, retry_sync
from gateway._config import load_config
from tests.gateway.commit_support import MANAGER, Setup, make_setup


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
