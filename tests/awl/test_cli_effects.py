"""`awl effects list` shows what became of each held call, whatever shape its result has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from awl.cli import main
from awl.desk import Desk
from awl.store.sqlite import SQLiteStore
from tests.awl.server_support import MANAGER, WORKER, hold_call, order_fields


def test_effects_list_shows_a_text_only_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A committed effect whose upstream answered with text only (a git commit hash) shows
    that text; one with structured content shows the structured content."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    desk = Desk(store)
    oid = desk.create(order_fields(staged=["mail/send"]), MANAGER).id
    desk.accept(oid, WORKER)
    desk.start(oid, WORKER)
    answers: dict[str, dict[str, Any]] = {
        "text": {"content": [{"type": "text", "text": "committed 3f2a9c1\nmain"}]},
        "structured": {"content": [{"type": "text", "text": "{}"}],
                       "structuredContent": {"id": 7}},
    }
    for kind, result in answers.items():
        ref = hold_call(store, oid, 1, "mail/send", {"kind": kind}).ref
        at = "2030-01-01T00:00:00Z"
        store.set_effect(oid, ref, expect=["held"], state="dispatching", count_dispatch=True,
                         at=at)
        store.set_effect(oid, ref, expect=["dispatching"], state="committed",
                         result=result, at=at)
    store.close()
    assert main(["effects", "list", oid, "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "  result: committed 3f2a9c1 main\n" in out
    assert '  result: {"id": 7}\n' in out
