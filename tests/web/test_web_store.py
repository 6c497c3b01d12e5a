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
