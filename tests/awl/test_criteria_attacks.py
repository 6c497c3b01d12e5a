"""A worker attacking the desk's checks: real processes, real files, real git."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from awl.desk.criteria import CheckRun, run_check, run_checks, take_snapshot, tamper_signals
from awl.documents.models import Check
from tests.awl.check_support import assert_stopped, check_folder
from tests.awl.test_criteria_checks import TEST, _git, _workspace

NAMING_TESTS = Check(run=("pytest", "tests"))
NEEDS_PROC = pytest.mark.skipif(
    not Path("/proc/self/stat").exists() and os.environ.get("CI") != "true",
    reason="needs Linux /proc (under CI=true it runs, and fails without it)")


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWL_HOME", str(tmp_path / "home"))


@pytest.fixture(params=["git", "folder"])
def workspace(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return _workspace(tmp_path, request.param)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


# A daemon the usual way: fork, leave the session (setsid), fork again, keep the output,
# and beat (append to a file) for as long as it lives.
DAEMON = """
import os, sys, time
beat = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            open(beat, 'a').write('.')
            print('still here', flush=True)
            time.sleep(0.05)
    os._exit(0)
while not os.path.exists(beat):
    time.sleep(0.01)
print('main done', flush=True)
"""


@pytest.mark.spec("SEC-12", "SEC-15")
def test_a_daemon_that_leaves_the_session_is_killed_and_does_not_stall_the_desk(
        tmp_path: Path) -> None:
    folder = check_folder(tmp_path)
    started = time.monotonic()
    run = run_check(folder, "c1", Check(run=(sys.executable, "-c", DAEMON,
                                             str(folder / "beat"))))
    assert time.monotonic() - started < 4  # not the reader's wait for a held-open pipe
    assert_stopped(folder / "beat")
    assert run.exit_code == 0
    assert "main done" in run.tail


@pytest.mark.spec("SEC-12", "SEC-15")
def test_at_the_timeout_a_daemon_out_of_the_group_is_killed_too(tmp_path: Path) -> None:
    folder = check_folder(tmp_path)
    script = DAEMON.replace("print('main done', flush=True)", "time.sleep(60)")
    run = run_check(folder, "c1", Check(run=(sys.executable, "-c", script,
                                             str(folder / "beat")), timeout=1))
    assert run.outcome == "timeout" and run.duration < 5
    assert_stopped(folder / "beat")


@pytest.mark.spec("SEC-12")
def test_a_check_killed_by_a_signal_is_named_and_fails(tmp_path: Path) -> None:
    script = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    run = run_check(tmp_path, "c1", Check(run=(sys.executable, "-c", script)))
    assert run.outcome == "failed"
    assert run.exit_code == 128 + signal.SIGSEGV
    assert run.summary().startswith(f"exit {128 + signal.SIGSEGV} (as when killed by SIGSEGV)")


@pytest.mark.spec("SEC-15")
def test_a_check_cannot_kill_or_see_what_runs_it(tmp_path: Path) -> None:
    """What watches the check (and the desk) is out of its reach: it sees only its own
    processes, cannot signal the sandbox's first process, and its exit is what it exits."""
    script = ("import os, signal\n"
              "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
              f"for pid in (1, os.getppid(), {os.getpid()}):\n"
              "    try:\n"
              "        os.kill(pid, signal.SIGKILL)\n"
              "    except OSError as exc:\n"
              "        print(pid, type(exc).__name__)\n"
              "raise SystemExit(3)\n")
    run = run_check(tmp_path, "c1", Check(run=(sys.executable, "-c", script)))
    assert run.exit_code == 3, run
    visible = [int(p) for p in run.tail[0].strip("[]").split(", ")]
    assert max(visible) < 10, visible  # its own PID namespace: the desk is not there


@pytest.mark.spec("SEC-12")
def test_a_check_that_closes_its_output_early_still_ends_with_its_exit(tmp_path: Path) -> None:
    script = "import os, time; print('bye', flush=True); os.close(1); os.close(2); time.sleep(1)"
    run = run_check(tmp_path, "c1", Check(run=(sys.executable, "-c", script), timeout=10))
    assert run.outcome == "passed" and run.tail == ("bye",)
    assert 0.9 < run.duration < 5


@pytest.mark.spec("SEC-12")
def test_a_missing_program_could_not_run(tmp_path: Path) -> None:
    run = run_check(tmp_path, "c1", Check(run=("no-such-program-awl",)))
    assert run.outcome == "failed"
    assert run.summary() == "could not run: no-such-program-awl: No such file or directory"


@pytest.mark.spec("SEC-12")
def test_a_cwd_that_is_a_symlink_loop_is_refused_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "sub").symlink_to("sub")
    run = run_check(tmp_path, "c1", Check(run=("true",), cwd="sub"))
    assert run.outcome == "failed" and "cannot be resolved" in str(run.error)


