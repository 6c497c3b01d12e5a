"""The manager's and worker's desk commands, called as ``awl.cli.main`` and as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from awl.cli import main
from awl.desk.home import default_store
from tests.awl.desk_support import (
    MANAGER,
    WORKER,
    effect,
    hold_effects,
    order_fields,
    report_fields,
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("AWL_ACTOR", raising=False)
    monkeypatch.setenv("AWL_HOME", str(tmp_path / "home"))
    return tmp_path


def write(folder: Path, name: str, doc: Any) -> str:
    path = folder / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def one_line_error(err: str) -> None:
    assert err.startswith("awl: ")
    assert err.count("\n") == 1, err


def new_order(capsys: pytest.CaptureFixture[str], folder: Path, **fields: Any) -> str:
    created = run_json(capsys, "order", "create", write(folder, "o.json", order_fields(**fields)),
                       "--as", MANAGER)
    order_id: str = created["order"]["id"]
    return order_id


def test_writes_need_an_actor(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --as or AWL_ACTOR a write is refused with a line saying how to name one."""
    code, _, err = run(capsys, "order", "create", write(home, "o.json", order_fields()))
    assert code != 0
    one_line_error(err)
    assert "--as" in err and "AWL_ACTOR" in err


@pytest.mark.slow
def test_an_order_runs_its_course_from_the_command_line(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Create, work, report, review and read an order with the commands alone."""
    order_id = new_order(capsys, home)
    monkeypatch.setenv("AWL_ACTOR", WORKER)  # the worker acts through the environment
    assert run_json(capsys, "work", "accept", order_id)["state"] == "accepted"
    assert run_json(capsys, "work", "start", order_id)["state"] == "working"
    code, out, _ = run(capsys, "work", "progress", order_id, "read the filings",
                       "--percent", "30")
    assert (code, out) == (0, f"noted progress on {order_id}: now working (seq 4)\n")
    effects = [effect(1), effect(2)]
    with closing(default_store()) as store:  # the gateway held the worker's two mails
        hold_effects(store, order_id, effects)
    report = write(home, "r.json", report_fields(effects=effects, tools_used=["mail/send"]))
    assert run_json(capsys, "work", "report", order_id, report)["state"] == "submitted"
    monkeypatch.delenv("AWL_ACTOR")

    code, out, err = run(capsys, "review", order_id, "--approve", "--effects",
                         "mail/send#2", "--as", MANAGER)
    assert code == 0, err
    assert out == f"approved {order_id} (effects: mail/send#2): now approved (seq 6)\n"

    code, out, _ = run(capsys, "order", "show", order_id)
    assert f"{order_id} · approved · attempt 1" in out
    assert "#4 " in out and "(30%): read the filings" in out
    shown = run_json(capsys, "order", "show", order_id)
    assert [e["action"] for e in shown["events"]] == ["create", "accept", "start", "progress",
                                                      "report", "approve"]
    assert shown["reviews"][0]["effects"] == ["mail/send#2"]

    code, out, _ = run(capsys, "order", "list")
    assert out.splitlines()[0].split() == ["ID", "STATE", "WORKER", "MANAGER", "UPDATED",
                                           "GOAL"]
    assert order_id in out
    assert run_json(capsys, "order", "list", "--state", "working") == []
    assert [o["order"]["id"] for o in run_json(capsys, "order", "list", "--worker",
                                                 WORKER)] == [order_id]

    track = run_json(capsys, "track", WORKER)
    assert track["approved_first_time"] == 1
    code, out, _ = run(capsys, "track", WORKER)
    assert "approved first time    1" in out

    code, out, _ = run(capsys, "handoff", order_id)
    assert out.startswith("# Handoff: Summarize the quarterly filings\n")


def test_refusals_are_one_line_and_non_zero(home: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Wrong actor, wrong state, unknown order and unknown effect each fail in one line."""
    order_id = new_order(capsys, home)
    for args in (["work", "accept", order_id, "--as", "agent:mallory"],
                 ["review", order_id, "--approve", "--as", MANAGER],
                 ["order", "show", "wo_missing"],
                 ["cancel", order_id, "done", "--as", WORKER]):
        code, _, err = run(capsys, *args)
        assert code == 1
        one_line_error(err)
    code, _, err = run(capsys, "review", order_id, "--rework", "why", "--effects", "a/b#1",
                       "--as", MANAGER)
    assert code == 2
    one_line_error(err)


@pytest.mark.spec("LC-11")
def test_progress_percent_is_a_whole_number(home: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """--percent takes 40 or 40.0; a fraction, a word or a value past 100 fails in one line
    and posts nothing."""
    order_id = new_order(capsys, home)
    for step in ("accept", "start"):
        run_json(capsys, "work", step, order_id, "--as", WORKER)
    for bad in ("40.5", "forty", "101", "-1", "nan"):
        code, _, err = run(capsys, "work", "progress", order_id, "halfway", "--percent", bad,
                           "--as", WORKER)
        assert code == 2, bad
        one_line_error(err)
        assert "--percent" in err
    shown = run_json(capsys, "work", "progress", order_id, "halfway", "--percent", "40.0",
                     "--as", WORKER)
    assert shown["seq"] == 4
    events = run_json(capsys, "order", "show", order_id)["events"]
    assert [e["data"] for e in events if e["action"] == "progress"] == [{"percent": 40}]


def test_an_invalid_order_prints_its_findings_for_scripts(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --json a refused document's findings go to stdout, the error line to stderr."""
    bad = write(home, "bad.json", order_fields(criteria=[{"id": "c", "text": "a"},
                                                         {"id": "c", "text": "b"}]))
    code, out, err = run(capsys, "order", "create", bad, "--as", MANAGER, "--json")
    assert code == 1
    one_line_error(err)
    assert "VALIDATION_FAILED" in err
    findings = json.loads(out)["findings"]
    assert [(f["rule"], f["path"]) for f in findings] == [("O2", "/criteria/1/id")]
    code, _, err = run(capsys, "order", "create", str(home / "absent.json"), "--as", MANAGER)
    assert code != 0
    one_line_error(err)


def test_questions_answers_and_cancel(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A blocked order's question is in the manager's queue until answered."""
    order_id = new_order(capsys, home)
    run_json(capsys, "work", "accept", order_id, "--as", WORKER)
    run_json(capsys, "work", "start", order_id, "--as", WORKER)
    run_json(capsys, "work", "report", order_id,
             write(home, "b.json", report_fields("blocked")), "--as", WORKER)
    code, out, _ = run(capsys, "order", "questions", "--as", MANAGER)
    assert out.startswith(f"{order_id} · blocks 1 · {WORKER}")
    assert "  - Which quarter?" in out
    assert run_json(capsys, "order", "questions", "--all")["questions"][0]["questions"] == [
        "Which quarter?"]
    code, _, err = run(capsys, "order", "questions")
    assert code == 2
    one_line_error(err)
    assert run_json(capsys, "answer", order_id, "Q3", "--as", MANAGER)["state"] == "working"
    code, out, _ = run(capsys, "order", "questions", "--as", MANAGER)
    assert out == "no open questions\n"
    code, out, _ = run(capsys, "cancel", order_id, "plans changed", "--as", MANAGER)
    assert out == f"cancelled {order_id}: now cancelled (seq 6)\n"
    code, out, _ = run(capsys, "work", "decline", new_order(capsys, home), "busy",
                       "--as", WORKER)
    assert code == 0 and "now declined" in out


def test_follow_prints_events_until_the_order_ends(home: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Following an ended order prints its log and exits 0; an open one times out with 3."""
    order_id = new_order(capsys, home)
    code, out, _ = run(capsys, "order", "follow", order_id, "--timeout", "0.2")
    assert code == 3
    assert out.startswith("#1 ") and "create (offered)" in out
    run(capsys, "cancel", order_id, "stop", "--as", MANAGER)
    code, out, _ = run(capsys, "order", "follow", order_id, "--after", "1", "--json",
                       "--timeout", "30")
    assert code == 0
    assert [json.loads(line)["action"] for line in out.splitlines()] == ["cancel"]


def test_copy_handoff_with_nothing_to_copy_says_so(home: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--copy-handoff used to be dropped without a word: on an order that continues none it
    is refused (no order made); when the continued order has no handoff, the new order is
    made and stderr says it starts without one."""
    code, _, err = run(capsys, "order", "create", write(home, "o.json", order_fields()),
                       "--copy-handoff", "--as", MANAGER)
    assert code == 2 and "continues" in err
    one_line_error(err)
    code, _, err = run(capsys, "order", "list")  # not even a desk was made
    assert code == 1 and "there is no desk at" in err
    first = new_order(capsys, home)
    run(capsys, "cancel", first, "plans changed", "--as", MANAGER)
    code, out, err = run(capsys, "order", "create",
                         write(home, "next.json", order_fields(continues=first)),
                         "--copy-handoff", "--as", MANAGER)
    assert code == 0 and out.startswith("created ")
    one_line_error(err)
    assert f"{first} has no handoff to copy" in err


def test_home_flag_picks_the_desk(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--home wins over AWL_HOME."""
    other = home / "other"
    run_json(capsys, "order", "create", write(home, "o.json", order_fields()), "--as", MANAGER,
             "--home", str(other))
    assert (other / "desk.sqlite3").exists()
    code, _, err = run(capsys, "order", "list")  # AWL_HOME's desk was never made
    assert code == 1 and "there is no desk at" in err
    assert len(run_json(capsys, "order", "list", "--home", str(other))) == 1


@pytest.mark.parametrize("words", [
    ["order", "list"], ["order", "show", "wo_1"], ["order", "questions", "--all"],
    ["order", "follow", "wo_1", "--timeout", "1"], ["track", "agent:worker"],
    ["handoff", "wo_1"], ["effects", "list", "wo_1"], ["notify", "list"], ["notify", "log"],
    ["token", "list"], ["review", "wo_1", "--approve", "--as", "human:ana"],
    ["cancel", "wo_1", "plans changed", "--as", "human:ana"],
    ["effects", "settle", "wo_1", "gmail/send#1", "--happened", "--evidence", "x", "--as",
     "human:ana"],
])
def test_a_command_on_a_desk_that_is_not_there_makes_nothing_and_names_the_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str]) -> None:
    """A made-up --home is named in one line, and no folder or desk file is left behind
    (`order list` there used to print "no orders", exit 0, and create the path)."""
    typo = tmp_path / "made" / "up"
    code = main([*words, "--home", str(typo)])
    _, err = capsys.readouterr()
    assert code == 1, err
    one_line_error(err)
    assert f"there is no desk at {typo / 'desk.sqlite3'}" in err
    assert "`awl order create` makes a desk there" in err
    assert not (tmp_path / "made").exists()


def test_not_found_names_the_desk_that_was_read(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A typo in an order id says which desk was read, so a wrong home shows as such."""
    new_order(capsys, home)
    for words in (["order", "show", "wo_typo"], ["effects", "list", "wo_typo"]):
        code, _, err = run(capsys, *words)
        assert code == 1
        one_line_error(err)
        assert err.startswith("awl: NOT_FOUND: no order with id 'wo_typo' on the desk at "
                              f"{home / 'home' / 'desk.sqlite3'}; check --home"), err


@pytest.mark.slow
def test_the_installed_command_runs_as_a_process(tmp_path: Path) -> None:
    """``python -m awl`` creates and lists an order in a real subprocess."""
    env = {**os.environ, "AWL_HOME": str(tmp_path / "home"), "AWL_ACTOR": MANAGER}
    order = write(tmp_path, "o.json", order_fields())
    created = subprocess.run([sys.executable, "-m", "awl", "order", "create", order, "--json"],
                             capture_output=True, text=True, env=env, timeout=60, check=False)
    assert created.returncode == 0, created.stderr
    order_id = json.loads(created.stdout)["order"]["id"]
    listed = subprocess.run([sys.executable, "-m", "awl", "order", "list"], capture_output=True,
                            text=True, env=env, timeout=60, check=False)
    assert listed.returncode == 0 and order_id in listed.stdout
    refused = subprocess.run([sys.executable, "-m", "awl", "review", order_id, "--approve"],
                             capture_output=True, text=True, env=env, timeout=60, check=False)
    assert refused.returncode == 1
    assert refused.stderr.startswith("awl: INVALID_TRANSITION: ")
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr


def _blocked(home: Path, managers: list[str]) -> list[str]:
    """Blocked orders, one from each of ``managers`` in turn, written by the desk itself."""
    from awl.desk import Desk
    from awl.desk.home import default_store
    from tests.awl.desk_support import Clock, working

    clock = Clock()
    store = default_store(None)
    try:
        desk = Desk(store, clock=clock)
        out = []
        for manager in managers:
            oid = working(desk, manager=manager).id
            desk.report(oid, WORKER, report_fields("blocked", questions=[f"{oid}?"]))
            out.append(oid)
            clock.advance(seconds=1)
        return out
    finally:
        store.close()


@pytest.mark.spec("BIND-20")
def test_questions_come_a_page_at_a_time_with_the_command_for_the_next(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`awl order questions --limit N` ends with the command that shows the next page, and
    running it does; a manager never sees another's question; --json carries `next`."""
    import shlex

    oids = _blocked(home, [MANAGER, "human:bo", MANAGER, MANAGER, "human:bo", MANAGER])
    mine = [oid for i, oid in enumerate(oids) if i not in (1, 4)]
    seen: list[str] = []
    args = ["order", "questions", "--as", MANAGER, "--limit", "3"]
    while True:
        code, out, err = run(capsys, *args)
        assert code == 0, err
        lines = out.splitlines()
        seen += [line.split(" · ")[0] for line in lines if line.startswith("wo_")]
        if not lines[-1].startswith("next page: "):
            break
        command = shlex.split(lines[-1].removeprefix("next page: "))
        assert command[:5] == ["awl", "order", "questions", "--as", MANAGER]
        args = command[1:]
    assert seen == mine
    assert "no more open questions" not in out
    code, out, _ = run(capsys, "order", "questions", "--all", "--limit", "5",
                       "--home", str(home / "home"))
    command = shlex.split(out.splitlines()[-1].removeprefix("next page: "))
    assert command[3:8] == ["--all", "--home", str(home / "home"), "--limit", "5"]
    code, out, _ = run(capsys, *command[1:])
    assert code == 0 and out.startswith(f"{oids[5]} · blocks 1")
    page = run_json(capsys, "order", "questions", "--all", "--limit", "4")
    assert [q["order_id"] for q in page["questions"]] == oids[:4] and page["next"]
    rest = run_json(capsys, "order", "questions", "--all", "--after", page["next"])
    assert [q["order_id"] for q in rest["questions"]] == oids[4:] and rest["next"] is None


@pytest.mark.spec("BIND-20")
@pytest.mark.parametrize("bad", [["--limit", "0"], ["--limit", "-3"], ["--limit", "201"],
                                 ["--after", "garbled"], ["--after", "q1.W10"]])
def test_a_bad_page_of_questions_is_one_line(home: Path, capsys: pytest.CaptureFixture[str],
                                             bad: list[str]) -> None:
    _blocked(home, [MANAGER])
    code, out, err = run(capsys, "order", "questions", "--as", MANAGER, *bad)
    assert code != 0 and out == ""
    one_line_error(err)
    assert bad[0] in err or "cursor" in err


@pytest.mark.spec("SEC-1", "BIND-3")
def test_reading_as_another_principal_shows_only_what_it_may_see(
        home: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`awl order show|follow|list` and `awl handoff` with `--as P` (or $AWL_ACTOR) read as
    P, as `awl track --as` does and the MCP desk would for P: an outsider is refused the
    order in one line and lists none of it; its parties read it; with neither, the operator
    reads everything."""
    order_id = new_order(capsys, home)
    reads = (["order", "show", order_id], ["handoff", order_id],
             ["order", "follow", order_id, "--timeout", "0.1"])
    for words in reads:
        code, out, err = run(capsys, *words, "--as", "agent:nosy")
        assert (code, out) == (1, ""), words
        one_line_error(err)
        assert "FORBIDDEN" in err and "not part of order" in err
    assert run_json(capsys, "order", "list", "--as", "agent:nosy") == []
    monkeypatch.setenv("AWL_ACTOR", "agent:nosy")
    code, out, err = run(capsys, "order", "show", order_id)
    assert (code, out) == (1, "") and "FORBIDDEN" in err
    monkeypatch.setenv("AWL_ACTOR", WORKER)
    assert run_json(capsys, "order", "show", order_id)["order"]["id"] == order_id
    assert [v["order"]["id"] for v in run_json(capsys, "order", "list")] == [order_id]
    monkeypatch.delenv("AWL_ACTOR")
    assert run_json(capsys, "order", "show", order_id)["order"]["id"] == order_id
    assert [v["order"]["id"] for v in run_json(capsys, "order", "list")] == [order_id]
