"""Rule ids follow the published AWL's, and findings stored under the old ids read under the
new ones (SPEC.md section 18.2)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from awl import Desk
from awl.cli import main
from awl.documents.models import Event
from awl.documents.rule_ids import RETIRED, current_findings_note, current_rule
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import MANAGER, WORKER, Clock, report_fields, working
from tests.test_conformance_suite import SPEC, spec_ids


def test_every_retired_id_is_no_rule_now_and_maps_to_one() -> None:
    """An old id that is mapped names no rule of today (so a stored finding under it cannot
    mean a rule of today), and the id it maps to is one."""
    defined = set(spec_ids(SPEC.read_text(encoding="utf-8")))
    assert not set(RETIRED) & defined
    assert set(RETIRED.values()) <= defined
    assert current_rule("R20") == "RX6" and current_rule("R7") == "R7"
    assert current_findings_note("R20 /cost/tokens: short; R7 /cost/usd: over") == (
        "RX6 /cost/tokens: short; R7 /cost/usd: over")
    assert current_findings_note("R200 apples; see R20") == "R200 apples; see R20"


@pytest.mark.spec("RX6", "LC-7")
def test_an_expire_event_stored_under_old_ids_reads_under_the_new(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An expire event a desk wrote before the ids changed (its findings and its note name
    R20) reads as RX6 from the store, and `awl order show` prints RX6; the stored text itself
    is left as it was."""
    path = tmp_path / "desk.sqlite3"
    store = SQLiteStore(path)
    desk = Desk(store, clock=Clock())
    view = working(desk)
    expired = desk.report(view.id, WORKER, report_fields(cost={"usd": 11, "tool_calls": 7}))
    assert expired.state == "expired"
    store.close()
    with sqlite3.connect(path) as conn:
        [(seq, doc)] = conn.execute(
            "SELECT seq, doc FROM events WHERE order_id = ? AND doc LIKE '%\"expire\"%'",
            (view.id,)).fetchall()
        old = json.loads(doc)
        old["data"]["findings"].insert(0, {"rule": "R20", "kind": "limit",
                                           "path": "/cost/tokens",
                                           "message": "tokens spent 1 is less than the 2"})
        old["note"] = "R20 /cost/tokens: tokens spent 1 is less than the 2; " + old["note"]
        conn.execute("UPDATE events SET doc = ? WHERE order_id = ? AND seq = ?",
                     (json.dumps(old), view.id, seq))
    reopened = SQLiteStore(path)
    try:
        last = reopened.events(view.id)[-1]
        assert isinstance(last, Event) and last.data is not None
        assert [f["rule"] for f in last.data["findings"]] == ["RX6", "R7"]
        assert last.note is not None and last.note.startswith("RX6 /cost/tokens: ")
    finally:
        reopened.close()
    monkeypatch.setenv("AWL_HOME", str(tmp_path))
    assert main(["order", "show", view.id, "--as", MANAGER]) == 0
    out = capsys.readouterr().out
    assert "expire (working → expired): RX6 /cost/tokens: tokens spent 1" in out
    with sqlite3.connect(path) as conn:
        [(doc,)] = conn.execute("SELECT doc FROM events WHERE order_id = ? AND seq = ?",
                                (view.id, seq)).fetchall()
    assert '"R20"' in doc
