"""The approval page in a real browser: Chromium from the system's packages, driven by
Playwright, against a real ``awl web`` process, a real SQLite desk and the receiver as the
upstream (whose own log counts deliveries).

One ``awl web`` and one browser serve the whole module; each test makes its own orders.
Locally the module is skipped when Chromium is missing; under ``CI=true`` it fails instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from awl.desk.tokens import issue_token
from tests.gateway.commit_support import ROOT, hold, report_doc
from tests.servers.receiver import read_log
from tests.service_support import unavailable
from tests.web.web_support import MANAGER, WORKER, Desked, make_desk, submit_order

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None or not __import__("importlib").util.find_spec("playwright"):
    unavailable("the browser tests need chromium (apt-get install chromium) and playwright "
                "(pip install playwright)", module=True)

from playwright.sync_api import (  # noqa: E402
    Browser,
    BrowserContext,
    Dialog,
    Page,
    sync_playwright,
)
from playwright.sync_api import Error as PlaywrightError  # noqa: E402

pytestmark = pytest.mark.slow

TIMEOUT_MS = 30_000
"""How long a page waits for what it expects (every wait is on a condition, so a generous
limit costs nothing when all is well; a commit starts processes, slow on a loaded machine)."""
TWO = [("receiver/deliver", {"to": "a@example.com", "body": "first"}),
       ("receiver/deliver", {"to": "b@example.com", "body": "second"})]


@dataclass
class Web:
    """The running page and its desk."""

    url: str
    signin: str
    desk: Desked


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    d = make_desk(tmp_path_factory.mktemp("web"))
    awl = Path(sys.executable).with_name("awl")
    log = d.home.parent / "web.log"
    with log.open("w", encoding="utf-8") as sink:
        process = subprocess.Popen(
            [str(awl), "web", "--listen", "127.0.0.1:0", "--as", MANAGER, "--config",
             str(d.config), "--home", str(d.home)],
            stderr=sink, env={**os.environ, "PYTHONPATH": str(ROOT)})
    end = time.monotonic() + 30
    signin = None
    while signin is None:
        found = re.search(r"(http://\S+/signin\?code=\S+)", log.read_text(encoding="utf-8"))
        signin = found.group(1) if found else None
        assert process.poll() is None and time.monotonic() < end, log.read_text()
        time.sleep(0.05)
    url = signin.split("/signin")[0]
    try:
        yield Web(url, signin, d)
    finally:
        process.terminate()
        process.wait(timeout=10)
        d.store.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as play:
        launched = play.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def manager(web: Web, browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.goto(web.signin)
    assert page.url == web.url + "/"  # the code left the address
    assert page.locator("#principal").inner_text() == MANAGER
    page.close()
    try:
        yield context
    finally:
        context.close()


@pytest.fixture(scope="module")
def worker(web: Web, browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.goto(web.url + "/signin")
    page.fill("input[name=token]", issue_token(web.desk.store, WORKER))
    page.click("button[type=submit]")
    assert page.locator("#principal").inner_text() == WORKER
    page.close()
    try:
        yield context
    finally:
        context.close()


def delivered(web: Web, oid: str) -> dict[str, int]:
    """The receiver's own count of deliveries per awl/ref, for one order."""
    out: dict[str, int] = {}
    for line in read_log(str(web.desk.log)):
        if line.get("order") == oid:
            out[line["ref"]] = out.get(line["ref"], 0) + 1
    return out


def open_order(context: BrowserContext, web: Web, oid: str) -> Page:
    page = context.new_page()
    page.goto(f"{web.url}/order?id={oid}")
    return page


def state_of(page: Page, ref: str) -> str:
    return page.locator(f"tr.effect-state[data-ref='{ref}'] td.state").inner_text()


@pytest.mark.spec("BIND-9")
def test_sign_in_and_the_inbox_shows_a_submitted_order(web: Web,
                                                       manager: BrowserContext) -> None:
    oid, _ = submit_order(web.desk, TWO, goal="Inbox shows me")
    page = manager.new_page()
    page.goto(web.url + "/")
    assert "Inbox shows me" in page.locator("#review").inner_text()
    page.click(f"#review a[href='/order?id={oid}']")
    assert page.locator("#state").inner_text() == "submitted"
    page.close()


