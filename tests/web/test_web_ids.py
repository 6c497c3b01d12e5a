"""Every order id and worker name the schema allows has its pages on the approval page.

An order id is any string of 1 to 128 characters and a worker's name any of 1 to 512 (the
work-order schema): ``.``, ``..``, a ``/``, an id ending in an action's name, ``%``, ``?``,
``#``, spaces, line breaks, any Unicode. These tests reach each order only through the links
and forms the pages themselves carry (as a manager clicks), so they hold for any address
scheme that works; a few pin the scheme itself (``/order?id=``) and the redirects of the old
``/orders/ID`` links that notifications already carried.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from awl.desk.notify import order_link
from awl.web._shown import shown as shown_html
from tests.web.web_support import MANAGER, WORKER, make_desk, signed_in, submit_order

CALLS = [("receiver/deliver", {"to": "a@example.com", "body": "one"}),
         ("receiver/deliver", {"to": "b@example.com", "body": "two"})]
IDS = [".", "..", "team/q1", "x/call", "a/review", "x/cancel", "50%", "a?b#c", "a b+c&d=e",
       "%2F", "/", "a/", "ünï/çødé 😀", "line\r\nbreak", "nul\x00tab\t"]
"""Order ids the schema allows that a path segment cannot carry (or carries ambiguously)."""
WORKERS = [".", "..", "agent:x/call", "agent:50% a?b#c", "agent:ünï/😀"]


def _links(page: str, before: str, text: str) -> list[str]:
    """The hrefs of the links whose text is ``text`` inside the element that ``before``
    opens, as a browser reads them (entities decoded)."""
    body = page[page.index(before):]
    tag = re.match(r"<(\w+)", before)
    if tag is not None:
        body = body[:body.index(f"</{tag.group(1)}>")]
    shown = re.escape(str(shown_html(text)))  # as the display rule shows it (SEC-14)
    return [unescape(h) for h in re.findall(rf'<a[^>]* href="([^"]*)"[^>]*>(?:<code>)?{shown}'
                                            rf'(?:</code>)?</a>', body)]


def _action(page: str, after: str) -> str:
    """The action of the first form that follows ``after`` on the page."""
    found = re.search(r'<form method="post" action="([^"]*)"', page[page.index(after):])
    assert found is not None, after
    return unescape(found.group(1))


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def _open_from_inbox(client: TestClient, oid: str) -> tuple[str, str]:
    """Follow the inbox's link to the order: (the link, the order's page)."""
    links = _links(client.get("/").text, '<section id="review">', oid)
    assert len(links) == 1, links
    page = client.get(links[0])
    assert page.status_code == 200, (links[0], page.text[:300])
    assert f"<dt>Order</dt><dd><code>{shown_html(oid)}</code></dd>" in page.text
    return links[0], page.text


def _post(client: TestClient, action: str, page: str, **form: Any) -> str:
    """Post one of the page's forms and follow its answer back to the order's page."""
    done = client.post(action, data={**form, "csrf": _csrf(page)})
    assert done.status_code == 303, (action, done.status_code, done.text[:300])
    back = client.get(done.headers["location"])
    assert back.status_code == 200
    return back.text


def _each(items: list[str], check: Callable[[str], None]) -> None:
    """``check`` each item, then fail naming every item whose check failed (and why)."""
    failed: dict[str, str] = {}
    for item in items:
        try:
            check(item)
        except AssertionError as exc:
            failed[item] = (str(exc).splitlines() or ["assertion failed"])[0][:200]
    assert not failed, failed


@pytest.mark.spec("BIND-11", "BIND-13")
def test_an_order_with_any_id_is_opened_its_call_shown_approved_and_cancelled(
        tmp_path: Path) -> None:
    """From the inbox's link: the order's page, the page of a held call it cites, approving
    one of its two held calls; on a second desk the same id is cancelled from its page.
    (An id of '.' or '..' in a path is folded away by every client, one ending in '/call'
    was taken for the call page of another order, and one holding a line break or a '%'
    escape matched no route or another order.)"""
    approving, cancelling = make_desk(tmp_path / "approve"), make_desk(tmp_path / "cancel")
    refs = {oid: submit_order(approving, CALLS, order_id=oid)[1] for oid in IDS}
    for oid in IDS:
        submit_order(cancelling, CALLS, order_id=oid)
    approver, canceller = signed_in(approving, MANAGER), signed_in(cancelling, MANAGER)

    def approve(oid: str) -> None:
        link, page = _open_from_inbox(approver, oid)
        # A notification links the same page (HOOK-5), after the desk's public address.
        assert order_link("https://desk.example/", oid) == "https://desk.example" + link
        [call] = _links(page, '<section id="held">', refs[oid][0])
        shown = approver.get(call)
        assert shown.status_code == 200 and "a@example.com" in shown.text
        assert _links(shown.text, "<h1>", oid) == [link]  # the call page links back
        after = _post(approver, _action(page, '<section id="held">'), page,
                      decision="approve", effect=[refs[oid][1]])
        view = approving.desk.get(oid)
        assert view.state == "approved" and view.latest_review is not None
        assert list(view.latest_review.effects or ()) == [refs[oid][1]]
        assert "approved with 1 effect(s)" in after and '<dd id="state">approved</dd>' in after

    def cancel(oid: str) -> None:
        _, page = _open_from_inbox(canceller, oid)
        after = _post(canceller, _action(page, '<section id="cancel">'), page,
                      reason="not needed")
        assert cancelling.desk.get(oid).state == "cancelled"
        assert '<dd id="state">cancelled</dd>' in after

    _each(IDS, approve)
    _each(IDS, cancel)


@pytest.mark.spec("BIND-11")
def test_a_blocked_order_with_an_awkward_id_is_answered_and_reworked_from_its_page(
        tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid = ".."
    d.desk.create({"id": oid, "to": WORKER, "goal": "Ask first",
                   "criteria": [{"id": "c1", "text": "asked"}], "budget": {"tool_calls": 5},
                   "deadline": "2099-01-01T00:00:00Z", "tools": ["receiver/*"]}, MANAGER)
    d.desk.accept(oid, WORKER)
    d.desk.start(oid, WORKER)
    d.desk.report(oid, WORKER, {
        "status": "blocked", "result": {"summary": "need a name"}, "evidence": [],
        "cost": {"tool_calls": 0}, "tools_used": [], "questions": ["Whom?"]})
    client = signed_in(d, MANAGER)
    [link] = _links(client.get("/").text, '<section id="questions">', oid)
    page = client.get(link).text
    _post(client, _action(page, '<section id="answer">'), page, answer="the team")
    assert d.desk.get(oid).state == "working"
    oid2, _ = submit_order(d, CALLS, order_id="x/call")
    _, page = _open_from_inbox(client, oid2)
    _post(client, _action(page, '<section id="decide">'), page,
          decision="rework", reason="wrong people")
    assert d.desk.get(oid2).state == "working"


@pytest.mark.spec("BIND-11")
def test_an_unknown_effect_of_an_order_with_an_awkward_id_is_settled_from_its_page(
        tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, refs = submit_order(d, CALLS[:1], order_id=".")
    d.desk.review(oid, MANAGER, "approve")
    at = "2030-01-01T00:00:00Z"
    d.store.set_effect(oid, refs[0], expect=["held"], state="dispatching",
                       count_dispatch=True, at=at)
    d.store.set_effect(oid, refs[0], expect=["dispatching"], state="unknown", at=at)
    client = signed_in(d, MANAGER)
    [link] = _links(client.get("/").text, '<section id="unknown">', oid)
    page = client.get(link).text
    after = _post(client, _action(page, '<section id="effects">'), page, ref=refs[0],
                  verdict="did_not_happen", evidence="not in its log")
    assert d.store.effects(oid)[0].settlement is not None
    assert "settled " + refs[0] in after


@pytest.mark.spec("BIND-13", "SEC-8")
def test_a_worker_with_any_name_has_its_track_record_page(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    orders = {worker: d.desk.create({
        "to": worker, "goal": "Anything", "criteria": [{"id": "c1", "text": "done"}],
        "budget": {"tool_calls": 5}, "deadline": "2099-01-01T00:00:00Z",
        "tools": ["receiver/*"]}, MANAGER).id for worker in WORKERS}
    for oid in orders.values():
        d.desk.cancel(oid, MANAGER, "changed my mind")
    client, stranger = signed_in(d, MANAGER), signed_in(d, "human:bob")

    def track(worker: str) -> None:
        inbox = client.get("/").text
        page = client.get(_links(inbox, '<section id="others">', orders[worker])[0]).text
        [link] = _links(page, '<dl class="facts">', worker)
        shown = client.get(link)
        assert shown.status_code == 200, (link, shown.text[:300])
        assert f"<h1>Track record of {shown_html(worker)}</h1>" in shown.text
        assert "cancelled" in shown.text
        assert stranger.get(link).status_code == 403  # SEC-8: bob issued nothing to it

    _each(WORKERS, track)


def test_the_page_names_an_order_or_a_worker_in_the_query_string(tmp_path: Path) -> None:
    """The scheme: ``/order?id=``, ``/order/ACTION?id=``, ``/worker?name=``, each value
    percent-encoded in full; the notification's link is the inbox's, after the public URL."""
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, CALLS, order_id="a?b#c/call 50%")
    client = signed_in(d, MANAGER)
    inbox = client.get("/").text
    encoded = "a%3Fb%23c%2Fcall%2050%25"
    assert f'<a class="order" href="/order?id={encoded}">' in inbox
    page = client.get(f"/order?id={encoded}").text
    assert f'action="/order/review?id={encoded}"' in page
    assert f'action="/order/cancel?id={encoded}"' in page
    assert f'href="/order/call?id={encoded}&amp;ref=receiver%2Fdeliver%231"' in page
    assert 'href="/worker?name=agent%3Amailer"' in page
    assert f'data-events="/events?order={encoded}"' in page
    assert order_link("https://desk.example/", oid) == f"https://desk.example/order?id={encoded}"


@pytest.mark.spec("BIND-13")
def test_an_address_naming_no_order_or_two_is_refused_in_words(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, CALLS)
    client = signed_in(d, MANAGER)
    for address in ("/order", "/order?id=", f"/order?id={oid}&id={oid}", "/order/call?ref=x",
                    "/worker", "/worker?name="):
        refused = client.get(address)
        assert refused.status_code == 400 and 'id="refusal"' in refused.text, address
        assert "names no" in refused.text
    cancel = client.post("/order/cancel", data={"reason": "r", "csrf": _csrf(client.get(
        f"/order?id={oid}").text)})
    assert cancel.status_code == 400 and d.desk.get(oid).state == "submitted"
    assert client.post("/order/cancel?id=" + oid, data={"reason": "no csrf"}
                       ).status_code == 403


@pytest.mark.parametrize(("old", "new"), [
    ("/orders/team%2Fq1", "/order?id=team%2Fq1"),
    ("/orders/x%2Fcall", "/order?id=x%2Fcall"),
    ("/orders/a%2Freview", "/order?id=a%2Freview"),
    ("/orders/50%25", "/order?id=50%25"),
    ("/orders/a%3Fb%23c", "/order?id=a%3Fb%23c"),
    ("/orders/%2E%2E", "/order?id=.."),
    ("/orders/%C3%BCn%C3%AF%2F%F0%9F%98%80", "/order?id=%C3%BCn%C3%AF%2F%F0%9F%98%80"),
    ("/orders/team/q1", "/order?id=team%2Fq1"),  # typed by hand: the old routes' reading
    ("/orders/x%2Fcall/call?ref=receiver%2Fdeliver%231",
     "/order/call?id=x%2Fcall&ref=receiver%2Fdeliver%231"),
    ("/workers/agent%3Ax%2Fcall", "/worker?name=agent%3Ax%2Fcall"),
])
def test_an_old_link_redirects_to_its_order(tmp_path: Path, old: str, new: str) -> None:
    """The links notifications already carried (``/orders/`` and the id with its '/' as
    %2F) go on to the order's page: only a literal '/' separates an id from an action."""
    d = make_desk(tmp_path)
    client = signed_in(d, MANAGER)
    moved = client.get(old)
    assert moved.status_code == 307, (old, moved.text[:300])
    assert moved.headers["location"] == new


