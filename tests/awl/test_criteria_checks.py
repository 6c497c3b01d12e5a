"""Criteria the desk checks itself: a real git work tree and real pytest runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from awl import BadRequest, Desk, ValidationFailed
from awl.cli import main
from awl.desk import AsyncDesk
from awl.desk.criteria import normalize, run_check, take_snapshot, tamper_signals
from awl.documents.models import Check
from awl.server import DeskServer
from awl.store.memory import MemoryStore
from awl.store.protocol import Store
from awl.store.sqlite import SQLiteStore
from tests.awl.check_support import assert_stopped, check_folder
from tests.awl.desk_support import MANAGER, WORKER, Clock, order_fields, report_fields
from tests.awl.server_support import Desk as McpDesk

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_calc.py"]

CALC_BROKEN = "def add(a, b):\n    return a - b\n"
# Another length than the broken one: Python trusts a cached .pyc whose source has the same
# size and modification second, and these files change within one second.
CALC_FIXED = "def add(a, b):\n    return a + b  # fixed\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                   check=True, capture_output=True)


def _workspace(tmp_path: Path, kind: str) -> Path:
    """A workspace whose one test fails until calc.add is fixed: a git work tree, or a plain
    folder (whose snapshots the desk keeps under its own home)."""
    root = tmp_path / "repo"
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text(CALC_BROKEN)
    (root / "tests" / "test_calc.py").write_text(TEST)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\npythonpath = ['.']\n")
    (root / ".gitignore").write_text("__pycache__/\n")
    if kind == "git":
        _git(root, "init", "-q")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", "start")
    return root


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWL_HOME", str(tmp_path / "home"))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The workspace as a git work tree."""
    return _workspace(tmp_path, "git")