@pytest.mark.spec("BIND-11")
def test_approve_one_of_two_and_commit_it_once(web: Web, manager: BrowserContext) -> None:
    oid, refs = submit_order(web.desk, TWO)
    page = open_order(manager, web, oid)
    page.check(f"input[name=effect][value='{refs[0]}']")  # nothing is ticked before
    page.click("#approve-selected")
    assert page.locator("#state").inner_text() == "approved"
    page.click("#run-commit")
    # The page follows the commit by itself (server-sent events), no reload pressed.
    page.locator(".flash", has_text="1 committed").wait_for()
    assert state_of(page, refs[0]) == "committed"
    assert state_of(page, refs[1]) == "dropped"
    assert delivered(web, oid) == {refs[0]: 1}
    page.click("#run-commit")  # a second run sends nothing
    page.locator(".flash", has_text="already committed before this run").wait_for()
    assert delivered(web, oid) == {refs[0]: 1}
    page.close()


def _first_lines(web: Web, context: BrowserContext, query: str, count: int) -> list[bytes]:
    """The first ``count`` lines of the page's event stream, as the context's session."""
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in context.cookies())
    request = urllib.request.Request(f"{web.url}/events?{query}", headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=TIMEOUT_MS / 1000) as stream:
        return [stream.readline() for _ in range(count)]


@pytest.mark.spec("BIND-11")
def test_a_change_before_the_page_s_event_stream_opens_still_reloads_it(
        web: Web, manager: BrowserContext) -> None:
    """The page carries the state it was made from (``data-since``) and its event stream
    starts from it: a change made after the page and before its stream opened (a commit
    that ended in between, whose note would otherwise never show) is told at once; a
    ``since`` that is no digest starts the stream from now."""
    oid, _ = submit_order(web.desk, TWO)
    page = open_order(manager, web, oid)
    since = page.locator("body").get_attribute("data-since")
    page.close()
    assert since is not None and re.fullmatch("[0-9a-f]{32}", since)
    assert oid not in since  # a digest: the page's attribute names no order
    web.desk.desk.review(oid, MANAGER, "rework", reason="send them again")
    lines = _first_lines(web, manager, f"order={quote(oid)}&since={quote(since)}", 3)
    assert lines == [b"retry: 2000\n", b"\n", b"event: change\n"]
    for bogus in ("not a digest", "[" * 5000, "0" * 31, "G" * 32):
        assert _first_lines(web, manager, f"order={quote(oid)}&since={quote(bogus)}", 2) == [
            b"retry: 2000\n", b"\n"]


