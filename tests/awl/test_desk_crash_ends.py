"""An order's end cut short: the desk killed between the ending event and its tidying.

Ending an order is two steps: the ending event (``cancel``, ``approve``, ...), then the
tidying after it (every pass of the order revoked, DP-8; every held call dropped unless it
was approved, CM-4). A manager's ``awl cancel`` or ``awl review --approve`` killed with
SIGKILL between the two used to leave an ended order whose passes still verified (``awl
pass show`` said ``valid``) and whose held calls still read ``held``, for ever: running the
command again only said the order had ended. The desk now finishes that tidying when it
next touches the order, whichever command the manager runs next.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from awl.desk import Desk
from awl.documents.models import Event
from awl.passes import KeyStore, issue_recorded_pass
from awl.store.protocol import Store
from awl.store.urls import open_store
from tests.awl.desk_support import (
    MANAGER,
    WORKER,
    effect,
    hold_effects,
    order_fields,
    report_fields,
    reserved,
)

# Runs the `awl` command, killing itself with SIGKILL at one point of the ending operation:
# "event": right after the ending event is written, before any tidying; "revocation": after
# the first of the order's passes is revoked, before the second; "drop": after the held
# call is dropped, before its drop event is logged.
KILLED_CHILD = r"""
import os, signal, sys
import awl.desk.core as core
from awl.cli import main

point = sys.argv[1]

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if point == "event":
    core.DeskCore._tidy = die
elif point == "drop":
    import awl.desk.effects as effects
    effects.record_event = die
else:
    real = core.revoke_order_passes
    def revoke_one(store, order_id, **kwargs):
        first = store.passes(order_id)[0].jti
        store.revoke(first, reason="order ended", at=kwargs["now"])
        die()
    core.revoke_order_passes = revoke_one
