"""Shared helpers for the approval page's tests: a desk with a submitted order whose report
lists held calls (written the way the gateway writes them), and a signed-in client."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from awl.desk import Desk
from awl.desk.tokens import issue_token
from awl.documents.models import format_time
from awl.store.protocol import Store
from awl.store.sqlite import SQLiteStore
from awl.web import Sessions, WebConfig, build_app
from tests.gateway.commit_support import MANAGER, WORKER, hold, report_doc, write_config

__all__ = ["MANAGER", "WORKER", "Desked", "csrf_of", "make_desk", "signed_in", "submit_order"]


@dataclass
class Desked:
    """A fresh desk home with a receiver config beside it."""

    home: Path
    store: Store
    desk: Desk
    config: Path
    log: Path
    control: Path


def make_desk(folder: Path) -> Desked:
    """A desk in ``folder/home`` and an upstream config naming the receiver."""
    home = folder / "home"
    home.mkdir(parents=True, exist_ok=True)
    store = SQLiteStore(home / "desk.sqlite3")
    log, control = folder / "receiver.jsonl", folder / "receiver-control.json"
    control.write_text("{}", encoding="utf-8")
    return Desked(home, store, Desk(store), write_config(folder, log, control), log, control)


def submit_order(d: Desked, calls: list[tuple[str, dict[str, Any]]], *,
                 goal: str = "Send the held messages",
                 order_id: str | None = None) -> tuple[str, list[str]]:
    """Create (with ``order_id`` if given), accept and start an order, hold ``calls`` and
    submit a report listing them."""
    view = d.desk.create({**({"id": order_id} if order_id else {}),
        "to": WORKER, "goal": goal,
        "criteria": [{"id": "c1", "text": "messages sent"}],
        "budget": {"usd": 5, "tool_calls": 50},
        "deadline": format_time(datetime.now(UTC) + timedelta(hours=2)),
        "tools": ["receiver/*"], "staged": ["receiver/deliver", "receiver/create_issue"],
    }, MANAGER)
    oid = view.id
    d.desk.accept(oid, WORKER)
    d.desk.start(oid, WORKER)
    refs = [hold(d.store, oid, tool, arguments) for tool, arguments in calls]
    effects = [{"ref": r, "tool": t, "arguments": a}
               for r, (t, a) in zip(refs, calls, strict=True)]
    d.desk.report(oid, WORKER, report_doc(effects, [t for t, _ in calls],
                                          refs[0] if refs else None))
    return oid, refs


def signed_in(d: Desked, principal: str, *, upstream: bool = False,
              sessions: Sessions | None = None) -> TestClient:
    """A test client signed in as ``principal`` with a desk token."""
    config = None
    if upstream:
        from gateway._config import load_config
        config = load_config(str(d.config))
    app = build_app(d.store, sessions or Sessions(),
                    WebConfig(upstream=config, upstream_path=str(d.config)), desk=d.desk)
    client = TestClient(app, follow_redirects=False)
    token = issue_token(d.store, principal)
    response = client.post("/signin", data={"token": token})
    assert response.status_code == 303, response.text
    return client


def csrf_of(client: TestClient, path: str = "/") -> str:
    """The CSRF token a page of this session carries."""
    import re
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(path).text)
    assert found is not None
    return found.group(1)