@pytest.mark.spec("BIND-9", "SEC-6")
def test_revoking_the_token_ends_the_open_event_stream(web: Web) -> None:
    """A session's event stream checks the session's token on every turn, as each request
    does: once the token is revoked the stream ends, rather than telling its former holder
    of changes until the next request."""
    import http.client

    from awl.desk.tokens import revoke_tokens

    holder = "human:carol"
    host = web.url.removeprefix("http://")
    signin = http.client.HTTPConnection(host, timeout=TIMEOUT_MS / 1000)
    signin.request("POST", "/signin", body=f"token={issue_token(web.desk.store, holder)}",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    answer = signin.getresponse()
    assert answer.status == 303, answer.read()
    cookie = answer.getheader("Set-Cookie", "").split(";")[0]
    signin.close()
    request = urllib.request.Request(f"{web.url}/events", headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=TIMEOUT_MS / 1000) as stream:
        assert [stream.readline(), stream.readline()] == [b"retry: 2000\n", b"\n"]
        revoke_tokens(web.desk.store, principal=holder)
        began = time.monotonic()
        rest = stream.read()  # to its end: raises a timeout if the stream goes on
    assert b"change" not in rest
    assert time.monotonic() - began < 10  # a turn of the stream, not its 15 s keep-alive


@pytest.mark.spec("BIND-12")
def test_a_hostile_argument_is_text_and_runs_nothing(web: Web, manager: BrowserContext) -> None:
    hostile = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    oid, _ = submit_order(web.desk, [("receiver/deliver", {"to": hostile, "body": hostile})],
                          goal=hostile)
    dialogs: list[Any] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page = manager.new_page()
    page.on("dialog", on_dialog)
    page.goto(f"{web.url}/order?id={oid}")
    assert page.locator("#held dd[data-field=to] .text").inner_text() == hostile
    assert json.dumps(hostile) in (page.locator("#held pre.arguments").text_content() or "")
    assert page.locator("h1").inner_text() == hostile
    assert page.locator("img").count() == 0
    assert page.locator("main script").count() == 0
    page.goto(web.url + "/")  # the inbox lists the goal too
    assert hostile in page.locator("#review").inner_text()
    assert dialogs == []
    page.close()


@pytest.mark.spec("BIND-10", "BIND-11", "SEC-1")
def test_a_worker_sees_no_approve_button_and_its_forged_post_is_refused(
        web: Web, worker: BrowserContext, manager: BrowserContext) -> None:
    oid, _ = submit_order(web.desk, TWO)
    page = open_order(worker, web, oid)
    assert page.locator("#state").inner_text() == "submitted"
    assert page.locator("#approve-selected, #approve-all, #rework, #cancel-order").count() == 0
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    assert csrf
    forged = worker.request.post(f"{web.url}/order/review?id={oid}",
                                 form={"decision": "approve", "all": "1", "csrf": csrf},
                                 max_redirects=0)
    assert forged.status == 403 and "only its manager" in forged.text()
    no_csrf = manager.request.post(f"{web.url}/order/review?id={oid}",
                                   form={"decision": "approve", "all": "1"}, max_redirects=0)
    assert no_csrf.status == 403 and "CSRF" in no_csrf.text()
    assert web.desk.desk.get(oid).state == "submitted"
    page.close()


@pytest.mark.spec("BIND-11")
def test_rework_drops_the_held_calls(web: Web, manager: BrowserContext) -> None:
    oid, refs = submit_order(web.desk, TWO)
    page = open_order(manager, web, oid)
    page.fill("#rework-form input[name=reason]", "write to the right people")
    page.click("#rework")
    assert page.locator("#state").inner_text() == "working"
    assert [state_of(page, r) for r in refs] == ["dropped", "dropped"]
    assert "write to the right people" in page.locator("#log").inner_text()
    page.close()


@pytest.mark.spec("BIND-11")
def test_settle_an_unknown_effect_and_retry_it_once(web: Web, manager: BrowserContext) -> None:
    oid, refs = submit_order(web.desk, TWO[:1])
    d = web.desk
    d.desk.review(oid, MANAGER, "approve")
    # As a committer that died mid-call leaves it: dispatched once, outcome unknown.
    at = "2030-01-01T00:00:00Z"
    d.store.set_effect(oid, refs[0], expect=["held"], state="dispatching",
                       count_dispatch=True, at=at)
    d.store.set_effect(oid, refs[0], expect=["dispatching"], state="unknown", at=at)
    page = manager.new_page()
    page.goto(web.url + "/")
    assert refs[0] in page.locator("#unknown").inner_text()
    page.goto(f"{web.url}/order?id={oid}")
    page.check("form.settle input[value=did_not_happen]")
    page.fill("form.settle input[name=evidence]", "the receiver has no such message")
    page.click("form.settle button")
    assert "did_not_happen" in state_of(page, refs[0])
    page.click("form.retry button")
    page.locator(f"tr.effect-state[data-ref='{refs[0]}'] td.state",
                 has_text="committed").wait_for()
    assert delivered(web, oid) == {refs[0]: 1}
    page.close()


@pytest.mark.spec("BIND-9")
def test_the_inbox_updates_without_a_reload_when_a_worker_submits(
        web: Web, manager: BrowserContext) -> None:
    page = manager.new_page()
    page.goto(web.url + "/")
    page.locator("body[data-events]").wait_for(state="attached")
    page.wait_for_timeout(700)  # the event stream is open
    submit_order(web.desk, TWO, goal="Arrived while watching")
    page.locator("#review", has_text="Arrived while watching").wait_for()
    page.close()


@pytest.mark.spec("BIND-11")
def test_the_page_follows_an_effect_through_dispatching_to_committed(
        web: Web, manager: BrowserContext) -> None:
    oid, refs = submit_order(web.desk, TWO[:1])
    web.desk.desk.review(oid, MANAGER, "approve")
    web.desk.control.write_text(json.dumps({"delay": 2.5}), encoding="utf-8")
    try:
        page = open_order(manager, web, oid)
        page.click("#run-commit")
        row = f"tr.effect-state[data-ref='{refs[0]}'] td.state"
        page.locator(row, has_text="dispatching").wait_for()
        page.locator(row, has_text="committed").wait_for()
    finally:
        web.desk.control.write_text("{}", encoding="utf-8")
    assert delivered(web, oid) == {refs[0]: 1}
    page.close()


@pytest.mark.spec("BIND-12", "SEC-2")
def test_the_running_page_refuses_a_foreign_host(web: Web) -> None:
    import http.client

    address = web.url.removeprefix("http://")
    for host, status in (("rebound.example:80", 421), (address, 200)):
        connection = http.client.HTTPConnection(address, timeout=10)
        try:
            connection.request("GET", "/signin", headers={"Host": host})
            assert connection.getresponse().status == status, host
        finally:
            connection.close()


@pytest.mark.spec("BIND-11")
def test_orders_whose_ids_a_path_cannot_carry_are_approved_and_cancelled(
        web: Web, manager: BrowserContext) -> None:
    """Ids that a path segment loses ('.', '..': the browser folds them) or misreads (one
    ending in an action's name), or that need escaping, open from the inbox, and their
    forms act on them."""
    for approved, cancelled in ((".", ".."), ("x/call", "a/review"),
                                ("a?b#c 50%", "team/q1"), ("ünï/😀", "x/cancel")):
        _, refs = submit_order(web.desk, TWO, order_id=approved)
        submit_order(web.desk, TWO, order_id=cancelled)
        page = manager.new_page()
        page.goto(web.url + "/")
        page.locator("#review").get_by_text(approved, exact=True).click()
        assert page.locator("dl.facts code").first.inner_text() == approved
        assert page.locator("#state").inner_text() == "submitted"
        page.check(f"input[name=effect][value='{refs[1]}']")
        page.click("#approve-selected")
        assert page.locator("#state").inner_text() == "approved"
        view = web.desk.desk.get(approved)
        assert view.latest_review is not None
        assert list(view.latest_review.effects or ()) == [refs[1]]
        page.goto(web.url + "/")
        page.locator("#review").get_by_text(cancelled, exact=True).click()
        assert page.locator("dl.facts code").first.inner_text() == cancelled
        page.fill("#cancel input[name=reason]", "not needed")
        page.click("#cancel-order")
        assert page.locator("#state").inner_text() == "cancelled"
        assert web.desk.desk.get(cancelled).state == "cancelled"
        page.close()


@pytest.mark.spec("BIND-11")
def test_the_page_of_an_order_whose_id_holds_a_line_break_follows_the_desk(
        web: Web, manager: BrowserContext) -> None:
    """The page's event stream names its order as the page's address does: an id a page's
    attribute would change (a CR LF becomes LF there) still has its page reload itself."""
    oid, _ = submit_order(web.desk, TWO, order_id="line\r\nbreak")
    page = manager.new_page()
    page.goto(f"{web.url}/order?id={quote(oid, safe='')}")
    assert page.locator("#state").inner_text() == "submitted"
    page.wait_for_timeout(700)  # the event stream is open
    web.desk.desk.review(oid, MANAGER, "rework", reason="send them again")
    page.locator("#state", has_text="working").wait_for()
    page.close()


# --------------------------------------------------------------------------- issue 45: what a
# manager sees is what will be sent. Each test saves screenshots of what it checked under the
# session's pytest temporary folder (screenshots/), kept as the run's artifacts.

RLO = "ceo@\u202emoc.elpmaxe\u202c"
ZWSP = "payroll@exa\u200bmple.com"
CYRILLIC = "p\u0430yroll@example.com"
HIDDEN = ("\u202e", "\u202c", "\u200b")


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.getbasetemp() / "screenshots"
    folder.mkdir(exist_ok=True)
    return folder


def effect_box(page: Page, ref: str) -> Any:
    return page.locator(f"li.effect[data-ref='{ref}']")


def page_width(page: Page) -> int:
    width: int = page.evaluate("document.documentElement.scrollWidth")
    return width


@pytest.mark.spec("SEC-14")
def test_spoofed_recipients_are_marked_and_warned_about_beside_their_effects(
        web: Web, manager: BrowserContext, shots: Path) -> None:
    calls = [("receiver/deliver", {"to": to, "body": "payslips"})
             for to in (RLO, ZWSP, CYRILLIC, "payroll@example.com")]
    oid, refs = submit_order(web.desk, calls, goal=f"Send the payslips to {ZWSP}")
    page = open_order(manager, web, oid)
    page.screenshot(path=str(shots / "spoofed-recipients.png"), full_page=True)
    text = page.locator("main").inner_text()
    assert not any(ch in text for ch in HIDDEN)  # nothing on the page hides
    expected = {refs[0]: ("U+202E", "RIGHT-TO-LEFT OVERRIDE"),
                refs[1]: ("U+200B", "looks like 'payroll@example.com'"),
                refs[2]: ("U+0430", "mixes scripts (Latin, Cyrillic)")}
    for ref, (code, said) in expected.items():
        box = effect_box(page, ref)
        assert box.locator(".warning").is_visible()
        assert said in box.locator(".warning").inner_text()
        field = box.locator("dd[data-field=to] .text")
        assert code in field.locator(".mark").all_inner_texts()
        assert field.locator(".mark").first.is_visible()
    assert effect_box(page, refs[3]).locator(".warning").count() == 0
    assert "U+200B" in page.locator("h1").inner_text()
    # The exact JSON is a click away, every hidden character in it escaped.
    box = effect_box(page, refs[0])
    assert not box.locator("pre.arguments").is_visible()
    box.locator("details.raw summary").click()
    assert '"to": "ceo@\\u202emoc.elpmaxe\\u202c"' in box.locator("pre.arguments").inner_text()
    # What is sent is what is stored: the receiver's log has the exact bytes.
    for ref in (refs[2], refs[3]):
        page.check(f"input[name=effect][value='{ref}']")
    page.click("#approve-selected")
    page.click("#run-commit")
    page.locator(".flash", has_text="2 committed").wait_for()
    sent = {line["ref"]: line["arguments"]["to"] for line in read_log(str(web.desk.log))
            if line.get("order") == oid}
    assert sent == {refs[2]: CYRILLIC, refs[3]: "payroll@example.com"}
    page.close()


@pytest.mark.spec("BIND-23")
def test_an_effect_reads_in_its_tool_s_order_and_words_with_long_text_wrapped(
        web: Web, manager: BrowserContext, shots: Path) -> None:
    long_word = "x" * 6000
    oid, refs = submit_order(web.desk, [("receiver/deliver", {
        "body": f"Dear team,\n{long_word}\nbye", "to": "team@example.com"})])
    page = open_order(manager, web, oid)
    box = effect_box(page, refs[0])
    # The schema lists `to` (titled "Recipient") before `body`; the worker sent body first.
    assert [t.strip() for t in box.locator("dl.fields dt").all_inner_texts()] == [
        "Recipient to", "body"]
    assert "Who gets the message." in box.locator("dd[data-field=to]").inner_text()
    assert box.locator("dd[data-field=body] .text").inner_text().startswith("Dear team,\n")
    assert page_width(page) <= page.viewport_size["width"]  # type: ignore[index]
    page.screenshot(path=str(shots / "effect-fields.png"), full_page=True)
    page.close()


@pytest.mark.spec("BIND-24")
def test_nothing_is_ticked_and_approve_all_asks_naming_count_and_tools(
        web: Web, manager: BrowserContext, shots: Path) -> None:
    oid, refs = submit_order(web.desk, [*TWO, ("receiver/create_issue", {"title": "t"})])
    page = open_order(manager, web, oid)
    assert page.locator("input[name=effect]").count() == 3
    assert page.locator("input[name=effect]:checked").count() == 0
    page.click("#approve-selected")  # nothing ticked: refused in words, nothing approved
    assert "you ticked no effect" in page.locator("#refusal").inner_text()
    assert web.desk.desk.get(oid).state == "submitted"
    page.goto(f"{web.url}/order?id={oid}")
    asked: list[str] = []

    def answer(accept: bool) -> Any:
        def on(dialog: Dialog) -> None:
            asked.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()
        return on

    page.once("dialog", answer(False))
    page.click("#approve-all")
    assert asked == ["Approve all 3 effects of this report (receiver/deliver \u00d72, "
                     "receiver/create_issue)? Each will be sent as shown."]
    assert web.desk.desk.get(oid).state == "submitted"  # said no: nothing happened
    page.once("dialog", answer(True))
    page.click("#approve-all")
    page.locator("#state", has_text="approved").wait_for()
    page.click("#run-commit")
    page.locator(".flash", has_text="3 committed").wait_for()
    assert delivered(web, oid) == {ref: 1 for ref in refs}
    page.screenshot(path=str(shots / "approve-all-committed.png"), full_page=True)
    page.close()


@pytest.mark.spec("BIND-24")
def test_without_scripts_approve_all_asks_on_a_page_of_its_own(
        web: Web, browser: Browser, shots: Path) -> None:
    oid, _ = submit_order(web.desk, TWO)
    context = browser.new_context(java_script_enabled=False)
    context.set_default_timeout(TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(web.url + "/signin")
        page.fill("input[name=token]", issue_token(web.desk.store, MANAGER))
        page.click("button[type=submit]")
        page.goto(f"{web.url}/order?id={oid}")
        page.click("#approve-all")
        assert "receiver/deliver \u00d72" in page.locator("#confirm-what").inner_text()
        page.screenshot(path=str(shots / "approve-all-confirm-page.png"), full_page=True)
        assert web.desk.desk.get(oid).state == "submitted"
        page.click("#confirm-all")
        assert page.locator("#state").inner_text() == "approved"
        assert web.desk.desk.get(oid).latest_review.effects is None  # type: ignore[union-attr]
    finally:
        context.close()


@pytest.mark.spec("BIND-25")
def test_between_approval_and_commit_the_page_and_inbox_say_what_is_sent_and_dropped(
        web: Web, manager: BrowserContext, shots: Path) -> None:
    oid, refs = submit_order(web.desk, TWO, goal="Scope until the commit")
    page = open_order(manager, web, oid)
    page.check(f"input[name=effect][value='{refs[1]}']")
    page.click("#approve-selected")
    # The approval's own page (live.js may reload it once more) before reloading it.
    page.locator(".flash", has_text="approved with 1 effect").wait_for()
    page.wait_for_load_state()
    page.reload()  # what a manager coming back later sees
    assert page.locator("#scope-covered").inner_text() == f"Sends 1: {refs[1]} (receiver/deliver)"
    assert page.locator("#scope-dropped").inner_text() == (
        f"Drops 1: {refs[0]} (receiver/deliver) (never sent)")
    assert "the commit sends it" in state_of(page, refs[1])
    assert "the commit drops it" in state_of(page, refs[0])
    page.screenshot(path=str(shots / "approval-scope.png"), full_page=True)
    inbox = manager.new_page()
    inbox.goto(web.url + "/")
    line = inbox.locator(f"#approved li[data-order='{oid}']").inner_text()
    assert f"the approval covers 1: {refs[1]}" in line and f"it drops 1: {refs[0]}" in line
    inbox.close()
    page.click("#run-commit")
    page.locator(".flash", has_text="1 committed").wait_for()
    assert page.locator("#scope").count() == 0  # the commit has run: the states say it all
    assert delivered(web, oid) == {refs[1]: 1}
    page.close()


@pytest.mark.spec("BIND-27")
def test_long_unbroken_strings_never_widen_the_page(
        web: Web, manager: BrowserContext, shots: Path) -> None:
    word = "W" * 20_000
    oid, refs = submit_order(web.desk, [("receiver/deliver", {"to": word, "body": word})],
                             goal=word)
    web.desk.desk.review(oid, MANAGER, "rework", word)  # a long note in the log
    hold_ref = submit_again(web, oid, word)
    page = open_order(manager, web, oid)
    width = page.viewport_size["width"]  # type: ignore[index]
    assert page_width(page) <= width, page_width(page)
    page.screenshot(path=str(shots / "long-strings-order.png"))
    page.goto(f"{web.url}/order/call?id={oid}&ref={quote(hold_ref, safe='')}")
    assert page_width(page) <= width
    page.goto(web.url + "/")
    assert page_width(page) <= width
    page.screenshot(path=str(shots / "long-strings-inbox.png"))
    page.close()
    assert refs


def submit_again(web: Web, oid: str, text: str) -> str:
    """Attempt 2 of ``oid``: one held call and a report whose summary is ``text``."""
    ref = hold(web.desk.store, oid, "receiver/deliver", {"to": text, "body": text}, attempt=2)
    doc = report_doc([{"ref": ref, "tool": "receiver/deliver",
                       "arguments": {"to": text, "body": text}}], ["receiver/deliver"], ref)
    web.desk.desk.report(oid, WORKER, {**doc, "result": {"summary": text}})
    return ref


def goto(page: Page, url: str) -> None:
    """``page.goto(url)``, again if live.js reloaded the page it was on meanwhile (the desk
    changed under it: the test's own writes just before)."""
    for _ in range(3):
        try:
            page.goto(url)
            return
        except PlaywrightError as exc:
            if "interrupted by another navigation" not in str(exc):
                raise
            page.wait_for_load_state()
    page.goto(url)


def walk(page: Page, start: str, items: str, next_link: str) -> list[list[str]]:
    """Follow ``next_link`` from ``start`` to the last page: each page's ``items`` texts."""
    pages: list[list[str]] = []
    goto(page, start)
    while True:
        pages.append(page.locator(items).all_inner_texts())
        link = page.locator(next_link)
        if link.count() == 0:
            return pages
        assert "after=" in (link.get_attribute("href") or "")
        link.click()
        page.wait_for_load_state()


@pytest.mark.spec("BIND-26")
def test_every_list_on_the_page_comes_a_page_at_a_time(
        web: Web, manager: BrowserContext, shots: Path) -> None:
    desk = web.desk.desk
    for n in range(55):
        submit_order(web.desk, TWO[:1], goal=f"paged review {n}")
    for n in range(52):
        view = web.desk.desk.create({
            "to": WORKER, "goal": f"paged other {n}", "criteria": [{"id": "c1", "text": "t"}],
            "budget": {"usd": 1}, "deadline": "2099-01-01T00:00:00Z", "tools": ["receiver/*"]},
            MANAGER)
        web.desk.desk.cancel(view.id, MANAGER, "not needed")
    page = manager.new_page()
    review = walk(page, web.url + "/", "#review li a.order", "#next-review")
    assert all(len(p) <= 50 for p in review) and len(review) >= 2
    assert sorted(i for p in review for i in p) == sorted(
        v.id for v in desk.list(state="submitted", manager=MANAGER, limit=None))
    others = walk(page, web.url + "/", "#others li a.order", "#next-others")
    assert all(len(p) <= 50 for p in others) and len(others) >= 2
    shown = [i for p in others for i in p]
    assert len(shown) == len(set(shown)) == len([
        v for v in desk.list(manager=MANAGER, limit=None) if v.state != "submitted"])
    page.screenshot(path=str(shots / "inbox-last-page.png"), full_page=True)
    # An order's events and calls: 120 progress notes and 60 calls.
    oid = desk.create({
        "to": WORKER, "goal": "a long log", "criteria": [{"id": "c1", "text": "t"}],
        "budget": {"usd": 1}, "deadline": "2099-01-01T00:00:00Z", "tools": ["receiver/*"]},
        MANAGER).id
    desk.accept(oid, WORKER)
    desk.start(oid, WORKER)
    for n in range(60):
        hold(web.desk.store, oid, "receiver/echo", {"text": str(n)})
    for n in range(120):
        web.desk.desk.progress(oid, WORKER, f"note {n}")
    events = walk(page, f"{web.url}/order?id={oid}", "#log tr td:first-child", "#next-events")
    seqs = [int(s) for p in events for s in p]
    assert seqs == list(range(1, len(desk.events(oid)) + 1)) and len(events) >= 3
    calls = walk(page, f"{web.url}/order?id={oid}", "#calls tr.call td:first-child",
                 "#next-calls")
    assert [len(p) for p in calls] == [50, 10]
    assert [c.strip() for p in calls for c in p] == [f"receiver/echo#{n}" for n in range(1, 61)]
    page.close()
