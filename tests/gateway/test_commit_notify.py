"""Webhooks for the effect events, written by a real commit against a real receiver server
and delivered to a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from awl.desk.notify import Deliverer, webhook_store
from gateway._commit import commit_sync
from gateway._config import load_config
from tests.awl.hook_support import Receiver
from tests.gateway.commit_support import make_setup

pytestmark = pytest.mark.slow  # each test starts the receiver server as a subprocess

DELIVER = "receiver/deliver"
REJECT = "receiver/reject"


@pytest.mark.spec("HOOK-2", "HOOK-3", "HOOK-4", "HOOK-5")
def test_a_commit_notifies_committed_failed_and_unknown(tmp_path: Path,
                                                      store_url: str | None) -> None:
    """One effect answered, one refused, one never answered: each state arrives once,
    signed, with the effect's ref and tool and the order's effects counted; the commit does
    not wait for the receiver (nothing is sent until a deliverer runs). On SQLite and on
    PostgreSQL."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"}), (REJECT, {"reason": "quota"}),
                                  (DELIVER, {"to": "board"})], timeout=0.5,
                       store_url=store_url)
    done, refused, lost = setup.refs
    setup.control_receiver(hang_after=[lost])
    with Receiver() as receiver:
        effects = setup.desk.add_webhook(receiver.url, "committed,failed,unknown")
        setup.desk.add_webhook(receiver.url, "submitted")  # wants none of these
        summary = commit_sync(setup.order_id, store=setup.store,
                              pool_or_config=load_config(setup.config))
        assert [e.state for e in summary.effects] == ["committed", "failed", "unknown"]
        assert receiver.received == []
        notes = setup.desk.notifications()
        assert sorted(n.event for n in notes) == ["committed", "failed", "unknown"]
        deliverer = Deliverer(webhook_store(setup.store))
        while deliverer.deliver_due():
            pass
        got = receiver.wait_for(3)
        time.sleep(0.1)
        assert len(receiver.received) == 3
    bodies = {b["data"]["ref"]: b for b in (r.verified(effects.secret) for r in got)}
    assert {ref: b["type"] for ref, b in bodies.items()} == {
        done: "effect.committed", refused: "effect.failed", lost: "effect.unknown"}
    last = bodies[lost]["data"]
    assert (last["order_id"], last["tool"], last["attempt"], last["state"]) == (
        setup.order_id, DELIVER, 1, "approved")
    assert last["effects"] == {"committed": 1, "failed": 1, "unknown": 1}
    assert "0.5 s" in last["error"]
    assert "rejected: quota" in bodies[refused]["data"]["error"]
    assert "error" not in bodies[done]["data"]
    assert bodies[done]["data"]["effects"] == {"committed": 1, "held": 2}
    assert {n.state for n in setup.desk.notifications()} == {"delivered"}


@pytest.mark.spec("HOOK-2")
def test_a_later_commit_finding_dispatching_notifies_unknown(tmp_path: Path) -> None:
    """A committer that died after its dispatching mark leaves no notification (nothing was
    known yet); the later commit that turns the mark into unknown writes one."""
    setup = make_setup(tmp_path, [(DELIVER, {"to": "cfo"})])
    [ref] = setup.refs
    setup.desk.add_webhook("http://127.0.0.1:9/hook", "unknown")
    setup.store.set_effect(setup.order_id, ref, expect=["held"], state="dispatching",
                           count_dispatch=True, at="2030-01-01T00:00:00Z")
    assert setup.desk.notifications() == []
    commit_sync(setup.order_id, store=setup.store, pool_or_config=load_config(setup.config))
    [note] = setup.desk.notifications()
    assert (note.event, note.payload["data"]["ref"]) == ("unknown", ref)
    assert "found dispatching by a later commit" in note.payload["data"]["error"]