@pytest.mark.spec("LC-19")
def test_a_named_path_made_a_symlink_loop_is_still_a_signal(tmp_path: Path) -> None:
    root = _workspace(tmp_path, "git")
    snapshot = take_snapshot(root)
    (root / "tests" / "test_calc.py").unlink()
    (root / "tests" / "test_calc.py").symlink_to("test_calc.py")
    signals = tamper_signals(root, snapshot, Check(run=("pytest", "tests/test_calc.py")))
    assert "edited test file tests/test_calc.py" in signals


@pytest.mark.spec("LC-19")
def test_a_test_file_swapped_for_a_symlink_out_of_the_workspace_is_a_signal(
        workspace: Path, tmp_path: Path) -> None:
    snapshot = take_snapshot(workspace)
    (tmp_path / "passes.py").write_text("def test_add():\n    pass\n")
    (workspace / "tests" / "test_calc.py").unlink()
    (workspace / "tests" / "test_calc.py").symlink_to(tmp_path / "passes.py")
    signals = tamper_signals(workspace, snapshot, NAMING_TESTS)
    assert "edited tests/test_calc.py, under a folder the check's command names" in signals
    assert any("changed type" in s for s in signals)


@pytest.mark.spec("LC-19")
def test_many_changes_hide_no_edit(workspace: Path) -> None:
    snapshot = take_snapshot(workspace)
    (workspace / "aaa").mkdir()
    for i in range(2001):  # they sort before tests/
        (workspace / "aaa" / f"f{i}").write_text("x")
    (workspace / "tests" / "test_calc.py").write_text(TEST.replace("== 5", "== 5 or True"))
    signals = tamper_signals(workspace, snapshot, NAMING_TESTS)
    assert "edited tests/test_calc.py, under a folder the check's command names" in signals
    assert any("only the first 2000 were searched" in s for s in signals)


@pytest.mark.spec("LC-19")
def test_core_worktree_cannot_point_the_snapshot_at_another_folder(tmp_path: Path) -> None:
    root = _workspace(tmp_path, "git")
    snapshot = take_snapshot(root)
    pristine = tmp_path / "pristine"
    shutil.copytree(root, pristine, ignore=shutil.ignore_patterns(".git"))
    (root / "tests" / "test_calc.py").write_text(TEST.replace("== 5", "== 5 or True"))
    _git(root, "config", "core.worktree", str(pristine))
    signals = tamper_signals(root, snapshot, NAMING_TESTS)
    assert "edited tests/test_calc.py, under a folder the check's command names" in signals


@pytest.mark.spec("LC-19")
def test_a_clean_filter_cannot_hand_git_the_original_text(tmp_path: Path) -> None:
    root = _workspace(tmp_path, "git")
    snapshot = take_snapshot(root)
    (root / "tests" / "test_calc.py").write_text(TEST.replace("== 5", "== 5 or True"))
    (root / ".gitattributes").write_text("tests/* filter=lie\n")
    _git(root, "config", "filter.lie.clean", "git show HEAD:tests/test_calc.py")
    _git(root, "config", "filter.lie.required", "true")
    signals = tamper_signals(root, snapshot, NAMING_TESTS)
    assert "edited tests/test_calc.py, under a folder the check's command names" in signals


@pytest.mark.spec("LC-19")
def test_a_huge_added_file_is_not_read_whole_into_memory(workspace: Path) -> None:
    snapshot = take_snapshot(workspace)
    with open(workspace / "big.txt", "wb") as big:  # sparse: cheap on disk
        big.truncate(96 * 1024 * 1024)
    tracemalloc.start()
    try:
        assert tamper_signals(workspace, snapshot, NAMING_TESTS) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024


@pytest.mark.spec("LC-17", "SEC-12")
def test_a_workspace_swapped_for_a_symlink_runs_nothing(tmp_path: Path) -> None:
    root = _workspace(tmp_path, "folder")
    snapshot = take_snapshot(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root.rename(tmp_path / "moved")
    root.symlink_to(elsewhere)
    marker = elsewhere / "ran"
    [run] = run_checks(root, [("c1", Check(run=("touch", str(marker))))], snapshot)
    assert run.outcome == "failed" and "is now a symbolic link to" in str(run.error)
    assert not marker.exists()


def test_runs_in_one_workspace_take_turns(tmp_path: Path) -> None:
    """The worker's report and the manager's re-run ran their checks in one workspace at
    once, disturbing each other's output: a spurious failure, and the same one twice blocks
    the order. They now take turns (a lock per workspace, under the desk's home)."""
    import threading

    root = _workspace(tmp_path, "folder")
    stamp = ("import time; print(time.time(), flush=True); time.sleep(0.6); "
             "print(time.time())")
    check = Check(run=(sys.executable, "-c", stamp))
    results: list[CheckRun] = []
    runs = [threading.Thread(target=lambda: results.extend(run_checks(root, [("c", check)],
                                                                      None)))
            for _ in range(3)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(60)
    spans = sorted((float(r.tail[0]), float(r.tail[1])) for r in results)
    assert len(spans) == 3
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), spans
