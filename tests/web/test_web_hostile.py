"""The approval page against those who must not succeed: a client sending bodies no form of
the page sends (too large, never finished), a page reached over HTTPS whose cookie must not
travel in clear, answers the page's own guard gives without its security headers, and text
written by a worker or an upstream that tries to become markup anywhere on the page.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest
from starlette.testclient import TestClient

from awl.desk.tokens import issue_token
from awl.web import CSP, Sessions, WebConfig, build_app, loopback_hosts
from tests.gateway.commit_support import ROOT, hold, report_doc
from tests.web.web_support import MANAGER, WORKER, csrf_of, make_desk, signed_in, submit_order

CALLS = [("receiver/deliver", {"to": "a@example.com", "body": "one"}),
         ("receiver/deliver", {"to": "b@example.com", "body": "two"})]
FORM = {"content-type": "application/x-www-form-urlencoded"}
MIB = 1024 * 1024


def _asgi(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]],
          chunks: list[bytes], *, wait: float = 10.0) -> tuple[int | None, bytes, int]:
    """Send one request to ``app`` in process: ``chunks`` of its body, then nothing more
    (the client neither finishes nor leaves). Returns the status (None when the app had not
    answered within ``wait`` seconds), the body and how many chunks the app read."""
    given = iter(chunks)
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        chunk = next(given, None)
        if chunk is None:
            await anyio.sleep(3600)
        read += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    address, _, query = path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": address,
             "raw_path": address.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(b"host", b"testserver"), *headers],
             "client": ("127.0.0.1", 1), "server": ("testserver", 80)}

    async def run() -> None:
        with anyio.move_on_after(wait):
            await app(scope, receive, send)

    anyio.run(run)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return (starts[0]["status"] if starts else None), body, read


@pytest.mark.spec("BIND-12")
def test_a_body_larger_than_any_form_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, CALLS)
    anonymous = TestClient(build_app(d.store, Sessions(), desk=d.desk), follow_redirects=False)
    # Read whole, this one took the form parser minutes, on the page's only event loop.
    started = time.monotonic()
    big = anonymous.post("/signin", content=b"&" * (2 * MIB), headers=FORM)
    assert big.status_code == 413, big.text[:200]
    assert big.text == ("refused: the request's body is larger than 1 MiB, more than any form "
                        "of this page sends")
    assert time.monotonic() - started < 5 and "set-cookie" not in big.headers
    # A file nobody asked for is not spooled to disk either, signed in or not.
    client = signed_in(d, MANAGER)
    csrf = csrf_of(client)
    upload = client.post(f"/order/review?id={oid}", data={"csrf": csrf, "decision": "approve",
                                                        "all": "1"},
                         files={"attachment": ("x.bin", b"\0" * (2 * MIB))})
    assert upload.status_code == 413 and "larger than 1 MiB" in upload.text
    assert d.desk.get(oid).state == "submitted"
    # A declared length over the limit is refused before a byte of the body is read.
    status, text, read = _asgi(client.app, "POST", "/signin",
                               [(b"content-length", str(10**12).encode()), *_bytes(FORM)], [])
    assert (status, read) == (413, 0) and b"larger than 1 MiB" in text
    status, text, _ = _asgi(client.app, "POST", "/signin",
                            [(b"content-length", b"12, 12"), *_bytes(FORM)], [])
    assert status == 400 and text == b"refused: the request's Content-Length is not a whole number"
    # A form as large as a field may be still goes through.
    reason = "r" * (MIB - 1000)
    done = client.post(f"/order/review?id={oid}",
                       data={"csrf": csrf, "decision": "rework", "reason": reason})
    assert done.status_code == 303, done.text[:300]
    assert d.desk.get(oid).state == "working"


@pytest.mark.spec("BIND-12")
def test_a_body_that_never_arrives_is_refused_in_time(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    app = build_app(d.store, Sessions(), WebConfig(body_seconds=0.5), desk=d.desk)
    for path in ("/signin", "/order/review?id=x"):
        started = time.monotonic()
        status, text, _ = _asgi(app, "POST", path,
                                [(b"content-length", b"100"), *_bytes(FORM)], [b"token=a"])
        assert status == 408, (path, status, text)
        assert text == b"refused: the request's body did not arrive within 0.5 seconds"
        assert time.monotonic() - started < 5


def _bytes(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v.encode()) for k, v in headers.items()]


@contextmanager
def _awl_web(d: Any, *extra: str) -> Iterator[tuple[str, int, str]]:
    """A real ``awl web`` (uvicorn) on a free loopback port: (host, port, what it printed so
    far)."""
    awl = Path(sys.executable).with_name("awl")
    log = d.home / "web.log"
    with log.open("w", encoding="utf-8") as sink:
        process = subprocess.Popen(
            [str(awl), "web", "--listen", "127.0.0.1:0", "--home", str(d.home), *extra],
            stderr=sink, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        end = time.monotonic() + 30
        found = None
        while found is None or (extra and "sign in" not in log.read_text(encoding="utf-8")):
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text(encoding="utf-8"))
            assert process.poll() is None and time.monotonic() < end, log.read_text()
            time.sleep(0.05)
        yield "127.0.0.1", int(found.group(1)), log.read_text(encoding="utf-8")
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A real ``awl web`` on a free loopback port: (host, port)."""
    d = make_desk(tmp_path)
    try:
        with _awl_web(d) as (host, port, _printed):
            yield host, port
    finally:
        d.store.close()


