"""The approval page's security rules over plain HTTP (no browser needed for these)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from awl import ValidationFailed
from awl.desk.tokens import issue_token
from awl.documents.models import format_time
from awl.web import CSP, Sessions, WebConfig, build_app, loopback_hosts
from tests.web.web_support import MANAGER, WORKER, csrf_of, make_desk, signed_in, submit_order

CALLS = [("receiver/deliver", {"to": "a@example.com", "body": "one"}),
         ("receiver/deliver", {"to": "b@example.com", "body": "two"})]


@pytest.mark.spec("BIND-9")
def test_a_one_time_code_signs_in_once_and_leaves_the_address(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    sessions = Sessions()
    client = TestClient(build_app(d.store, sessions, desk=d.desk), follow_redirects=False)
    code = sessions.new_code(MANAGER)
    first = client.get(f"/signin?code={code}")
    assert first.status_code == 303 and first.headers["location"] == "/"
    cookie = first.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert code not in first.headers["set-cookie"]
    assert MANAGER in client.get("/").text
    other = TestClient(build_app(d.store, sessions, desk=d.desk), follow_redirects=False)
    again = other.get(f"/signin?code={code}")
    assert again.status_code == 403 and "used already" in again.text
    assert other.get("/").status_code == 303  # not signed in


@pytest.mark.spec("BIND-9")
def test_a_wrong_token_is_refused_and_sessions_expire_and_sign_out(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    now = [0.0]
    sessions = Sessions(ttl=60, clock=lambda: now[0])
    bad = TestClient(build_app(d.store, sessions, desk=d.desk), follow_redirects=False)
    refused = bad.post("/signin", data={"token": "awl_not-a-token"})
    assert refused.status_code == 403 and "not a desk token" in refused.text
    client = signed_in(d, MANAGER, sessions=sessions)
    assert client.get("/").status_code == 200
    now[0] = 61.0
    assert client.get("/").status_code == 303  # expired: back to sign-in
    client = signed_in(d, MANAGER, sessions=sessions)
    out = client.post("/signout", data={"csrf": csrf_of(client)})
    assert out.status_code == 303
    assert client.get("/").status_code == 303


@pytest.mark.spec("BIND-10")
def test_a_post_without_or_with_a_foreign_csrf_token_changes_nothing(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, CALLS)
    client = signed_in(d, MANAGER)
    other = signed_in(d, MANAGER)
    for data in ({"decision": "approve", "all": "1"},
                 {"decision": "approve", "all": "1", "csrf": csrf_of(other)}):
        refused = client.post(f"/order/review?id={oid}", data=data)
        assert refused.status_code == 403 and "CSRF token" in refused.text
    anonymous = TestClient(build_app(d.store, Sessions(), desk=d.desk), follow_redirects=False)
    assert anonymous.post(f"/order/review?id={oid}", data={"decision": "approve"}
                          ).status_code == 403
    assert d.desk.get(oid).state == "submitted"


@pytest.mark.spec("BIND-11", "SEC-1")
def test_a_worker_session_is_offered_and_allowed_no_manager_action(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, refs = submit_order(d, CALLS)
    worker = signed_in(d, WORKER)
    page = worker.get(f"/order?id={oid}")
    assert page.status_code == 200 and refs[0] in page.text
    assert "/review" not in page.text and "/cancel" not in page.text
    csrf = csrf_of(worker, f"/order?id={oid}")
    for path, data in ((f"/order/review?id={oid}", {"decision": "approve", "all": "1"}),
                       (f"/order/cancel?id={oid}", {"reason": "mine now"}),
                       (f"/order/answer?id={oid}", {"answer": "yes"})):
        refused = worker.post(path, data={**data, "csrf": csrf})
        assert refused.status_code in (403, 409), (path, refused.text)
        assert "refusal" in refused.text
    review = worker.post(f"/order/review?id={oid}",
                         data={"decision": "approve", "all": "1", "csrf": csrf})
    assert review.status_code == 403 and "manager" in review.text
    assert d.desk.get(oid).state == "submitted"


@pytest.mark.spec("BIND-12", "SEC-2")
def test_headers_and_a_foreign_host_on_loopback(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    hosts = loopback_hosts("127.0.0.1", 8766)
    app = build_app(d.store, Sessions(), WebConfig(hosts=hosts), desk=d.desk)
    client = TestClient(app, base_url="http://127.0.0.1:8766", follow_redirects=False)
    ok = client.get("/signin")
    assert ok.status_code == 200
    assert ok.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
    assert "<script>" not in ok.text  # the one script is external
    assert client.get("/signin", headers={"host": "localhost:8766"}).status_code == 200
    evil = client.get("/signin", headers={"host": "evil.example:8766"})
    assert evil.status_code == 421 and "not this page's address" in evil.text


@pytest.mark.spec("BIND-12", "BIND-13")
def test_hostile_arguments_are_escaped_and_placeholders_shown(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    hostile = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    oid, _ = submit_order(d, [
        ("receiver/create_issue", {"title": hostile}),
        ("receiver/deliver", {"to": "x@example.com",
                              "body": {"$ref": "receiver/create_issue#1", "pointer": "/number"}}),
    ], goal=hostile)
    page = signed_in(d, MANAGER).get(f"/order?id={oid}").text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&#34;$ref&#34;: &#34;receiver/create_issue#1&#34;" in page
    assert "filled from the result of" in page and "/number" in page


@pytest.mark.spec("BIND-13")
def test_an_order_page_is_only_for_its_parties(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, CALLS)
    stranger = signed_in(d, "human:bob")
    refused = stranger.get(f"/order?id={oid}")
    assert refused.status_code == 403 and "not a party" in refused.text
    assert oid not in stranger.get("/").text


@pytest.mark.spec("BIND-11")
def test_approve_a_subset_and_rework_through_the_desk(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, refs = submit_order(d, CALLS)
    client = signed_in(d, MANAGER)
    csrf = csrf_of(client, f"/order?id={oid}")
    done = client.post(f"/order/review?id={oid}",
                       data={"decision": "approve", "effect": [refs[1]], "csrf": csrf})
    assert done.status_code == 303
    view = d.desk.get(oid)
    assert view.state == "approved" and view.latest_review is not None
    assert list(view.latest_review.effects or ()) == [refs[1]]
    page = client.get(f"/order?id={oid}").text
    assert "approved with 1 effect(s)" in page
    assert f"awl gateway --order {oid} --config" in page  # no --config: the command

    oid2, refs2 = submit_order(d, CALLS)
    empty = client.post(f"/order/review?id={oid2}", data={"decision": "rework", "csrf": csrf})
    assert empty.status_code == 400 and "refusal" in empty.text  # a rework needs a reason
    client.post(f"/order/review?id={oid2}",
                data={"decision": "rework", "reason": "wrong people", "csrf": csrf})
    states = {e.ref: e.state for e in d.store.effects(oid2)}
    assert d.desk.get(oid2).state == "working"
    assert states == dict.fromkeys(refs2, "dropped")


@pytest.mark.spec("BIND-11")
def test_answer_cancel_and_track_record_through_the_desk(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    view = d.desk.create({
        "to": WORKER, "goal": "Ask first", "criteria": [{"id": "c1", "text": "asked"}],
        "budget": {"tool_calls": 5}, "deadline": "2099-01-01T00:00:00Z",
        "tools": ["receiver/*"]}, MANAGER)
    oid = view.id
    d.desk.accept(oid, WORKER)
    d.desk.start(oid, WORKER)
    d.desk.report(oid, WORKER, {
        "status": "blocked", "result": {"summary": "need a name"}, "evidence": [],
        "cost": {"tool_calls": 0}, "tools_used": [], "questions": ["Whom <b>to</b> mail?"]})
    client = signed_in(d, MANAGER)
    inbox = client.get("/").text
    assert "Whom &lt;b&gt;to&lt;/b&gt; mail?" in inbox
    csrf = csrf_of(client)
    assert client.post(f"/order/answer?id={oid}",
                       data={"answer": "the team", "csrf": csrf}).status_code == 303
    assert d.desk.get(oid).state == "working"
    empty = client.post(f"/order/cancel?id={oid}", data={"reason": " ", "csrf": csrf})
    assert empty.status_code == 400 and "give a reason" in empty.text
    assert client.post(f"/order/cancel?id={oid}",
                       data={"reason": "not needed", "csrf": csrf}).status_code == 303
    assert d.desk.get(oid).state == "cancelled"
    track = client.get(f"/worker?name={WORKER}")
    assert track.status_code == 200 and "cancelled" in track.text
    stranger = signed_in(d, "human:bob").get(f"/worker?name={WORKER}")
    assert stranger.status_code == 403  # SEC-8: bob issued nothing to this worker


@pytest.mark.spec("BIND-11")
def test_a_settle_and_commit_without_config_are_refused_in_words(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, refs = submit_order(d, CALLS[:1])
    d.desk.review(oid, MANAGER, "approve")
    client = signed_in(d, MANAGER)
    csrf = csrf_of(client)
    held = client.post(f"/order/settle?id={oid}", data={
        "ref": refs[0], "verdict": "happened", "evidence": "seen", "csrf": csrf})
    assert held.status_code == 409 and "only an unknown effect is settled" in held.text
    commit = client.post(f"/order/commit?id={oid}", data={"csrf": csrf})
    assert commit.status_code == 400 and "without --config" in commit.text
    assert d.store.effects(oid)[0].state == "held"


def test_awl_web_refuses_a_remote_address_without_allow_remote(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from awl.cli import main

    assert main(["web", "--listen", "0.0.0.0:0", "--home", str(tmp_path)]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["web", "--session-hours", "0", "--home", str(tmp_path)]) == 2
    assert "--session-hours" in capsys.readouterr().err


@pytest.mark.spec("BIND-11")
def test_without_config_a_settled_effect_shows_the_retry_command(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, refs = submit_order(d, CALLS[:1])
    d.desk.review(oid, MANAGER, "approve")
    at = "2030-01-01T00:00:00Z"
    d.store.set_effect(oid, refs[0], expect=["held"], state="dispatching",
                       count_dispatch=True, at=at)
    d.store.set_effect(oid, refs[0], expect=["dispatching"], state="unknown", at=at)
    client = signed_in(d, MANAGER)
    csrf = csrf_of(client)
    assert client.post(f"/order/settle?id={oid}", data={
        "ref": refs[0], "verdict": "did_not_happen", "evidence": "not in its log",
        "csrf": csrf}).status_code == 303
    page = client.get(f"/order?id={oid}").text
    assert f"awl effects retry {oid} {shlex.quote(refs[0])} --config" in page.replace(
        "&#39;", "'")
    again = client.post(f"/order/settle?id={oid}", data={
        "ref": refs[0], "verdict": "happened", "evidence": "changed my mind", "csrf": csrf})
    assert again.status_code == 409 and "a settlement is final" in again.text


@pytest.mark.spec("BIND-13")
def test_a_cited_ref_opens_the_recorded_call_and_the_inbox_names_the_deadline(
        tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, refs = submit_order(d, CALLS)
    client = signed_in(d, MANAGER)
    inbox = client.get("/").text
    review, near = inbox.index('id="review"'), inbox.index('id="near"')
    assert review < inbox.index(oid) < near < inbox.rindex(oid)  # listed in both, review first
    page = client.get(f"/order?id={oid}").text
    link = f"/order/call?id={oid}&ref={refs[0].replace('/', '%2F').replace('#', '%23')}"
    assert f'href="{link.replace("&", "&amp;")}"' in page
    call = client.get(link)
    assert call.status_code == 200
    for shown in ("receiver/deliver", "held", "a@example.com", "pending:receiver/deliver#1",
                  "none (the order&#39;s own worker)"):
        assert shown in call.text
    missing = client.get(f"/order/call?id={oid}&ref=receiver/deliver%2399")
    assert missing.status_code == 404 and "has no recorded call" in missing.text


@pytest.mark.spec("BIND-9")
def test_a_sign_in_posted_from_another_site_is_refused(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    token = issue_token(d.store, MANAGER)
    client = TestClient(build_app(d.store, Sessions(), desk=d.desk), follow_redirects=False)
    for headers in ({"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"},
                    {"sec-fetch-site": "same-site", "origin": "http://testserver"}):
        refused = client.post("/signin", data={"token": token}, headers=headers)
        assert refused.status_code == 403 and "did not come from this page" in refused.text
        assert "set-cookie" not in refused.headers
    same = client.post("/signin", data={"token": token},
                       headers={"sec-fetch-site": "same-origin", "origin": "null"})
    assert same.status_code == 303


@pytest.mark.spec("BIND-9", "SEC-6")
def test_revoking_the_desk_token_ends_the_session_it_started(tmp_path: Path) -> None:
    from awl.desk.tokens import revoke_tokens

    d = make_desk(tmp_path)
    client = signed_in(d, MANAGER)
    assert client.get("/").status_code == 200
    revoke_tokens(d.store, principal=MANAGER)
    assert client.get("/").status_code == 303
    assert client.get("/").headers["location"] == "/signin"


def test_a_worker_inbox_lists_its_work_and_offers_no_decisions(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, CALLS)
    d.desk.review(oid, MANAGER, "rework", "name the right people")
    inbox = signed_in(d, WORKER).get("/").text
    working = inbox[inbox.index('id="working"'):]
    assert oid in working and "working, from human:ana" in working
    assert "/review" not in inbox


@pytest.mark.slow
@pytest.mark.spec("LC-21")
def test_the_order_page_shows_each_check_result_beside_its_criterion(tmp_path: Path) -> None:
    hostile = "<script>alert(1)</script>"
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    (repo / "tests" / "test_bad.py").write_text(
        f"def test_bad():\n    assert False, {hostile!r}\n")
    (repo / ".gitignore").write_text("__pycache__/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "start"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                       check=True, capture_output=True)
    pytest_argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    d = make_desk(tmp_path)
    view = d.desk.create({
        "to": WORKER, "goal": "Make the tests pass",
        "criteria": [{"id": "ok", "text": "the good test passes",
                      "check": {"run": [*pytest_argv, "tests/test_ok.py"]}},
                     {"id": "bad", "text": "the bad test passes",
                      "check": {"run": [*pytest_argv, "tests/test_bad.py"]}}],
        "budget": {"usd": 5, "tool_calls": 50},
        "deadline": format_time(datetime.now(UTC) + timedelta(hours=2)),
        "tools": ["receiver/*"],
    }, MANAGER, workspace=repo)
    oid = view.id
    d.desk.accept(oid, WORKER)
    d.desk.start(oid, WORKER)
    with pytest.raises(ValidationFailed):
        d.desk.report(oid, WORKER, {
            "status": "done", "result": {"summary": "all green"}, "cost": {"tool_calls": 1},
            "evidence": [{"criterion": c, "type": "note", "note": "ran"} for c in ("ok", "bad")],
            "tools_used": []})
    results = d.desk.check_results(oid)
    page = signed_in(d, MANAGER).get(f"/order?id={oid}").text
    good = page.split('data-criterion="ok"', 1)[1].split("</div>", 1)[0]
    assert 'data-outcome="passed"' in good and "passed" in good
    assert results["ok"]["check"]["summary"] in good and "exit 0 after" in good
    assert "tests/test_ok.py" in good and '<pre class="tail">' not in good
    bad = page.split('data-criterion="bad"', 1)[1].split("</div>", 1)[0]
    assert page.index("the good test passes") < page.index('data-criterion="ok"') \
        < page.index("the bad test passes") < page.index('data-criterion="bad"')
    assert 'data-outcome="failed"' in bad and "exit 1 after" in bad
    assert "1 failed" in bad
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in bad
    assert hostile not in page


@pytest.mark.spec("RX6", "BIND-11")
def test_the_order_page_shows_a_report_leaving_out_its_sub_orders_tokens(tmp_path: Path) -> None:
    """The manager's page of an order whose worker reported fewer tokens than its sub-order
    did lists the RX6 limit finding at /cost/tokens with both figures, beside the expiry."""
    d = make_desk(tmp_path)
    deadline = format_time(datetime.now(UTC) + timedelta(hours=2))
    fields = {"goal": "Survey the suppliers", "criteria": [{"id": "c1", "text": "surveyed"}],
              "deadline": deadline, "tools": ["receiver/*"]}
    root = d.desk.create({**fields, "to": WORKER,
                          "budget": {"usd": 5, "tool_calls": 50, "tokens": 1000}}, MANAGER).id
    d.desk.accept(root, WORKER)
    d.desk.start(root, WORKER)
    child = d.desk.create({**fields, "to": "agent:helper", "parent_id": root,
                           "budget": {"usd": 1, "tool_calls": 5, "tokens": 600}}, WORKER).id

    def report(tokens: int) -> dict[str, object]:
        return {"status": "done", "result": {"summary": "surveyed"}, "tools_used": [],
                "cost": {"usd": 0, "tool_calls": 0, "tokens": tokens},
                "evidence": [{"criterion": "c1", "type": "note", "note": "read"}]}

    d.desk.accept(child, "agent:helper")
    d.desk.start(child, "agent:helper")
    d.desk.report(child, "agent:helper", report(600))
    assert d.desk.report(root, WORKER, report(100)).state == "expired"
    page = signed_in(d, MANAGER).get(f"/order?id={root}").text
    found = page.split('<section id="findings">', 1)[1].split("</section>", 1)[0]
    assert '<li class="limit"><b>RX6</b> limit at <code>/cost/tokens</code>' in found
    assert "tokens spent 100 is less than the 600 its sub-orders reported" in found


@pytest.mark.spec("BIND-20")
def test_the_inbox_shows_questions_a_page_at_a_time_with_a_next_page_link(
        tmp_path: Path) -> None:
    """The inbox's questions come a page at a time, with a "next page" link while more
    follow; following the links shows each of the manager's questions once and no other
    manager's; a garbled cursor or limit is refused in one line."""
    import re
    from html import unescape

    d = make_desk(tmp_path)
    mine: list[str] = []
    theirs: list[str] = []
    for i in range(5):
        manager = "human:bob" if i == 1 else MANAGER
        oid = d.desk.create({
            "to": WORKER, "goal": f"Ask {i}", "criteria": [{"id": "c1", "text": "asked"}],
            "budget": {"tool_calls": 5}, "deadline": "2099-01-01T00:00:00Z",
            "tools": ["receiver/*"]}, manager).id
        d.desk.accept(oid, WORKER)
        d.desk.start(oid, WORKER)
        d.desk.report(oid, WORKER, {
            "status": "blocked", "result": {"summary": "stuck"}, "evidence": [],
            "cost": {"tool_calls": 0}, "tools_used": [], "questions": [f"Which {i}?"]})
        (theirs if manager != MANAGER else mine).append(oid)
    client = signed_in(d, MANAGER)
    seen: list[str] = []
    link = "/?limit=2"
    while link:
        page = client.get(link)
        assert page.status_code == 200
        section = page.text.split('<section id="questions">')[1].split("</section>")[0]
        seen += re.findall(r'href="/order\?id=([^"]+)"', section)
        found = re.search(r'<a class="next" href="([^"]+)">next page of questions</a>', section)
        link = unescape(found.group(1)) if found else ""
        assert not found or "&limit=2" in link
    assert seen == mine and not set(theirs) & set(seen)
    for bad in ("/?after=garbled", "/?limit=0", "/?limit=abc", "/?limit=9999"):
        refused = client.get(bad)
        assert refused.status_code == 400, bad
        assert "cursor of the question queue" in refused.text or "limit" in refused.text