def test_an_old_link_is_followed_to_the_page_and_an_old_form_still_posts(
        tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, CALLS, order_id="x/call")
    client = signed_in(d, MANAGER)
    page = client.get("/orders/x%2Fcall", follow_redirects=True)
    assert page.status_code == 200
    assert "<dt>Order</dt><dd><code>x/call</code></dd>" in page.text
    # A page opened before the change posts to its old address: sent on with its form,
    # which still needs its CSRF token.
    assert client.post("/orders/x%2Fcall/cancel", data={"reason": "stale page"},
                       follow_redirects=True).status_code == 403
    done = client.post("/orders/x%2Fcall/cancel",
                       data={"reason": "stale page", "csrf": _csrf(page.text)})
    assert done.status_code == 307 and done.headers["location"] == "/order/cancel?id=x%2Fcall"
    assert client.post("/orders/x%2Fcall/cancel", follow_redirects=True, data={
        "reason": "stale page", "csrf": _csrf(page.text)}).status_code == 200
    assert d.desk.get(oid).state == "cancelled"
    gone = client.get("/orders/")  # what '/orders/.' becomes on its way
    assert gone.status_code == 404 and "names no order" in gone.text
    signed_out = TestClient(client.app, follow_redirects=False)
    assert signed_out.get("/orders/x%2Fcall").headers["location"] == "/signin"