@pytest.mark.slow
@pytest.mark.spec("BIND-9")
def test_awl_web_with_an_https_public_url_sets_a_secure_cookie(tmp_path: Path) -> None:
    """`awl web --public-url https://...` (a page behind a TLS proxy): the cookie its
    sign-in sets is Secure, though the proxy reaches it over plain HTTP on loopback."""
    d = make_desk(tmp_path)
    try:
        with _awl_web(d, "--public-url", "https://desk.example/", "--no-notify",
                      "--as", MANAGER) as (host, port, printed):
            code = re.search(r"/signin\?code=(\S+)", printed)
            assert code is not None, printed
            with socket.create_connection((host, port), timeout=10) as conn:
                conn.sendall(f"GET /signin?code={code.group(1)} HTTP/1.1\r\n"
                             f"Host: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
                answer = b""
                while piece := conn.recv(4096):
                    answer += piece
    finally:
        d.store.close()
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    assert head.startswith("http/1.1 303"), head
    cookie = next(line for line in head.split("\r\n") if line.startswith("set-cookie:"))
    assert "; secure" in cookie and "httponly" in cookie, cookie


@pytest.mark.slow
@pytest.mark.spec("BIND-12")
def test_the_running_page_refuses_a_huge_declared_body_at_once(
        running: tuple[str, int]) -> None:
    host, port = running
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(f"POST /signin HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     "Content-Type: application/x-www-form-urlencoded\r\n"
                     f"Content-Length: {8 * 1024**3}\r\n\r\ntoken=".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            piece = conn.recv(4096)
            assert piece, answer
            answer += piece
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


@pytest.mark.spec("BIND-9")
def test_the_session_cookie_is_secure_when_the_page_is_reached_over_https(
        tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    token = issue_token(d.store, MANAGER)

    def cookie(config: WebConfig, base: str) -> tuple[str, str]:
        client = TestClient(build_app(d.store, Sessions(), config, desk=d.desk),
                            base_url=base, follow_redirects=False)
        signin = client.post("/signin", data={"token": token})
        assert signin.status_code == 303, signin.text[:300]
        session = signin.headers["set-cookie"]
        client.cookies.set("awl_session", session.split("=", 1)[1].split(";", 1)[0])
        out = client.post("/signout", data={"csrf": csrf_of(client)})
        assert out.status_code == 303
        return session.lower(), out.headers["set-cookie"].lower()

    for config, base in ((WebConfig(), "https://desk.example"),
                         (WebConfig(public_url="https://desk.example/"), "http://testserver")):
        session, ended = cookie(config, base)
        assert "; secure" in session and "httponly" in session and "samesite=strict" in session
        assert "; secure" in ended
    session, ended = cookie(WebConfig(), "http://testserver")  # plain HTTP: it could not be
    assert "; secure" not in session and "httponly" in session


@pytest.mark.spec("BIND-12", "SEC-2")
def test_every_answer_carries_the_security_headers(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, refs = submit_order(d, CALLS)
    hosts = loopback_hosts("127.0.0.1", 8766)
    client = signed_in(d, MANAGER)
    app = build_app(d.store, Sessions(), WebConfig(hosts=hosts), desk=d.desk)
    loopback = TestClient(app, base_url="http://127.0.0.1:8766", follow_redirects=False)
    answers = {
        "foreign host": loopback.get("/", headers={"host": "evil.example:8766"}),
        "sign-in": loopback.get("/signin"),
        "not signed in": loopback.get("/"),
        "order": client.get(f"/order?id={oid}"),
        "call": client.get(f"/order/call?id={oid}&ref={refs[0].replace('#', '%23')}"),
        "refusal": client.get("/order?id=nope"),
        "no such page": client.get("/nowhere"),
        "wrong method": client.get("/signout"),
        "bad multipart": client.post("/signout", content=b"x",
                                     headers={"content-type": "multipart/form-data"}),
        "too large": client.post("/signin", content=b"a" * (MIB + 1), headers=FORM),
        "static": client.get("/static/live.js"),
    }
    assert answers["foreign host"].status_code == 421
    for name, answer in answers.items():
        headers = answer.headers
        assert headers.get("content-security-policy") == CSP, name
        assert "frame-ancestors 'none'" in CSP
        assert (headers.get("x-frame-options"), headers.get("x-content-type-options"),
                headers.get("cache-control")) == ("DENY", "nosniff", "no-store"), name


MARK = "ZQ\"ZQ'ZQ<x-evil onclick=1>&amp;"
"""Text that would be markup, or break out of an attribute, were it not escaped."""


@pytest.mark.spec("BIND-12", "BIND-13")
def test_text_from_workers_and_upstreams_is_text_everywhere_on_the_page(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    worker = f"agent:{MARK}"
    view = d.desk.create({
        "id": f"o-{MARK}", "to": worker, "goal": f"goal {MARK}",
        "criteria": [{"id": "c1", "text": f"criterion {MARK}"}],
        "budget": {"usd": 5, "tool_calls": 50}, "deadline": "2099-01-01T00:00:00Z",
        "tools": ["receiver/*"], "staged": ["receiver/deliver"]}, MANAGER)
    oid = view.id
    d.desk.accept(oid, worker)
    d.desk.start(oid, worker)
    ref = hold(d.store, oid, "receiver/deliver", {f"key {MARK}": f"value {MARK}",
                                                  "nested": {"see": f"x/{MARK}#1"}})
    d.desk.report(oid, worker, {
        "status": "done", "result": {"summary": f"summary {MARK}", "output": {MARK: MARK}},
        "evidence": [{"criterion": "c1", "type": "tool_call", "ref": ref},
                     {"criterion": "c1", "type": "note", "note": f"note {MARK}"}],
        "cost": {"usd": 0, "tool_calls": 1}, "tools_used": ["receiver/deliver"],
        "effects": [{"ref": ref, "tool": "receiver/deliver",
                     "arguments": {f"key {MARK}": f"value {MARK}",
                                   "nested": {"see": f"x/{MARK}#1"}}}]})
    client = signed_in(d, MANAGER)
    csrf = csrf_of(client)
    done = client.post(f"/order/review?id={_q(oid)}",
                       data={"csrf": csrf, "decision": "approve", "effect": [ref, MARK]})
    assert done.status_code == 400  # MARK is no effect of the order; the refusal is a page
    pages = {"refusal": done.text}
    client.post(f"/order/review?id={_q(oid)}", data={"csrf": csrf, "decision": "approve",
                                                     "none": "1"})
    at = "2030-01-01T00:00:00Z"
    d.store.set_effect(oid, ref, expect=["held"], state="dispatching", count_dispatch=True,
                       at=at)
    d.store.set_effect(oid, ref, expect=["dispatching"], state="unknown",
                       result={"content": [{"type": "text", "text": f"result {MARK}"}]},
                       error=f"error {MARK}", at=at)
    pages["inbox"] = client.get("/").text
    pages["order"] = client.get(f"/order?id={_q(oid)}").text
    pages["call"] = client.get(f"/order/call?id={_q(oid)}&ref={_q(ref)}").text
    settled = client.post(f"/order/settle?id={_q(oid)}", data={
        "csrf": csrf, "ref": ref, "verdict": "did_not_happen", "evidence": f"seen {MARK}"})
    assert settled.status_code == 303, settled.text[:300]
    pages["settled order"] = client.get(f"/order?id={_q(oid)}").text
    pages["track"] = client.get(f"/worker?name={_q(worker)}").text
    pages["missing order"] = client.get(f"/order?id={_q(MARK)}").text
    for name, page in pages.items():
        assert "ZQ" in page, name  # shown...
        for raw in ('ZQ"', "ZQ'", "<x-evil"):  # ...as text, in every context
            assert raw not in page, (name, raw)
    every = "".join(pages.values())
    for shown in ("goal", "summary", "note", "criterion", "error", "seen"):
        assert f"{shown} ZQ&#34;ZQ&#39;ZQ&lt;x-evil onclick=1&gt;&amp;amp;" in every, shown
    for shown in ("value", "result"):  # inside JSON, its quote escaped first
        assert f"{shown} ZQ\\&#34;ZQ&#39;ZQ&lt;x-evil onclick=1&gt;&amp;amp;" in every, shown


def _q(text: str) -> str:
    return quote(text, safe="")


def _form(page: str, button: str) -> dict[str, str]:
    """The hidden fields of the form holding the button of this id, as the page sent it."""
    end = page.index(f'id="{button}"')
    start = page.rindex("<form ", 0, end)
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">',
                           page[start:end]))


def _confirmed(form: dict[str, str]) -> dict[str, str]:
    """The approve-all form as its script sends it once asked (BIND-24)."""
    return {**form, "confirmed": form["count"]}


@pytest.mark.spec("BIND-11")
def test_a_stale_page_approves_nothing_of_a_later_attempt(tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, CALLS)
    client = signed_in(d, MANAGER)
    stale = client.get(f"/order?id={oid}").text
    approve_all, rework = _confirmed(_form(stale, "approve-all")), _form(stale, "rework")
    assert approve_all["attempt"] == rework["attempt"] == "1"
    # Sent back from another door (the CLI, another tab), and submitted again with other
    # held calls that this page never showed.
    d.desk.review(oid, MANAGER, "rework", "address the team instead")
    later = [("receiver/deliver", {"to": "everyone@example.com", "body": "unseen"})]
    refs = [hold(d.store, oid, tool, arguments, attempt=2) for tool, arguments in later]
    d.desk.report(oid, WORKER, report_doc(
        [{"ref": r, "tool": t, "arguments": a} for r, (t, a) in zip(refs, later, strict=True)],
        ["receiver/deliver"], refs[0]))
    for form in (approve_all, {**rework, "reason": "again"}):
        refused = client.post(f"/order/review?id={oid}", data=form)
        assert refused.status_code == 409, refused.text[:300]
        assert ("you reviewed attempt 1 of order" in refused.text
                and "its report now is attempt 2&#39;s; read the order again" in refused.text)
    view = d.desk.get(oid)
    assert (view.state, view.attempt, view.latest_review and view.latest_review.attempt) == (
        "submitted", 2, 1)
    fresh = _confirmed(_form(client.get(f"/order?id={oid}").text, "approve-all"))
    assert fresh["attempt"] == "2"
    assert client.post(f"/order/review?id={oid}", data=fresh).status_code == 303
    assert d.desk.get(oid).state == "approved"
    odd = client.post(f"/order/review?id={oid}", data={**fresh, "attempt": "one"})
    assert odd.status_code == 400 and "attempt must be a whole number" in odd.text


@pytest.mark.slow
@pytest.mark.spec("BIND-11")
def test_a_second_commit_while_one_runs_is_refused_and_the_page_still_follows_the_first(
        tmp_path: Path) -> None:
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, CALLS)
    d.desk.review(oid, MANAGER, "approve")
    d.control.write_text(json.dumps({"delay": 1.5}), encoding="utf-8")
    client = signed_in(d, MANAGER, upstream=True)
    csrf = csrf_of(client)
    first: dict[str, Any] = {}
    running = threading.Thread(target=lambda: first.setdefault(
        "answer", client.post(f"/order/commit?id={oid}", data={"csrf": csrf})))
    running.start()
    try:
        end = time.monotonic() + 20
        while d.store.effects(oid)[0].state != "dispatching":
            assert time.monotonic() < end
            time.sleep(0.05)
        again = client.post(f"/order/commit?id={oid}", data={"csrf": csrf})
        assert again.status_code == 409 and "is running already" in again.text
        page = client.get(f"/order?id={oid}").text
        assert 'id="committing"' in page  # the first still runs, and the page says so
    finally:
        running.join(timeout=60)
    assert first["answer"].status_code == 303
    assert [(e.state, e.dispatches) for e in d.store.effects(oid)] == [("committed", 1)] * 2


@pytest.mark.spec("BIND-11", "SEC-4")
def test_a_commit_that_fails_unexpectedly_is_said_on_the_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The commit runs after the answer; only the desk's own errors were caught, so any
    other failure was a server traceback and the page never said what happened (nor let
    the order be committed again: it stayed "running"). The commit itself is replaced here:
    what is tested is what the page does when it fails."""
    from awl.web import _app

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the pool fell over\nbadly")

    monkeypatch.setattr(_app, "commit", broken)
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, CALLS)
    d.desk.review(oid, MANAGER, "approve")
    client = signed_in(d, MANAGER, upstream=True)
    answer = client.post(f"/order/commit?id={oid}", data={"csrf": csrf_of(client)})
    assert answer.status_code == 303
    page = client.get(f"/order?id={oid}").text
    assert "the commit failed unexpectedly (RuntimeError: the pool fell over badly)" in page
    assert 'id="committing"' not in page
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    again = client.post(f"/order/commit?id={oid}", data={"csrf": csrf_of(client)})
    assert again.status_code == 303  # not refused as still running