sys.exit(main(sys.argv[2:]))
"""

FAR = "2099-01-01T00:00:00Z"


def _awl(home: Path, url: str, *words: str, killed_at: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AWL_ACTOR", "AWL_STORE")}
    lead = ([sys.executable, "-c", KILLED_CHILD, killed_at] if killed_at is not None
            else [sys.executable, "-m", "awl"])
    return subprocess.run([*lead, *words, "--home", str(home), "--store", url],
                          capture_output=True, text=True, env=env, timeout=120)


def _working_with_passes(store: Store, home: Path) -> tuple[str, list[str]]:
    """An order being worked, with two passes issued and one call held (mail/send#1)."""
    desk = Desk(store)
    view = desk.create(order_fields(deadline=FAR), MANAGER)
    desk.accept(view.id, WORKER)
    desk.start(view.id, WORKER)
    keys = KeyStore(home)
    tokens = [issue_recorded_pass(store, view.id, keys=keys, subject=WORKER) for _ in range(2)]
    hold_effects(store, view.id, [effect(1)])
    return view.id, tokens


def _ending(store: Store, order_id: str) -> Event:
    return next(e for e in reversed(store.events(order_id)) if e.from_ != e.to)


@pytest.fixture
def opened(desk_url: str) -> Iterator[Store]:
    store = open_store(desk_url)
    yield store
    store.close()


@pytest.mark.slow
@pytest.mark.spec("DP-8", "CM-4")
@pytest.mark.parametrize("killed_at", ["event", "revocation", "drop"])
def test_a_cancel_killed_after_its_event_is_finished_by_the_next_command(
        tmp_path: Path, desk_url: str, opened: Store, killed_at: str) -> None:
    """`awl cancel` killed -9 after writing the cancel event: the manager's next command
    (`awl effects list`) drops the held call, in one drop event by awl:desk, and every pass
    of the order is revoked as of the cancel; `awl pass show` then refuses the pass."""
    home = tmp_path / "home"
    order_id, tokens = _working_with_passes(opened, home)

    killed = _awl(home, desk_url, "cancel", order_id, "the client called it off",
                  "--as", MANAGER, killed_at=killed_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert opened.load(order_id).state == "cancelled"
    # The kill left work undone (the case under test): a pass valid, or a drop unlogged.
    assert len(opened.revoked()) < 2 or "drop" not in [e.action for e in
                                                        opened.events(order_id)]

    shown = _awl(home, desk_url, "effects", "list", order_id, "--json")
    assert shown.returncode == 0, shown.stderr
    (listed,) = json.loads(shown.stdout)["effects"]
    assert (listed["ref"], listed["state"]) == ("mail/send#1", "dropped")
    assert listed["error"] == "the order was cancelled"

    cancel = _ending(opened, order_id)
    assert cancel.action == "cancel"
    revocations = opened.revocations()
    jtis = [p.jti for p in opened.passes(order_id)]
    assert sorted(revocations) == sorted(jtis)
    assert {revocations[j].at for j in jtis} == {cancel.at}
    for token in tokens:
        verdict = _awl(home, desk_url, "pass", "show", token)
        assert verdict.returncode == 1, verdict.stdout
        assert "REFUSED (revoked)" in verdict.stdout

    # Run again, nothing more is written: one drop event, after the cancel.
    again = _awl(home, desk_url, "cancel", order_id, "again", "--as", MANAGER)
    assert again.returncode == 1
    assert again.stderr.startswith("awl: INVALID_TRANSITION: ") and again.stderr.count("\n") == 1
    drops = [e for e in opened.events(order_id) if e.action == "drop"]
    assert [(e.actor, e.data and e.data["refs"]) for e in drops] == [
        ("awl:desk", ["mail/send#1"])]
    assert drops[0].seq == cancel.seq + 1


@pytest.mark.slow
@pytest.mark.spec("DP-8")
def test_an_approval_killed_after_its_event_revokes_on_the_next_look(
        tmp_path: Path, desk_url: str, opened: Store) -> None:
    """`awl review --approve` killed -9 after writing the approval: the pass still verified;
    the next `awl pass show` revokes the order's passes (as of the approval) and refuses
    it, and the approved held call stays held for its commit."""
    home = tmp_path / "home"
    order_id, tokens = _working_with_passes(opened, home)
    Desk(opened).report(order_id, WORKER, report_fields(effects=[effect(1)],
                                                        tools_used=["mail/send"]))

    killed = _awl(home, desk_url, "review", order_id, "--approve", "--as", MANAGER,
                  killed_at="event")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert opened.load(order_id).state == "approved"
    assert opened.revoked() == {}

    verdict = _awl(home, desk_url, "pass", "show", tokens[0])
    assert verdict.returncode == 1, verdict.stdout
    assert "REFUSED (revoked)" in verdict.stdout
    approve = _ending(opened, order_id)
    assert approve.action == "approve"
    assert {r.at for r in opened.revocations().values()} == {approve.at}
    assert sorted(opened.revocations()) == sorted(p.jti for p in opened.passes(order_id))
    assert [e.state for e in opened.effects(order_id)] == ["held"]
    assert [e.action for e in opened.events(order_id)][-1] == "approve"


@pytest.mark.spec("CM-4")
def test_a_call_held_while_its_order_was_cancelled_is_dropped_when_next_read(
        opened: Store) -> None:
    """The gateway reserves a staged call while the order works; the manager cancels
    (nothing is held yet, so nothing is dropped); the hold lands after. The next read of the
    order drops it, so a cancelled order never shows a call waiting for approval."""
    desk = Desk(opened)
    view = desk.create(order_fields(deadline=FAR), MANAGER)
    desk.accept(view.id, WORKER)
    desk.start(view.id, WORKER)
    call = reserved(opened.reserve_call(view.id, attempt=1, tool="mail/send",
                                        arguments={"n": 1}, pass_jti=None, usd=0.0,
                                        started_at="2030-01-01T09:00:00Z", scopes=()))
    desk.cancel(view.id, MANAGER, "the client called it off")
    opened.hold_call(view.id, call.ref, result=None, ended_at="2030-01-01T09:00:01Z")
    assert [e.state for e in opened.effects(view.id)] == ["held"]

    assert Desk(opened).get(view.id).state == "cancelled"
    assert [(e.state, e.error) for e in opened.effects(view.id)] == [
        ("dropped", "the order was cancelled")]
    events = opened.events(view.id)
    assert [e.action for e in events][-2:] == ["cancel", "drop"]
    assert Desk(opened).get(view.id).seq == events[-1].seq  # read again: nothing more
