"""Webhooks from the library: subscriptions, and delivery to a real receiver on 127.0.0.1,
from a desk in SQLite and from one in PostgreSQL."""

from __future__ import annotations

import base64
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from awl.desk.asyncdesk import AsyncDesk
from awl.desk.desk import Desk
from awl.desk.notify import (
    Deliverer,
    add_webhook,
    check_public_url,
    check_url,
    describe,
    webhook_store,
)
from awl.documents.errors import BadRequest, NotFound
from awl.store.protocol import Notification, Store
from awl.store.sqlite import SQLiteStore
from awl.store.urls import open_store
from tests.awl.desk_support import MANAGER, WORKER, order_fields, report_fields
from tests.awl.hook_support import HANG, DeadReceiver, Receiver


@pytest.fixture
def desk(tmp_path: Path, store_url: str | None) -> Iterator[Desk]:
    store = SQLiteStore(tmp_path / "desk.sqlite3") if store_url is None else open_store(store_url)
    yield Desk(store)
    store.close()


@pytest.fixture
def sqlite_desk(tmp_path: Path) -> Iterator[Desk]:
    """A desk in SQLite only, for what is refused before any store is asked."""
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        yield Desk(store)


def soon(hours: float = 1) -> str:
    moment = datetime.now(UTC) + timedelta(hours=hours)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def working(desk: Desk, **fields: Any) -> str:
    view = desk.create(order_fields(deadline=soon(), **fields), MANAGER)
    desk.accept(view.id, WORKER)
    desk.start(view.id, WORKER)
    return view.id


def deliver_all(deliverer: Deliverer, desk: Desk, *, timeout: float = 10.0) -> list[Notification]:
    """Run the deliverer until nothing is pending."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        deliverer.deliver_due()
        if not desk.notifications(state="pending"):
            return desk.notifications()
        time.sleep(0.02)
    raise AssertionError(f"still pending: {desk.notifications(state='pending')}")


@pytest.mark.spec("HOOK-1")
def test_a_webhook_gets_its_own_secret_shown_only_at_creation(desk: Desk) -> None:
    """Each subscription has its own whsec_ secret of 32 random bytes; the events come back
    in the desk's order, and the orders filter as given."""
    order_id = working(desk)
    first = desk.add_webhook("https://chat.example/hook?x=1", " committed, submitted ",
                             orders=order_id)
    second = desk.add_webhook("http://127.0.0.1:8080/", ["failed"])
    assert first.events == ("submitted", "committed") and first.orders == (order_id,)
    assert second.orders is None
    for webhook in (first, second):
        assert webhook.secret.startswith("whsec_")
        assert len(base64.b64decode(webhook.secret.removeprefix("whsec_"))) == 32
    assert first.secret != second.secret and first.id != second.id
    assert desk.webhooks() == [first, second]


@pytest.mark.spec("HOOK-1")
@pytest.mark.parametrize(("url", "events", "says"), [
    ("ftp://example.com/hook", "submitted", "must start with http:// or https://"),
    ("https:///hook", "submitted", "name a host"),
    ("chat.example/hook", "submitted", "must start with http:// or https://"),
    ("https://example.com/a b", "submitted", "spaces or control characters"),
    ("https://example.com:99999/", "submitted", "is not a URL"),
    ("https://example.com/#top", "submitted", "fragment"),
    ("https://example.com/", "submitted,approved", "unknown event 'approved'; use some of "
                                                    "submitted, blocked, unknown, committed"),
    ("https://example.com/", " , ", "needs at least one event"),
])
def test_a_bad_url_or_event_is_one_clear_refusal(sqlite_desk: Desk, url: str, events: str,
                                                 says: str) -> None:
    """Nothing is kept, and the message names what was wrong."""
    with pytest.raises(BadRequest) as info:
        sqlite_desk.add_webhook(url, events)
    assert says in info.value.message and "\n" not in info.value.message
    assert sqlite_desk.webhooks() == []


def test_an_unknown_order_or_webhook_is_not_found(desk: Desk) -> None:
    with pytest.raises(NotFound, match="wo_nope"):
        desk.add_webhook("https://example.com/", "submitted", orders="wo_nope")
    with pytest.raises(NotFound, match="awl notify list"):
        desk.remove_webhook("wh_nope")


