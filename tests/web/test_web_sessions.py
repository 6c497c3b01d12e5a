"""Sessions of the approval page live in the desk's store (BIND-9): real ``awl web``
processes, driven over HTTP with cookies, in front of one SQLite file or one PostgreSQL
schema. A restart keeps a manager signed in, two processes share a session, a session
signed out on one is refused by the other (a stolen cookie gets nothing), and the store holds
only the hash of the session id."""

from __future__ import annotations

import http.client
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest

from awl.desk.desk import Desk
from awl.desk.tokens import token_hash
from awl.store.urls import open_store
from tests.gateway.commit_support import ROOT
from tests.web.web_support import MANAGER, Desked, make_desk, submit_order

pytestmark = pytest.mark.slow

COOKIE = "awl_session"


@contextmanager
def awl_web(d: Desked, store: str | None, log: Path) -> Iterator[tuple[str, str]]:
    """A running ``awl web --as MANAGER`` on the desk: its base URL and its sign-in link."""
    command = [str(Path(sys.executable).with_name("awl")), "web", "--listen", "127.0.0.1:0",
               "--as", MANAGER, "--home", str(d.home)]
    if store is not None:
        command += ["--store", store]
    with log.open("w", encoding="utf-8") as sink:
        process = subprocess.Popen(command, stderr=sink,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        end = time.monotonic() + 30
        while (found := re.search(r"(http://\S+)/signin\?code=(\S+)",
                                  log.read_text(encoding="utf-8"))) is None:
            assert process.poll() is None and time.monotonic() < end, log.read_text()
            time.sleep(0.05)
        yield found.group(1), found.group(0)
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass
class Answer:
    status_code: int
    text: str
    cookie: str | None
    """The session cookie the answer sets, if any."""


def _http(method: str, url: str, *, cookie: str | None = None,
          form: dict[str, str] | None = None) -> Answer:
    """One request, redirects not followed, the session cookie sent when given."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    headers = {"Host": parts.netloc}
    if cookie is not None:
        headers["Cookie"] = f"{COOKIE}={cookie}"
    body = None
    if form is not None:
        body = urlencode(form)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""),
                     body=body, headers=headers)
        response = conn.getresponse()
        found = re.search(rf"{COOKIE}=([^;]+)", response.getheader("set-cookie") or "")
        return Answer(response.status, response.read().decode("utf-8"),
                      found.group(1) if found else None)
    finally:
        conn.close()


def _page(base: str, cookie: str) -> Answer:
    return _http("GET", f"{base}/", cookie=cookie)


def _csrf(page: Answer) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, page.text
    return found.group(1)


def _rows(d: Desked, store: str | None, *, files: bool = True) -> list[str]:
    """Every value of every row of every table the store holds, as text; with ``files``,
    for SQLite, every byte of the desk file and its journals too."""
    if store is None:
        conn = sqlite3.connect(d.home / "desk.sqlite3")
        raw = [p.read_bytes().decode("latin-1") for p in d.home.glob("desk.sqlite3*")
               if files]
        try:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
            return raw + [str(v) for t in tables for row in conn.execute(f"SELECT * FROM {t}")
                            for v in row]
        finally:
            conn.close()
    import psycopg
    with psycopg.connect(store) as pg:
        tables = [r[0] for r in pg.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        return [str(row[0]) for t in tables
                for row in pg.execute(f"SELECT t::text FROM {t} AS t")]


@pytest.mark.spec("BIND-19", "BIND-9", "BIND-10")
def test_a_session_outlives_a_restart_is_shared_and_ends_everywhere_on_sign_out(
        tmp_path: Path, store_url: str | None) -> None:
    d = make_desk(tmp_path)
    if store_url is not None:
        d.store.close()
        store = open_store(store_url)
        d = Desked(d.home, store, Desk(store), d.config, d.log, d.control)
    oid, _ = submit_order(d, [("receiver/deliver", {"to": "a@example.com", "body": "hi"})])
    logs = [tmp_path / f"web{i}.log" for i in range(3)]

    with awl_web(d, store_url, logs[0]) as (base, signin):
        answer = _http("GET", signin)
        assert answer.status_code == 303 and answer.cookie is not None
        cookie = answer.cookie
        assert MANAGER in _page(base, cookie).text
    # The first process is gone; the session is not.
    with (awl_web(d, store_url, logs[1]) as (again, _),
          awl_web(d, store_url, logs[2]) as (other, _)):
        restarted, shared = _page(again, cookie), _page(other, cookie)
        assert restarted.status_code == 200 and MANAGER in restarted.text
        assert shared.status_code == 200 and _csrf(shared) == _csrf(restarted)
        csrf = _csrf(shared)

        kept = "\n".join(_rows(d, store_url))
        assert cookie not in kept and token_hash(cookie) in kept

        out = _http("POST", f"{other}/signout", cookie=cookie, form={"csrf": csrf})
        assert out.status_code == 303
        # The same cookie, replayed on the other process after the sign-out: nothing.
        assert _page(again, cookie).status_code == 303
        stolen = _http("POST", f"{again}/order/cancel?id={oid}", cookie=cookie,
                       form={"csrf": csrf, "reason": "stolen"})
        assert stolen.status_code == 403 and "not signed in" in stolen.text
    assert token_hash(cookie) not in "\n".join(_rows(d, store_url, files=False))
    assert d.store.load(oid).state == "submitted"
    d.store.close()
