"""The display rule (SPEC SEC-14): what a manager is shown of worker-written text, by every
door that is not the page (the page's own tests are in tests/web): the rule itself, the CLI
(`awl order show`, `awl review`, `awl effects list`), the handoff briefing, and a webhook's
body as a real receiver gets it. What is stored is never changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from awl.cli import main
from awl.desk import Desk
from awl.desk.notify import Deliverer, webhook_store
from awl.documents.display import identifier, look_alike, pieces, scan, visible, warnings
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import MANAGER, WORKER, order_fields, report_fields
from tests.awl.hook_support import Receiver
from tests.awl.server_support import hold_call

RLO = "ceo@\u202emoc.elpmaxe\u202c"
ZWSP = "payroll@exa\u200bmple.com"
CYRILLIC = "p\u0430yroll@example.com"
SPOOFED = (RLO, ZWSP, CYRILLIC)
PLAIN = ("payroll@example.com", "https://example.com/a/b?c=d", "/srv/data/file.txt",
         "caf\u00e9.fr", "\u043f\u0440\u0438\u043c\u0435\u0440.\u0440\u0444",
         "Hello, world.\nA second line\twith a tab.", "Gr\u00fc\u00dfe aus K\u00f6ln")


@pytest.mark.spec("SEC-14")
def test_each_spoofed_recipient_is_marked_and_warned_about() -> None:
    assert visible(RLO) == "ceo@<U+202E>moc.elpmaxe<U+202C>"
    assert visible(ZWSP) == "payroll@exa<U+200B>mple.com"
    assert visible(CYRILLIC) == "p<U+0430>yroll@example.com"
    rlo, zwsp, cyrillic = (warnings(t) for t in SPOOFED)
    assert "U+202E RIGHT-TO-LEFT OVERRIDE" in rlo[0] and "direction" in rlo[0]
    assert not any("looks like" in w for w in rlo)  # reordered text has no honest skeleton
    assert "U+200B ZERO WIDTH SPACE" in zwsp[0]
    assert zwsp[1] == "looks like 'payroll@example.com' but is not that"
    assert cyrillic == ["mixes scripts (Latin, Cyrillic): U+0430 CYRILLIC SMALL LETTER A",
                        "looks like 'payroll@example.com' but is not that"]


@pytest.mark.spec("SEC-14")
@pytest.mark.parametrize("text", PLAIN)
def test_ordinary_text_and_single_script_names_show_as_they_are(text: str) -> None:
    assert visible(text, lines=True) == text
    assert warnings(text) == []


@pytest.mark.spec("SEC-14")
@pytest.mark.parametrize(("char", "kind"), [
    ("\u2066", "bidi"), ("\u200f", "bidi"), ("\u061c", "bidi"), ("\ufeff", "zero-width"),
    ("\u2060", "zero-width"), ("\u00ad", "format"), ("\U000e0041", "format"),
    ("\ufe0f", "format"), ("\u3164", "format"), ("\u2028", "format"), ("\x1b", "control"),
    ("\x00", "control")])
def test_every_kind_of_hidden_character_is_marked(char: str, kind: str) -> None:
    marks = [p for p in pieces(f"a{char}b c") if not isinstance(p, str)]
    assert [(m.char, m.kind, m.code) for m in marks] == [(char, kind, f"U+{ord(char):04X}")]
    assert warnings(f"a{char}b c")  # and said in words


@pytest.mark.spec("SEC-14")
def test_identifiers_get_odd_spaces_and_compatibility_forms_flagged() -> None:
    assert identifier("x@y.com") and not identifier("two words") and not identifier("")
    assert visible("x\u00a0y@z.com") == "x<U+00A0>y@z.com"
    assert visible("two\u00a0words in prose") == "two\u00a0words in prose"
    fullwidth = "\uff45xample.com"
    assert look_alike(fullwidth) == "example.com"
    assert warnings(fullwidth) == ["looks like 'example.com' but is not that"]
    greek = "\u03bfpenai.com"  # Greek omicron
    assert "mixes scripts (Greek, Latin)" in warnings(greek)[0] or \
        "mixes scripts (Latin, Greek)" in warnings(greek)[0]


@pytest.mark.spec("SEC-14")
def test_scan_names_where_each_flagged_string_is_keys_included() -> None:
    flags = scan({"to": [CYRILLIC], "cc": "fine@example.com", f"b{chr(0x200b)}cc": "x"})
    assert {f.where for f in flags} == {"/to/0", "/b\u200bcc"}
    assert any(f.line().startswith("at /b\u200bcc: the name of this field hidden") for f in flags)


def _submit(desk: Desk, recipients: tuple[str, ...] = SPOOFED) -> tuple[str, list[str]]:
    """A submitted order whose goal hides a zero-width space, its report asking to send
    one message to each of ``recipients``."""
    oid = desk.create(order_fields(goal=f"Tell {ZWSP} and the team"), MANAGER).id
    desk.accept(oid, WORKER)
    desk.start(oid, WORKER)
    refs = [hold_call(desk.store, oid, 1, "mail/send", {"to": to, "body": "hi"}).ref
            for to in recipients]
    desk.report(oid, WORKER, {**report_fields(), "effects": [
        {"ref": r, "tool": "mail/send", "arguments": {"to": to, "body": "hi"}}
        for r, to in zip(refs, recipients, strict=True)], "tools_used": ["mail/send"]})
    return oid, refs


def _submitted(tmp_path: Path) -> tuple[Desk, str, list[str]]:
    desk = Desk(SQLiteStore(tmp_path / "desk.sqlite3"))
    return (desk, *_submit(desk))


@pytest.mark.spec("SEC-14")
def test_the_cli_shows_marks_and_warnings_and_json_stays_exact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    desk, oid, refs = _submitted(tmp_path)
    desk.store.close()
    home = ["--home", str(tmp_path)]
    assert main(["order", "show", oid, *home]) == 0
    shown = capsys.readouterr().out
    assert f"goal: Tell {visible(ZWSP)} and the team" in shown
    for ref, to in zip(refs, SPOOFED, strict=True):
        assert f'effect {ref}: {{"to": "{visible(to)}", "body": "hi"}}' in shown
    assert "warning at /to: mixes scripts (Latin, Cyrillic)" in shown
    assert shown.count("warning at /to: looks like 'payroll@example.com'") == 2
    assert "\u202e" not in shown and "\u200b" not in shown
    assert main(["effects", "list", oid, *home]) == 0
    listed = capsys.readouterr().out
    assert f'  arguments: {{"to": "{visible(RLO)}", "body": "hi"}}' in listed
    assert "  warning at /to: hidden characters U+202E RIGHT-TO-LEFT OVERRIDE" in listed
    assert main(["effects", "list", oid, *home, "--json"]) == 0  # the exact bytes
    exact = json.loads(capsys.readouterr().out)
    assert [e["arguments"]["to"] for e in exact["effects"]] == list(SPOOFED)
    assert main(["review", oid, "--approve", "--effects", refs[2], "--as", MANAGER, *home]) == 0
    said = capsys.readouterr()
    assert f"awl: {refs[2]}: warning at /to: mixes scripts" in said.err
    assert refs[0] not in said.err  # not approved, not warned about here
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        report = Desk(store).get(oid).latest_report
        assert report is not None and report.effects is not None
        assert [e.arguments["to"] for e in report.effects] == list(SPOOFED)


@pytest.mark.spec("SEC-14")
def test_the_briefing_marks_hidden_characters(tmp_path: Path) -> None:
    desk, oid, _ = _submitted(tmp_path)
    text = desk.handoff(oid)
    assert f"Tell {visible(ZWSP)} and the team" in text and "\u200b" not in text
    desk.store.close()


@pytest.mark.spec("SEC-14")
def test_a_webhook_body_keeps_its_fields_exact_and_adds_what_to_show(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    desk = Desk(store)
    with Receiver() as receiver:
        desk.add_webhook(receiver.url, "submitted")
        plain = desk.create(order_fields(), MANAGER).id
        for oid in (plain,):
            desk.accept(oid, WORKER)
            desk.start(oid, WORKER)
            desk.report(oid, WORKER, report_fields())
        spoofed, _ = _submit(desk, (CYRILLIC,))
        deliverer = Deliverer(webhook_store(store))
        while desk.notifications(state="pending"):
            deliverer.deliver_due()
        bodies = {b["data"]["order_id"]: b["data"] for b in
                  (r.json() for r in receiver.wait_for(2))}
    assert "display" not in bodies[plain] and "warnings" not in bodies[plain]
    data = bodies[spoofed]
    assert data["goal"] == f"Tell {ZWSP} and the team"  # exact
    assert data["display"] == {"goal": f"Tell {visible(ZWSP)} and the team"}
    assert data["warnings"] == [f"goal: {warnings(data['goal'])[0]}"]
    store.close()


@pytest.mark.spec("BIND-25")
def test_order_show_says_what_the_approval_sends_and_drops_until_the_commit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    desk, oid, refs = _submitted(tmp_path)
    desk.review(oid, MANAGER, "approve", effects=[refs[1]])
    assert main(["order", "show", oid, "--home", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert (f"until the commit runs:\n  the approval covers 1: {refs[1]} (mail/send) (sent by "
            f"the commit)\n  it drops 2: {refs[0]} (mail/send), {refs[2]} (mail/send) (never "
            "sent)\n") in shown
    at = "2030-01-01T00:00:00Z"
    for ref in refs:  # as the commit leaves them
        desk.store.set_effect(oid, ref, expect=["held"], state="dropped" if ref != refs[1]
                              else "dispatching", at=at)
    assert main(["order", "show", oid, "--home", str(tmp_path)]) == 0
    assert "until the commit runs" not in capsys.readouterr().out
    desk.store.close()