@pytest.mark.spec("HOOK-2", "HOOK-4", "HOOK-5")
def test_every_order_event_arrives_signed_with_its_secret(desk: Desk) -> None:
    """submitted, blocked and expired each reach the receiver once, with the Standard
    Webhooks headers, signed with the subscription's secret, the body linking the order."""
    with Receiver() as receiver:
        webhook = desk.add_webhook(receiver.url, "submitted,blocked,expired")
        other = desk.add_webhook(receiver.url, "committed")
        done = working(desk)
        desk.report(done, WORKER, report_fields())
        blocked = working(desk)
        desk.report(blocked, WORKER, report_fields("blocked"))
        late = desk.create(order_fields(deadline=soon(hours=1 / 3600)), MANAGER)
        while desk.get(late.id).state != "expired":  # reading it expires it, once past
            time.sleep(0.05)
        deliverer = Deliverer(webhook_store(desk.store), public_url="https://desk.example/")
        notes = deliver_all(deliverer, desk)
        got = receiver.wait_for(3)
    assert {n.webhook_id for n in notes} == {webhook.id}
    assert {(n.event, n.state) for n in notes} == {
        ("submitted", "delivered"), ("blocked", "delivered"), ("expired", "delivered")}
    bodies = {}
    for request in got:
        body = request.verified(webhook.secret)  # raises unless the signature is right
        assert request.headers["webhook-id"] in {n.id for n in notes}
        assert request.headers["content-type"] == "application/json"
        assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 60
        bodies[body["data"]["event"]] = body
    with pytest.raises(Exception, match="signature"):
        got[0].verified(other.secret)
    sub = bodies["submitted"]
    assert sub["type"] == "order.submitted"
    assert sub["data"] == {
        "event": "submitted", "order_id": done, "goal": "Summarize the quarterly filings",
        "worker": WORKER, "manager": MANAGER, "state": "submitted", "at": sub["timestamp"],
        "effects": {}, "seq": 4, "action": "report", "actor": WORKER, "note": "report (done)",
        "url": f"https://desk.example/order?id={done}"}
    assert bodies["blocked"]["data"]["state"] == "blocked"
    assert bodies["expired"]["data"]["actor"] == "awl:desk"
    assert bodies["expired"]["data"]["note"] == "the deadline passed"


@pytest.mark.spec("HOOK-4")
def test_two_failures_then_success_is_delivered_once_with_both_failures_logged(
        desk: Desk) -> None:
    """The same webhook-id comes three times; the notification ends delivered with two
    failed attempts and one good one, and is never sent again."""
    with Receiver(500, 503, 200) as receiver:
        desk.add_webhook(receiver.url, "submitted")
        desk.report(working(desk), WORKER, report_fields())
        deliverer = Deliverer(webhook_store(desk.store), backoff=0.05)
        [note] = deliver_all(deliverer, desk)
        for _ in range(3):
            deliverer.deliver_due()
        got = receiver.received
    assert len(got) == 3 and len({r.headers["webhook-id"] for r in got}) == 1
    assert note.state == "delivered"
    assert [(a.status, a.error) for a in note.attempts] == [
        (500, "HTTP 500: ok"), (503, "HTTP 503: ok"), (200, None)]
    assert all(a.ms >= 0 for a in note.attempts)


@pytest.mark.spec("HOOK-4")
def test_retries_back_off_with_jitter_and_stop_at_the_window(desk: Desk) -> None:
    """A receiver that always fails gets fewer and fewer attempts (the delay doubles, cut
    by jitter to between half and all of it), and after the retry window the notification
    is dead, saying why."""
    with Receiver(500) as receiver:
        desk.add_webhook(receiver.url, "submitted")
        desk.report(working(desk), WORKER, report_fields())
        deliverer = Deliverer(webhook_store(desk.store), backoff=0.1, retry_for=1.0)
        [note] = deliver_all(deliverer, desk, timeout=5)
    assert note.state == "dead"
    assert note.error is not None and note.error.startswith("not delivered within 1 s")
    assert note.error.endswith("the last: HTTP 500: ok")
    times = [datetime.fromisoformat(a.at) for a in note.attempts]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert 3 <= len(note.attempts) <= 6
    for k, gap in enumerate(gaps):
        assert 0.1 * 2 ** k * 0.5 - 0.01 <= gap <= 0.1 * 2 ** k + 0.3


@pytest.mark.spec("HOOK-4")
def test_a_receiver_that_never_answers_times_out_and_is_retried(desk: Desk) -> None:
    """No answer within the timeout is a failed attempt, retried later."""
    with DeadReceiver() as dead:
        desk.add_webhook(dead.url, "submitted")
        desk.report(working(desk), WORKER, report_fields())
        deliverer = Deliverer(webhook_store(desk.store), timeout=0.3, backoff=60)
        started = time.monotonic()
        assert deliverer.deliver_due() == 1
        assert time.monotonic() - started < 2
    [note] = desk.notifications()
    assert note.state == "pending"
    assert [(a.status, a.error) for a in note.attempts] == [(None, "no answer within 0.3 s")]


