"""`awl effects list` shows what became of each held call, whatever shape its result has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from awl.cli import main
from awl.desk import Desk
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import effect, submitted
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


def test_settle_and_retry_act_as_awl_actor_and_the_sends_are_counted_in_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`effects settle` and `effects retry` take $AWL_ACTOR when --as is left out, as every
    other command does (they required --as); naming nobody is one line. The list says how
    often a request went out in words ("sent 2x" read as two messages at the receiver)."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    desk = Desk(store)
    oid = submitted(desk, effects=[effect(1)]).id
    desk.review(oid, MANAGER, "approve")
    ref = "mail/send#1"
    at = "2030-01-01T00:00:00Z"
    store.set_effect(oid, ref, expect=["held"], state="dispatching", count_dispatch=True, at=at)
    store.set_effect(oid, ref, expect=["dispatching"], state="unknown", error="cut off", at=at)
    store.close()
    home = ["--home", str(tmp_path)]
    monkeypatch.delenv("AWL_ACTOR", raising=False)
    assert main(["effects", "list", oid, *home]) == 0
    assert f"{ref}  unknown  attempt 1  sent once\n" in capsys.readouterr().out
    for words in (["effects", "settle", oid, ref, "--did-not-happen", "--evidence", "no log"],
                  ["effects", "retry", oid, ref, "--config", str(tmp_path / "none.json")]):
        assert main([*words, *home]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1
        assert err.startswith("awl: who is acting? pass --as PRINCIPAL") and "AWL_ACTOR" in err
    monkeypatch.setenv("AWL_ACTOR", MANAGER)
    assert main(["effects", "settle", oid, ref, "--did-not-happen", "--evidence", "not in the "
                 "mail server's log", *home]) == 0
    assert "may now be retried" in capsys.readouterr().out
    with SQLiteStore(tmp_path / "desk.sqlite3") as again:
        [settled] = [e for e in again.effects(oid) if e.ref == ref]
        assert settled.settlement is not None and settled.settlement.by == MANAGER
        # A retry dispatches it again (tests/gateway/test_commit.py runs real ones).
        again.set_effect(oid, ref, expect=["unknown"], state="dispatching",
                         count_dispatch=True, at=at)
    assert main(["effects", "list", oid, *home]) == 0
    assert ("sent 2 times: retried after 1 send settled as did-not-happen"
            in capsys.readouterr().out)
