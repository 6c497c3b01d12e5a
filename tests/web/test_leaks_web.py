"""What the approval page keeps of browsers that went away: the notes an action leaves for
the session's next page ("cancelled", "approved with …") must not outlive the session nor
pile up from sessions that never show another page, and a connection that never finishes
its request must not hold its socket."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from awl.desk.tokens import issue_token
from awl.documents.models import format_time
from awl.web import Sessions, WebConfig
from awl.web import _app as web_app
from awl.web._app import ApprovalPage
from awl.web._links import order_url
from tests.awl.server_support import ROOT
from tests.web.web_support import MANAGER, WORKER, Desked, csrf_of, make_desk


def _order(d: Desked) -> str:
    return d.desk.create({
        "to": WORKER, "goal": "g", "criteria": [{"id": "c1", "text": "done"}],
        "budget": {"tool_calls": 1}, "tools": [],
        "deadline": format_time(datetime.now(UTC) + timedelta(hours=2))}, MANAGER).id


def _cancel_once(app: Any, token: str, order_id: str, *, sign_out: bool) -> None:
    """A browser signs in, cancels an order and leaves without opening the order page the
    answer redirects to (signing out first, or not)."""
    client = TestClient(app, follow_redirects=False)
    assert client.post("/signin", data={"token": token}).status_code == 303
    csrf = csrf_of(client)
    done = client.post(order_url(order_id, "cancel"),
                       data={"csrf": csrf, "reason": "no longer needed"})
    assert done.status_code == 303, done.text
    if sign_out:
        assert client.post("/signout", data={"csrf": csrf}).status_code == 303


@pytest.mark.spec("SEC-13")
def test_notes_of_sessions_that_never_show_another_page_do_not_pile_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each action's note was kept until the session's next page: a session that signed
    out right after acting, or never came back, left it for as long as the page ran (here
    100 + 150 notes, one per session). Now signing out drops a session's notes, and only
    the latest sessions' notes are kept (here 50)."""
    monkeypatch.setattr(web_app, "FLASH_SESSIONS", 50, raising=False)
    d = make_desk(tmp_path)
    token = issue_token(d.store, MANAGER)
    page = ApprovalPage(d.store, Sessions(), WebConfig(), desk=d.desk)
    app = Starlette(routes=page.routes())
    flashes = page.flashes
    for _ in range(100):
        _cancel_once(app, token, _order(d), sign_out=True)
    after_sign_outs = len(flashes)
    for _ in range(150):
        _cancel_once(app, token, _order(d), sign_out=False)
    assert after_sign_outs == 0, f"{after_sign_outs} signed-out sessions' notes kept"
    assert len(flashes) <= 50, f"{len(flashes)} sessions' notes kept"
    assert all(notes == ["cancelled"] for notes in flashes.values())


# `awl web` as the command runs it, with its deadline for a request's head shortened so the
# test need not wait the real 30 seconds.
_WEB = textwrap.dedent("""
    import sys
    from awl.mcp import transport
    from awl.cli import main
    transport.HEAD_SECONDS = 0.5
    sys.exit(main(["web", "--listen", "127.0.0.1:0", "--no-notify", "--home", sys.argv[1]]))
""")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir() and not os.environ.get("CI"),
                    reason="counts /proc/PID/fd")
@pytest.mark.spec("SEC-13")
def test_awl_web_closes_connections_that_never_send_a_whole_request_head(
        tmp_path: Path) -> None:
    """A browser that crashes or loses its network mid-request leaves a connection that
    sends nothing more. uvicorn closes none that have not finished a request head, so each
    held a descriptor for as long as the page ran, until it could accept no one. Now each
    is closed once its head is late, the descriptors come back, and the page still
    serves."""
    d = make_desk(tmp_path)
    d.store.close()
    log = tmp_path / "web.log"
    with log.open("w", encoding="utf-8") as sink, subprocess.Popen(
            [sys.executable, "-c", _WEB, str(d.home)], stderr=sink,
            env={**os.environ, "PYTHONPATH": str(ROOT)}) as web:
        try:
            end = time.monotonic() + 30
            while (found := re.search(r"http://127\.0\.0\.1:(\d+)/",
                                      log.read_text(encoding="utf-8"))) is None:
                assert web.poll() is None and time.monotonic() < end, log.read_text()
                time.sleep(0.05)
            port = int(found.group(1))
            before = _fds(web.pid)
            half = b"GET /signin HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Ag"
            held = []
            for sent in [b""] * 150 + [half] * 150:
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(sent)
                held.append(sock)
            try:
                deadline = time.monotonic() + 20
                while _fds(web.pid) > before + 30 and time.monotonic() < deadline:
                    time.sleep(0.2)
                after = _fds(web.pid)
                # The page closed them: each reads the end of its stream.
                for sock in held[:5] + held[-5:]:
                    sock.settimeout(5)
                    assert sock.recv(1) == b""
            finally:
                for sock in held:
                    sock.close()
            assert after <= before + 30, f"{after - before} descriptors more than at the start"
            assert httpx2.get(f"http://127.0.0.1:{port}/signin", timeout=10).status_code == 200
        finally:
            web.terminate()
            web.wait(timeout=10)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))