@pytest.mark.spec("HOOK-3")
def test_a_dead_receiver_never_slows_the_desk(desk: Desk) -> None:
    """With the deliverer running against a receiver that never answers, reports and
    events take no longer than the store's own writes: nothing waits for delivery."""
    with DeadReceiver() as dead:
        for _ in range(3):
            desk.add_webhook(dead.url, "submitted,blocked")
        with Deliverer(webhook_store(desk.store), timeout=30, poll=0.01, workers=2):
            started = time.monotonic()
            for _ in range(5):
                desk.report(working(desk), WORKER, report_fields())
            took = time.monotonic() - started
    assert took < 5, took
    assert len(desk.notifications()) == 15


@pytest.mark.spec("HOOK-4")
def test_the_running_deliverer_keeps_others_going_past_a_dead_receiver(desk: Desk) -> None:
    """One receiver hanging holds one worker; the next notification goes out meanwhile."""
    with DeadReceiver() as dead, Receiver() as live:
        desk.add_webhook(dead.url, "submitted")
        desk.add_webhook(live.url, "submitted")
        with Deliverer(webhook_store(desk.store), timeout=30, poll=0.02, workers=2):
            desk.report(working(desk), WORKER, report_fields())
            [request] = live.wait_for(1)
    assert request.json()["type"] == "order.submitted"


@pytest.mark.spec("HOOK-6")
def test_a_removed_webhook_is_never_sent_its_pending_notifications(desk: Desk) -> None:
    with Receiver(HANG) as receiver:
        webhook = desk.add_webhook(receiver.url, "submitted")
        desk.report(working(desk), WORKER, report_fields())
        desk.remove_webhook(webhook.id)
        assert Deliverer(webhook_store(desk.store)).deliver_due() == 0
        assert receiver.received == []
    [note] = desk.notifications()
    assert (note.state, note.error) == ("dead", "its webhook was removed")


def test_stopping_never_waits_for_a_receiver(desk: Desk) -> None:
    """With every worker stuck on a receiver that never answers, stop() returns at once;
    the claimed notification is left to its lease, never lost: once the receiver goes away
    the POST still in flight ends, and its attempt is recorded for a later try.

    (What the notification holds is read while the receiver still holds the POST: closing
    the receiver ends that POST at once, and its attempt is recorded.)"""
    with DeadReceiver() as dead:
        desk.add_webhook(dead.url, "submitted")
        desk.report(working(desk), WORKER, report_fields())
        [before] = desk.notifications()
        deliverer = Deliverer(webhook_store(desk.store), timeout=30, poll=0.01, workers=1).start()
        while desk.notifications()[0].next_at == before.next_at:  # claimed: lease set
            time.sleep(0.01)
        started = time.monotonic()
        deliverer.stop(wait=20)
        assert time.monotonic() - started < 5 and not deliverer.alive  # the POST waits 30 s
        [note] = desk.notifications()
        assert (note.state, note.attempts) == ("pending", ())
        assert note.next_at != before.next_at  # the claim's lease
        [post] = [t for t in threading.enumerate() if t.name == f"awl-notify-{note.id}"]
    post.join(20)
    assert not post.is_alive()
    [note] = desk.notifications()
    assert note.state == "pending" and [a.status for a in note.attempts] == [None]


def test_a_store_that_keeps_no_webhooks_refuses_them_in_one_line() -> None:
    """WebhookStore is optional (a third backend may not keep webhooks): asking a store that
    keeps none is one line."""
    class Bare:
        pass

    with pytest.raises(BadRequest, match="keeps no webhooks; use a SQLite or PostgreSQL desk"):
        webhook_store(cast(Store, Bare()))


# ------------------------------------------------------------------ a URL's credentials