@pytest.fixture(params=["git", "folder"])
def workspace(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The workspace, once as a git work tree and once as a plain folder: what the snapshot
    and the tamper signals see must not depend on which."""
    return _workspace(tmp_path, request.param)


def _started(repo: Path, store: Store | None = None, **check: Any) -> tuple[Desk, str]:
    desk = Desk(store or MemoryStore(), clock=Clock())
    criteria = [{"id": "c1", "text": "add adds", "check": {"run": PYTEST, **check}},
                {"id": "c2", "text": "every figure cited"}]
    view = desk.create(order_fields(criteria=criteria), MANAGER, workspace=repo)
    desk.accept(view.id, WORKER)
    desk.start(view.id, WORKER)
    return desk, view.id


@pytest.mark.slow
@pytest.mark.spec("LC-17")
@pytest.mark.spec("LC-18")
def test_passing_check_marks_the_criterion_met(workspace: Path) -> None:
    repo = workspace
    desk, order_id = _started(repo)
    start = desk.events(order_id)[-1]
    kind = "git" if (repo / ".git").is_dir() else "folder"
    assert start.data is not None and start.data["snapshot"]["kind"] == kind
    assert desk.workspace(order_id) == str(repo.resolve())
    (repo / "calc.py").write_text(CALC_FIXED)
    view = desk.report(order_id, WORKER, report_fields())
    assert view.state == "submitted"
    result = desk.check_results(order_id)["c1"]
    assert result["type"] == "check"
    assert result["check"]["outcome"] == "passed"
    assert result["check"]["exit_code"] == 0
    assert "1 passed" in " ".join(result["check"]["tail"])
    assert result["check"]["snapshot"] == start.data["snapshot"]


@pytest.mark.slow
@pytest.mark.spec("LC-18")
@pytest.mark.spec("RX5")
def test_failing_check_refuses_the_report_with_its_output_tail(workspace: Path) -> None:
    repo = workspace
    desk, order_id = _started(repo)
    with pytest.raises(ValidationFailed) as caught:
        desk.report(order_id, WORKER, report_fields())
    finding = caught.value.findings[0]
    assert (finding.rule, finding.path) == ("RX5", "/status")
    assert "c1" in finding.message and "exit 1" in finding.message
    assert "1 failed" in finding.message
    assert desk.get(order_id).state == "working"
    assert desk.get(order_id).reports == ()
    assert desk.events(order_id)[-1].action == "check"


@pytest.mark.slow
@pytest.mark.spec("LC-20")
def test_same_failure_twice_blocks_the_order_with_a_question(repo: Path, tmp_path: Path) -> None:
    desk, order_id = _started(repo, SQLiteStore(tmp_path / "desk.sqlite3"))
    with pytest.raises(ValidationFailed):
        desk.report(order_id, WORKER, report_fields())
    with pytest.raises(ValidationFailed, match="blocked"):
        desk.report(order_id, WORKER, report_fields())
    view = desk.get(order_id)
    assert view.state == "blocked"
    assert "failed the same way twice" in desk.open_questions(view)[0]
    assert "failed the same way twice" in desk.handoff(order_id)
    [question] = desk.questions(MANAGER).questions
    assert question.order_id == order_id
    assert "failed the same way twice" in question.questions[0]
    desk.answer(order_id, MANAGER, "the test is right; fix add()")
    assert desk.get(order_id).state == "working"


@pytest.mark.slow
@pytest.mark.spec("LC-20")
def test_a_different_failure_is_another_attempt(repo: Path) -> None:
    desk, order_id = _started(repo)
    with pytest.raises(ValidationFailed):
        desk.report(order_id, WORKER, report_fields())
    (repo / "calc.py").write_text("def add(a, b):\n    raise RuntimeError('nope')\n")
    with pytest.raises(ValidationFailed) as caught:
        desk.report(order_id, WORKER, report_fields())
    assert "blocked" not in str(caught.value)
    assert desk.get(order_id).state == "working"


@pytest.mark.slow
@pytest.mark.spec("LC-19")
def test_a_new_skip_marker_passes_but_asks_the_manager(workspace: Path) -> None:
    repo = workspace
    desk, order_id = _started(repo)
    (repo / "tests" / "test_calc.py").write_text(
        "import pytest\n" + TEST.replace("def test_add", "@pytest.mark.skip\ndef test_add"))
    view = desk.report(order_id, WORKER, report_fields())
    assert view.state == "submitted"
    result = desk.check_results(order_id)["c1"]["check"]
    assert result["outcome"] == "question"
    assert any("skip" in s for s in result["signals"])
    assert any("tests/test_calc.py, which the check's command names" in s
               for s in result["signals"])


@pytest.mark.slow
@pytest.mark.spec("LC-19")
def test_deleting_the_test_file_is_a_question(workspace: Path) -> None:
    repo = workspace
    check = {"run": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
             "env": {"PYTHONDONTWRITEBYTECODE": "1"}}
    desk = Desk(MemoryStore(), clock=Clock())
    (repo / "tests" / "test_other.py").write_text("def test_ok():\n    pass\n")
    criteria = [{"id": "c1", "text": "tests pass", "check": check},
                {"id": "c2", "text": "cited"}]
    view = desk.create(order_fields(criteria=criteria), MANAGER, workspace=repo)
    desk.accept(view.id, WORKER)
    desk.start(view.id, WORKER)
    (repo / "tests" / "test_calc.py").unlink()
    (repo / "tests" / "test_new.py").write_text("def test_new():\n    pass\n")
    desk.report(view.id, WORKER, report_fields())
    result = desk.check_results(view.id)["c1"]["check"]
    assert result["outcome"] == "question"
    assert result["signals"] == ["deleted test file tests/test_calc.py"]
    (repo / "tests" / "test_other.py").write_text("def test_ok():\n    assert True\n")
    [item] = desk.run_checks(view.id, MANAGER)
    assert "edited tests/test_other.py, under a folder the check's command names" in (
        item["check"]["signals"])


@pytest.mark.slow
@pytest.mark.spec("LC-19")
def test_editing_how_checks_run_is_a_question(workspace: Path) -> None:
    repo = workspace
    desk, order_id = _started(repo)
    (repo / "calc.py").write_text(CALC_FIXED)
    (repo / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\npythonpath = ['.']\naddopts = '-q'\n")
    desk.report(order_id, WORKER, report_fields())
    signals = desk.check_results(order_id)["c1"]["check"]["signals"]
    assert signals == ["edited pyproject.toml, which defines how checks run"]


@pytest.mark.spec("SEC-12")
def test_a_hanging_check_is_killed_at_its_timeout(repo: Path) -> None:
    desk2 = Desk(MemoryStore(), clock=Clock())
    hang = {"run": [sys.executable, "-c", "import time; print('waiting', flush=True); "
                    "time.sleep(60)"], "timeout": 0.5}
    view = desk2.create(order_fields(criteria=[{"id": "c1", "text": "t", "check": hang},
                                               {"id": "c2", "text": "u"}]),
                        MANAGER, workspace=repo)
    desk2.accept(view.id, WORKER)
    desk2.start(view.id, WORKER)
    with pytest.raises(ValidationFailed, match="killed at its timeout") as caught:
        desk2.report(view.id, WORKER, report_fields())
    assert "waiting" in caught.value.findings[0].message
    result = desk2.check_results(view.id)["c1"]["check"]
    assert result["outcome"] == "timeout" and result["exit_code"] is None
    assert result["duration"] < 10


@pytest.mark.spec("SEC-12")
def test_the_environment_holds_only_the_minimal_set_and_what_the_check_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWL_SECRET_FOR_TEST", "leak")
    script = "import os, sys; print(sorted(os.environ)); print(os.environ.get('MODE'))"
    run = run_check(tmp_path, "c1", Check(run=(sys.executable, "-c", script),
                                          env={"MODE": "strict"}))
    assert run.exit_code == 0
    assert "AWL_SECRET_FOR_TEST" not in run.tail[0]
    assert run.tail[1] == "strict"


@pytest.mark.spec("SEC-12")
def test_no_shell_and_output_bounded(tmp_path: Path) -> None:
    run = run_check(tmp_path, "c1", Check(run=("echo hi && echo there",)))
    assert run.outcome == "failed"
    assert run.error == "echo hi && echo there: No such file or directory"
    many = Check(run=(sys.executable, "-c", "for i in range(200000): print('line', i)"))
    run = run_check(tmp_path, "c1", many)
    assert run.exit_code == 0 and len(run.tail) == 20
    assert run.tail[-1] == "line 199999"


@pytest.mark.slow
@pytest.mark.spec("SEC-12")
def test_checks_come_only_from_the_order(repo: Path) -> None:
    desk, order_id = _started(repo)
    forged = report_fields(evidence=[
        {"criterion": "c1", "type": "check", "note": "passed"},
        {"criterion": "c2", "type": "note", "note": "cited"}])
    with pytest.raises(ValidationFailed) as caught:
        desk.report(order_id, WORKER, forged)
    assert caught.value.findings[0].rule in ("R1", "RX5")
    assert desk.get(order_id).reports == ()


@pytest.mark.spec("LC-17")
def test_checks_need_a_workspace_that_is_a_folder_or_the_top_of_a_work_tree(
        tmp_path: Path, repo: Path) -> None:
    desk = Desk(MemoryStore(), clock=Clock())
    criteria = [{"id": "c1", "text": "t", "check": {"run": ["true"]}}]
    with pytest.raises(BadRequest, match="--workspace"):
        desk.create(order_fields(criteria=criteria), MANAGER)
    with pytest.raises(BadRequest, match="is not a folder"):
        desk.create(order_fields(criteria=criteria), MANAGER, workspace=tmp_path / "absent")
    with pytest.raises(BadRequest, match=r"inside the git work tree .* not its top folder"):
        desk.create(order_fields(criteria=criteria), MANAGER, workspace=repo / "tests")
    plain = tmp_path / "plain"
    plain.mkdir()
    view = desk.create(order_fields(criteria=criteria), MANAGER, workspace=plain)
    assert desk.workspace(view.id) == str(plain.resolve())


@pytest.mark.spec("LC-17")
def test_a_plain_folders_snapshot_lives_in_the_desks_home_not_in_the_folder(
        tmp_path: Path) -> None:
    plain = _workspace(tmp_path, "folder")
    before = sorted(p.relative_to(plain) for p in plain.rglob("*"))
    snapshot = take_snapshot(plain)
    assert snapshot["kind"] == "folder" and "head" not in snapshot
    assert Path(snapshot["objects"]) == (tmp_path / "home" / "snapshots").resolve()
    assert sorted(p.relative_to(plain) for p in plain.rglob("*")) == before
    assert take_snapshot(plain)["tree"] == snapshot["tree"]  # nothing changed, same tree


@pytest.mark.spec("LC-19")
def test_in_a_plain_folder_a_gitignore_hides_no_edit(tmp_path: Path) -> None:
    plain = _workspace(tmp_path, "folder")
    (plain / ".gitignore").write_text("__pycache__/\ntests/\nconftest.py\n")
    snapshot = take_snapshot(plain)
    check = Check.model_validate({"run": PYTEST})
    (plain / "tests" / "test_calc.py").write_text(TEST.replace("== 5", "== -1"))
    (plain / "conftest.py").write_text("collect_ignore = []\n")
    assert tamper_signals(plain, snapshot, check) == [
        "added conftest.py, which defines how checks run",
        "edited tests/test_calc.py, which the check's command names",
    ]


@pytest.mark.slow
@pytest.mark.spec("LC-19")
def test_a_snapshot_that_cannot_be_read_is_a_question(workspace: Path, tmp_path: Path) -> None:
    repo = workspace
    desk, order_id = _started(repo)
    (repo / "calc.py").write_text(CALC_FIXED)
    shutil.rmtree(tmp_path / "home" / "snapshots", ignore_errors=True)
    if (repo / ".git").is_dir():
        shutil.rmtree(repo / ".git")  # the start tree's objects are gone with it
    assert desk.report(order_id, WORKER, report_fields()).state == "submitted"
    result = desk.check_results(order_id)["c1"]["check"]
    assert result["outcome"] == "question"
    assert "could not be compared with its start snapshot" in result["signals"][0]


@pytest.mark.slow
@pytest.mark.spec("LC-21")
def test_the_manager_reruns_the_checks(repo: Path) -> None:
    desk, order_id = _started(repo)
    with pytest.raises(ValidationFailed):
        desk.report(order_id, WORKER, report_fields())
    (repo / "calc.py").write_text(CALC_FIXED)
    from awl import Forbidden

    with pytest.raises(Forbidden):
        desk.run_checks(order_id, WORKER)
    [item] = desk.run_checks(order_id, MANAGER)
    assert item["check"]["outcome"] == "passed"
    (repo / "calc.py").write_text("def add(a, b):\n    return 0\n")
    assert desk.run_checks(order_id, MANAGER)[0]["check"]["outcome"] == "failed"
    with pytest.raises(ValidationFailed) as caught:  # a re-run is not the worker's try
        desk.report(order_id, WORKER, report_fields())
    assert "blocked" not in str(caught.value) and desk.get(order_id).state == "working"
    (repo / "calc.py").write_text(CALC_FIXED)
    desk.run_checks(order_id, MANAGER)
    assert desk.check_results(order_id)["c1"]["check"]["outcome"] == "passed"
    assert desk.events(order_id)[-1].actor == "awl:desk"


def test_normalize_removes_what_differs_between_runs() -> None:
    one = "\x1b[31mFAILED\x1b[0m /tmp/pytest-of-x/pytest-3/t.py:12 - 1 failed in 0.31s"
    two = "FAILED /tmp/pytest-of-x/pytest-9/t.py:40 - 1 failed in 2.05s"
    assert normalize(one) == normalize(two)
    assert normalize("1 failed") != normalize("1 error")


@pytest.mark.slow
@pytest.mark.spec("LC-19", "LC-21")
def test_show_and_briefing_put_the_check_beside_its_criterion(repo: Path) -> None:
    desk, order_id = _started(repo)
    (repo / "tests" / "test_calc.py").write_text(
        "import pytest\n" + TEST.replace("def test_add", "@pytest.mark.xfail\ndef test_add"))
    desk.report(order_id, WORKER, report_fields())
    page = desk.handoff(order_id)
    assert "- [?] `c1` add adds" in page
    assert "check `" in page and "question: exit 0" in page
    assert "Is the pass to be trusted?" in page.split("## Open questions")[1]


@pytest.mark.slow
@pytest.mark.spec("LC-17", "LC-21")
def test_cli_workspace_show_and_checks_run(repo: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("AWL_ACTOR", raising=False)
    monkeypatch.setenv("AWL_HOME", str(tmp_path / "home"))
    fields = order_fields(criteria=[{"id": "c1", "text": "add adds", "check": {"run": PYTEST}},
                                    {"id": "c2", "text": "cited"}],
                          deadline="2099-01-01T00:00:00Z")
    (tmp_path / "o.json").write_text(json.dumps(fields))
    assert main(["order", "create", str(tmp_path / "o.json"), "--as", MANAGER,
                 "--workspace", str(repo), "--json"]) == 0
    order_id = json.loads(capsys.readouterr().out)["order"]["id"]
    assert "workspace" not in json.dumps(fields)
    for step in ("accept", "start"):
        assert main(["work", step, order_id, "--as", WORKER]) == 0
    assert main(["checks", "run", order_id, "--as", MANAGER]) == 1
    out = capsys.readouterr().out
    assert "c1: failed (exit 1" in out and "| " in out
    assert main(["checks", "run", order_id, "--as", WORKER]) == 1
    assert capsys.readouterr().err.startswith("awl: FORBIDDEN")
    (repo / "calc.py").write_text(CALC_FIXED)
    assert main(["checks", "run", order_id, "--as", MANAGER]) == 0
    assert main(["order", "show", order_id]) == 0
    shown = capsys.readouterr().out
    assert "check " in shown and ": passed (exit 0" in shown


@pytest.mark.slow
@pytest.mark.spec("SEC-12", "SEC-15")
def test_the_whole_process_group_is_killed(tmp_path: Path) -> None:
    folder = check_folder(tmp_path)
    beat = folder / "beat"
    child = ("import sys, time\n"
             "while True:\n    open(sys.argv[1], 'a').write('.'); time.sleep(0.05)")
    script = ("import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); "
              "time.sleep(60)")
    run = run_check(folder, "c1", Check(run=(sys.executable, "-c", script, child, str(beat)),
                                        timeout=1))
    assert run.outcome == "timeout"
    assert_stopped(beat)


@pytest.mark.spec("SEC-12")
def test_snapshots_run_git_without_the_desks_environment_or_a_monitor(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWL_SECRET_FOR_TEST", "leak")
    seen = repo.parent / "filter-env.txt"
    monitor = repo.parent / "monitor-ran.txt"
    hook = repo.parent / "monitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {monitor}\n")
    hook.chmod(0o755)
    _git(repo, "config", "core.fsmonitor", str(hook))
    _git(repo, "config", "filter.spy.clean", f"sh -c 'env > {seen}; cat'")
    (repo / ".gitattributes").write_text("*.py filter=spy\n")
    take_snapshot(repo)
    assert not monitor.exists()
    assert not seen.exists()  # the work tree's filters never run (test_criteria_attacks.py)


@pytest.mark.slow
@pytest.mark.spec("LC-19")
def test_editing_the_checks_test_to_pass_is_a_question(workspace: Path) -> None:
    repo = workspace
    desk, order_id = _started(repo)
    (repo / "tests" / "test_calc.py").write_text(TEST.replace("== 5", "== -1"))
    assert desk.report(order_id, WORKER, report_fields()).state == "submitted"
    result = desk.check_results(order_id)["c1"]["check"]
    assert result["outcome"] == "question"
    assert result["signals"] == ["edited tests/test_calc.py, which the check's command names"]


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("LC-17", "SEC-12")
async def test_over_mcp_no_workspace_is_given_and_a_failing_check_refuses_the_report(
        repo: Path) -> None:
    """No MCP door takes a workspace, so nobody there can make the desk run a command; a
    worker's done report over MCP is judged by the checks the manager's side set up."""
    desk = AsyncDesk(MemoryStore())
    criteria = [{"id": "c1", "text": "add adds", "check": {"run": PYTEST}},
                {"id": "c2", "text": "cited"}]
    fields = order_fields(criteria=criteria, deadline="2099-01-01T00:00:00Z")
    async with AsyncExitStack() as stack:
        m, w = [McpDesk(await stack.enter_async_context(
            Client(DeskServer(desk, principal=p).server, mode="legacy")))
            for p in (MANAGER, WORKER)]
        error = await m.refused("create_work_order", order=fields)
        assert error["code"] == "BAD_REQUEST" and "workspace" in error["message"]
        view = await desk.create(fields, MANAGER, workspace=repo)
        await w.call("accept_work_order", order_id=view.id)
        await w.call("start_work_order", order_id=view.id)
        error = await w.refused("submit_work_report", order_id=view.id,
                                report=report_fields())
        assert error["code"] == "VALIDATION_FAILED"
        assert [f["rule"] for f in error["findings"]] == ["RX5"]
        await w.refused("submit_work_report", order_id=view.id, report=report_fields())
        got = await w.call("get_work_order", order_id=view.id)
        assert got["state"] == "blocked"
        assert "failed the same way twice" in got["open_questions"][0]
