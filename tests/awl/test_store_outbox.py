"""The Store contract for subscriptions and the outbox, run against every implementation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, cast

import pytest

from awl.documents.errors import BadRequest, Conflict, NotFound
from awl.store.protocol import (
    DeliveryAttempt,
    Reserved,
    Settlement,
    Store,
    Webhook,
    WebhookStore,
)
from tests.awl.desk_support import STORES, open_backend
from tests.awl.test_store import T0, create, ev, report, reserve

T1 = "2030-01-01T00:00:05Z"
T2 = "2030-01-01T00:01:00Z"
ALL = ("submitted", "blocked", "unknown", "committed", "failed", "expired")


class OutboxStore(Store, WebhookStore, Protocol):
    """A store that keeps webhooks: what these tests run against."""


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OutboxStore]:
    opened = open_backend(request.param, tmp_path, request)
    assert isinstance(opened, WebhookStore)
    yield cast(OutboxStore, opened)
    opened.close()


def hook(hook_id: str = "wh_1", events: tuple[str, ...] = ALL,
         orders: tuple[str, ...] | None = None) -> Webhook:
    return Webhook(id=hook_id, url="http://127.0.0.1:9/hook", events=events,
                   secret="whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0", orders=orders,
                   created_at=T0)


def working(store: OutboxStore, order_id: str = "o1") -> None:
    create(store, order_id)
    store.append(order_id, ev(2, "accept", "offered", "accepted"), state="accepted")
    store.append(order_id, ev(3, "start", "accepted", "working"), state="working")


def test_webhooks_are_kept_listed_and_removed(store: OutboxStore) -> None:
    """A webhook reads back as added; a second with its id is a Conflict; removal says
    whether there was one."""
    store.add_webhook(hook("wh_1", ("submitted",), ("o1", "o2")))
    store.add_webhook(hook("wh_2"))
    assert store.webhooks() == [hook("wh_1", ("submitted",), ("o1", "o2")), hook("wh_2")]
    with pytest.raises(Conflict):
        store.add_webhook(hook("wh_1"))
    assert store.remove_webhook("wh_1", at=T1) is True
    assert store.remove_webhook("wh_1", at=T1) is False
    assert [w.id for w in store.webhooks()] == ["wh_2"]


@pytest.mark.spec("HOOK-2", "HOOK-3", "HOOK-5")
def test_an_order_event_writes_one_notification_per_wanting_webhook(store: OutboxStore) -> None:
    """Reaching submitted notifies each webhook that wants it for that order, with the
    payload; events that move elsewhere or keep the state notify nobody."""
    store.add_webhook(hook("wh_all"))
    store.add_webhook(hook("wh_blocked", ("blocked",)))
    store.add_webhook(hook("wh_other", ALL, ("o2",)))
    working(store)
    store.append("o1", ev(4, "progress", "working", "working"), state="working")
    assert store.notifications() == []
    store.append("o1", ev(5, "report", "working", "submitted", T1), state="submitted",
                 report=report())
    [note] = store.notifications()
    assert (note.webhook_id, note.event, note.order_id, note.state) == (
        "wh_all", "submitted", "o1", "pending")
    assert note.id.startswith("msg_") and note.created_at == note.next_at == T1
    assert note.payload == {"type": "order.submitted", "timestamp": T1, "data": {
        "event": "submitted", "order_id": "o1", "goal": "do it", "worker": "agent:w",
        "manager": "human:m", "state": "submitted", "at": T1, "effects": {},
        "seq": 5, "action": "report", "actor": "agent:w"}}


@pytest.mark.spec("HOOK-2")
def test_blocked_and_expired_are_notified(store: OutboxStore) -> None:
    """An order reaching blocked, then expired, notifies each once."""
    store.add_webhook(hook())
    working(store)
    store.append("o1", ev(4, "block", "working", "blocked"), state="blocked")
    store.append("o1", ev(5, "expire", "blocked", "expired"), state="expired")
    assert [n.event for n in store.notifications()] == ["expired", "blocked"]
    assert [n.payload["type"] for n in store.notifications()] == ["order.expired",
                                                                   "order.blocked"]


@pytest.mark.spec("HOOK-3")
def test_a_refused_append_writes_no_notification(store: OutboxStore) -> None:
    """An append that loses its seq check writes neither the event nor its notification."""
    store.add_webhook(hook())
    working(store)
    with pytest.raises(Conflict):
        store.append("o1", ev(9, "report", "working", "submitted"), state="submitted")
    assert store.notifications() == []


@pytest.mark.spec("HOOK-2", "HOOK-5")
def test_effect_states_are_notified_with_counts(store: OutboxStore) -> None:
    """Committed, failed and unknown each notify once when reached; a write that keeps the
    state (a settlement) does not; the counts are the held calls by effect state."""
    store.add_webhook(hook())
    working(store)
    refs = []
    for _ in range(4):
        made = reserve(store, tool="srv/send")
        assert isinstance(made, Reserved)
        store.hold_call("o1", made.record.ref, result=None, ended_at=T0)
        refs.append(made.record.ref)
    for ref, end in zip(refs[:3], ("committed", "failed", "unknown"), strict=True):
        store.set_effect("o1", ref, expect=["held"], state="dispatching", at=T1)
        store.set_effect("o1", ref, expect=["dispatching"], state=end, at=T1,
                         error=None if end == "committed" else f"it {end}")
    settled = Settlement(verdict="happened", evidence="seen", by="human:m", at=T2)
    store.set_effect("o1", refs[2], expect=["unknown"], state="unknown", settlement=settled,
                     error="it unknown", at=T2)
    notes = list(reversed(store.notifications()))
    assert [(n.event, n.payload["data"]["ref"]) for n in notes] == [
        ("committed", refs[0]), ("failed", refs[1]), ("unknown", refs[2])]
    assert notes[0].payload["type"] == "effect.committed"
    data = notes[2].payload["data"]
    assert data["effects"] == {"committed": 1, "failed": 1, "held": 1, "unknown": 1}
    assert (data["tool"], data["attempt"], data["error"], data["state"]) == (
        "srv/send", 1, "it unknown", "working")
    assert "error" not in notes[0].payload["data"]


@pytest.mark.spec("HOOK-4")
def test_a_claim_leases_and_attempts_are_recorded(store: OutboxStore) -> None:
    """A claim takes what is due and hides it until its lease ends; a failed attempt makes
    it due later; a delivered one stays delivered, and every attempt is kept."""
    store.add_webhook(hook())
    working(store)
    store.append("o1", ev(4, "report", "working", "submitted"), state="submitted")
    assert store.claim_notifications(now="2029-12-31T00:00:00Z", lease_until=T2,
                                     limit=5) == []
    [(note, webhook)] = store.claim_notifications(now=T1, lease_until=T2, limit=5)
    assert webhook == hook() and note.next_at == T2
    assert store.claim_notifications(now=T1, lease_until=T2, limit=5) == []
    failed = DeliveryAttempt(at=T1, status=500, error="HTTP 500", ms=3.5)
    after = store.record_attempt(note.id, failed, state="pending", next_at=T1)
    assert (after.state, after.attempts) == ("pending", (failed,))
    [(again, _)] = store.claim_notifications(now=T1, lease_until=T2, limit=1)
    ok = DeliveryAttempt(at=T2, status=204, error=None, ms=1.0)
    done = store.record_attempt(again.id, ok, state="delivered", next_at=T2)
    late = store.record_attempt(again.id, failed, state="pending", next_at=T2)
    assert (done.state, late.state, late.attempts) == ("delivered", "delivered",
                                                       (failed, ok, failed))
    assert store.notifications(state="delivered") == [late]
    assert store.claim_notifications(now="2031-01-01T00:00:00Z", lease_until=T2,
                                     limit=5) == []
    with pytest.raises(NotFound):
        store.record_attempt("msg_none", ok, state="delivered", next_at=T2)
    with pytest.raises(BadRequest):
        store.record_attempt(note.id, ok, state="sent", next_at=T2)


@pytest.mark.spec("HOOK-4")
def test_a_dead_notification_keeps_its_reason(store: OutboxStore) -> None:
    """Given up, a notification is dead with its reason and never claimed again."""
    store.add_webhook(hook())
    working(store)
    store.append("o1", ev(4, "report", "working", "submitted"), state="submitted")
    [(note, _)] = store.claim_notifications(now=T1, lease_until=T1, limit=1)
    gone = DeliveryAttempt(at=T1, status=None, error="connection refused", ms=0.5)
    dead = store.record_attempt(note.id, gone, state="dead", next_at=T1,
                                error="no delivery within 1 s")
    assert (dead.state, dead.error) == ("dead", "no delivery within 1 s")
    assert store.claim_notifications(now=T2, lease_until=T2, limit=1) == []
    assert store.notifications(webhook_id="wh_1", order_id="o1") == [dead]
    assert store.notifications(order_id="o2") == []


@pytest.mark.spec("HOOK-6")
def test_removing_a_webhook_kills_its_pending_notifications(store: OutboxStore) -> None:
    """Once its webhook is gone a pending notification is dead and never sent."""
    store.add_webhook(hook("wh_1"))
    store.add_webhook(hook("wh_2"))
    working(store)
    store.append("o1", ev(4, "report", "working", "submitted"), state="submitted")
    store.remove_webhook("wh_1", at=T1)
    states = {n.webhook_id: (n.state, n.error) for n in store.notifications()}
    assert states == {"wh_1": ("dead", "its webhook was removed"), "wh_2": ("pending", None)}
    assert [n.webhook_id for n, _ in store.claim_notifications(
        now=T2, lease_until=T2, limit=5)] == ["wh_2"]


@pytest.mark.spec("HOOK-6")
def test_a_notification_in_flight_when_its_webhook_goes_stays_dead(store: OutboxStore) -> None:
    """An attempt that ends after the removal is recorded, but a failure never makes the
    notification pending again (it would have no webhook); a success still counts."""
    store.add_webhook(hook())
    working(store)
    store.append("o1", ev(4, "report", "working", "submitted"), state="submitted")
    store.append("o1", ev(5, "expire", "submitted", "expired"), state="expired")
    claimed = [n for n, _ in store.claim_notifications(now=T1, lease_until=T2, limit=5)]
    store.remove_webhook("wh_1", at=T1)
    failed = DeliveryAttempt(at=T1, status=500, error="HTTP 500", ms=1.0)
    ok = DeliveryAttempt(at=T1, status=200, error=None, ms=1.0)
    lost = store.record_attempt(claimed[0].id, failed, state="pending", next_at=T1)
    made = store.record_attempt(claimed[1].id, ok, state="delivered", next_at=T1)
    assert (lost.state, lost.attempts, made.state) == ("dead", (failed,), "delivered")
    assert store.claim_notifications(now=T2, lease_until=T2, limit=5) == []


@pytest.mark.spec("HOOK-3")
def test_the_event_and_its_notification_are_one_sqlite_transaction(tmp_path: Path) -> None:
    """When the notification cannot be written, the event is not written either: the two
    commit together or not at all (here the outbox table is gone from a damaged file)."""
    import sqlite3

    from awl.store.sqlite import SQLiteStore

    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as store:
        store.add_webhook(hook())
        working(store)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("ALTER TABLE outbox RENAME TO outbox_gone")
        conn.close()
        with pytest.raises(sqlite3.OperationalError, match="outbox"):
            store.append("o1", ev(4, "report", "working", "submitted"), state="submitted")
        assert (store.load("o1").state, store.load("o1").seq) == ("working", 3)
        store.append("o1", ev(4, "progress", "working", "working"), state="working")
        assert store.load("o1").seq == 4  # an event that notifies nobody never touches it
