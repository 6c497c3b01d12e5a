"""The approval page started with ``--store``: the commands it shows name that store."""

from __future__ import annotations

import html
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from awl.desk.tokens import issue_token
from awl.web import Sessions, WebConfig, build_app
from tests.web.web_support import MANAGER, make_desk, submit_order


@pytest.mark.spec("BIND-16")
def test_the_commit_command_names_the_store_with_its_password_hidden(tmp_path: Path) -> None:
    """An approved order's page shows `awl gateway ... --store URL --commit`, no password."""
    d = make_desk(tmp_path)
    oid, _ = submit_order(d, [("receiver/deliver", {"to": "cfo"})])
    d.desk.review(oid, MANAGER, "approve")
    config = WebConfig(upstream_path="upstream.json", home="desk-home",
                       store="postgresql://ana:s3cret@db.example/awl")
    client = TestClient(build_app(d.store, Sessions(), config, desk=d.desk),
                        follow_redirects=False)
    assert client.post("/signin", data={"token": issue_token(d.store, MANAGER)}).status_code == 303
    page = client.get(f"/order?id={oid}").text
    assert "s3cret" not in page
    command = html.unescape(page.split('<pre id="commit-command">')[1].split("</pre>")[0])
    assert command == (f"awl gateway --order {oid} --config upstream.json --home desk-home "
                       "--store 'postgresql://ana:***@db.example/awl' --commit")


def test_a_desk_that_fails_while_the_page_serves_is_503_in_words_and_one_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A real SQLite desk damaged under a running page: the inbox and an order's page answer
    503 "The desk cannot be reached" with the store's own line (what failed, what to do),
    never a traceback, and the operator's log gets that line once per request."""
    import logging

    from awl import Desk, SQLiteStore
    from tests.awl.desk_support import order_fields

    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as setup:
        ids = [Desk(setup).create(order_fields(goal=f"order {i} " + "x" * 400), MANAGER).id
               for i in range(60)]
        setup.checkpoint()
    store = SQLiteStore(path)
    try:
        client = TestClient(build_app(store, Sessions(), WebConfig(), desk=Desk(store)),
                            follow_redirects=False, raise_server_exceptions=True)
        assert client.post("/signin", data={
            "token": issue_token(store, MANAGER)}).status_code == 303
        data = path.read_bytes()
        page = data.index(b'"goal":"order 30 ') // 4096
        with path.open("r+b") as file:  # the rows of some orders overwritten with garbage
            file.seek(page * 4096 + 8)
            file.write(b"\xa5" * 4000)
        caplog.set_level(logging.WARNING, logger="awl.web")
        answers = [client.get("/")] + [client.get("/order", params={"id": i}) for i in ids]
        failed = [a for a in answers if a.status_code != 200]
        assert failed, "the damage was not met"
        for answer in failed:
            assert answer.status_code == 503, answer.text[-500:]
            assert "<h1>The desk cannot be reached</h1>" in answer.text
            assert str(path) in html.unescape(answer.text) and "damaged" in answer.text
            assert "Traceback" not in answer.text
        lines = [r.getMessage() for r in caplog.records if r.name == "awl.web"]
        assert len(lines) == len(failed)
        assert all(line.startswith("awl web: GET /") and "\n" not in line for line in lines)
    finally:
        store.close()