@pytest.mark.spec("HOOK-4")
def test_a_urls_userinfo_is_sent_as_basic_auth_and_never_logged(
        desk: Desk, caplog: pytest.LogCaptureFixture) -> None:
    """A webhook registered as https://USER:PASSWORD@host/path was POSTed with no
    credentials at all (the userinfo was dropped with the host's parsing), so a receiver
    behind Basic auth never accepted one. Now the POST goes to the URL without its userinfo
    and carries `Authorization: Basic` of USER:PASSWORD, each percent-decoded; a URL
    without userinfo sends none; no attempt's record and no log line has the password."""
    caplog.set_level(logging.DEBUG)
    with Receiver(500, 204) as receiver, Receiver() as other:
        port = receiver.url.split(":")[2].split("/")[0]
        secured = receiver.url.replace("http://", "http://an%20a:p%40ss%3Aw%C3%B6rd@") + "?x=1"
        webhook = desk.add_webhook(secured, "submitted")
        plain = desk.add_webhook(other.url, "submitted")
        desk.report(working(desk), WORKER, report_fields())
        notes = deliver_all(Deliverer(webhook_store(desk.store), backoff=0.01), desk)
        to_secured = receiver.wait_for(2)  # 500, then 204
        to_plain = other.wait_for(1)
    assert {n.state for n in notes} == {"delivered"}
    assert [r.path for r in to_secured] == ["/hook?x=1"] * 2 and len(to_plain) == 1
    expected = "Basic " + base64.b64encode("an a:p@ss:wörd".encode()).decode()
    for request in to_secured:
        headers = {k.lower(): v for k, v in request.headers.items()}
        assert headers["authorization"] == expected
        assert headers["host"] == f"127.0.0.1:{port}"  # the userinfo is not in the host
        request.verified(webhook.secret)
    assert "authorization" not in {k.lower() for k in to_plain[0].headers}
    to_plain[0].verified(plain.secret)
    attempts = [a for n in desk.notifications() for a in n.attempts]
    assert len(attempts) == 3 and any(a.error for a in attempts)  # the 500 was recorded
    recorded = repr(desk.notifications()) + caplog.text
    for secret in ("p%40ss", "p@ss", "w%C3%B6rd", "wörd", expected.removeprefix("Basic ")):
        assert secret not in recorded


# A password in each URL a door refuses, with what is wrong with it: each refusal quotes the
# URL, and used to quote it whole (show_value keeps its first 40 characters: the password).
SECRET = "hunter2"
REFUSED_WITH_A_PASSWORD = [
    (f"http://ana:{SECRET}@127.0.0.1:9/h#top", "#fragment"),
    (f"https://ana:{SECRET}@hooks.example.com/a-path-well-past-forty-chars#x", "#fragment"),
    (f"http://ana:{SECRET}@127.0.0.1:0/h", "port 0"),
    (f"http://ana:{SECRET}@127.0.0.1:x/h", "is not a URL"),
    (f"ftp://ana:{SECRET}@127.0.0.1/h", "must start with http://"),
    (f"http://ana:{SECRET} x@127.0.0.1/h", "spaces or control characters"),
    (f"http://ana:{SECRET}@[::1/h", "is not a URL"),
    # An unescaped / ? or # in the password ends the host early: the password's start is
    # then read as the port ("Port could not be cast to integer value as 'hun'").
    ("http://ana:hun/ter2@127.0.0.1/h", "is not a URL (its port is not a number)"),
    ("http://ana:hun#ter2@127.0.0.1/h", "is not a URL (its port is not a number)"),
]


def assert_hidden(message: str, says: str) -> None:
    assert says in message and "\n" not in message, message
    assert "ana:***@" in message, message
    for part in (SECRET, "hun", "ter2"):
        assert part not in message, message


@pytest.mark.spec("HOOK-1")
@pytest.mark.parametrize(("url", "says"), REFUSED_WITH_A_PASSWORD,
                         ids=[says for _, says in REFUSED_WITH_A_PASSWORD])
def test_a_refused_webhook_url_never_quotes_its_password_from_any_door(
        sqlite_desk: Desk, url: str, says: str) -> None:
    """Only `awl notify add` hid a refused URL's password (it re-checked the URL as shown);
    the desk, the async desk, the library's add_webhook, check_url itself and the
    deliverer's public URL each quoted it. Now check_url hides it, for every door."""
    async def from_async_desk() -> None:
        await AsyncDesk(sqlite_desk.store).add_webhook(url, "submitted")

    doors: list[Callable[[], object]] = [
        lambda: sqlite_desk.add_webhook(url, "submitted"),
        lambda: anyio.run(from_async_desk),
        lambda: add_webhook(sqlite_desk.store, url, ["submitted"]),
        lambda: check_url(url),
        lambda: check_public_url(url),
        lambda: Deliverer(webhook_store(sqlite_desk.store), public_url=url),
    ]
    for door in doors:
        with pytest.raises(BadRequest) as info:
            door()
        assert_hidden(info.value.message, says)
    assert sqlite_desk.webhooks() == []


def test_describe_hides_a_urls_password_and_the_desk_keeps_it_whole(sqlite_desk: Desk) -> None:
    """describe (what `awl notify` prints) gave the URL whole; the CLI alone replaced it.
    Now it hides the password itself; the desk keeps the URL whole, to POST to."""
    url = f"https://ana:{SECRET}@hooks.example.com/h"
    webhook = sqlite_desk.add_webhook(url, "submitted")
    assert describe(webhook)["url"] == "https://ana:***@hooks.example.com/h"
    assert SECRET not in repr(describe(webhook, secret=True))
    assert [w.url for w in sqlite_desk.webhooks()] == [url]

